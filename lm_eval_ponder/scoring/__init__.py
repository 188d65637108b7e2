"""The tasks' scoring: what our YAML tasks' ``utils.py`` and the trainer call to prompt, grade
and account for an answer (``tasklib``: prompts, few-shot examples, ``process_results``;
``grading``: sympy/math-verify answers). Not the lm-eval adapter's (``evaluation``): the adapter
generates, the tasks score, and training grades its rollouts the same way."""

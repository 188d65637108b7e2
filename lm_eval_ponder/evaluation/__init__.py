"""Stage 3 of the data path: lm-eval's side, the model and the generation loop training reuses.

``lm`` (``--model ponder``), ``settings`` (the model args), ``accounting`` (per-row
tokens/FLOPs travelling to the tasks), ``generation`` (the decoding loop), ``tasklib`` (the
tasks' shared logic) and ``grading``. Training (stage 4) generates its rollouts through
``lm.PonderLM`` and grades them with ``grading``, so it comes after this stage. Imported lazily
by lm-eval; kept free of eager imports here so task ``utils.py`` files stay cheap to load.
"""

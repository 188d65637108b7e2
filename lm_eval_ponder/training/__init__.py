"""Stage 3 of the data path: training a controller with GRPO (``python -m lm_eval_ponder.train``).

``config`` (the config dataclasses and command line), ``cli`` (the entry point), ``rollouts``
(the per-depth rollout cache), ``rewards`` (one function per reward equation), ``environment``
(rewards over cached outcomes), ``grpo`` (the policy-gradient update), ``loop`` (the
prompt-level training loop), ``online`` (token-level training on online rollouts),
``distributed`` and ``checkpoint``.
"""

"""Kept so that lm-eval ``--use_cache`` files written before the layout move still open.

lm-eval pickles generated texts into its cache; ours were ``lm_eval_ponder.stats.GenerationText``
objects, so unpickling an old cache looks the class up here. It lives in
``lm_eval_ponder.generation.accounting``.
"""

from lm_eval_ponder.generation.accounting import GenerationText  # noqa: F401

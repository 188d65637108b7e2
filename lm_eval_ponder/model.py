"""``lm_eval_ponder.model.PonderLM``: kept for code that imported the model from here.

``--model ponder`` lives in ``lm_eval_ponder.evaluation.lm``.
"""

from lm_eval_ponder.evaluation.lm import PonderLM  # noqa: F401

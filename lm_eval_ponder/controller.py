"""``lm_eval_ponder.controller.PonderController``, the import path the README documents.

The controller lives in ``lm_eval_ponder.pondering.controller``.
"""

from lm_eval_ponder.pondering.controller import (  # noqa: F401
    PonderController,
    load_controller,
    save_controller,
)

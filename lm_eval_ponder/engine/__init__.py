"""The generation engine: a loop over rows in flight in which a finished row stops costing
compute (docs/design/generation.md, "The engine in one page", lists its modules). It imports no
lm-eval: ``evaluation.lm`` adapts it to lm-eval's ``LM`` API and the trainer drives it through
that adapter.

This is its one door: code outside ``engine/`` imports these names from here, never a
submodule (``tests/test_layout.py`` checks it), so the engine's files can move without
touching their callers. Only the engine's own tests read its modules directly."""

from lm_eval_ponder.engine.config import LoopConfig
from lm_eval_ponder.engine.loop import generate_rows
from lm_eval_ponder.engine.observers import Callbacks, LoopObserver, StepTimer
from lm_eval_ponder.engine.rows import (
    cache_bytes_per_token,
    cache_keyword,
    cache_shape,
    check_model_supported,
    supports_logits_to_keep,
)
from lm_eval_ponder.engine.sampling import SamplingConfig
from lm_eval_ponder.engine.stops import FINISH_UNSURE, StepView, StopRule, TopProbBelow

__all__ = ["FINISH_UNSURE", "Callbacks", "LoopConfig", "LoopObserver", "SamplingConfig",
           "StepTimer", "StepView", "StopRule", "TopProbBelow", "cache_bytes_per_token",
           "cache_keyword", "cache_shape", "check_model_supported", "generate_rows",
           "supports_logits_to_keep"]

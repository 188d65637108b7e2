"""The generation engine: a loop over rows in flight in which a finished row stops costing
compute (``loop``), its two cache layouts (``rows``: dynamic, the default; ``slots``: static,
for the ``captured`` decode step of ``capture``), the next-token choice (``sampling``), stop
strings (``stops``), its batching settings (``config``) and what it tells its callers
(``observers``). It imports no lm-eval: ``evaluation.lm`` adapts it to lm-eval's ``LM`` API and
the trainer drives it through that adapter.

This is its one door: code outside ``engine/`` imports these names from here, never a
submodule (``tests/test_layout.py`` checks it), so the engine's files can move without
touching their callers. Only the engine's own tests read its modules directly."""

from lm_eval_ponder.engine.capture import CapturedForward
from lm_eval_ponder.engine.config import LoopConfig, check_decode_step
from lm_eval_ponder.engine.loop import FINISH_UNSURE, generate_rows
from lm_eval_ponder.engine.observers import Callbacks, LoopObserver, StepTimer
from lm_eval_ponder.engine.rows import (
    cache_bytes_per_token,
    cache_keyword,
    cache_shape,
    check_model_supported,
    supports_logits_to_keep,
)
from lm_eval_ponder.engine.sampling import SamplingConfig
from lm_eval_ponder.engine.slots import decode_forward

__all__ = ["FINISH_UNSURE", "Callbacks", "CapturedForward", "LoopConfig", "LoopObserver",
           "SamplingConfig", "StepTimer", "cache_bytes_per_token", "cache_keyword",
           "cache_shape", "check_decode_step", "check_model_supported", "decode_forward",
           "generate_rows", "supports_logits_to_keep"]

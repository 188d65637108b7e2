"""Stage 2 of the data path: latent pondering at inference.

``dynamics`` (the state evolution, offsets, halting; one function per equation), ``controller``
(the halting network), ``hook`` (the forward hook that adds the chosen offset to one layer).
"""

from lm_eval_ponder.pondering.controller import PonderController  # noqa: F401
from lm_eval_ponder.pondering.dynamics import PonderConfig, cumulative_offsets  # noqa: F401
from lm_eval_ponder.pondering.hook import SteeringHook  # noqa: F401

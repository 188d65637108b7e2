"""``python -m lm_eval_ponder.train``: parse the config, then run the matching training loop.

The dispatch lives here, above both loops, so neither loop imports the other: prompt
granularity trains on the rollout cache (``training.loop``), token granularity on online
rollouts (``training.online``).
"""

from __future__ import annotations

import sys

from lm_eval_ponder.errors import command
from lm_eval_ponder.training.config import parse_args


@command
def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.ponder.granularity == "token":
        from lm_eval_ponder.training.online import run_online as run
    else:
        from lm_eval_ponder.training.loop import run
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

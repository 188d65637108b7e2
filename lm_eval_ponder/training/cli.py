"""``python -m lm_eval_ponder.train``: parse the config, then run the training loop.

One loop (``training.loop.run``) serves both granularities through an environment: the
rollout cache (prompt level) or online rollouts (token level).
"""

from __future__ import annotations

import sys

from lm_eval_ponder.errors import command
from lm_eval_ponder.training.config import parse_args


@command
def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    from lm_eval_ponder.training.loop import run

    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

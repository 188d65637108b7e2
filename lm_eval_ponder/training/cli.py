"""``python -m lm_eval_ponder.train``: parse the config, then run the training loop.

One loop (``training.loop.run``) serves both granularities through an environment: the
rollout cache (prompt level) or online rollouts (token level). A finished run prints one line
(where the controller is, its held-out figures, the wall time); Ctrl-C prints where the run
stopped and the command that resumes it (``training.status``).
"""

from __future__ import annotations

import os
import sys
import time

from lm_eval_ponder.errors import Interrupted, command, run_program
from lm_eval_ponder.training.config import parse_args


@command
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(argv)
    from lm_eval_ponder.training.loop import run
    from lm_eval_ponder.training.status import interrupted_message, summary_line

    start = time.monotonic()
    try:
        out = run(cfg)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_message(cfg, argv)) from None
    if os.environ.get("RANK", "0") == "0":  # rank 0 wrote the controller
        print(summary_line(out, time.monotonic() - start))
    return 0


if __name__ == "__main__":
    run_program(main)

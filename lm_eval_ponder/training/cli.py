"""``python -m lm_eval_ponder.train``: parse the config, then run the training loop.

One loop (``training.loop.run``) serves both granularities through an environment: the
rollout cache (prompt level) or online rollouts (token level). A finished run prints one line
(where the controller is, its held-out figures, the wall time); Ctrl-C prints where the run
stopped and the command that resumes it (``training.status``).
"""

from __future__ import annotations

import errno
import os
import sys
import time

from lm_eval_ponder.errors import Interrupted, PonderError, command, run_program
from lm_eval_ponder.training.config import control_options, parse_args

# a disk that cannot take more: full, over quota, read-only
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


@command
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(argv)
    options = control_options(argv)
    if options.control or options.control_from:
        return control(cfg, options)
    from lm_eval_ponder.training.loop import run
    from lm_eval_ponder.training.status import (
        interrupted_message,
        resume_command,
        stopped_at,
        summary_line,
    )

    start = time.monotonic()
    try:
        out = run(cfg)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_message(cfg, argv)) from None
    except OSError as error:
        if error.errno not in DISK_ERRORS:
            raise
        # a full disk mid-run (a checkpoint, a cache block, the log): what was written before
        # is whole (every file is replaced atomically or appended line by line)
        raise PonderError(f"cannot write {error.filename or cfg.output}: {error.strerror}; "
                          f"{stopped_at(cfg)}. Free space, then run the same command again to "
                          f"resume: {resume_command(argv)}") from None
    if os.environ.get("RANK", "0") == "0":  # rank 0 wrote the controller
        print(summary_line(out, time.monotonic() - start))
    return 0


def control(cfg, options) -> int:
    """``--control WORLD`` / ``--control-from CACHE``: the positive control (training.control);
    exit 0 whether or not the recipe passes (the report says which), 1 only on an error."""
    from lm_eval_ponder.training import control as ctl

    if options.control and options.control_from:
        raise PonderError("give --control WORLD or --control-from CACHE, not both")
    try:
        seeds = [int(s) for s in options.seeds.split(",") if s.strip()]
    except ValueError:
        raise PonderError(f"--seeds takes integers separated by commas, got {options.seeds!r}") \
            from None
    if not seeds:
        raise PonderError("--seeds names no seed")
    world = (ctl.world_from_cache(options.control_from, cfg) if options.control_from
             else ctl.load_world(options.control))
    report = ctl.run_control(cfg, world, seeds, price_given=options.price_given)
    print(ctl.report_text(report))
    print(f"written: {cfg.output}/control.json")
    return 0


if __name__ == "__main__":
    run_program(main)

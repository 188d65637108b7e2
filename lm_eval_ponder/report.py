"""``python -m lm_eval_ponder.report``: the documented entry point of the leaderboard report.

The code lives in ``lm_eval_ponder.reporting.report``; this module keeps the command working.
"""

from lm_eval_ponder.errors import run_program
from lm_eval_ponder.reporting.report import main, report  # noqa: F401

if __name__ == "__main__":
    run_program(main)

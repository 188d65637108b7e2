"""``python -m lm_eval_ponder.suite``: the documented entry point of the benchmark suite.

The code lives in ``lm_eval_ponder.reporting.suite``; this module keeps the command working.
"""

from lm_eval_ponder.errors import run_program
from lm_eval_ponder.reporting.suite import main  # noqa: F401

if __name__ == "__main__":
    run_program(main)

"""``python -m lm_eval_ponder.steer``: the documented entry point of steering-vector extraction.

The code lives in ``lm_eval_ponder.steering.cli``; this module keeps the command working.
"""

from lm_eval_ponder.errors import run_program
from lm_eval_ponder.steering.cli import main  # noqa: F401

if __name__ == "__main__":
    run_program(main)

"""``python -m lm_eval_ponder.train``: the documented entry point of the trainer.

The code lives in ``lm_eval_ponder.training`` (``cli``, ``config``, ``loop``, ``online``); this
module keeps the command and the imports the README documents working.
"""

from lm_eval_ponder.errors import run_program
from lm_eval_ponder.training.cli import main  # noqa: F401
from lm_eval_ponder.training.config import TrainConfig, parse_args  # noqa: F401

if __name__ == "__main__":
    run_program(main)

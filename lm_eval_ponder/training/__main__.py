"""``python -m lm_eval_ponder.training``, the same command as ``python -m lm_eval_ponder.train``."""

from lm_eval_ponder.errors import run_program
from lm_eval_ponder.training.cli import main

run_program(main)

"""``python -m lm_eval_ponder.training``, the same command as ``python -m lm_eval_ponder.train``."""

import sys

from lm_eval_ponder.training.cli import main

sys.exit(main())

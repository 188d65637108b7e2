"""The studies' committed records: ``python scripts/records.py unpack [FOLDER ...]`` unpacks the
archives (``results/*.tar.xz``, all by default) to read them, ``pack FOLDER`` rewrites a study's
archive after adding runs. The code is ``studies/studylib/records.py``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))

from studylib.records import main  # noqa: E402

from lm_eval_ponder.errors import run_program  # noqa: E402

if __name__ == "__main__":
    run_program(main)

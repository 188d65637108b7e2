"""Code that more than one study script uses, kept once.

The rule (the same as ``benchmarks/lib``'s): a script under ``studies/`` never imports another
script; what two scripts share lives here (or, when the package itself has a use for it, in
``lm_eval_ponder``), and scripts take it as ``from studylib.<module> import ...``. Running
``python studies/<script>.py`` puts ``studies/`` first on ``sys.path`` (Python does so for the
script's own folder), so ``studylib`` is found from any working directory without touching
``sys.path``; tests and ``python -c`` add ``studies/`` themselves. ``studylib`` imports nothing
from the scripts. Its name differs from ``benchmarks/lib`` so that a process (the tests) can
hold both folders on its path at once. ``tests/test_benchmarks.py`` enforces the rule for both
folders.

- ``caches``: the two pondering forms and the headroom rollout caches (``headroom.py`` builds
  them; ``adaptation.py``, ``testset.py`` and ``per_type.py`` read them, their outcomes
  without z_0 through ``cache_matrices``).
- ``analysis``: per-prompt outcome matrices, the fixed-depth curve, oracle choices,
  cross-fitting folds, bootstrap intervals, depth by difficulty level, one depth per type, and
  a gap at equal tokens against the three comparators (in-sample, cross-fitted, smoothed).
- ``heldout``: the packed held-out records of an adaptation sweep.
- ``records``: the studies' committed records as archives (``results/*.tar.xz``), unpacked to
  be read; ``scripts/records.py`` is its command line.
"""

"""Code that more than one benchmark script uses, kept once.

The rule: a script under ``benchmarks/`` never imports another script; what two scripts share
lives here (or, when the package itself has a use for it, in ``lm_eval_ponder``), and scripts
take it as ``from lib.<module> import ...``. Running ``python benchmarks/<script>.py`` puts
``benchmarks/`` first on ``sys.path`` (Python does so for the script's own folder), so ``lib``
is found without touching ``sys.path``; tests and ``python -c`` add ``benchmarks/`` themselves.
``lib`` itself imports nothing from the scripts. ``tests/test_benchmarks.py`` enforces the rule
(here and in ``studies/``, whose shared code is ``studies/studylib``).

- ``decoding``: the timing harness of a decode step (a tiny random model, arith chat prompts,
  our loop and HFLM's path with their forwards timed).
"""

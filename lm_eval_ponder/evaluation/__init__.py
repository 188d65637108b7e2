"""Stage 4 of the data path: lm-eval's side.

``lm`` (``--model ponder``), ``accounting`` (per-row tokens/FLOPs travelling to the tasks),
``tasklib`` (the tasks' shared logic), ``grading`` and ``data``. Imported lazily by lm-eval; kept
free of eager imports here so task ``utils.py`` files stay cheap to load.
"""

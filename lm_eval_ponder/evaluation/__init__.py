"""The ``--model ponder`` adapter: everything that reads lm-eval, and nothing else.

``lm`` (``PonderLM``, an ``HFLM``), ``requests`` (``generate_until``'s requests read as HFLM
reads them), ``resume`` (answers kept in lm-eval's ``--use_cache``), and lm-eval's command
line, output and patches (``lmeval_cli``, ``lmeval_output``, ``lmeval_patches``). Generation
itself is the ``generation`` stage, which the trainer calls too. Imported lazily by lm-eval;
kept free of eager imports here so task ``utils.py`` files stay cheap to load.
"""

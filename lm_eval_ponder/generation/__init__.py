"""Generation as both callers need it, between the engine and them: the model args that shape
a call (``settings``, ``batching``), one steered call through the engine or ``generate``
(``batch``), the per-row price and accounting of each answer (``pricing``, ``accounting``),
the early exit (``early_exit``), live progress (``progress``), and the ``SteeredGenerator``
that holds all of it for one model (``generator``). Nothing here reads lm-eval: ``evaluation``
(the ``--model ponder`` adapter) builds the generator and ``training`` (the rollouts) holds it.
Kept free of eager imports so that importing a module stays cheap.
"""

"""The generation engine: a loop over rows in flight in which a finished row stops costing
compute (``loop``), its two cache layouts (``rows``: dynamic, the default; ``slots``: static,
for the ``captured`` decode step of ``capture``), the next-token choice (``sampling``), stop
strings (``stops``), its batching settings (``config``) and what it tells its callers
(``observers``). It imports no lm-eval: ``evaluation.lm`` adapts it to lm-eval's ``LM`` API and
the trainer drives it through that adapter."""

"""How per-sample accounting travels from the model to a task's ``process_results``.

lm-eval hands ``process_results(doc, results)`` only the generated strings. The ``ponder``
model returns each string as a ``GenerationText``: a ``str`` subclass that also carries
``.stats`` (``gen_tokens``, ``prompt_tokens``, ``flops``, ``ponder_steps``; ``exit_layer`` under
early exit). Anything that treats it as a string (lm-eval's own tasks, filters, JSON sample
logs) sees an ordinary string; our tasks read the attribute. It pickles with its stats, so
lm-eval's ``--use_cache`` returns the accounting of the run that produced the text.

Filters that build new strings (regex extraction) drop the attribute; our tasks therefore do
their own extraction in ``process_results`` and keep every repeat (Best-of-N) with an identity
filter. A response without stats (``--model hf`` or ``vllm``, or a filter that rebuilt the
string) is reported as NaN in the sample log: ``process_results`` cannot see the model or its
tokenizer. The report re-tokenises such responses with ``count_text_tokens`` and marks the
metrics as estimated (``reporting.estimate``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

STAT_KEYS = ("gen_tokens", "flops", "ponder_steps")
# recorded only by early-exit runs (``generation.early_exit``: the mean exit layer) and by
# runs with an answer stop (``<reason>_stop``, e.g. ``unsure_stop`` of ``min_top_prob``: the
# share of answers it stopped), so every other run's samples and results keep exactly their
# keys; averaged over a document's responses like ponder steps
OPTIONAL_STAT_KEYS = ("exit_layer",)
ANSWER_STOP_SUFFIX = "_stop"


class GenerationText(str):
    """A generated string plus the accounting of the row that produced it."""

    stats: dict[str, float]

    def __new__(cls, text: str, stats: dict[str, float]) -> GenerationText:
        obj = super().__new__(cls, text)
        obj.stats = dict(stats)
        return obj

    def __reduce__(self):
        return (GenerationText, (str(self), self.stats))


def count_generated_tokens(
    decode, tokens: Sequence[int], stops: Sequence[str], eos_ids: Sequence[int]
) -> int:
    """Tokens this row generated, up to and including its own EOS or completed stop string.

    HFLM's stopping criterion is batch-wide, so a finished row keeps decoding (padding or
    junk) until every row is done; those tokens were wasted by batching, not spent by this
    sample. The stop-string search is a binary search on decoded prefixes (decoding a longer
    prefix never removes a stop string that a shorter one contained), so it costs
    O(log n) decodes.
    """
    eos = set(eos_ids)
    limit = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
    stops = [s for s in stops if s]
    if not stops or limit == 0:
        return limit

    def has_stop(n: int) -> bool:
        text = decode(list(tokens[:n]))
        return any(s in text for s in stops)

    if not has_stop(limit):
        return limit
    # the shortest prefix of 1..limit with a stop (has_stop(limit) is True)
    return 1 + bisect.bisect_left(range(1, limit), True, key=has_stop)


def count_text_tokens(tokenizer, text: str, max_gen_toks: int | None = None) -> int:
    """Tokens a response took, re-derived from its text when the model did not count them.

    Comparable with ``count_generated_tokens``: the text lm-eval returns has lost the EOS (or
    the stop string) that ended it, so one token is added back; a response cut at
    ``max_gen_toks`` had no such token, hence the cap. Re-tokenising a decoded text can differ
    from the generated ids by a token or two (merges across the boundary), which is why the
    report marks these counts as estimated.
    """
    n = len(tokenizer(text, add_special_tokens=False).input_ids) + 1
    return n if max_gen_toks is None else min(n, int(max_gen_toks))


def response_stats(responses: Sequence[str] | str) -> dict[str, float]:
    """Accounting of one document: sums tokens and FLOPs over all its responses (Best-of-N
    pays for every sample), averages ponder steps (and the exit layer of an early-exit run).
    NaN when any response has no stats."""
    if isinstance(responses, str):
        responses = [responses]
    if not responses or not all(isinstance(r, GenerationText) for r in responses):
        return {key: math.nan for key in STAT_KEYS}
    from lm_eval_ponder.flops import FlopCount

    stats = [r.stats for r in responses]  # type: ignore[union-attr]
    out = {
        "gen_tokens": float(sum(s["gen_tokens"] for s in stats)),
        "flops": FlopCount(sum(s["flops"] for s in stats)),  # lm-eval's table: readable
        "ponder_steps": float(sum(s.get("ponder_steps", 0.0) for s in stats) / len(stats)),
    }
    stops = sorted(k for k in stats[0] if k.endswith(ANSWER_STOP_SUFFIX))
    for key in (*OPTIONAL_STAT_KEYS, *stops):
        if all(key in s for s in stats):
            out[key] = float(sum(s[key] for s in stats) / len(stats))
    return out


"""A generation call's rows priced as they end: the accounting each answer carries
(``accounting.GenerationText``), read from the call's steering (``pondering.hook.SteeredCall``)
and priced with ``flops``.

Kept apart from ``generation.accounting`` (what the tasks read, light to import) and from the
model class: this is where a row's depth, exit layers and FLOPs come from, for the answers
lm-eval gets and for the answers kept as rows end (``evaluation.resume``) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from lm_eval_ponder.engine import StopRule
from lm_eval_ponder.flops import FlopsSpec, generation_flops
from lm_eval_ponder.generation.accounting import GenerationText
from lm_eval_ponder.pondering.hook import RowStatistics


@dataclass
class Pricing:
    """What prices a row's FLOPs: the backbone's shape, the prefill's logits as generation
    computes them (``flops.generation_flops``), and the run's answer stops
    (``engine.stops``), under one of which (``min_top_prob``'s) a row runs the forward of a
    token it drops."""

    spec: FlopsSpec
    prefill_logits: int
    answer_stops: tuple[StopRule, ...] = ()

    def text(self, text: str, row: dict[str, float], controller_flops: int = 0,
             dropped: bool = False) -> GenerationText:
        """A generated text with its row's accounting, FLOPs priced from its counts plus its
        controller's (unless the row priced its own: early exit). A row whose stop dropped the
        token it stopped at ran that token's forward: it is priced at one token more than it
        kept (the test itself, e.g. a softmax, a few operations per vocabulary entry, is not
        priced)."""
        if "flops" in row:
            return GenerationText(text, dict(row))
        ran = row["gen_tokens"] + int(dropped)
        flops = generation_flops(self.spec, row["prompt_tokens"], ran, self.prefill_logits)
        return GenerationText(text, {**row, "flops": float(flops + controller_flops)})


class CallAccounts:
    """The accounting of one generation call's rows: prompt and generated tokens, and what its
    steering's statistics (``rows``) say of each row (ponder steps, controller evaluations,
    under early exit the mean exit layer and FLOPs). Read as each row ends, so an answer kept
    the moment it ends carries the same accounting as the one returned."""

    def __init__(self, pricing: Pricing, prompt_tokens: list[int], rows: RowStatistics) -> None:
        self.pricing, self.prompt_tokens, self.rows = pricing, prompt_tokens, rows

    def text(self, row: int, gen_tokens: int, text: str, reason: str = "") -> GenerationText:
        """Row ``row``'s answer with its accounting, having generated ``gen_tokens`` tokens and
        ended for ``reason`` (the engine's ``finish_reason``)."""
        # a row whose stop dropped its token made one decision more than it kept tokens (at
        # token granularity): the one that steered the logits the stop tested
        dropped = any(r.reason == reason and not r.keeps_token for r in self.pricing.answer_stops)
        steered = self.rows.row(row, gen_tokens + int(dropped))
        prompt = int(self.prompt_tokens[row])
        stats = {"prompt_tokens": prompt, "gen_tokens": gen_tokens,
                 "ponder_steps": steered.ponder_steps, "controller_evals": steered.controller_evals}
        for rule in self.pricing.answer_stops:  # absent otherwise: other runs keep their keys
            stats[f"{rule.reason}_stop"] = float(reason == rule.reason)
        if steered.own_accounting is not None:
            stats.update(steered.own_accounting(self.pricing.spec, prompt, gen_tokens,
                                                self.pricing.prefill_logits))
        return self.pricing.text(text, stats, steered.controller_flops, dropped)

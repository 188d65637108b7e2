"""A generation call's rows priced as they end: the accounting each answer carries
(``accounting.GenerationText``), read from the call's hooks and priced with ``flops``.

Kept apart from ``generation.accounting`` (what the tasks read, light to import) and from the
model class: this is where a row's depth, exit layers and FLOPs come from, for the answers
lm-eval gets and for the answers kept as rows end (``evaluation.resume``) alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from lm_eval_ponder.flops import FlopsSpec, generation_flops
from lm_eval_ponder.generation.accounting import GenerationText
from lm_eval_ponder.generation.early_exit import ExitHook, ExitSettings, exit_accounting
from lm_eval_ponder.hooks import RowRecords
from lm_eval_ponder.pondering.dynamics import ControllerDecide
from lm_eval_ponder.pondering.hook import SteeredCall, SteeringHook


@dataclass
class Pricing:
    """What prices a row's FLOPs: the backbone's shape, the prefill's logits (``PonderLM.
    prefill_logits``), the controller whose evaluations are added, and the early-exit settings
    whose rows price themselves (every token's exit layer, not the counts, sets their cost)."""

    spec: FlopsSpec
    prefill_logits: int
    controller: torch.nn.Module | None = None
    early_exit: ExitSettings | None = None
    min_top_prob: float | None = None

    def for_call(self, call: SteeredCall) -> Pricing:
        """This pricing with the call's controller, whose evaluations each row adds."""
        return replace(self, controller=call.pondering.controller if call.pondering else None)

    def text(self, text: str, row: dict[str, float]) -> GenerationText:
        """A generated text with its row's accounting, FLOPs priced from its counts (unless
        the row priced its own: early exit). A row stopped below ``min_top_prob`` ran the
        forward of the token it dropped: it is priced at one token more than it kept (the
        softmax that tested it, a few operations per vocabulary entry, is not priced)."""
        if "flops" in row:
            return GenerationText(text, dict(row))
        ran = row["gen_tokens"] + int(row.get("unsure_stop", 0.0))
        flops = generation_flops(self.spec, row["prompt_tokens"], ran, self.prefill_logits)
        if row["controller_evals"]:
            flops += self.controller.evaluation_flops(row["controller_evals"])
        return GenerationText(text, {**row, "flops": float(flops)})


class CallAccounts:
    """The accounting of one generation call's rows, read from its hooks' records: prompt and
    generated tokens, ponder steps and controller evaluations (the depths ``decider`` chose, by
    the rows ``hook`` saw in each forward), and under early exit the mean exit layer and FLOPs.
    Records are read as they grow (``hooks.RowRecords``), so a row's accounting is ready the
    moment it ends (all its decisions and exits precede its last token) and reading every row
    after the call costs one pass too."""

    def __init__(self, pricing: Pricing, prompt_tokens: list[int], call: SteeredCall) -> None:
        self.pricing, self.prompt_tokens, self.ponder = pricing, prompt_tokens, call.pondering
        # a controller's depths, by the rows its hook saw in each forward
        self.steering: SteeringHook | None = call.hook if call.decider is not None else None
        self.decider: ControllerDecide | None = call.decider
        self.exit_hook: ExitHook | None = call.exits
        self.depths, self.exits = RowRecords(), RowRecords()

    def stats(self, row: int, gen_tokens: int, unsure: bool = False) -> dict[str, float]:
        """Row ``row``'s accounting, having generated ``gen_tokens`` tokens (``unsure``: and
        then stopped below ``min_top_prob``)."""
        if self.steering is not None:
            self.depths.read(self.decider.depths, self.steering.decision_rows)
        depths = self.depths.of(row) if self.steering is not None else None
        # a row stopped below min_top_prob made one decision more than it kept tokens (at token
        # granularity): the one that steered the logits the stop tested
        ran = gen_tokens + int(unsure)
        steps, evals = self.ponder.row_stats(depths, ran) if self.ponder else (0.0, 0)
        prompt = int(self.prompt_tokens[row])
        stats = {"prompt_tokens": prompt, "gen_tokens": gen_tokens, "ponder_steps": steps,
                 "controller_evals": evals}
        if self.pricing.min_top_prob is not None:  # absent otherwise: other runs keep their keys
            stats["unsure_stop"] = float(unsure)
        if self.exit_hook is not None and self.pricing.early_exit is not None:
            self.exits.read(self.exit_hook.exits, self.exit_hook.exit_rows)
            stats.update(exit_accounting(self.pricing.spec, self.pricing.early_exit,
                                         self.exits.of(row), prompt, gen_tokens,
                                         self.pricing.prefill_logits))
        return stats

    def text(self, row: int, gen_tokens: int, text: str, unsure: bool = False) -> GenerationText:
        return self.pricing.text(text, self.stats(row, gen_tokens, unsure))

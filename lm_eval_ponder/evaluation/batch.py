"""The batch step of ``--model ponder``: one left-padded batch through the generation engine
(or transformers' ``generate``), steered as the call says, each row priced as it ends.

Both ways into ``PonderLM`` (lm-eval's ``generate_until`` and the trainer's ``generate_texts``)
end here, so an answer is generated, counted and priced the same way whoever asked for it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lm_eval.models.huggingface import HFLM

from lm_eval_ponder.engine import (
    FINISH_UNSURE,
    Callbacks,
    LoopObserver,
    SamplingConfig,
    check_model_supported,
    generate_rows,
)
from lm_eval_ponder.errors import PonderError, UnsupportedGeneration
from lm_eval_ponder.evaluation.accounting import GenerationText, count_generated_tokens
from lm_eval_ponder.evaluation.early_exit import ExitHook
from lm_eval_ponder.evaluation.pricing import CallAccounts, Pricing
from lm_eval_ponder.evaluation.requests import hf_sampling_kwargs
from lm_eval_ponder.evaluation.settings import Pondering
from lm_eval_ponder.pondering.hook import SteeringHook

LOGGER = logging.getLogger(__name__)
# how a call is steered: the model's pondering (None), a Pondering, one offset per row, or a
# steering hook the caller built (the trainer's token-level policy)
Steer = Pondering | Sequence[float] | SteeringHook | None


@dataclass
class BatchGeneration:
    """One batch's output: ``sequences`` [B, L + T] as ``generate`` returns them, each row's
    generated tokens (to its EOS or stop string), prompt tokens, its accounting, and whether
    it ended at a token below ``min_top_prob`` (which it ran a forward for and did not keep)."""

    sequences: torch.Tensor
    gen_tokens: list[int]
    prompt_tokens: list[int]
    accounts: CallAccounts
    unsure: list[bool]

    def text(self, row: int, text: str) -> GenerationText:
        return self.accounts.text(row, int(self.gen_tokens[row]), text, self.unsure[row])


class BatchStep:
    """One call of ``PonderLM.generate_batch``: ``lm`` is the model (its state is read, never
    changed; not imported here, which would make a circle with ``evaluation.lm``)."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *,
            max_new_tokens: int, stop: list[str], steer: Steer = None,
            on_text: Callable[[int, GenerationText], Any] | None = None,
            observers: Sequence[LoopObserver] = (), **generation_kwargs) -> BatchGeneration:
        """Generate with the engine (``generation=loop``) or, for ``generation=hf`` and
        settings the loop cannot reproduce exactly (with one warning), transformers'
        ``generate``. ``on_text(row, text)`` gets each row's answer as it ends (the loop;
        ``generate`` hands all rows over at the end), ``observers`` the loop's events."""
        lm = self.lm
        if max_new_tokens < 1:  # the loop would return empty answers, scored as wrong
            raise PonderError(f"max_gen_toks must be at least 1, got {max_new_tokens}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hook, decider, ponder = self.hook(steer, input_ids.shape[0])
        accounts = CallAccounts(
            Pricing(lm.flops_spec, lm.prefill_logits, ponder.controller if ponder else None,
                    lm.early_exit, lm.min_top_prob),
            attention_mask.sum(dim=1).tolist(), hook, decider, ponder)
        kwargs = hf_sampling_kwargs(generation_kwargs)
        texts = None if on_text is None else Callbacks(on_tokens=lambda row, tokens, why: on_text(
            row, accounts.text(row, len(tokens), lm.answer(tokens, stop), why == FINISH_UNSURE)))
        autocast = torch.autocast(device_type=lm.device.type, dtype=lm.mixed_precision_dtype,
                                  enabled=lm.mixed_precision_dtype is not None)
        with hook or contextlib.nullcontext(), autocast:
            result = self.loop(input_ids, attention_mask, max_new_tokens, stop, kwargs,
                               [texts, hook, *observers])
            if result is None:
                result = self.generate(input_ids, attention_mask, max_new_tokens, stop, kwargs)
                for row, tokens in enumerate(result[0][:, input_ids.shape[1]:].tolist()):
                    for observer in (texts, *observers):
                        if observer is not None:
                            observer.row_finished(row, tokens[:result[1][row]])
        return BatchGeneration(result[0], result[1], accounts.prompt_tokens, accounts, result[2])

    def hook(self, steer: Steer, n_rows: int) -> tuple[Any, Any, Pondering | None]:
        """(hook, decider, pondering) of one call, from how it is steered (``Steer``); with
        nothing said, the model's pondering, else its early exit, else nothing."""
        lm = self.lm
        if isinstance(steer, SteeringHook):
            hook, decider, ponder = steer, None, None
        elif steer is not None and not isinstance(steer, Pondering):
            hook = lm.require_steering().offsets_hook(lm.model, list(steer), lm.device)
            decider, ponder = None, None
        else:
            ponder = steer or lm.ponder
            hook, decider = ponder.hook(lm.model, lm.device) if ponder else (None, None)
            if ponder is None and lm.early_exit is not None:
                hook = ExitHook(lm.model, lm.early_exit)
        if isinstance(hook, SteeringHook):
            hook.expect_rows(n_rows)
        return hook, decider, ponder

    def loop(self, input_ids, attention_mask, max_new_tokens: int, stop: list[str],
             kwargs: dict, observers: list) -> tuple[torch.Tensor, list[int], list[bool]] | None:
        """The engine's generation, or None (with one warning) where it cannot reproduce
        ``generate`` exactly."""
        lm = self.lm
        if lm.generation != "loop":  # what generate would refuse deep inside, in one line
            with contextlib.suppress(UnsupportedGeneration):
                SamplingConfig.from_kwargs(lm.model.generation_config, **kwargs)
            return None
        try:
            sampling = SamplingConfig.from_kwargs(lm.model.generation_config, **kwargs)
            check_model_supported(lm.model)
        except UnsupportedGeneration as why:
            if lm.min_top_prob is not None:  # generate would answer without the stop
                raise PonderError(f"min_top_prob= needs the generation loop, and {why}") from None
            lm.warn_once(f"generation loop: {why}; using transformers' generate for these "
                         "requests (finished rows keep decoding)")
            return None
        result = generate_rows(
            lm.model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
            eos_token_ids=set(sampling.eos_token_ids) or {lm.eot_token_id},
            pad_token_id=lm.tokenizer.pad_token_id, stop=stop, decode=lm.tok_decode,
            sampling=sampling, config=lm.batching.loop_config(lm.min_top_prob),
            observers=observers)
        if result.decode_step != lm.batching.decode_step:
            lm.warn_once(f"decode_step={lm.batching.decode_step} does not apply to these "
                         f"calls ({result.why}); they decode with the dynamic cache")
        return (result.sequences, list(result.gen_tokens),
                [why == FINISH_UNSURE for why in result.finish_reason])

    def generate(self, input_ids, attention_mask, max_new_tokens: int, stop: list[str],
                 kwargs: dict) -> tuple[torch.Tensor, list[int], list[bool]]:
        """transformers' ``generate`` through HFLM's ``_model_generate``; each row counted to
        its EOS or stop string (the pad token is no end: the model may generate it)."""
        lm = self.lm
        width = input_ids.shape[1]
        sequences = HFLM._model_generate(lm, input_ids, width + max_new_tokens, stop,
                                         attention_mask=attention_mask, **kwargs)
        eos_ids = {lm.eot_token_id}
        for ids in (lm.model.generation_config.eos_token_id, kwargs.get("eos_token_id")):
            eos_ids |= {ids} if isinstance(ids, int) else set(ids or ())
        counts = [count_generated_tokens(lm.tok_decode, row, stop, eos_ids)
                  for row in sequences[:, width:].tolist()]
        return sequences, counts, [False] * len(counts)

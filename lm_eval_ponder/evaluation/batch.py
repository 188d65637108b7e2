"""The batch step of ``--model ponder``: one left-padded batch through the generation engine
(or transformers' ``generate``), steered as the call says, each row priced as it ends.

Both ways into ``PonderLM`` (lm-eval's ``generate_until`` and the trainer's ``generate_texts``)
end here, so an answer is generated, counted and priced the same way whoever asked for it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from lm_eval_ponder.engine import (
    FINISH_UNSURE,
    Callbacks,
    LoopConfig,
    LoopObserver,
    SamplingConfig,
    check_model_supported,
    generate_rows,
)
from lm_eval_ponder.errors import PonderError, UnsupportedGeneration
from lm_eval_ponder.evaluation.accounting import GenerationText, count_generated_tokens
from lm_eval_ponder.evaluation.pricing import CallAccounts, Pricing
from lm_eval_ponder.evaluation.requests import hf_sampling_kwargs
from lm_eval_ponder.pondering.hook import CallSteering

LOGGER = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class GenerationCall:
    """What one batch step needs of the model that makes it (``PonderLM.generation_call``):
    the backbone and its device, the decoding path (``generation``: ``loop`` or ``hf``) and
    the loop's batching, how a row is priced, the tokenizer's ends and texts, and the
    callbacks for transformers' ``generate`` (through HFLM) and for one-time warnings."""

    model: Any
    device: torch.device
    generation: str
    loop_config: LoopConfig
    decode_step: str
    pricing: Pricing
    eos_token_id: int
    pad_token_id: int | None
    decode: Callable[[list[int]], str]
    answer: Callable[[list[int], list[str]], str]
    autocast_dtype: torch.dtype | None
    hf_generate: Callable[..., torch.Tensor]
    warn_once: Callable[[str], None]


class BatchStep:
    """One left-padded batch through the engine (or ``generate``), steered by one
    ``CallSteering``."""

    def __init__(self, call: GenerationCall) -> None:
        self.call = call

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *,
            max_new_tokens: int, stop: list[str], steering: CallSteering,
            on_text: Callable[[int, GenerationText], Any] | None = None,
            observers: Sequence[LoopObserver] = (), **generation_kwargs) -> BatchGeneration:
        """Generate with the engine (``generation=loop``) or, for ``generation=hf`` and
        settings the loop cannot reproduce exactly (with one warning), transformers'
        ``generate``. ``on_text(row, text)`` gets each row's answer as it ends (the loop;
        ``generate`` hands all rows over at the end), ``observers`` the loop's events."""
        call = self.call
        if max_new_tokens < 1:  # the loop would return empty answers, scored as wrong
            raise PonderError(f"max_gen_toks must be at least 1, got {max_new_tokens}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        steered = steering.set_up(call.model, call.device, input_ids.shape[0])
        controller = steered.pondering.controller if steered.pondering else None
        accounts = CallAccounts(replace(call.pricing, controller=controller),
                                attention_mask.sum(dim=1).tolist(), steered)
        kwargs = hf_sampling_kwargs(generation_kwargs)
        texts = None if on_text is None else Callbacks(on_tokens=lambda row, tokens, why: on_text(
            row, accounts.text(row, len(tokens), call.answer(tokens, stop), why == FINISH_UNSURE)))
        autocast = torch.autocast(device_type=call.device.type, dtype=call.autocast_dtype,
                                  enabled=call.autocast_dtype is not None)
        with steered.hook or contextlib.nullcontext(), autocast:
            result = self.loop(input_ids, attention_mask, max_new_tokens, stop, kwargs,
                               [texts, steered.hook, *observers])
            if result is None:
                result = self.generate(input_ids, attention_mask, max_new_tokens, stop, kwargs)
                for row, tokens in enumerate(result[0][:, input_ids.shape[1]:].tolist()):
                    for observer in (texts, *observers):
                        if observer is not None:
                            observer.row_finished(row, tokens[:result[1][row]])
        return BatchGeneration(result[0], result[1], accounts.prompt_tokens, accounts, result[2])

    def loop(self, input_ids, attention_mask, max_new_tokens: int, stop: list[str],
             kwargs: dict, observers: list) -> tuple[torch.Tensor, list[int], list[bool]] | None:
        """The engine's generation, or None (with one warning) where it cannot reproduce
        ``generate`` exactly."""
        call = self.call
        if call.generation != "loop":  # what generate would refuse deep inside, in one line
            with contextlib.suppress(UnsupportedGeneration):
                SamplingConfig.from_kwargs(call.model.generation_config, **kwargs)
            return None
        try:
            sampling = SamplingConfig.from_kwargs(call.model.generation_config, **kwargs)
            check_model_supported(call.model)
        except UnsupportedGeneration as why:
            if call.loop_config.min_top_prob is not None:  # generate would not stop there
                raise PonderError(f"min_top_prob= needs the generation loop, and {why}") from None
            call.warn_once(f"generation loop: {why}; using transformers' generate for these "
                           "requests (finished rows keep decoding)")
            return None
        result = generate_rows(
            call.model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
            eos_token_ids=set(sampling.eos_token_ids) or {call.eos_token_id},
            pad_token_id=call.pad_token_id, stop=stop, decode=call.decode,
            sampling=sampling, config=call.loop_config, observers=observers)
        if result.decode_step != call.decode_step:
            call.warn_once(f"decode_step={call.decode_step} does not apply to these "
                           f"calls ({result.why}); they decode with the dynamic cache")
        return (result.sequences, list(result.gen_tokens),
                [why == FINISH_UNSURE for why in result.finish_reason])

    def generate(self, input_ids, attention_mask, max_new_tokens: int, stop: list[str],
                 kwargs: dict) -> tuple[torch.Tensor, list[int], list[bool]]:
        """transformers' ``generate`` through HFLM's ``_model_generate``; each row counted to
        its EOS or stop string (the pad token is no end: the model may generate it)."""
        call = self.call
        width = input_ids.shape[1]
        sequences = call.hf_generate(input_ids, width + max_new_tokens, stop,
                                     attention_mask=attention_mask, **kwargs)
        eos_ids = {call.eos_token_id}
        for ids in (call.model.generation_config.eos_token_id, kwargs.get("eos_token_id")):
            eos_ids |= {ids} if isinstance(ids, int) else set(ids or ())
        counts = [count_generated_tokens(call.decode, row, stop, eos_ids)
                  for row in sequences[:, width:].tolist()]
        return sequences, counts, [False] * len(counts)

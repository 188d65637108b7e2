"""The batch step: one left-padded batch through the generation engine (or transformers'
``generate``), steered as the call says, each row priced as it ends.

Both callers (lm-eval's ``generate_until`` and the trainer) reach it through one
``generation.generator.SteeredGenerator``, so an answer is generated, counted and priced the
same way whoever asked for it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lm_eval_ponder.engine import (
    Callbacks,
    LoopConfig,
    LoopObserver,
    SamplingConfig,
    check_model_supported,
    generate_rows,
)
from lm_eval_ponder.errors import PonderError, UnsupportedGeneration
from lm_eval_ponder.generation.accounting import GenerationText, count_generated_tokens
from lm_eval_ponder.generation.batching import Batching
from lm_eval_ponder.generation.pricing import CallAccounts, Pricing
from lm_eval_ponder.pondering.hook import CallSteering

LOGGER = logging.getLogger(__name__)


def hf_sampling_kwargs(generation_kwargs: dict) -> dict:
    """lm-eval's reading of generation kwargs (``HFLM._model_generate``): an absent temperature
    is 0, and temperature 0 means greedy."""
    kwargs = dict(generation_kwargs)
    kwargs["temperature"] = kwargs.get("temperature", 0.0)
    do_sample = kwargs.get("do_sample")
    if kwargs["temperature"] == 0.0 and do_sample is None:
        kwargs["do_sample"] = do_sample = False
    if do_sample is False and kwargs["temperature"] == 0.0:
        kwargs.pop("temperature")
    return kwargs


@dataclass
class BatchGeneration:
    """One batch's output: ``sequences`` [B, L + T] as ``generate`` returns them, each row's
    generated tokens (to its EOS or stop string), prompt tokens, its accounting, and why each
    row ended (the engine's ``finish_reason``; "" where ``generate`` decoded)."""

    sequences: torch.Tensor
    gen_tokens: list[int]
    prompt_tokens: list[int]
    accounts: CallAccounts
    reasons: list[str]


@dataclass(frozen=True)
class GenerationCall:
    """What one batch step needs of the model that makes it (built once per model, by
    ``PonderLM``): the backbone and its device, the decoding path (``generation``: ``loop`` or
    ``hf``) and the loop's batching, how a row is priced, the tokenizer's ends and texts, and
    the callbacks for transformers' ``generate`` (through HFLM) and for one-time warnings."""

    model: Any
    device: torch.device
    generation: str
    batching: Batching
    pricing: Pricing
    eos_token_id: int
    pad_token_id: int | None
    decode: Callable[[list[int]], str]
    answer: Callable[[list[int], list[str]], str]
    autocast_dtype: torch.dtype | None
    hf_generate: Callable[..., torch.Tensor]
    warn_once: Callable[[str], None]

    @property
    def loop_config(self) -> LoopConfig:
        """The engine's batching, read at each call (a benchmark may change ``batching``)."""
        return self.batching.loop_config(self.pricing.answer_stops)


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
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        steered = steering.set_up(call.model, call.device, input_ids.shape[0])
        accounts = CallAccounts(call.pricing, mask.sum(dim=1).tolist(), steered.rows)
        texts = None if on_text is None else Callbacks(on_tokens=lambda row, tokens, why: on_text(
            row, accounts.text(row, len(tokens), call.answer(tokens, stop), why)))
        kwargs = hf_sampling_kwargs(generation_kwargs)
        sampling = self.loop_sampling(kwargs)
        generate = self.loop if sampling is not None else self.generate
        with steered.hook or contextlib.nullcontext(), self.autocast():
            sequences, counts, reasons = generate(input_ids, mask, max_new_tokens, stop,
                                                  sampling or kwargs, [texts, steered.hook, *observers])
        return BatchGeneration(sequences, counts, accounts.prompt_tokens, accounts, reasons)

    def autocast(self) -> torch.autocast:
        call = self.call
        return torch.autocast(device_type=call.device.type, dtype=call.autocast_dtype,
                              enabled=call.autocast_dtype is not None)

    def loop_sampling(self, kwargs: dict) -> SamplingConfig | None:
        """The loop's sampling settings, or None (with one warning where the loop was asked
        for) where ``generate`` decodes: ``generation=hf``, or settings the loop cannot
        reproduce exactly."""
        call = self.call
        if call.generation != "loop":  # what generate would refuse deep inside, in one line
            with contextlib.suppress(UnsupportedGeneration):
                SamplingConfig.from_kwargs(call.model.generation_config, **kwargs)
            return None
        try:
            sampling = SamplingConfig.from_kwargs(call.model.generation_config, **kwargs)
            check_model_supported(call.model)
        except UnsupportedGeneration as why:
            if call.pricing.answer_stops:  # generate would not stop there
                names = ", ".join(r.reason for r in call.pricing.answer_stops)
                raise PonderError(f"an answer stop ({names}) needs the generation loop, and "
                                  f"{why}") from None
            call.warn_once(f"generation loop: {why}; using transformers' generate for these "
                           "requests (finished rows keep decoding)")
            return None
        return sampling

    def loop(self, input_ids, attention_mask, max_new_tokens: int, stop: list[str],
             sampling: SamplingConfig, observers: list) -> tuple[torch.Tensor, list[int], list[str]]:
        """The engine's generation: (sequences, generated tokens per row, why each ended)."""
        call = self.call
        result = generate_rows(
            call.model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
            eos_token_ids=set(sampling.eos_token_ids) or {call.eos_token_id},
            pad_token_id=call.pad_token_id, stop=stop, decode=call.decode,
            sampling=sampling, config=call.loop_config, observers=observers)
        return result.sequences, list(result.gen_tokens), list(result.finish_reason)

    def generate(self, input_ids, attention_mask, max_new_tokens: int, stop: list[str],
                 kwargs: dict, observers: list) -> tuple[torch.Tensor, list[int], list[str]]:
        """transformers' ``generate`` through HFLM's ``_model_generate``; each row counted to
        its EOS or stop string (the pad token is no end: the model may generate it), and
        handed to the observers once the call returns."""
        call = self.call
        width = input_ids.shape[1]
        sequences = call.hf_generate(input_ids, width + max_new_tokens, stop,
                                     attention_mask=attention_mask, **kwargs)
        eos_ids = {call.eos_token_id}
        for ids in (call.model.generation_config.eos_token_id, kwargs.get("eos_token_id")):
            eos_ids |= {ids} if isinstance(ids, int) else set(ids or ())
        generated = sequences[:, width:].tolist()
        counts = [count_generated_tokens(call.decode, row, stop, eos_ids) for row in generated]
        finishers = [o for o in observers if o is not None and hasattr(o, "row_finished")]
        for row, (tokens, count) in enumerate(zip(generated, counts)):
            for observer in finishers:
                observer.row_finished(row, tokens[:count])
        return sequences, counts, [""] * len(counts)

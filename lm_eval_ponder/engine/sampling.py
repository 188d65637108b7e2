"""How the generation loop chooses the next token: ``generate``'s settings, merged as
``generate`` merges them, and applied to the rows in flight only.

Kept apart from the loop because it is the one place that must agree with transformers token
for token: the same processor and warper classes in the same order, the repetition penalty over
each row's own history, EOS blocked until ``min_new_tokens``. Anything else raises
``UnsupportedGeneration`` and the caller uses ``generate`` instead.

Greedy decoding without processors (every greedy lm-eval task on a model whose generation config
adds nothing) takes the maximum of the logits in their own dtype (casting bf16 to float32 keeps
values and order), with no [rows, vocab] float32 copy per step, by ``first_max_index``: exactly
``argmax`` (the first index of a tie, a NaN as the maximum; tested). On a CPU torch's
index-returning reductions are not vectorised (256 rows of a 49,152-token vocabulary, one AMD
EPYC core: ``argmax`` 11 ms in float32 and 45 ms in bf16, ``max(dim=-1)`` 11 ms in both) while
numpy's ``argmax`` is (1.5 ms in float32). A non-negative bf16/fp16 float orders as its bits
read as a signed 16-bit integer and every negative float reads as negative, so numpy's integer
``argmax`` over the bits is the float ``argmax`` of every row whose maximum is positive and
finite; with the pass that finds negative NaNs the choice takes about 2 ms at 256 rows in the
loop, against 5.3 ms for ``amax`` then the first bit-equal element and 45 ms for torch's bf16
``argmax`` (``benchmarks/step_cost.py``). Elsewhere (CUDA) ``max(dim=-1).indices`` is one kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessor,
    MinPLogitsWarper,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from lm_eval_ponder.errors import PonderError, UnsupportedGeneration

# GenerationConfig attributes that do not change what a greedy/sampling decode produces here.
_IGNORED_FIELDS = frozenset({
    "max_length", "max_new_tokens",  # the caller passes max_new_tokens to generate_rows
    "eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id",
    "use_cache", "cache_config", "max_cache_len", "compile_config", "disable_compile",
    "continuous_batching_config", "low_memory", "early_stopping", "length_penalty",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind", "max_matching_ngram_size",
    "assistant_ensemble_weight", "speculation_type",
    # generate ignores these two for decoder-only models (no encoder input ids):
    "encoder_repetition_penalty", "encoder_no_repeat_ngram_size",
    "output_attentions", "output_hidden_states",  # forwarded to the model; only affect outputs
    "transformers_version", "_from_model_config", "_commit_hash", "_original_object_hash",
})
# Fields that SamplingConfig reproduces.
_HANDLED_FIELDS = frozenset({
    "do_sample", "num_beams", "temperature", "top_k", "top_p", "min_p", "top_h", "typical_p",
    "epsilon_cutoff", "eta_cutoff", "repetition_penalty", "min_new_tokens", "min_length",
    "suppress_tokens", "remove_invalid_values", "renormalize_logits", "num_return_sequences",
})
# Keyword arguments of generate() that are not GenerationConfig fields but are harmless here.
_IGNORED_KWARGS = frozenset({"attention_mask", "use_cache"})


@dataclass
class SamplingConfig:
    """How the next token is chosen, as ``generate`` would with the same merged settings."""

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    min_p: float | None = None
    top_h: float | None = None
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    min_new_tokens: int = 0
    min_length: int = 0  # generate's total-length minimum (prompt padding included)
    suppress_tokens: tuple[int, ...] | None = None
    remove_invalid_values: bool = False
    renormalize_logits: bool = False
    eos_token_ids: tuple[int, ...] = ()  # the merged config's EOS ids (what generate stops on)
    generator: torch.Generator | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_kwargs(cls, generation_config: GenerationConfig | None = None,
                    **gen_kwargs) -> "SamplingConfig":
        """Merge ``gen_kwargs`` over ``generation_config`` (normally ``model.generation_config``)
        and transformers' global defaults, in ``generate``'s priority order.

        ``generator=`` (a ``torch.Generator``) may be passed too; it is not an HF kwarg.
        Raises ``UnsupportedGeneration`` for anything the loop cannot honour exactly: beams,
        contrastive/assisted/constrained modes, n-gram and bad-word constraints, forced tokens,
        guidance, watermarking, static or other cache implementations, stop_strings,
        custom logits processors/stopping criteria, return_dict outputs, unknown kwargs.
        """
        gen_kwargs = dict(gen_kwargs)
        generator = gen_kwargs.pop("generator", None)
        for key in _IGNORED_KWARGS:
            gen_kwargs.pop(key, None)
        merged = merged_config(generation_config, gen_kwargs)
        check_supported(merged)
        temperature = merged.temperature if merged.temperature is not None else 1.0
        refused = refused_setting(merged, temperature)
        if refused is not None:
            raise PonderError(f"generation settings (--gen_kwargs over the model's generation "
                              f"config): {refused}")
        eos = merged.eos_token_id
        eos_ids = () if eos is None else tuple(int(e) for e in ([eos] if isinstance(eos, int)
                                                                 else eos))
        suppress = merged.suppress_tokens
        return cls(
            do_sample=bool(merged.do_sample),
            temperature=float(temperature),
            top_p=float(merged.top_p if merged.top_p is not None else 1.0),
            top_k=int(merged.top_k or 0),
            repetition_penalty=float(merged.repetition_penalty or 1.0),
            min_p=merged.min_p,
            top_h=merged.top_h,
            typical_p=float(merged.typical_p if merged.typical_p is not None else 1.0),
            epsilon_cutoff=float(merged.epsilon_cutoff or 0.0),
            eta_cutoff=float(merged.eta_cutoff or 0.0),
            min_new_tokens=int(merged.min_new_tokens or 0),
            min_length=int(merged.min_length or 0),
            suppress_tokens=None if suppress is None else tuple(int(t) for t in suppress),
            remove_invalid_values=bool(merged.remove_invalid_values),
            renormalize_logits=bool(merged.renormalize_logits),
            eos_token_ids=eos_ids,
            generator=generator,
        )

    def row_local_processors(self, device: torch.device) -> list[LogitsProcessor]:
        """transformers' processors/warpers that act on each row on its own, in ``generate``'s
        order. They come after the two that the loop applies itself, as in ``generate``: the
        repetition penalty (needs each row's history) and min_length/min_new_tokens EOS blocking
        (needs each row's count of generated tokens).
        """
        after: list[LogitsProcessor] = []
        if self.remove_invalid_values:
            after.append(InfNanRemoveLogitsProcessor())
        if self.suppress_tokens is not None:
            after.append(SuppressTokensLogitsProcessor(list(self.suppress_tokens), device=device))
        if self.do_sample:
            after += self.warpers(device)
        if self.renormalize_logits:
            after.append(LogitNormalization())
        return after

    def warpers(self, device: torch.device) -> list[LogitsProcessor]:
        """The sampling warpers ``generate`` builds for these settings, in its order."""
        wanted = [
            (self.temperature != 1.0, lambda: TemperatureLogitsWarper(self.temperature)),
            (self.top_h is not None, lambda: TopHLogitsWarper(top_h=self.top_h)),
            (self.top_k != 0, lambda: TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1)),
            (self.top_p < 1.0, lambda: TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1)),
            (self.min_p is not None,
             lambda: MinPLogitsWarper(min_p=self.min_p, min_tokens_to_keep=1)),
            (self.typical_p < 1.0,
             lambda: TypicalLogitsWarper(mass=self.typical_p, min_tokens_to_keep=1)),
            (0.0 < self.epsilon_cutoff < 1.0,
             lambda: EpsilonLogitsWarper(epsilon=self.epsilon_cutoff, min_tokens_to_keep=1)),
            (0.0 < self.eta_cutoff < 1.0,
             lambda: EtaLogitsWarper(epsilon=self.eta_cutoff, min_tokens_to_keep=1,
                                     device=device)),
        ]
        return [make() for wanted_here, make in wanted if wanted_here]


def merged_config(generation_config: GenerationConfig | None, gen_kwargs: dict) -> GenerationConfig:
    """``gen_kwargs`` over ``generation_config`` over transformers' global defaults, merged as
    ``generate`` merges them; anything ``generate`` would refuse to merge, or a kwarg it does
    not know, is ``UnsupportedGeneration``."""
    merged = GenerationConfig()
    try:
        if generation_config is not None:
            merged.update(**generation_config.to_dict(), defaults_only=True,
                          allow_custom_entries=True)
        merged.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
        unknown = merged.update(**gen_kwargs)
    except (ValueError, TypeError) as err:  # generate would raise the same; let it
        raise UnsupportedGeneration(f"invalid generation settings: {err}") from err
    if unknown:
        raise UnsupportedGeneration(f"generation kwargs not handled: {sorted(unknown)}")
    return merged


def check_supported(merged: GenerationConfig) -> None:
    """``UnsupportedGeneration`` unless the loop reproduces ``merged`` exactly: greedy or
    plain sampling of one sequence, with no setting the loop does not handle."""
    if (merged.num_beams or 1) > 1:
        raise UnsupportedGeneration(f"num_beams={merged.num_beams} (beam search)")
    if (merged.num_return_sequences or 1) > 1:
        raise UnsupportedGeneration(f"num_return_sequences={merged.num_return_sequences}")
    try:
        mode = str(merged.get_generation_mode())
    except Exception as err:  # noqa: BLE001 - any failure here means: let generate decide
        raise UnsupportedGeneration(f"generation mode: {err}") from err
    if mode not in ("greedy_search", "sample", "GenerationMode.GREEDY_SEARCH",
                    "GenerationMode.SAMPLE"):
        raise UnsupportedGeneration(f"generation mode {mode}")
    reference = merged_config(None, {}).to_dict()  # transformers' defaults alone
    for key, value in merged.to_dict().items():
        if key not in reference or key in _IGNORED_FIELDS or key in _HANDLED_FIELDS:
            continue  # custom entries (not GenerationConfig fields) are ignored by generate
        if key == "cache_implementation" and value in (None, "dynamic"):
            continue
        if value != reference.get(key) and not (value is None or value is False):
            raise UnsupportedGeneration(f"generation setting {key}={value!r}")


def refused_setting(merged: GenerationConfig, temperature: float) -> str | None:
    """What ``generate`` would refuse with a ``ValueError`` from deep inside a processor's
    constructor, said in the user's terms; None if nothing. Checked here so that the loop
    neither runs such a setting its own way (``repetition_penalty=0`` read as 1) nor hands it to
    ``generate`` for a traceback. Settings ``generate`` ignores (``top_p`` above 1, any warper
    while greedy) are ignored here too."""
    penalty = merged.repetition_penalty
    if penalty is not None and not penalty > 0:
        return f"repetition_penalty={penalty!r} must be > 0 (1 for none)"
    if not merged.do_sample:
        return None
    if not temperature > 0:
        return (f"do_sample=true with temperature={temperature!r}: sampling needs a temperature "
                f"> 0. do_sample=true may be the task's own (its YAML's generation_kwargs: the "
                f"*_bon tasks sample by definition) rather than yours; to decode greedily pass "
                f"--gen_kwargs do_sample=false, else a temperature > 0")
    if merged.top_k is not None and merged.top_k < 0:
        return f"top_k={merged.top_k!r} must be >= 0 (0 for none)"
    return None


# +inf's bit pattern per half-precision dtype: exponent all ones, mantissa 0.
_HALF_INFINITY_BITS = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}


def first_max_index(logits: torch.Tensor) -> torch.Tensor:
    """``argmax(logits, dim=-1)`` of [R, V] logits, exactly, by the fastest reduction on the
    tensor's device (module docstring): on a CPU, numpy's vectorised ``argmax`` over float32,
    and over bf16/fp16 the integer ``argmax`` of the bits. Bits order as values only among
    non-negative floats, so a row takes ``max`` itself where that reading can differ: its
    maximum is not positive (-0 equals +0; all-negative rows order backwards), it holds a NaN
    (``argmax`` takes the first NaN, whatever its sign), or the maximum is a NaN."""
    if logits.device.type != "cpu" or logits.dim() != 2 or not logits.is_contiguous():
        return logits.max(dim=-1).indices
    if logits.dtype == torch.float32:
        return torch.from_numpy(np.argmax(logits.detach().numpy(), axis=-1))
    if logits.dtype not in _HALF_INFINITY_BITS:
        return logits.max(dim=-1).indices
    infinity = _HALF_INFINITY_BITS[logits.dtype]
    bits = logits.detach().view(torch.int16).numpy()
    index = np.argmax(bits, axis=-1)
    top = bits[np.arange(len(index)), index]  # (take_along_axis costs 20x more here)
    # a negative NaN has the largest unsigned bits of all (above -inf's); a positive one, the
    # largest signed bits (above +inf's)
    odd = (top <= 0) | (top > infinity)
    odd |= bits.view(np.uint16).max(axis=-1) > (infinity | 0x8000)
    result = torch.from_numpy(index)
    if odd.any():  # numpy's test: no torch dispatch on the common path
        picked = torch.from_numpy(odd)
        result[picked] = logits[picked].max(dim=-1).indices
    return result


def penalise_repeats(scores: torch.Tensor, history: torch.LongTensor, penalty: float,
                     pad_cols: torch.LongTensor) -> torch.Tensor:
    """``generate``'s repetition penalty (``RepetitionPenaltyLogitsProcessor``: the logit of
    every token already in the row divided by ``penalty`` where positive, multiplied where
    negative), each row's history read from column ``pad_cols[i]`` on: its prompt padding is not
    history. The processor takes such a per-row start only since transformers 5.2x; 5.17 (the
    GPU image of 2026-11) raises on one, so the same arithmetic is done here for every release."""
    vocab = scores.shape[-1]
    columns = torch.arange(history.shape[1], device=history.device)
    # padding, and ids past the head's vocabulary, go to one extra column that is dropped
    ids = history.masked_fill(columns[None, :] < pad_cols[:, None], vocab).clamp(max=vocab)
    padded = torch.nn.functional.pad(scores, (0, 1))
    seen = padded.gather(1, ids)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return padded.scatter(1, ids, seen)[:, :vocab]


def draw_tokens(probs: torch.Tensor, generator: torch.Generator | None = None,
                expected_support: int | None = None) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] (non-negative, rows need not sum to 1).

    Why not ``torch.multinomial(probs, 1)`` alone: on CPU it draws one random number per
    vocabulary entry, 190 ms per step for 128 rows of SmolLM2's 49k vocabulary, a sixth of a
    sampled rollout build's time (a retired benchmark, ``docs/results/history.md``). After top-k
    (50 by default in most generation configs) nearly every entry is 0, and a draw among the
    positive ones has the same distribution. ``expected_support`` (the top-k) is checked, not
    trusted: bf16 logits tie often and top-k keeps every tie (SmolLM2: 51-65 entries at k = 50),
    so the draw is among the first 2k of the 2k+1 largest entries only where the last is 0 in
    every row. A seed reproduces this function's samples, not ``generate``'s.
    """
    vocab = probs.shape[-1]
    if expected_support is not None and 0 < 2 * expected_support < vocab:
        weights, index = probs.topk(2 * expected_support + 1, dim=-1)
        if not bool(weights[:, -1].any()):
            pick = torch.multinomial(weights[:, :-1], num_samples=1, generator=generator)
            return index.gather(1, pick).squeeze(1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


class TokenChooser:
    """The next token of every row in a decode forward, as ``generate`` would choose it.

    Device tensors only, no host sync. Rows that finished may still sit in the batch until the
    loop compacts it (``alive`` marks the others); they are neither processed nor sampled, so
    the random stream is the one the rows in flight alone draw, and their token is ``pad``.
    """

    def __init__(self, sampling: SamplingConfig, device: torch.device, eos_ids: list[int],
                 prompt_width: int) -> None:
        self.sampling = sampling
        self.processors = sampling.row_local_processors(device)
        self.penalty = sampling.repetition_penalty
        self.uses_history = self.penalty != 1.0
        # generate's min_length counts the padded prompt width; per row it is a min_new_tokens
        self.min_new = max(sampling.min_new_tokens, sampling.min_length - prompt_width)
        self.eos_t = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
        self.block_eos = self.min_new > 0 and len(eos_ids) > 0
        self.plain_greedy = not (sampling.do_sample or self.processors or self.uses_history
                                 or self.block_eos)
        # sampling with a temperature and a top-k only (lm-eval's do_sample + temperature on a
        # generation config's default top_k = 50): drawn from the model's top 2k+1 logits
        self.top_k_only = (sampling.do_sample and sampling.top_k > 0 and not self.uses_history
                           and not self.block_eos and all(
                               isinstance(p, (TemperatureLogitsWarper, TopKLogitsWarper))
                               for p in self.processors))

    def choose(self, logits: torch.Tensor, rows: "ChoiceRows", pad: int) -> torch.Tensor:
        """``logits`` [R, V] in the model's dtype -> tokens [R]."""
        if self.plain_greedy:  # exact: the first maximum, as argmax (module docstring)
            nxt = first_max_index(logits)
            return nxt if rows.alive_mask is None else torch.where(rows.alive_mask, nxt, pad)
        select = rows.alive_index
        counts, last, history, pad_cols = rows.counts, rows.last, rows.history, rows.history_pad
        if select is not None:  # the rows in flight only
            logits, counts, last = (t.index_select(0, select) for t in (logits, counts, last))
            if history is not None:
                history, pad_cols = history.index_select(0, select), pad_cols.index_select(0, select)
        chosen = self.draw_top_k(logits) if self.top_k_only else None
        if chosen is None:
            chosen = self.process_and_choose(logits, counts, last, history, pad_cols)
        if select is None:
            return chosen
        return torch.full_like(rows.last, pad).index_copy_(0, select, chosen)

    def process_and_choose(self, logits: torch.Tensor, counts: torch.Tensor, last: torch.Tensor,
                           history: torch.Tensor | None, pad_cols: torch.Tensor | None) -> torch.Tensor:
        """The full path, over every vocabulary entry of the rows in flight: a float32 copy,
        the penalty, EOS blocking and the processors in ``generate``'s order, then the choice."""
        scores = logits.to(copy=True, dtype=torch.float32)
        if self.uses_history:  # prompt padding is not history: ignore each row's pad columns
            scores = penalise_repeats(scores, history, self.penalty, pad_cols)
        if self.block_eos:
            young = counts < self.min_new
            is_eos = torch.isin(torch.arange(scores.shape[-1], device=scores.device), self.eos_t)
            scores = torch.where(young[:, None] & is_eos[None, :], -math.inf, scores)
        for proc in self.processors:
            scores = proc(history if history is not None else last[:, None], scores)
        if self.sampling.do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            return draw_tokens(probs, self.sampling.generator, self.sampling.top_k or None)
        return first_max_index(scores)

    def draw_top_k(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Temperature then top-k then a draw, as ``generate`` does them, from each row's 2k+1
        largest logits instead of the whole vocabulary (a float32 copy, four passes over it
        and two ``topk`` calls: 58 against 13.5 ms per step at 128 rows of bf16 logits on one
        CPU core; a retired benchmark, ``docs/results/history.md``). Exact in distribution:
        dividing by the temperature keeps the order, so every entry ``TopKLogitsWarper`` keeps
        (score >= the k-th largest, ties included) is among the candidates unless the (2k+1)-th
        ties with it, or a NaN is there: then None, and the caller takes the full path."""
        k, vocab = self.sampling.top_k, logits.shape[-1]
        if 2 * k + 1 >= vocab:
            return None
        values, index = logits.topk(2 * k + 1, dim=-1)
        scores = values.float()
        if self.sampling.temperature != 1.0:
            scores = scores / self.sampling.temperature  # TemperatureLogitsWarper's operation
        keep = scores >= scores[:, k - 1:k]
        if bool(keep[:, -1].any()) or bool(torch.isnan(scores).any()):
            return None
        probs = torch.softmax(scores.masked_fill(~keep, -math.inf)[:, :-1], dim=-1)
        pick = torch.multinomial(probs, num_samples=1, generator=self.sampling.generator)
        return index.gather(1, pick).squeeze(1)


@dataclass
class ChoiceRows:
    """What ``TokenChooser.choose`` reads of the rows in a forward, in batch order, on the
    device: ``alive_mask``/``alive_index`` are None when every row is in flight."""

    counts: torch.Tensor  # tokens generated so far
    last: torch.Tensor  # the token each row fed this step
    history: torch.Tensor | None  # left-padded token history (repetition penalty only)
    history_pad: torch.Tensor | None  # its leading pad columns per row
    alive_mask: torch.Tensor | None = None
    alive_index: torch.Tensor | None = None

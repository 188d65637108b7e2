"""A generation loop in which a finished row stops costing compute.

Why: lm-eval's HFLM calls ``model.generate`` on a left-padded batch with a batch-wide stopping
criterion, so every row keeps decoding until the longest row is done. On our arith workload
(SmolLM2-135M, bf16, batch 64, 256 new tokens) only 46% of the decoded slots are real output
(NOTES.md, "Generation speed"). ``generate_rows`` runs the same model forward passes with the
same ``DynamicCache`` that ``generate`` uses, but

- a row leaves the running batch as soon as it emits an EOS id, completes one of its stop strings
  (searched in its own decoded generated text, so a stop string split across tokens is caught)
  or reaches ``max_new_tokens``; its key/value rows are dropped from the cache
  (``DynamicCache.batch_select_indices``) and cache columns that became padding for every
  remaining row are trimmed;
- with ``max_rows`` smaller than the batch, waiting rows are prefilled as a left-padded group
  and join the running batch when enough slots are free (continuous batching): the two caches
  are aligned by left-padding keys/values and the attention mask with zeros, then concatenated
  along the batch;
- a group whose prompts differ more than twofold is prefilled in parts (``prefill_parts``),
  so short prompts are not padded to a long one's length in the prefill forward;
- with ``max_cache_tokens``, rows in flight times the widest row's prompt plus
  ``max_new_tokens`` stay within that many cache positions. Rows share one cache width, so one
  long prompt widens every row's cache to its length: GPQA's longest question (2,899 tokens,
  against a median of 168) took a 128-row batch past 13 GiB on a 135M model, and the kernel
  killed the run. ``cache_bytes_per_token`` turns a memory budget into positions.

Positions are explicit (``attention_mask.cumsum(-1) - 1`` as ``generate`` computes them, then
"real tokens so far" per row), logits are processed with transformers' own processor/warper
classes in ``generate``'s order, and settings are merged over ``model.generation_config`` the way
``generate`` merges them, so greedy outputs match ``generate`` token for token (tests check this
in fp32). Anything the loop cannot reproduce exactly raises ``UnsupportedGeneration`` before any
forward pass; the caller then uses ``model.generate``.

Integration with HFLM's ``_model_generate(context, max_length, stop, **kwargs)``::

    cfg = SamplingConfig.from_kwargs(model.generation_config, **kwargs_without_attention_mask)
    result = generate_rows(model, context, attention_mask, max_new_tokens=max_length - L,
                           eos_token_ids=set(cfg.eos_token_ids), pad_token_id=tok.pad_token_id,
                           stop=stop, decode=self.tok_decode, sampling=cfg)
    return result.sequences

Pass ``decode=self.tok_decode`` (skip_special_tokens=True): it is what HFLM cuts the final text
with and what ``evaluation.accounting.count_generated_tokens`` counts with, so the text after HFLM's cut and
the token counts agree with the ``generate`` path.
"""

from __future__ import annotations

import inspect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch
from transformers import DynamicCache, GenerationConfig, GenerationMixin
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

__all__ = [
    "GenerationResult",
    "cache_bytes_per_token",
    "prefill_parts",
    "RowObserver",
    "SamplingConfig",
    "UnsupportedGeneration",
    "check_model_supported",
    "generate_rows",
]

FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


class UnsupportedGeneration(Exception):
    """The loop cannot reproduce ``model.generate`` exactly for this model or these settings.

    Raised before any forward pass; the caller should fall back to ``model.generate``.
    """


@runtime_checkable
class RowObserver(Protocol):
    """Told which requests are in each forward pass, so per-row state stays attached to them."""

    def begin_forward(self, rows: torch.LongTensor, prefill: bool) -> None:
        """``rows``: original row indices (0..B-1) of the rows in the coming forward, in batch
        order, on the model's device. ``prefill``: the forward processes a group's prompts."""


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

        if (merged.num_beams or 1) > 1:
            raise UnsupportedGeneration(f"num_beams={merged.num_beams} (beam search)")
        if (merged.num_return_sequences or 1) > 1:
            raise UnsupportedGeneration(
                f"num_return_sequences={merged.num_return_sequences}")
        try:
            mode = str(merged.get_generation_mode())
        except Exception as err:  # noqa: BLE001 - any failure here means: let generate decide
            raise UnsupportedGeneration(f"generation mode: {err}") from err
        if mode not in ("greedy_search", "sample", "GenerationMode.GREEDY_SEARCH",
                        "GenerationMode.SAMPLE"):
            raise UnsupportedGeneration(f"generation mode {mode}")

        baseline = GenerationConfig()
        baseline.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
        reference = baseline.to_dict()
        for key, value in merged.to_dict().items():
            if key not in reference or key in _IGNORED_FIELDS or key in _HANDLED_FIELDS:
                continue  # custom entries (not GenerationConfig fields) are ignored by generate
            if key == "cache_implementation" and value in (None, "dynamic"):
                continue
            if value != reference.get(key) and not (value is None or value is False):
                raise UnsupportedGeneration(f"generation setting {key}={value!r}")

        temperature = merged.temperature if merged.temperature is not None else 1.0
        if merged.do_sample and not temperature > 0:
            raise UnsupportedGeneration(f"do_sample with temperature={temperature}")
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
            if self.temperature != 1.0:
                after.append(TemperatureLogitsWarper(self.temperature))
            if self.top_h is not None:
                after.append(TopHLogitsWarper(top_h=self.top_h))
            if self.top_k != 0:
                after.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
            if self.top_p < 1.0:
                after.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
            if self.min_p is not None:
                after.append(MinPLogitsWarper(min_p=self.min_p, min_tokens_to_keep=1))
            if self.typical_p < 1.0:
                after.append(TypicalLogitsWarper(mass=self.typical_p, min_tokens_to_keep=1))
            if 0.0 < self.epsilon_cutoff < 1.0:
                after.append(EpsilonLogitsWarper(epsilon=self.epsilon_cutoff, min_tokens_to_keep=1))
            if 0.0 < self.eta_cutoff < 1.0:
                after.append(EtaLogitsWarper(epsilon=self.eta_cutoff, min_tokens_to_keep=1,
                                             device=device))
        if self.renormalize_logits:
            after.append(LogitNormalization())
        return after


@dataclass
class GenerationResult:
    """``sequences``: [B, L + T], context then generated tokens, ``pad_token_id`` after each
    row's end (the form ``generate`` returns). ``gen_tokens``: each row's generated tokens up to
    and including its EOS or the token completing a stop string. ``finish_reason``: "eos",
    "stop" or "length" per row. The counters describe the work done."""

    sequences: torch.LongTensor
    gen_tokens: list[int]
    finish_reason: list[str]
    prefill_forwards: int = 0
    decode_forwards: int = 0
    decode_row_slots: int = 0  # sum over decode forwards of the rows in the batch
    joins: int = 0


def cache_bytes_per_token(config, dtype: torch.dtype) -> int | None:
    """Bytes of key/value cache one token position takes across all layers (a full-attention
    cache of ``num_key_value_heads`` x ``head_dim`` per layer; None when the config does not
    say). An upper bound for sliding-window and hybrid models, which keep less."""
    config = _decoder_config(config)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // heads if heads and getattr(config, "hidden_size", None) else None)
    if not (layers and kv_heads and head_dim):
        return None
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * torch.empty((), dtype=dtype).element_size()


def prefill_parts(rows: list[int], lengths: Sequence[int]) -> list[list[int]]:
    """Split a group of rows joining at once into prefill forwards in which no prompt is
    shorter than half the longest. A prefill pads every row to its longest: GPQA's first group
    holds its 2,899-token question beside rows of 300-800, and one forward of that group spent
    most of its compute on padding. A group within a factor of 2 stays one forward, in its
    order (arith and GSM8K groups: their batches are unchanged)."""
    lens = [int(lengths[r]) for r in rows]
    if not rows or max(lens) <= 2 * max(min(lens), 1):
        return [list(rows)]
    parts: list[list[int]] = []
    for r in sorted(rows, key=lambda r: -int(lengths[r])):
        if parts and 2 * int(lengths[r]) >= int(lengths[parts[-1][0]]):
            parts[-1].append(r)
        else:
            parts.append([r])
    return parts


def _decoder_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _text_config(model):
    return _decoder_config(model.config)


def cache_keyword(model) -> str:
    """The name under which ``model.forward`` takes the KV cache: ``cache`` from transformers
    5.24 on (``past_key_values`` is deprecated there, removed in 5.40), ``past_key_values``
    before. Passing the current name keeps the deprecation shim and its warning out of every
    decode step."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise UnsupportedGeneration(f"{type(model).__name__}.forward takes no KV cache argument "
                                "(neither cache nor past_key_values)")


def check_model_supported(model) -> None:
    """Raise ``UnsupportedGeneration`` unless ``model`` is a decoder-only LM whose generation
    cache is a ``DynamicCache`` of plain full-attention ``DynamicLayer``s and whose forward
    takes ``attention_mask`` and ``position_ids``."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedGeneration("encoder-decoder model")
    supports_dynamic = getattr(model, "_supports_default_dynamic_cache", None)
    if supports_dynamic is None or not supports_dynamic():
        raise UnsupportedGeneration(f"{type(model).__name__} does not use a DynamicCache")
    if getattr(model, "is_remote_code", lambda: False)():
        raise UnsupportedGeneration("remote-code model (its forward may expect cache_position)")
    prepare = getattr(type(model), "prepare_inputs_for_generation", None)
    if prepare is not GenerationMixin.prepare_inputs_for_generation:
        raise UnsupportedGeneration(
            f"{type(model).__name__} overrides prepare_inputs_for_generation")
    params = inspect.signature(model.forward).parameters
    for name in ("attention_mask", "position_ids"):
        if name not in params:
            raise UnsupportedGeneration(f"{type(model).__name__}.forward takes no {name}")
    cache_keyword(model)
    cache = DynamicCache(config=_text_config(model))
    kinds = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if kinds:
        raise UnsupportedGeneration(f"cache layers other than full attention: {sorted(kinds)}")


def _supports_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


class _StopMatcher:
    """Per-row stop-string search on the row's decoded generated text.

    Each step decodes only a window of the row's last tokens (4 tokens per stop character plus
    4 covers tokens that decode to nothing alone, e.g. byte-fallback pieces, and a first token
    whose leading space a tokenizer strips). A hit in the window is confirmed on the full
    decoded text, so a row never stops before a stop string is complete in its own text.
    """

    def __init__(self, stop: Sequence[str] | None, decode: Callable[[list[int]], str] | None):
        self.stops = [s for s in (stop or []) if s]
        if self.stops and decode is None:
            raise ValueError("stop strings need a decode callable (list[int] -> str)")
        self.decode = decode
        self.window = max((4 * len(s) + 4 for s in self.stops), default=0)

    def __bool__(self) -> bool:
        return bool(self.stops)

    def hit(self, tokens: list[int]) -> bool:
        assert self.decode is not None
        tail = self.decode(tokens[-self.window:])
        if not any(s in tail for s in self.stops):
            return False
        text = tail if len(tokens) <= self.window else self.decode(tokens)
        return any(s in text for s in self.stops)


@dataclass
class _Batch:
    """The rows in flight. Cache, ``lead`` (leading padding columns per row in the cache),
    ``hist`` (left-padded token history for the repetition penalty) and ``last`` (the token each
    row feeds next) are all in batch order; ``rows`` holds their original indices. ``lead`` and
    ``rows`` are kept on the host and mirrored on the device (``lead_t``, ``rows_t``), refreshed
    only when the batch changes, so a decode step copies nothing host-to-device."""

    cache: DynamicCache
    rows: list[int]
    lead: list[int]
    length: int  # cache sequence length (columns)
    last: torch.LongTensor  # [R]
    hist: torch.LongTensor | None
    hist_lead: list[int] | None
    lead_t: torch.LongTensor | None = None
    rows_t: torch.LongTensor | None = None
    hist_lead_t: torch.LongTensor | None = None

    def refresh(self, device: torch.device) -> None:
        self.lead_t = torch.tensor(self.lead, dtype=torch.long, device=device)
        self.rows_t = torch.tensor(self.rows, dtype=torch.long, device=device)
        if self.hist_lead is not None:
            self.hist_lead_t = torch.tensor(self.hist_lead, dtype=torch.long, device=device)


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    return list(cache.layers)


def _select_rows(batch: _Batch, keep: list[int], device: torch.device) -> None:
    index = torch.tensor(keep, dtype=torch.long, device=device)
    batch.cache.batch_select_indices(index)
    batch.rows = [batch.rows[i] for i in keep]
    batch.lead = [batch.lead[i] for i in keep]
    batch.last = batch.last.index_select(0, index)
    if batch.hist is not None:
        batch.hist = batch.hist.index_select(0, index)
        batch.hist_lead = [batch.hist_lead[i] for i in keep]
    _trim(batch)
    batch.refresh(device)


def _trim(batch: _Batch) -> None:
    """Drop leading cache columns that are padding for every running row."""
    if not batch.rows:
        return
    cut = min(batch.lead)
    if cut > 0:
        for layer in _layers(batch.cache):
            if layer.is_initialized and layer.keys.numel():
                layer.keys = layer.keys[:, :, cut:, :]
                layer.values = layer.values[:, :, cut:, :]
        batch.lead = [p - cut for p in batch.lead]
        batch.length -= cut
    if batch.hist is not None:
        hcut = min(batch.hist_lead)
        if hcut > 0:
            batch.hist = batch.hist[:, hcut:]
            batch.hist_lead = [p - hcut for p in batch.hist_lead]


def _left_pad(x: torch.Tensor, n: int, dim: int, value: int | float = 0) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_full(shape, value), x], dim=dim)


def _merge(batch: _Batch, group: _Batch, pad_token_id: int) -> None:
    """Append ``group``'s rows to ``batch``: align cache lengths by left-padding K/V with zeros
    (those columns are masked: their ``lead`` grows), then concatenate along the batch."""
    length = max(batch.length, group.length)
    da, db = length - batch.length, length - group.length
    for la, lb in zip(_layers(batch.cache), _layers(group.cache), strict=True):
        la.keys = torch.cat([_left_pad(la.keys, da, 2), _left_pad(lb.keys, db, 2)], dim=0)
        la.values = torch.cat([_left_pad(la.values, da, 2), _left_pad(lb.values, db, 2)], dim=0)
    batch.rows += group.rows
    batch.lead = [p + da for p in batch.lead] + [p + db for p in group.lead]
    batch.length = length
    batch.last = torch.cat([batch.last, group.last])
    if batch.hist is not None and group.hist is not None:
        ha, hb = batch.hist.shape[1], group.hist.shape[1]
        width = max(ha, hb)
        batch.hist = torch.cat([_left_pad(batch.hist, width - ha, 1, pad_token_id),
                                _left_pad(group.hist, width - hb, 1, pad_token_id)], dim=0)
        batch.hist_lead = ([p + width - ha for p in batch.hist_lead]
                           + [p + width - hb for p in group.hist_lead])


def _mask_from_lead(lead_t: torch.LongTensor, width: int) -> torch.Tensor:
    """Left-padded 2D attention mask: row i attends to columns >= lead_t[i]."""
    return (torch.arange(width, device=lead_t.device)[None, :] >= lead_t[:, None]).long()


def draw_tokens(probs: torch.Tensor, generator: torch.Generator | None = None,
                expected_support: int | None = None) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] (non-negative, rows need not sum to 1).

    Why not ``torch.multinomial(probs, 1)`` alone: on CPU it draws one random number per
    vocabulary entry, 190 ms per step for 128 rows of SmolLM2's 49k vocabulary, a sixth of a
    sampled rollout build's time. After top-k (on by default in most generation configs: 50)
    nearly every entry is exactly 0, and a draw among the positive entries has the same
    distribution. ``expected_support`` (the top-k) is a hint, checked rather than trusted: bf16
    logits tie often, and top-k keeps every tie at the k-th value (SmolLM2: 51-65 entries at
    k = 50). So the 2k+1 largest entries are taken, and only if the last is 0 in every row is
    the draw made among the first 2k; otherwise it is the full draw.
    ``benchmarks/sampling_draw.py`` measures it. The random stream differs from a
    full-vocabulary draw: a seed reproduces this function's samples, not ``generate``'s.
    """
    vocab = probs.shape[-1]
    if expected_support is not None and 0 < 2 * expected_support < vocab:
        weights, index = probs.topk(2 * expected_support + 1, dim=-1)
        if not bool(weights[:, -1].any()):
            pick = torch.multinomial(weights[:, :-1], num_samples=1, generator=generator)
            return index.gather(1, pick).squeeze(1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def generate_rows(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None,
    *,
    max_new_tokens: int,
    eos_token_ids: set[int],
    pad_token_id: int,
    stop: list[str] | None = None,
    decode: Callable[[list[int]], str] | None = None,
    sampling: SamplingConfig | None = None,
    max_rows: int | None = None,
    max_cache_tokens: int | None = None,
    steering: RowObserver | None = None,
    admit_fraction: float = 0.5,
    on_finish: Callable[[int], None] | None = None,
) -> GenerationResult:
    """Generate for a left-padded batch, dropping each row from the batch as soon as it ends.

    ``input_ids``/``attention_mask``: [B, L], left-padded, as HFLM passes them to
    ``_model_generate``. ``max_rows``: at most this many rows in flight; waiting rows join the
    running batch (prefilled as a group) once at least ``admit_fraction * max_rows`` slots are
    free (or all remaining waiting rows fit). ``max_cache_tokens``: a row joins only while the
    rows in flight times (the longest prompt among them + ``max_new_tokens``), the cache's
    widest extent, stays within it (one row always runs). ``steering.begin_forward`` is called
    before every forward with the original indices of the rows in it; ``on_finish`` with a row's
    original index as soon as it ends (progress bars).
    """
    if pad_token_id is None:
        raise ValueError("pad_token_id is required")
    sampling = sampling or SamplingConfig()
    check_model_supported(model)
    matcher = _StopMatcher(stop, decode)
    device = model.device if hasattr(model, "device") else input_ids.device
    input_ids = input_ids.to(device)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(device)
    n_rows, width = input_ids.shape
    max_rows = n_rows if max_rows is None else max(1, int(max_rows))
    admit_at = max(1, math.ceil(admit_fraction * max_rows))

    eos_list = sorted(int(e) for e in eos_token_ids)
    eos_t = torch.tensor(eos_list, dtype=torch.long, device=device)
    # generate's min_length counts the padded prompt width; per row it is a min_new_tokens.
    min_new = max(sampling.min_new_tokens, sampling.min_length - width)
    processors = sampling.row_local_processors(device)
    penalty = sampling.repetition_penalty
    use_hist = penalty != 1.0
    keep_logits = {"logits_to_keep": 1} if _supports_logits_to_keep(model) else {}
    cache_arg = cache_keyword(model)
    text_config = _text_config(model)

    # Host-side per-row state (original row index -> ...).
    real_len = attention_mask.sum(dim=1).tolist()
    generated: list[list[int]] = [[] for _ in range(n_rows)]
    reason: list[str] = [FINISH_LENGTH] * n_rows
    result = GenerationResult(input_ids, [0] * n_rows, reason)

    def choose(logits: torch.Tensor, batch: _Batch) -> list[int]:
        """Next token per row of ``batch`` from its float32 last-position logits. Returns the
        tokens as a Python list: the one host sync per step, needed to decide who finished."""
        scores = logits
        if use_hist:  # prompt padding is not history: ignore each row's leading pad columns
            scores = RepetitionPenaltyLogitsProcessor(
                penalty, prompt_ignore_length=batch.hist_lead_t)(batch.hist, scores)
        if min_new > 0 and eos_list:
            counts = [len(generated[r]) for r in batch.rows]
            if min(counts) < min_new:
                young = torch.tensor([c < min_new for c in counts], device=device)
                is_eos = torch.isin(torch.arange(scores.shape[-1], device=device), eos_t)
                scores = torch.where(young[:, None] & is_eos[None, :], -math.inf, scores)
        for proc in processors:
            scores = proc(batch.hist if batch.hist is not None else batch.last[:, None], scores)
        if sampling.do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            nxt = draw_tokens(probs, sampling.generator, sampling.top_k or None)
        else:
            nxt = torch.argmax(scores, dim=-1)
        del scores
        batch.last = nxt
        if batch.hist is not None:
            batch.hist = torch.cat([batch.hist, nxt[:, None]], dim=1)
        return nxt.tolist()

    def record(batch: _Batch, tokens: list[int]) -> list[int]:
        """Append each row's token; return batch positions of rows still running."""
        keep = []
        for i, (row, tok) in enumerate(zip(batch.rows, tokens)):
            gen = generated[row]
            gen.append(tok)
            if tok in eos_token_ids:
                reason[row] = FINISH_EOS
            elif matcher and matcher.hit(gen):
                reason[row] = FINISH_STOP
            elif len(gen) >= max_new_tokens:
                reason[row] = FINISH_LENGTH
            else:
                keep.append(i)
                continue
            if on_finish is not None:
                on_finish(row)
        return keep

    def prefill(rows: list[int]) -> _Batch:
        index = torch.tensor(rows, dtype=torch.long, device=device)
        lens = [int(real_len[r]) for r in rows]
        span = max(max(lens), 1)
        ids = input_ids.index_select(0, index)[:, width - span:]
        mask = attention_mask.index_select(0, index)[:, width - span:]
        # The group's own padding beyond its longest row is stripped; rows of a left-padded
        # batch have their real tokens at the right end, so the cut keeps all of them.
        position_ids = mask.long().cumsum(-1) - 1
        position_ids = position_ids.masked_fill(mask == 0, 0)
        cache = DynamicCache(config=text_config)
        if steering is not None:
            steering.begin_forward(index, True)
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                    **{cache_arg: cache}, use_cache=True, return_dict=True, **keep_logits)
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        del out
        result.prefill_forwards += 1
        lead = [span - n for n in lens]
        hist = ids.clone() if use_hist else None
        batch = _Batch(cache, list(rows), lead, span, ids[:, -1], hist,
                       list(lead) if use_hist else None)
        batch.refresh(device)
        tokens = choose(logits, batch)
        del logits
        keep = record(batch, tokens)
        if len(keep) < len(batch.rows):
            _select_rows(batch, keep, device)
        return batch

    if max_new_tokens <= 0 or n_rows == 0:
        return result

    def admissible(in_flight: int, n: int) -> int:
        """How many of the next ``n`` waiting rows fit ``max_cache_tokens`` beside the rows in
        flight (at least one when none is in flight)."""
        if max_cache_tokens is None:
            return n
        widest = max((int(real_len[r]) for r in running.rows), default=0) if in_flight else 0
        k = 0
        while k < n:
            widest = max(widest, int(real_len[waiting[k]]))
            if (in_flight + k + 1) * (widest + max_new_tokens) > max_cache_tokens:
                break
            k += 1
        return max(k, 1) if in_flight == 0 else k

    waiting = deque(range(n_rows))
    running: _Batch | None = None
    with torch.no_grad():
        while waiting or (running is not None and running.rows):
            in_flight = 0 if running is None else len(running.rows)
            free = max_rows - in_flight
            admit = 0
            if waiting and free > 0 and (in_flight == 0 or free >= min(admit_at, len(waiting))):
                admit = admissible(in_flight, min(free, len(waiting)))
            if admit:
                group = [waiting.popleft() for _ in range(admit)]
                for part in prefill_parts(group, real_len):
                    joined = prefill(part)
                    if running is None or not running.rows:
                        running = joined
                    elif joined.rows:
                        _merge(running, joined, pad_token_id)
                        running.refresh(device)
                        result.joins += 1
                continue  # re-check admission (the group may have finished at once)
            assert running is not None
            # One decode step for every running row.
            width_now = running.length + 1
            mask = _mask_from_lead(running.lead_t, width_now)
            # The new token's position is the row's count of real tokens already cached.
            position_ids = (running.length - running.lead_t)[:, None]
            if steering is not None:
                steering.begin_forward(running.rows_t, False)
            out = model(input_ids=running.last[:, None], attention_mask=mask,
                        position_ids=position_ids, **{cache_arg: running.cache},
                        use_cache=True, return_dict=True, **keep_logits)
            logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
            del out
            running.length = width_now
            result.decode_forwards += 1
            result.decode_row_slots += len(running.rows)
            tokens = choose(logits, running)
            del logits
            keep = record(running, tokens)
            if len(keep) < len(running.rows):
                _select_rows(running, keep, device)

    steps = max(len(g) for g in generated)
    out_ids = torch.full((n_rows, width + steps), pad_token_id, dtype=input_ids.dtype,
                         device=device)
    out_ids[:, :width] = input_ids
    if steps:
        padded = [g + [pad_token_id] * (steps - len(g)) for g in generated]
        out_ids[:, width:] = torch.tensor(padded, dtype=input_ids.dtype, device=device)
    result.sequences = out_ids
    result.gen_tokens = [len(g) for g in generated]
    return result

"""Analytic FLOPs accounting from a Hugging Face model's shape; no tracing.

FR-Ponder reports accuracy against compute, so every run must price its forward passes the
same way whatever the model. Counting from the shape (not by tracing) keeps the numbers cheap,
deterministic and comparable across machines. The shape comes from a table of checked decoder
families (``DecoderShape.from_config``), or, for a family the table does not know, from the
loaded model's linear layers (``FlopsSpec.from_model``, with a warning). Conventions, used
everywhere below:

* one multiply-add is 2 FLOPs; a ``(n, i) @ (i, o)`` matmul costs ``2 * n * i * o``;
* only matmuls are counted in the decoder: norms, activations, biases, rotary embeddings and
  softmax are ignored (they are O(hidden) per token, negligible next to O(hidden^2)); the
  embedding lookup is free (a gather, not a matmul);
* attention is causal: new token ``i`` (0-based) of a pass attends to ``n_past + i + 1``
  positions. HF's *eager* kernel actually computes the full ``n_new x (n_past + n_new)`` score
  matrix and masks it afterwards, so a tracer sees a little more in prefill; we count the work
  a causal kernel needs, which is what the paper's comparison is about;
* sliding-window attention (Mistral, Gemma 2/3) is ignored, so the count is an upper bound for
  contexts longer than the window;
* the LM head is priced for the positions whose logits are computed. A bare HF ``forward``
  computes them at every position (``logits_to_keep=0``); generation passes
  ``logits_to_keep=1`` wherever the model's ``forward`` takes it (transformers' ``generate``
  and our loop alike), so a prefill of P tokens runs the LM head once, not P times. Pricing
  all P positions, as this module once did, overstated a 60-token prompt's 8-token
  answer on the embedded model by x1.24 against ``FlopCounterMode`` over the real ``generate``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lm_eval_ponder.backbone import text_config
from lm_eval_ponder.errors import PonderError

LOGGER = logging.getLogger(__name__)

# Llama-like decoders: q/k/v/o projections and a gated MLP (gate, up, down). Phi-3 fuses q/k/v
# and gate/up into single matrices, which is the same multiply-adds. OLMo 2 and Gemma 3 add
# q/k norms and Gemma 2/3 soft-capping: elementwise, not counted.
_GATED_TYPES = frozenset({
    "llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "olmo",
    "olmo2",
})
# Classic decoders: q/k/v/o projections and a two-matrix MLP (up, down).
_UNGATED_TYPES = frozenset({"gpt2", "gpt_neox"})
_TABULATED = _GATED_TYPES | _UNGATED_TYPES  # the families ``DecoderShape.from_config`` knows
# Config fields that mark a mixture of experts: a token runs through only the routed experts,
# which the stored weight shapes do not show, so the module-shape estimate would be wrong.
_MOE_FIELDS = ("num_experts_per_tok", "num_local_experts", "num_experts", "n_routed_experts")

# How every FLOPs figure is priced; results JSONs carry it (``PonderLM``'s model
# info as ``ponder_flops_pricing``, a re-priced older log as its top-level ``flops_pricing``)
FLOPS_PRICING = "prefill logits at the last position only (logits_to_keep=1; issue 52)"
# Controller elementwise costs, per element. LayerNorm: mean (1), subtract (1), square and
# accumulate (2), normalise (1); the affine scale and shift are folded into the 5 as well as
# the rsqrt, which is per row. GELU (tanh form): x^3, two multiplies, add, tanh, add, two
# multiplies, rounded to 8. Both are tiny next to the matmuls; they exist so the count is honest.
LAYERNORM_FLOPS_PER_ELEMENT = 5
GELU_FLOPS_PER_ELEMENT = 8


@dataclass(frozen=True)
class DecoderShape:
    """The shape numbers of a decoder family in the table, as its config spells them."""

    n_layers: int
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    gated_mlp: bool
    tied_embeddings: bool

    @classmethod
    def from_config(cls, config: Any) -> DecoderShape:
        """Read the shape from a ``transformers.PretrainedConfig``; refuse families we have not checked.

        Refusing is deliberate here: the table only holds families whose count was checked
        against a tracer; ``FlopsSpec.from_model`` is where unknown families get an estimate.
        """
        config = text_config(config)
        model_type = getattr(config, "model_type", None)
        if model_type == "gpt2":
            n_layers, hidden, n_heads = config.n_layer, config.n_embd, config.n_head
            intermediate = config.n_inner or 4 * config.n_embd
        elif model_type in _TABULATED:
            n_layers, hidden = config.num_hidden_layers, config.hidden_size
            n_heads, intermediate = config.num_attention_heads, config.intermediate_size
        else:
            supported = ", ".join(sorted(_TABULATED))
            raise PonderError(
                f"FLOPs accounting does not support model_type {model_type!r}; "
                f"supported model types: {supported}."
            )
        return cls(
            n_layers=int(n_layers),
            hidden=int(hidden),
            intermediate=int(intermediate),
            n_heads=int(n_heads),
            n_kv_heads=int(getattr(config, "num_key_value_heads", None) or n_heads),
            head_dim=config_head_dim(config, hidden, n_heads),
            vocab=int(config.vocab_size),
            gated_mlp=model_type in _GATED_TYPES,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )


@dataclass(frozen=True)
class FlopsSpec:
    """What a decoder's per-token compute depends on: its matmul weights, attention, LM head.

    ``decoder_params`` is the ``N`` of the usual ``2 * N`` FLOPs-per-token rule: weights of the
    decoder matmuls every token passes through (no embeddings, head, norms or biases).
    ``kv_dim`` is the width of one layer's key (and of its value) projection, key/value heads
    times head size: what an early exit still computes in the layers it skips.
    """

    n_layers: int
    n_heads: int
    head_dim: int
    hidden: int
    vocab: int
    decoder_params: int
    kv_dim: int

    @classmethod
    def from_config(cls, config: Any) -> FlopsSpec:
        """The count for a family in the table; refuses others (the config alone cannot tell).
        Its decoder matmuls: q/o, k/v (grouped-query) and the MLP of every layer."""
        shape = DecoderShape.from_config(config)
        q_and_o = 2 * shape.hidden * shape.n_heads * shape.head_dim
        k_and_v = 2 * shape.hidden * shape.n_kv_heads * shape.head_dim
        mlp = (3 if shape.gated_mlp else 2) * shape.hidden * shape.intermediate
        return cls(n_layers=shape.n_layers, n_heads=shape.n_heads, head_dim=shape.head_dim,
                   hidden=shape.hidden, vocab=shape.vocab,
                   decoder_params=shape.n_layers * (q_and_o + k_and_v + mlp),
                   kv_dim=shape.n_kv_heads * shape.head_dim)

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> FlopsSpec:
        """The table's count when it knows the family, else an estimate from the loaded modules.

        An unknown family is estimated rather than refused so any decoder can be evaluated; the
        one warning says the number is an estimate, since no tracer has checked that family.
        """
        config = model.config
        if getattr(text_config(config), "model_type", None) in _TABULATED:
            return cls.from_config(config)
        spec = spec_from_modules(model)
        LOGGER.warning(
            "FLOPs for model_type %r are estimated from module shapes (linear layers of the "
            "decoder + attention + LM head); this family is not in the checked FLOPs table.",
            getattr(text_config(config), "model_type", None),
        )
        return spec


def config_head_dim(config: Any, hidden: int, n_heads: int) -> int:
    """An explicit ``head_dim`` (Gemma, Qwen 3) wins over ``hidden / n_heads``."""
    return int(getattr(config, "head_dim", None) or hidden // n_heads)


def linear_weights(module: torch.nn.Module) -> int:
    """``in * out`` summed over the dense layers inside ``module`` (nn.Linear and GPT-2's Conv1D).

    Read from ``in_features``/``out_features`` and ``nf``, not from ``weight.numel()``, so
    quantised layers that pack their weights still count the matmul they compute.
    """
    from transformers.pytorch_utils import Conv1D  # only needed once a model is loaded

    total = 0
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            total += layer.in_features * layer.out_features
        elif isinstance(layer, Conv1D):
            total += layer.weight.shape[0] * layer.nf
    return total


def spec_from_modules(model: torch.nn.Module) -> FlopsSpec:
    """Estimate the cost inputs of any decoder from its loaded modules plus its config.

    The config alone cannot say how many matmuls a layer of an unknown family has, but its
    linear layers can: every dense layer of the decoder runs once per token. The LM head's
    shape gives hidden size and vocabulary; attention needs layers, heads and head size, which
    only the config has. Refused where these rules do not hold: a mixture of experts (a token
    uses only the routed experts' weights) and a config without attention heads (no attention
    to price, e.g. state-space models).
    """
    config = text_config(model.config)
    model_type = getattr(config, "model_type", None)
    if any(getattr(config, field, None) for field in _MOE_FIELDS):
        raise PonderError(
            f"FLOPs accounting cannot estimate model_type {model_type!r}: it is a mixture of "
            "experts, whose per-token weights depend on routing, not on module shapes."
        )
    n_heads = getattr(config, "num_attention_heads", None)
    n_layers = getattr(config, "num_hidden_layers", None)
    if not n_heads or not n_layers:
        raise PonderError(
            f"FLOPs accounting cannot estimate model_type {model_type!r}: its config has no "
            "num_attention_heads/num_hidden_layers to price attention with."
        )
    head = model.get_output_embeddings()
    if head is None:  # logits from the tied input embedding, e.g. F.linear(h, embed.weight)
        head = model.get_input_embeddings()
    if isinstance(head, torch.nn.Linear):  # features, not weight.shape: packed quantised heads
        vocab, hidden = head.out_features, head.in_features
    else:
        vocab, hidden = head.weight.shape
    decoder = model.get_decoder()
    decoder_params = linear_weights(decoder)
    if decoder is model:  # the wrapper itself: its LM head is not a decoder matmul
        decoder_params -= linear_weights(head)
    head_dim = config_head_dim(config, getattr(config, "hidden_size", None) or hidden, n_heads)
    n_kv_heads = getattr(config, "num_key_value_heads", None) or n_heads
    return FlopsSpec(n_layers=int(n_layers), n_heads=int(n_heads), head_dim=head_dim,
                     hidden=int(hidden), vocab=int(vocab), decoder_params=decoder_params,
                     kv_dim=int(n_kv_heads) * head_dim)


def _check_non_negative(**values: int) -> None:
    """Token counts come from user data; a negative one is a bug upstream, not a zero cost."""
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def non_embedding_params(spec: FlopsSpec) -> int:
    """Weights of the decoder matmuls every token passes through (no embeddings, head, norms, biases).

    This is the ``N`` of the usual ``2 * N`` FLOPs-per-token rule.
    """
    return spec.decoder_params


def attention_flops(spec: FlopsSpec, n_new: int, n_past: int = 0) -> int:
    """QK^T plus weights @ V for ``n_new`` causal queries over ``n_past`` cached positions.

    Separate from the matmul term because it grows with context length, which is what makes
    long ponder chains more than linearly expensive.
    """
    _check_non_negative(n_new=n_new, n_past=n_past)
    attended = n_new * n_past + n_new * (n_new + 1) // 2
    per_position = 2 * (2 * spec.head_dim * spec.n_heads)  # QK^T and AV, every query head
    return spec.n_layers * per_position * attended


def lm_head_flops(spec: FlopsSpec, n_logits: int) -> int:
    """The LM head on ``n_logits`` positions (the ones whose logits a forward computes)."""
    _check_non_negative(n_logits=n_logits)
    return 2 * spec.hidden * spec.vocab * n_logits


def kept_logits(n_new: int, logits_to_keep: int = 0) -> int:
    """How many of ``n_new`` positions get logits under HF's ``logits_to_keep``: 0 (a bare
    ``forward``'s default) keeps every position, ``k > 0`` the last ``k``."""
    _check_non_negative(n_new=n_new, logits_to_keep=logits_to_keep)
    return n_new if logits_to_keep == 0 else min(logits_to_keep, n_new)


def flops_floor(spec: FlopsSpec, tokens_processed: int) -> int:
    """``2 * N * tokens``: the bound any honest count must meet, whatever it assumes about attention."""
    _check_non_negative(tokens_processed=tokens_processed)
    return 2 * non_embedding_params(spec) * tokens_processed


def forward_flops(spec: FlopsSpec, n_new: int, n_past: int = 0, logits_to_keep: int = 0) -> int:
    """One forward pass over ``n_new`` tokens with ``n_past`` tokens already in the KV cache,
    with logits at the positions ``logits_to_keep`` keeps (``kept_logits``)."""
    return (
        flops_floor(spec, n_new)
        + attention_flops(spec, n_new, n_past)
        + lm_head_flops(spec, kept_logits(n_new, logits_to_keep))
    )


def generation_flops(spec: FlopsSpec, prompt_len: int, gen_tokens: int,
                     logits_to_keep: int = 1) -> int:
    """Cached generation of one sequence: a prefill, then one decode step per further token.

    The prefill yields the first generated token, so ``gen_tokens`` tokens need
    ``gen_tokens - 1`` decode steps. With ``gen_tokens == 0`` the prefill still ran (e.g. to
    score the prompt), so it is counted: 0 and 1 cost the same. The decode steps together
    equal one pass of ``gen_tokens - 1`` tokens after the prompt (decode token ``k`` attends
    exactly where token ``k`` of such a pass would, and each computes its one logit row),
    which keeps this O(1) for long outputs. ``logits_to_keep`` is the prefill's: 1, as
    ``generate`` and our loop pass it to every model whose ``forward`` takes it; 0 for one
    whose ``forward`` does not, which then computes logits at every prompt position.
    """
    _check_non_negative(prompt_len=prompt_len, gen_tokens=gen_tokens)
    decode_steps = max(gen_tokens - 1, 0)
    return (forward_flops(spec, prompt_len, logits_to_keep=logits_to_keep)
            + forward_flops(spec, decode_steps, n_past=prompt_len))


def layers_flops(spec: FlopsSpec, n_run: int, n_new: int, n_past: int = 0) -> int:
    """The decoder matmuls and attention of the first ``n_run`` layers (no LM head): an early
    exit runs only those. Layers are priced alike (one layer is ``1 / n_layers`` of the
    decoder), exact for every family of the table; ``n_run == n_layers`` is exactly
    ``forward_flops`` less the LM head."""
    _check_non_negative(n_run=n_run)
    if n_run > spec.n_layers:
        raise ValueError(f"n_run must be <= {spec.n_layers} layers, got {n_run}")
    whole = flops_floor(spec, n_new) + attention_flops(spec, n_new, n_past)
    return whole * n_run // spec.n_layers


def kv_projection_flops(spec: FlopsSpec, n_new: int) -> int:
    """The key and value projections of one layer for ``n_new`` tokens: all that an early exit
    computes in a layer it skips (CALM fills the skipped layers' cache from the exit state;
    their queries, attention, output projection and MLP never run)."""
    _check_non_negative(n_new=n_new)
    return 2 * spec.hidden * 2 * spec.kv_dim * n_new


def early_exit_step_flops(spec: FlopsSpec, n_past: int, exit_layer: int, n_tests: int) -> int:
    """One decode token under early exit, as an early-exit implementation runs it: the first
    ``exit_layer`` layers, the key/value projections of the layers after it, and ``n_tests``
    exit tests, each one final norm + LM head on the token's state (the norm is elementwise,
    not counted, as everywhere here). The test at the exit layer yields the token's logits, so
    the LM head runs once more only when no test exited (``exit_layer == n_layers``)."""
    _check_non_negative(n_past=n_past, n_tests=n_tests)
    skipped = spec.n_layers - exit_layer
    return (layers_flops(spec, exit_layer, 1, n_past) + skipped * kv_projection_flops(spec, 1)
            + lm_head_flops(spec, n_tests + (1 if skipped == 0 else 0)))


def early_exit_generation_flops(spec: FlopsSpec, prompt_len: int,
                                steps: Sequence[tuple[int, int]], logits_to_keep: int = 1) -> int:
    """Cached generation of one sequence under early exit: the prefill runs every layer (the
    prompt's cache must be complete; it yields the first token, its logits kept as
    ``generation_flops`` says), then one decode step per ``(exit_layer, n_tests)`` in
    ``steps`` (``early_exit_step_flops``). With every step at ``(n_layers, 0)`` this is
    ``generation_flops`` exactly."""
    _check_non_negative(prompt_len=prompt_len)
    return forward_flops(spec, prompt_len, logits_to_keep=logits_to_keep) + sum(
        early_exit_step_flops(spec, prompt_len + k, exit_layer, n_tests)
        for k, (exit_layer, n_tests) in enumerate(steps))


def _linear_flops(n_in: int, n_out: int) -> int:
    """A dense layer on one vector; its bias add is ignored like every other bias here."""
    return 2 * n_in * n_out


def controller_flops(
    d_model: int, width: int = 512, n_evals: int = 1, projection_dim: int | None = None
) -> int:
    """The ponder controller, LayerNorm(d) -> Linear(d,h) -> GELU -> Linear(h,h) -> GELU -> Linear(h,1).

    ``d_model`` is the backbone's width d, ``width`` the controller's hidden width h.
    Counted separately from the LM so reports can show that the controller's overhead is tiny
    (about 2 * (d*h + h*h) per decision) next to the model it steers. ``projection_dim``: the
    fixed random projection d -> p that controllers of backbones wider than 1024 apply after
    the LayerNorm (``controller.PROJECTION_DIM``).
    """
    _check_non_negative(d_model=d_model, width=width, n_evals=n_evals)
    d, h = d_model, width
    projection = 0
    if projection_dim is not None and projection_dim < d:
        projection, d_in = _linear_flops(d, projection_dim), projection_dim
    else:
        d_in = d
    matmuls = projection + _linear_flops(d_in, h) + _linear_flops(h, h) + _linear_flops(h, 1)
    elementwise = LAYERNORM_FLOPS_PER_ELEMENT * d + GELU_FLOPS_PER_ELEMENT * 2 * h
    return n_evals * (matmuls + elementwise)


# ----------------------------------------------------------------------------- showing FLOPs
SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def readable_flops(value: float) -> str:
    """``32037787699.2`` as ``32.04 GFLOPs``: four significant digits and an SI prefix, for
    every place a person reads a FLOPs figure (an 11-digit float reads as noise)."""
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        return f"{value} FLOPs"
    for scale, prefix in SI_PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}FLOPs"
    return f"{value:.4g} FLOPs"


class FlopCount(float):
    """A FLOPs figure that lm-eval's results table shows readably.

    lm-eval prints every metric as ``f"{value:.4f}"``, which turns a generation's FLOPs into
    ``32037787699.2000``. A ``FlopCount`` is the same float everywhere (arithmetic, JSON,
    comparisons, ``repr``: results files and figures do not change) except that a fixed-point
    format (``.4f``) shows ``readable_flops``. Sums and quotients stay ``FlopCount`` so that
    lm-eval's ``mean`` aggregation of per-document values keeps the type."""

    __slots__ = ()

    def __format__(self, spec: str) -> str:
        if spec.endswith("f"):
            return readable_flops(self)
        return super().__format__(spec)

    def __add__(self, other):
        result = float.__add__(self, other)
        return result if result is NotImplemented else FlopCount(result)

    __radd__ = __add__

    def __truediv__(self, other):
        result = float.__truediv__(self, other)
        return result if result is NotImplemented else FlopCount(result)

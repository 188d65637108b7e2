"""A text report on a steering vector: logit lens, norms per layer, cosines between layers."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.steering.vector import SteeringVector, format_ranges


def _final_norm_weight(model, d: int) -> torch.Tensor | None:
    """Elementwise gain of the final norm (RMSNorm/LayerNorm ``weight`` of shape [d]), if any."""
    base = getattr(model, "base_model", model)
    for name in ("norm", "final_layernorm", "ln_f", "final_layer_norm"):
        module = getattr(base, name, None)
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.shape == (d,):
            return weight.detach().float().cpu()
    return None


def _token_text(tokenizer, token_id: int) -> str:
    text = tokenizer.decode([token_id])
    if text == "" or text == "\ufffd":
        text = str(tokenizer.convert_ids_to_tokens(token_id))
    return repr(text)


def _lens_block(title: str, logits: torch.Tensor, tokenizer, top_k: int) -> list[str]:
    k = min(top_k, logits.numel())
    up = torch.topk(logits, k)
    down = torch.topk(-logits, k)
    lines = [title, f"  {'promoted':<36}{'suppressed':<36}"]
    for r in range(k):
        a = f"{float(up.values[r]):+8.3f} {_token_text(tokenizer, int(up.indices[r]))}"
        b = f"{float(-down.values[r]):+8.3f} {_token_text(tokenizer, int(down.indices[r]))}"
        lines.append(f"  {a[:34]:<36}{b[:34]:<36}")
    return lines


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def inspect_vector(sv: SteeringVector, model, tokenizer, top_k: int = 15,
                   lens_layers: Sequence[int] | None = None) -> str:
    """A text report: logit lens of the default layer's vector, norms per layer, cosines.

    ``lens_layers``: the layers whose vectors get a logit lens; default the default layer and
    the last stored layer (a mid-depth vector read through the unembedding is often noise; the
    last layer's is the one the unembedding was trained to read).

    Logit lens choice: the vector is a DIRECTION added to the residual stream, not a state, so
    we report its first-order effect on the logits. For a final RMSNorm with gain g the Jacobian
    at a state h is diag(g)/rms(h) times a projection that removes the component along h; the
    projection depends on h and is dropped, the positive 1/rms(h) does not change the ranking,
    which leaves W_U (g * v). We show that ("through the final-norm gain") and the plain
    W_U v ("direct"), since g is far from uniform in many models. Running a unit vector through
    the norm itself would be meaningless: RMSNorm rescales it to norm sqrt(d).
    """
    lines = _provenance(sv) + [""]
    lines += _logit_lens(sv, model, tokenizer, top_k, lens_layers)
    lines += _norms_table(sv) + [""]
    lines += _cosine_matrix(sv)
    return "\n".join(lines) + "\n"


def _provenance(sv: SteeringVector) -> list[str]:
    """Where the vector came from: method, layers, backbone, questions, contrastive prompts
    (what a reader needs to tell two vectors apart before comparing their numbers)."""
    meta = sv.meta
    bb = meta.get("backbone") or {}
    prompts = meta.get("prompts") or {}
    return [
        f"steering vector: method={meta.get('method')} default layer={sv.default_layer} "
        f"stored layers={format_ranges(sv.layers)} hidden={sv.hidden_size}",
        f"backbone: {bb.get('name')} (source sha256 {str(bb.get('source_sha256'))[:16]}...)",
        f"questions: {meta.get('n_questions')} from {meta.get('question_source')} "
        f"(sha256 {str(meta.get('questions_sha256'))[:16]}...), chat template: "
        f"{meta.get('chat_template')}",
        f"prompts: + {prompts.get('positive')!r}",
        f"         - {prompts.get('negative')!r}",
    ]


def _logit_lens(sv: SteeringVector, model, tokenizer, top_k: int,
                lens_layers: Sequence[int] | None) -> list[str]:
    """The tokens each lens layer's vector promotes and suppresses, through the final norm's
    gain and directly (``inspect_vector``'s docstring says why both); a model without an
    output embedding gets a line saying it was skipped."""
    layer = sv.default_layer
    v = sv.vector(layer).detach().float().cpu()
    head = model.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        return ["logit lens: the model has no output embedding matrix; skipped"]
    w_u = head.weight.detach().float().cpu()
    if w_u.shape[1] != v.shape[0]:
        raise PonderError(f"the model's unembedding has width {w_u.shape[1]} but the vector has {v.shape[0]}")
    gain = _final_norm_weight(model, v.shape[0])
    if lens_layers is None:
        lens_layers = list(dict.fromkeys([layer, sv.layers[-1]]))
    lines: list[str] = []
    for lens_layer in lens_layers:
        u = sv.vector(lens_layer).detach().float().cpu()
        lines.append(f"logit lens of layer {lens_layer}'s unit vector (+ = toward the positive "
                     "prompt, i.e. 'deliberate'; - = toward 'direct'):")  # fmt: skip
        if gain is not None:
            lines += _lens_block("[through the final-norm gain: W_U (g * v)]", w_u @ (gain * u),
                                 tokenizer, top_k)  # fmt: skip
            lines.append("")
        lines += _lens_block("[direct: W_U v]", w_u @ u, tokenizer, top_k)
        lines.append("")
    return lines


def _norms_table(sv: SteeringVector) -> list[str]:
    """Per stored layer: the raw difference's norms, the residual norm that alpha is a
    fraction of, their ratio, and the cosines to the layer before and to the default layer
    (how fast the direction turns with depth)."""
    meta, layer = sv.meta, sv.default_layer
    residual = meta.get("residual_norm")
    raw = meta.get("raw_norm") or {}
    raw_mean, raw_sum = raw.get("mean"), raw.get("sum")
    lines = ["norms per layer (at the last prompt token; alpha elsewhere is a fraction of "
             "residual_norm):",
             f"  {'layer':>5} {'raw_sum':>11} {'raw_mean':>9} {'residual':>9} "
             f"{'mean/resid':>10} {'cos(l-1,l)':>10} {'cos(l,default)':>14}"]  # fmt: skip
    vd = sv.vector(layer)
    for j, lay in enumerate(sv.layers):
        def fmt(values, width, spec, j=j):
            return f"{values[j]:{width}{spec}}" if values is not None else f"{'-':>{width}}"

        has_ratio = raw_mean is not None and residual is not None and residual[j]
        ratio = f"{raw_mean[j] / residual[j]:10.3f}" if has_ratio else f"{'-':>10}"
        adjacent = j > 0 and sv.layers[j - 1] == lay - 1
        adj = f"{_cos(sv.vectors[j - 1], sv.vectors[j]):10.3f}" if adjacent else f"{'-':>10}"
        mark = " *" if lay == layer else ""
        lines.append(f"  {lay:5d} {fmt(raw_sum, 11, '.2f')} {fmt(raw_mean, 9, '.3f')} "
                     f"{fmt(residual, 9, '.2f')} {ratio} {adj} {_cos(sv.vectors[j], vd):14.3f}{mark}")
    return lines


def _cosine_matrix(sv: SteeringVector) -> list[str]:
    """Cosines between the vectors of up to 8 stored layers (evenly strided, the last always
    in), and the fractional PCA's figures where the extraction ran it."""
    meta, layer = sv.meta, sv.default_layer
    n = len(sv.layers)
    stride = max(1, math.ceil(n / 7))
    picks = list(range(0, n, stride))
    if picks[-1] != n - 1:
        picks.append(n - 1)
    lines = [f"cosine similarity between layers' vectors (stored layers at stride {stride}):",
             "  " + " " * 6 + "".join(f"{sv.layers[j]:>7d}" for j in picks)]
    for a in picks:
        row = "".join(f"{_cos(sv.vectors[a], sv.vectors[b]):7.2f}" for b in picks)
        lines.append(f"  {sv.layers[a]:>6d}{row}")
    if "pca" in meta:
        pca = meta["pca"]
        lines.append("")
        lines.append(f"fractional PCA: PC1 explains {pca.get('explained_variance_ratio_pc1', 0):.3f} "
                     f"of the variance of the differences; cosine(final, mean difference) at "
                     f"layer {layer}: {pca['cosine_with_mean_difference'][sv.index(layer)]:.4f}")  # fmt: skip
    return lines

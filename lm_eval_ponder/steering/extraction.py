"""Steering-vector extraction: the paper's contrastive estimator and Fractional Reasoning's.

What the vector is, its layer indexing and its metadata are described in
``lm_eval_ponder.steering.vector``; this module reads the residual stream and builds the vectors.

Extraction choices (the paper leaves them open; each is recorded in the vector's metadata):

- Chat template. With ``chat_template=True`` and a tokenizer that has one, each prompt is the
  user message of a one-turn chat rendered with ``add_generation_prompt=True``: its last token
  ends the assistant header, the state that produces the answer's first token under
  ``--apply_chat_template``, which is where steering acts.
- Batching. Prompts are sorted by length and left-padded, with explicit ``position_ids``
  counting real tokens only, so a padded row sees the positions of the prompt alone. The
  result does not depend on the questions' order, only (at float rounding level) on
  ``batch_size``; it is deterministic.

Fractional Reasoning (Liu et al. 2025, github shengliu66/FractionalReason), as its code does it
(``tasks/base.py:obtain_icv``, ``utils/tools.py:apply_template``, ``utils/pca.py``): prompts
"Solve the problem with step-by-step detailed reasoning. " + q vs "Solve the problem with
direct answering. " + q; last-token states at every layer concatenated into one vector per
prompt; the differences (pos - neg) are fit with a rank-1 PCA over the CONCATENATION of layers;
direction = mean difference + sign * PC1, the sign making PC1 agree with the mean. Their code
feeds this to a hook that normalises it per layer, so we store it unit-normalised per layer.
Because PC1 is unit-norm over all layers together while the mean difference is not normalised,
the mean dominates; ``meta["pca"]`` reports PC1's explained variance and, per layer, the cosine
between the final vector and the plain mean difference. Differences from their code: they
tokenise the plain text (no chat template) one prompt at a time; ``chat_template=False``
reproduces that. Their question-text "special character" stripping is not reproduced.
"""

from __future__ import annotations

import hashlib
import inspect as _inspect
from typing import Any, Callable, Iterable, Sequence

import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.hooks import block_hidden
from lm_eval_ponder.portable import portable_path
from lm_eval_ponder.steering.vector import (
    DEFAULT_LAYER_FRACTION,
    FORMAT,
    FRACTIONAL_NEGATIVE,
    FRACTIONAL_POSITIVE,
    LAYER_INDEXING,
    PAPER_NEGATIVE,
    PAPER_POSITIVE,
    SteeringVector,
    config_dims,
    default_layer,
)


def _render(tokenizer, text: str, use_chat: bool) -> str:
    """The prompt as the model reads it: the user message of a one-turn chat, or plain."""
    if not use_chat:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def _encode(tokenizer, texts: Sequence[str], chat_template: bool) -> tuple[list[list[int]], bool]:
    """Token ids of each prompt; returns (ids, whether a chat template was applied)."""
    use_chat = bool(chat_template and getattr(tokenizer, "chat_template", None))
    out: list[list[int]] = []
    for text in texts:
        if use_chat:
            ids = tokenizer(_render(tokenizer, text, True), add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        if not ids:
            raise PonderError(f"the tokenizer produced no tokens for a prompt: {text[:60]!r}")
        out.append(list(ids))
    return out, use_chat


def _left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of token lists padded on the left, so every prompt's last
    token sits in the last column, where the hooks read it."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        input_ids[r, width - len(row) :] = torch.tensor(row)
        mask[r, width - len(row) :] = 1
    return input_ids, mask


@torch.no_grad()
def last_token_states(model, tokenizer, prompts: Sequence[str], layers: Sequence[int],
                      batch_size: int = 8, chat_template: bool = True, progress: bool = True,
                      desc: str = "steering: forward") -> tuple[torch.Tensor, dict]:
    """Residual stream at the last prompt token after each decoder block in ``layers`` (checked
    by ``_resolve_layers``).

    Returns ``(states [n_prompts, len(layers), d] float32, info)``; ``info`` says whether a chat
    template was applied. See this module's docstring for padding and position ids, and
    ``lm_eval_ponder.steering.vector``'s for layer indexing.
    """
    from tqdm.auto import tqdm

    from lm_eval_ponder.backbone import decoder_layers

    if batch_size < 1:
        raise PonderError(f"batch_size must be >= 1, got {batch_size}")
    blocks = decoder_layers(model)
    ids, use_chat = _encode(tokenizer, prompts, chat_template)
    device = next(model.parameters()).device
    pad_id = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    # no KV cache and the LM head on one position (only the states matter); positions passed so
    # that left padding does not shift them
    params = _inspect.signature(model.forward).parameters
    extra: dict[str, Any] = {"use_cache": False} if "use_cache" in params else {}
    if "logits_to_keep" in params:
        extra["logits_to_keep"] = 1

    captured: dict[int, torch.Tensor] = {}

    def make_hook(layer: int):
        def hook(_module, _inputs, output):
            captured[layer] = block_hidden(output)[:, -1, :].detach().float().cpu()

        return hook

    handles = [blocks[layer].register_forward_hook(make_hook(layer)) for layer in set(layers)]
    states: torch.Tensor | None = None
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))  # deterministic
    try:
        bar = tqdm(total=len(ids), desc=desc, unit="prompt", disable=not progress)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, mask = _left_padded([ids[i] for i in rows], pad_id)
            kwargs = dict(extra)
            if "position_ids" in params:
                kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
            captured.clear()
            model(input_ids=input_ids.to(device), attention_mask=mask.to(device), **kwargs)
            if states is None:
                d = captured[layers[0]].shape[-1]
                states = torch.empty((len(ids), len(layers), d), dtype=torch.float32)
            for j, layer in enumerate(layers):
                states[rows, j] = captured[layer]
            bar.update(len(rows))
        bar.close()
    finally:
        for handle in handles:
            handle.remove()
    assert states is not None
    if not torch.isfinite(states).all():
        raise PonderError("non-finite hidden states during extraction (check the model dtype)")
    return states, {"chat_template_applied": use_chat}


def _questions_list(questions: Iterable[str]) -> list[str]:
    out = list(questions)
    if not out:
        raise PonderError("steering extraction needs at least one question")
    bad = [i for i, q in enumerate(out) if not isinstance(q, str) or not q.strip()]
    if bad:
        raise PonderError(f"questions must be non-empty strings; bad at index {bad[:5]}")
    return out


def _resolve_layers(layer: int | list[int] | None, n_layers: int) -> tuple[list[int], int]:
    """(stored layers, default layer). int/None: store all; list: store those, default = first."""
    if isinstance(layer, (list, tuple)):
        if not layer:
            raise PonderError("an empty layer list was given")
        stored = sorted({int(x) for x in layer})
        chosen = int(layer[0])
    else:
        stored = list(range(n_layers))
        chosen = default_layer(n_layers) if layer is None else int(layer)
    bad = [x for x in stored + [chosen] if not 0 <= x < n_layers]
    if bad:
        raise PonderError(f"layer {bad[0]} out of range: the model has {n_layers} decoder layers "
                          f"(0..{n_layers - 1})")
    return stored, chosen


def _model_dims(model) -> tuple[int, int]:
    from lm_eval_ponder.backbone import decoder_layers

    n_layers = len(decoder_layers(model))
    hidden = config_dims(model.config)[0]
    if hidden is None:
        hidden = int(model.get_input_embeddings().weight.shape[1])
    return int(hidden), n_layers


def _sha256_text(questions: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(questions).encode("utf-8")).hexdigest()


def _backbone_meta(backbone: Any) -> dict | None:
    if backbone is None:
        return None
    get = backbone.get if isinstance(backbone, dict) else \
        (lambda key: getattr(backbone, key, None))
    path = get("path")  # a record read on other machines: no path of this one
    return {"name": get("name"), "path": None if path is None else portable_path(path),
            "source_sha256": get("source_sha256")}


def _unit_rows(matrix: torch.Tensor, what: str, layers: list[int]) -> torch.Tensor:
    norms = matrix.norm(dim=-1, keepdim=True)
    zero = [layers[j] for j in range(len(layers)) if not norms[j, 0] > 0]
    if zero:
        raise PonderError(f"{what} is zero at layer(s) {zero}: the two prompt sets give identical "
                          "states there, so there is no direction to normalise")
    return (matrix / norms).float()


def paper_direction(pos: torch.Tensor, neg: torch.Tensor, stored: list[int]) -> tuple[torch.Tensor, dict]:
    """The paper's estimator, eq. (steering): h = sum_i (h_i+ - h_i-) / Z per layer, from the
    float64 states [N, L, d]; returns (unit vectors, its own meta)."""
    diff_sum = (pos - neg).sum(dim=0)  # [L, d], float64
    vectors = _unit_rows(diff_sum, "the summed difference", stored)
    raw = diff_sum.norm(dim=-1)
    n = pos.shape[0]
    return vectors, {"raw_norm": {"sum": [float(x) for x in raw], "mean": [float(x) for x in raw / n]}}


def fractional_direction(pos: torch.Tensor, neg: torch.Tensor,
                         stored: list[int]) -> tuple[torch.Tensor, dict]:
    """Mean difference + sign-aligned PC1 of the differences concatenated over layers."""
    diffs = pos - neg  # [N, L, d] float64
    n, n_stored, d = diffs.shape
    flat = diffs.reshape(n, n_stored * d)
    mean = flat.mean(dim=0)
    centred = flat - mean
    _, singular, vh = torch.linalg.svd(centred, full_matrices=False)
    pc1 = vh[0]
    dot = float(pc1 @ mean)
    sign = 1.0 if dot >= 0 else -1.0  # their torch.sign would give 0 for an exact tie; we keep PC1
    combined = (mean + sign * pc1).reshape(n_stored, d)
    vectors = _unit_rows(combined, "the fractional direction", stored)
    mean_rows = mean.reshape(n_stored, d)
    total_var = float((singular**2).sum())
    return vectors, {
        "raw_norm": {
            "sum": [float(x) for x in mean_rows.norm(dim=-1) * n],
            "mean": [float(x) for x in mean_rows.norm(dim=-1)],
            "combined": [float(x) for x in combined.norm(dim=-1)],
        },
        "pca": {
            "scope": "rank-1 PCA of the per-question differences concatenated over stored layers",
            "explained_variance_ratio_pc1": float(singular[0] ** 2) / total_var if total_var > 0 else 0.0,
            "sign": sign,
            "cosine_with_mean_difference": [
                float(torch.nn.functional.cosine_similarity(combined[j], mean_rows[j], dim=0))
                for j in range(n_stored)
            ],
        },
    }


def _extract(
    method: str, positive: str, negative: str,
    direction: Callable[[torch.Tensor, torch.Tensor, list[int]], tuple[torch.Tensor, dict]],
    model, tokenizer, questions: list[str], layer: int | list[int] | None, batch_size: int,
    chat_template: bool, progress: bool, backbone: Any, question_source: Any,
) -> SteeringVector:  # fmt: skip
    """What both estimators share: last-token states of the two prompt sets at the stored layers,
    ``direction(pos, neg, stored)`` -> (unit vectors, its own meta), and the common metadata."""
    import transformers

    from lm_eval_ponder import __version__

    hidden, n_layers = _model_dims(model)
    stored, chosen = _resolve_layers(layer, n_layers)
    n = len(questions)
    prompts = [positive + q for q in questions] + [negative + q for q in questions]
    states, info = last_token_states(model, tokenizer, prompts, stored, batch_size, chat_template,
                                     progress, f"steering: {method}")
    pos, neg = states[:n].double(), states[n:].double()
    vectors, extra = direction(pos, neg, stored)
    use_chat = info["chat_template_applied"]
    meta = {
        "format": FORMAT,
        "method": method,
        "layer": chosen,
        "layers": stored,
        "layer_indexing": LAYER_INDEXING,
        "position": "last prompt token",
        "default_layer_rule": f"int({DEFAULT_LAYER_FRACTION} * n_layers) unless given",
        "prompts": {"positive": positive + "{question}", "negative": negative + "{question}"},
        "chat_template": bool(use_chat),
        "example_prompt": {"positive": _render(tokenizer, positive + questions[0], use_chat),
                           "negative": _render(tokenizer, negative + questions[0], use_chat)},
        "n_questions": len(questions),
        "question_source": question_source,
        "questions_sha256": _sha256_text(questions),
        "backbone": _backbone_meta(backbone),
        "hidden_size": hidden,
        "n_layers": n_layers,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "batch_size": batch_size,
        "padding": "left, position_ids from the attention mask",
        "created_by": f"lm_eval_ponder {__version__}",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "residual_norm": [float(x) for x in torch.cat([pos, neg]).norm(dim=-1).mean(dim=0)],
        **extra,
    }
    return SteeringVector(vectors, stored, meta)


def extract_paper(model, tokenizer, questions: Iterable[str], layer: int | list[int] | None = None,
                  batch_size: int = 8, chat_template: bool = True, progress: bool = True, *,
                  backbone: Any = None, question_source: Any = None) -> SteeringVector:
    """The paper's estimator: unit-normalised sum over questions of h+ - h- at each layer.

    ``layer``: None -> store every layer, default ``default_layer(n_layers)``; an int -> store
    every layer, default that one; a list -> store those layers, default the first listed.
    ``backbone`` (a ``ResolvedBackbone`` or dict) and ``question_source`` are recorded in meta.
    """
    return _extract("paper", PAPER_POSITIVE, PAPER_NEGATIVE, paper_direction, model, tokenizer,
                    _questions_list(questions), layer, batch_size, chat_template, progress,
                    backbone, question_source)


def extract_fractional(model, tokenizer, questions: Iterable[str], layer: int | list[int] | None = None,
                       batch_size: int = 8, chat_template: bool = True, progress: bool = True, *,
                       backbone: Any = None, question_source: Any = None) -> SteeringVector:
    """Fractional Reasoning's vector: mean difference + sign-aligned PC1 (joint over layers).

    PCA is fit on the per-question differences concatenated over the stored layers, as in
    their code; the result is unit-normalised per layer. Needs at least two questions.
    ``layer``, ``backbone`` and ``question_source`` as for ``extract_paper``.
    """
    questions = _questions_list(questions)
    if len(questions) < 2:
        raise PonderError("the fractional method fits a PCA and needs at least two questions")
    return _extract("fractional", FRACTIONAL_POSITIVE, FRACTIONAL_NEGATIVE, fractional_direction,
                    model, tokenizer, questions, layer, batch_size, chat_template, progress,
                    backbone, question_source)


METHODS = {"paper": extract_paper, "fractional": extract_fractional}

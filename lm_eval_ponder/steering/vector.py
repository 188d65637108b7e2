"""Steering vectors: the ``SteeringVector`` type, its default layer, and its file format.

Extraction lives in ``steering.extraction``, the text report in ``steering.inspection``; this
module is what the rest of the project needs at inference time and imports neither.

A steering vector is, per decoder layer l, the paper's estimator (appendix, "Steering Vector
Extraction via Contrastive Representation"; docs/design/paper-gaps.md, "Steering vector")

    h_steer^(l) = sum_i (h_i^{+,l} - h_i^{-,l}) / || sum_i (h_i^{+,l} - h_i^{-,l}) ||

over TRAIN questions q, read at the LAST prompt token of p+ = ``PAPER_POSITIVE`` + q and p- =
``PAPER_NEGATIVE`` + q: positive alpha pushes toward "deliberate", negative toward "direct".
Choices the paper leaves open, each recorded in the vector's metadata:

- Layer indexing (``LAYER_INDEXING``): ``layers[l]`` is the output of decoder block ``l``, the
  tensor a forward hook on that block sees and a steering hook modifies. Hooks, because
  transformers' last ``hidden_states`` entry is after the final norm, not the last block's
  output; they are uniform over layers and architectures and keep no other position.
- Every layer is stored, so a layer sweep or ``inspect`` needs no re-extraction;
  ``meta["layer"]`` is the default, ``default_layer(n_layers)`` unless the caller chose one
  (``DEFAULT_LAYER_FRACTION`` says why; the paper reports "layers 16-24 of 32").
- ``meta["residual_norm"][j]`` is the mean L2 norm of the residual stream at the last token
  over all 2N prompts at ``layers[j]``. Steering strengths elsewhere are FRACTIONS of it, so one
  setting transfers across backbones and layers. ``meta["raw_norm"]``: per layer, the norms of
  the summed ("sum") and mean ("mean") difference before normalisation.

File format (``save_vector``/``load_vector``): a directory with ``steering.safetensors``
(tensors "vectors" [n_stored, d] float32 unit rows and "layers" [n_stored] int64) and
``steering.json`` (the metadata, with the safetensors file's SHA-256 so a mismatched pair is
detected), each written atomically. No pickle.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from lm_eval_ponder.backbone import text_config
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import atomic_write, file_sha256

FORMAT = "lm_eval_ponder.steering/1"
VECTORS_FILE = "steering.safetensors"
META_FILE = "steering.json"

#: Default steering layer as a fraction of depth: ``int(0.5 * n_layers)``. Measured on the
#: embedded backbone (studies/layer_sweep.py, docs/results/steering.md): layers 6-10 barely change
#: the output, layers 15-25 form a plateau of similar effect; 15 of 30 sits at its start.
DEFAULT_LAYER_FRACTION = 0.5

PAPER_POSITIVE = "Let's think step by step about this problem: "
PAPER_NEGATIVE = "The answer is: "
FRACTIONAL_POSITIVE = "Solve the problem with step-by-step detailed reasoning. "
FRACTIONAL_NEGATIVE = "Solve the problem with direct answering. "

LAYER_INDEXING = (
    "layers[l] = output of decoder block l (0-based), recorded by a forward hook on that block; "
    "equals transformers hidden_states[l+1] for l < n_layers-1 (hidden_states[-1] is after the "
    "final norm)"
)
_UNIT_TOL = 1e-3


def default_layer(n_layers: int) -> int:
    """``int(DEFAULT_LAYER_FRACTION * n_layers)``, clamped to a valid block index."""
    if n_layers < 1:
        raise PonderError(f"a model needs at least one decoder layer, got {n_layers}")
    return min(n_layers - 1, max(0, int(DEFAULT_LAYER_FRACTION * n_layers)))


# --------------------------------------------------------------------------- the vector


@dataclass
class SteeringVector:
    """Unit steering directions for one or more decoder layers of one backbone.

    ``vectors[j]`` belongs to decoder block ``layers[j]``; ``meta["layer"]`` is the default.
    """

    vectors: torch.Tensor
    layers: list[int]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.layers = [int(x) for x in self.layers]
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.layers):
            raise PonderError(
                f"steering vectors must be [n_layers_stored, hidden]; got {tuple(self.vectors.shape)} "
                f"for {len(self.layers)} layer index(es)"
            )
        if len(set(self.layers)) != len(self.layers):
            raise PonderError(f"duplicate layer indices in steering vector: {self.layers}")

    @property
    def default_layer(self) -> int:
        layer = self.meta.get("layer")
        return int(layer) if layer is not None else self.layers[0]

    @property
    def hidden_size(self) -> int:
        return int(self.vectors.shape[1])

    def index(self, layer: int | None = None) -> int:
        """Row of ``vectors`` that holds ``layer`` (default: ``meta["layer"]``)."""
        layer = self.default_layer if layer is None else int(layer)
        try:
            return self.layers.index(layer)
        except ValueError:
            raise PonderError(f"layer {layer} is not stored in this steering vector (stored: "
                              f"{format_ranges(self.layers)}); re-extract with that layer") from None

    def vector(self, layer: int | None = None) -> torch.Tensor:
        """The unit direction [d] for ``layer`` (default: ``meta["layer"]``)."""
        return self.vectors[self.index(layer)]

    def residual_norm(self, layer: int | None = None) -> float | None:
        """Mean residual-stream norm at the last prompt token at ``layer``, if recorded."""
        norms = self.meta.get("residual_norm")
        return None if norms is None else float(norms[self.index(layer)])


def format_ranges(values: Sequence[int]) -> str:
    values = sorted(values)
    if not values:
        return "none"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


# --------------------------------------------------------------------------- files


def save_vector(sv: SteeringVector, directory: str | os.PathLike) -> Path:
    """Write ``steering.safetensors`` + ``steering.json`` into ``directory``; returns it."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        "vectors": sv.vectors.detach().to(torch.float32).cpu().contiguous(),
        "layers": torch.tensor(sv.layers, dtype=torch.int64),
    }
    vec_path = directory / VECTORS_FILE
    atomic_write(vec_path, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    meta = dict(sv.meta)
    meta["layers"] = list(sv.layers)
    meta.setdefault("layer", sv.default_layer)
    meta["vectors_sha256"] = file_sha256(vec_path)
    text = json.dumps(meta, indent=2, ensure_ascii=False) + "\n"
    atomic_write(directory / META_FILE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return directory


def config_dims(config: Any) -> tuple[int | None, int | None]:
    """(hidden size, decoder layer count) of a transformers config or a plain dict."""
    if config is None:
        return None, None
    config = text_config(config)
    get = config.get if isinstance(config, dict) else lambda k, default=None: getattr(config, k, default)
    hidden = next((get(k) for k in ("hidden_size", "n_embd", "d_model") if get(k) is not None), None)
    layers = next(
        (get(k) for k in ("num_hidden_layers", "n_layer", "num_layers") if get(k) is not None), None
    )
    return (None if hidden is None else int(hidden)), (None if layers is None else int(layers))


def load_vector(
    directory_or_file: str | os.PathLike,
    model_config: Any = None,
    backbone_sha256: str | None = None,
) -> SteeringVector:
    """Read a saved vector and check it fits the backbone it will steer.

    ``directory_or_file``: the directory, or either of its two files. Checks hidden size and
    layer count against ``model_config`` (a transformers config or a dict) and the backbone's
    source hash when both that and the vector's are known; raises ``PonderError`` naming both
    values on a mismatch.
    """
    path = Path(directory_or_file).expanduser()
    directory = path.parent if path.is_file() else path
    vec_path, meta_path = directory / VECTORS_FILE, directory / META_FILE
    missing = [p.name for p in (vec_path, meta_path) if not p.is_file()]
    if missing:
        raise PonderError(f"no steering vector at {path}: missing {', '.join(missing)} (make one with "
                          "`python -m lm_eval_ponder.steer extract --output DIR`)")
    meta = _read_meta(meta_path)
    vectors, layers = _read_vectors(vec_path, meta_path, meta)
    sv = SteeringVector(vectors, layers, meta)
    _check_consistent(sv, vec_path, meta_path)
    _check_fits_backbone(sv, directory, model_config, backbone_sha256)
    return sv


def _read_meta(meta_path: Path) -> dict:
    """The vector's JSON metadata, or one line naming the file: a hand-edited or cut-off file
    would otherwise end in a JSON traceback, or an AttributeError on a non-object."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PonderError(f"cannot read {meta_path}: {exc}") from None
    if not isinstance(meta, dict):
        raise PonderError(f"{meta_path} does not hold a JSON object")
    return meta


def _read_vectors(vec_path: Path, meta_path: Path, meta: dict) -> tuple[torch.Tensor, list[int]]:
    """(unit vectors [n_layers, d] float32, their layers) from the safetensors file, checked to
    be the file its metadata was written with (the SHA-256 it records, the layers it lists):
    the two files travel as a pair, and a pair mixed from two extractions would steer with
    vectors the metadata does not describe."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    expected_sha = meta.get("vectors_sha256")
    if expected_sha and file_sha256(vec_path) != expected_sha:
        raise PonderError(f"{vec_path.name} does not match {meta_path.name} in {vec_path.parent} (the file's "
                          "SHA-256 differs from the one recorded): the pair was mixed or edited; re-extract")
    try:
        tensors = load_file(str(vec_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise PonderError(f"cannot read {vec_path}: {exc}") from None
    if "vectors" not in tensors or "layers" not in tensors:
        raise PonderError(f"{vec_path} lacks the tensors 'vectors' and 'layers'")
    layers = [int(x) for x in tensors["layers"].tolist()]
    if meta.get("layers") is not None and list(meta["layers"]) != layers:
        raise PonderError(
            f"{meta_path.name} lists layers {meta['layers']} but {vec_path.name} holds {layers}"
        )
    return tensors["vectors"].to(torch.float32), layers


def _check_consistent(sv: SteeringVector, vec_path: Path, meta_path: Path) -> None:
    """The vector agrees with itself: its default layer is stored, its rows are finite unit
    vectors (alpha is a fraction of the residual norm only for a unit direction), its width
    is the hidden size the metadata records."""
    if sv.default_layer not in sv.layers:
        raise PonderError(f"default layer {sv.default_layer} is not among the stored {sv.layers}")
    vectors, meta = sv.vectors, sv.meta
    norms = vectors.norm(dim=-1)
    if not torch.isfinite(vectors).all() or (norms - 1).abs().max() > _UNIT_TOL:
        raise PonderError(f"{vec_path} does not hold finite unit-norm rows (norms {norms.tolist()[:4]}...)")
    if meta.get("hidden_size") is not None and int(meta["hidden_size"]) != sv.hidden_size:
        raise PonderError(
            f"{meta_path.name} says hidden size {meta['hidden_size']} but the vectors have {sv.hidden_size}"
        )


def _check_fits_backbone(sv: SteeringVector, directory: Path, model_config: Any,
                         backbone_sha256: str | None) -> None:
    """The vector fits the backbone it will steer: its hidden size, its layer count and the
    backbone's source hash, where each is known. A vector of another model of the same width
    would steer without an error, with a direction that means nothing there."""
    meta, layers = sv.meta, sv.layers
    hidden, n_layers = config_dims(model_config)
    if hidden is not None and hidden != sv.hidden_size:
        raise PonderError(
            f"steering vector {directory} has hidden size {sv.hidden_size} but the backbone has "
            f"{hidden}: it was extracted from a different model; re-extract for this backbone"
        )
    meta_layers = meta.get("n_layers")
    if n_layers is not None:
        if meta_layers is not None and int(meta_layers) != n_layers:
            raise PonderError(f"steering vector {directory} was extracted from a model with {meta_layers} "
                              f"decoder layers but the backbone has {n_layers}: re-extract for this backbone")
        if max(layers) >= n_layers:
            raise PonderError(f"steering vector {directory} stores layer {max(layers)} but the backbone has "
                              f"only {n_layers} decoder layers")
    recorded = (meta.get("backbone") or {}).get("source_sha256")
    if backbone_sha256 and recorded and backbone_sha256 != recorded:
        raise PonderError(
            f"steering vector {directory} was extracted from backbone source sha256 {recorded} "
            f"but the backbone in use has sha256 {backbone_sha256}: re-extract for this backbone"
        )

"""The pondering controller: a small MLP that reads a hidden state and says "keep thinking".

Architecture (paper, Methodology, "Pondering Controller Architecture", eqs. controller_norm,
controller_hidden, controller_output):

    g0 = LayerNorm(z)                       d -> d
    g1 = GELU(W1 g0 + b1)                   d -> 512
    g2 = GELU(W2 g1 + b2)                   512 -> 512
    p  = sigmoid((w . g2 + b) / temperature)

The paper's at most 1M parameters hold for d <= 1024 (0.79M at d=1024, 0.72M at d=896 for
Qwen2.5-0.5B, 0.56M at d=576 for SmolLM2-135M), not for its larger backbones (d=2048..4096 would
need 1.3M..2.4M). For d > 1024 a *fixed* (never trained) seeded Gaussian projection d -> 1024
sits between the LayerNorm and W1: a buffer saved with the weights and counted separately
(``n_fixed``). Any other configuration over ``MAX_PARAMS`` is refused (docs/design/paper-gaps.md,
"Controller size").

Checkpoints are a directory with ``controller.safetensors`` (weights, never pickle) and
``config.json`` (sizes and metadata), each written atomically. Its sizes ``d_model`` and
``width`` are also written under their old names ``hidden_size`` and ``hidden`` (for older
code), which the loader reads where the new keys are absent (the shipped controllers).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import atomic_write
from lm_eval_ponder.pondering.dynamics import PonderConfig
from lm_eval_ponder.typed import WrongType, describe, fill

MAX_PARAMS = 1_000_000
PROJECTION_DIM = 1024  # backbone widths above this are randomly projected down to it
PROJECTION_SEED = 0
WEIGHTS_FILE = "controller.safetensors"
CONFIG_FILE = "config.json"
# config.json's size keys, and the names they had before (still written and read)
SIZE_KEYS = ("d_model", "width")
LEGACY_SIZE_KEYS = {"d_model": "hidden_size", "width": "hidden"}


def count_params(d_model: int, width: int = 512) -> int:
    """Learned parameters of a controller, without building it (LayerNorm + three Linears)."""
    d_in = min(d_model, PROJECTION_DIM)
    return 2 * d_model + (d_in * width + width) + (width * width + width) + (width + 1)


class PonderController(nn.Module):
    """phi(z) = P(continue pondering | z), the paper's <=1M-parameter halting controller.

    ``d_model``: the backbone's width (the size of the state z it reads); ``width``: the
    controller's hidden width (h, 512 in the paper)."""

    def __init__(self, d_model: int, width: int = 512, temperature: float = 1.0) -> None:
        super().__init__()
        if d_model < 1 or width < 1:
            raise PonderError(f"controller sizes must be positive (got d_model={d_model}, "
                              f"width={width})")
        if not (math.isfinite(temperature) and temperature > 0):
            raise PonderError(f"controller temperature must be > 0 (got {temperature})")
        n = count_params(d_model, width)
        if n > MAX_PARAMS:
            raise PonderError(f"a controller with d_model={d_model} and width={width} would have "
                              f"{n:,} learned parameters, over the paper's budget of {MAX_PARAMS:,}; "
                              "use a smaller `width`")
        self.d_model = d_model
        self.width = width
        self.temperature = float(temperature)
        self.norm = nn.LayerNorm(d_model)
        d_in = d_model
        if d_model > PROJECTION_DIM:
            # Fixed, seeded, scaled so that a unit-variance input keeps its per-unit variance.
            gen = torch.Generator().manual_seed(PROJECTION_SEED)
            proj = torch.randn(PROJECTION_DIM, d_model, generator=gen) / math.sqrt(d_model)
            self.register_buffer("projection", proj)
            d_in = PROJECTION_DIM
        else:
            self.projection = None
        self.fc1 = nn.Linear(d_in, width)
        self.fc2 = nn.Linear(width, width)
        self.head = nn.Linear(width, 1)

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def n_fixed(self) -> int:
        """Numbers in the fixed random projection (0 when d <= PROJECTION_DIM)."""
        return 0 if self.projection is None else self.projection.numel()

    def evaluation_flops(self, n_evals: int) -> int:
        """FLOPs of ``n_evals`` evaluations of this controller (``flops.controller_flops``)."""
        from lm_eval_ponder.flops import controller_flops

        projection = None if self.projection is None else int(self.projection.shape[0])
        return controller_flops(self.d_model, self.width, n_evals, projection)

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Pre-temperature logit w.g2 + b (eqs. controller_norm, controller_hidden): z.shape[:-1].

        The input is cast to the controller's dtype/device so a bf16 backbone state can be fed
        directly; the controller itself stays in float32.
        """
        z = z.to(device=self.norm.weight.device, dtype=self.norm.weight.dtype)
        g = self.norm(z)
        if self.projection is not None:
            g = g @ self.projection.T
        g = nn.functional.gelu(self.fc1(g))
        g = nn.functional.gelu(self.fc2(g))
        return self.head(g).squeeze(-1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Continue probability phi(z) (eq. controller_output)."""
        return self.probability(self.logits(z))

    def probability(self, logits: torch.Tensor) -> torch.Tensor:
        """phi from this controller's ``logits`` (callers that keep the logits for
        log-probabilities)."""
        return continue_probability(logits, self.temperature)


def continue_probability(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """phi = sigmoid(logit / T), eq. (controller_output): the one place it is computed."""
    return torch.sigmoid(logits / temperature)


def save_controller(
    controller: PonderController, directory: str | os.PathLike, extra_config: dict | None = None
) -> Path:
    """Write ``controller.safetensors`` and ``config.json`` into ``directory``; return it.

    ``extra_config`` (e.g. the steering layer, tau, k_max, the backbone's name) is merged into
    config.json so a checkpoint says what it was trained for; it must be JSON-serialisable.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sizes = {"d_model": controller.d_model, "width": controller.width}
    config = {
        **sizes,
        **{LEGACY_SIZE_KEYS[k]: v for k, v in sizes.items()},  # for older loaders
        "temperature": controller.temperature,
        "n_params": controller.n_params,
        "n_fixed": controller.n_fixed,
    }
    clash = set(config) & set(extra_config or {})
    if clash:
        raise PonderError(f"extra_config may not override controller fields: {sorted(clash)}")
    config.update(extra_config or {})
    text = json.dumps(config, indent=2, sort_keys=True)  # fail before writing anything
    tensors = {k: v.detach().cpu().contiguous() for k, v in controller.state_dict().items()}
    atomic_write(directory / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp))
    atomic_write(directory / CONFIG_FILE, lambda tmp: Path(tmp).write_text(text + "\n"))
    return directory


@dataclass
class ControllerFile:
    """The keys of a controller's ``config.json`` that loading reads, with their types: read
    through ``lm_eval_ponder.typed``, as the trainer's config is, so a value of the wrong type
    is refused at its key, naming the file (``"ponder": {"tau": "low"}`` ended in a traceback
    from the settings that named neither). Other keys (the training record) are not read."""

    d_model: int | None = None
    width: int | None = None
    hidden_size: int | None = None  # the older size keys
    hidden: int | None = None
    temperature: float = 1.0
    layer: int | None = None
    ponder: PonderConfig = field(default_factory=PonderConfig)
    backbone: dict[str, Any] | None = None


def check_config(config: Any, path: Path) -> None:
    """Refuse a controller ``config.json`` whose read keys do not have their types (an
    unknown key under ``ponder``, a misspelt setting, too), in one line naming ``path`` and
    the key."""
    if not isinstance(config, dict):
        raise PonderError(f"controller config {path} holds a JSON {type(config).__name__}, "
                          "not an object of keys")
    read = {k: v for k, v in config.items() if k in ControllerFile.__dataclass_fields__}
    if not isinstance(read.get("ponder", {}), dict):
        raise PonderError(f"controller config {path}: key 'ponder' must be a mapping of ponder "
                          f"settings (tau, k_max, ...), got {read['ponder']!r}")
    try:
        checked = fill(ControllerFile(), read)
    except WrongType as error:
        raise PonderError(f"controller config {path}: key {error.key!r} must be "
                          f"{describe(error.hint)}, got {error.value!r}") from None
    except PonderError as error:  # a key it does not have
        raise PonderError(f"controller config {path}: {error}") from None
    try:
        checked.ponder.validate()
    except PonderError as error:  # a value of the right type out of its range
        raise PonderError(f"controller config {path}: key 'ponder': {error}") from None


def config_sizes(config: dict) -> tuple[int, int]:
    """(d_model, width) of a controller's config.json: its ``d_model``/``width``, else the keys
    they had before (``hidden_size``/``hidden``); refused where both are present and
    disagree, since either could be the one the weights were trained with."""
    sizes = []
    for key in SIZE_KEYS:
        legacy = LEGACY_SIZE_KEYS[key]
        if key in config and legacy in config and int(config[key]) != int(config[legacy]):
            raise ValueError(f"{key}={config[key]} but {legacy}={config[legacy]}")
        sizes.append(int(config[key] if key in config else config[legacy]))
    return sizes[0], sizes[1]


def load_controller(
    directory: str | os.PathLike, expected_d_model: int | None = None
) -> tuple[PonderController, dict]:
    """Load a checkpoint written by ``save_controller`` (of any version: see the module
    docstring); return (controller in eval mode, config).

    Refuses, with a PonderError, anything that would silently give a wrong controller: missing
    files, a controller trained for another backbone width (``expected_d_model``), or tensors
    whose names/shapes do not match the config.
    """
    directory = Path(directory)
    if directory.is_file():
        raise PonderError(f"controller={directory} is a file: pass the folder that holds "
                          f"{WEIGHTS_FILE} and {CONFIG_FILE} ({directory.parent})")
    if not directory.is_dir():
        raise PonderError(f"controller directory not found: {directory}")
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        if not (directory / name).is_file():
            card = directory / "card.md"  # a committed controller whose weights are in history
            hint = (f" (its {card} says where its weights are kept and how to restore them)"
                    if card.is_file() and name == WEIGHTS_FILE else "")
            raise PonderError(f"controller checkpoint {directory} has no {name}{hint}")
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (ValueError, OSError) as error:
        raise PonderError(
            f"unreadable controller config {directory / CONFIG_FILE}: {error}") from None
    check_config(config, directory / CONFIG_FILE)
    try:
        d_model, width = config_sizes(config)
        temperature = float(config["temperature"])
    except (ValueError, KeyError, TypeError) as error:
        raise PonderError(
            f"unreadable controller config {directory / CONFIG_FILE}: {error}") from None
    if expected_d_model is not None and d_model != expected_d_model:
        raise PonderError(f"controller {directory} was trained for a backbone of width {d_model}, but the "
                          f"backbone has width {expected_d_model}: train a controller for this backbone")
    # The checkpoint overwrites the layers' random initialisation; drawing that from the global
    # generator would shift a seeded run's sampling stream, so that FP-Direct with a controller
    # that halts at once would not sample the tokens FR samples at the same offset and seed.
    with torch.random.fork_rng(devices=[]):
        controller = PonderController(d_model, width, temperature)
    try:
        tensors = load_file(str(directory / WEIGHTS_FILE))
    except Exception as error:  # safetensors raises its own error types on corrupt files
        raise PonderError(
            f"unreadable controller weights {directory / WEIGHTS_FILE}: {error}") from None
    wanted = {k: tuple(v.shape) for k, v in controller.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in tensors.items()}
    if wanted != found:
        raise PonderError(f"controller weights in {directory} do not match its config.json "
                          f"(expected {wanted}, found {found})")
    controller.load_state_dict(tensors, strict=True)
    return controller.eval(), config

"""Training state on disk: one safetensors file, replaced atomically, never pickle.

Everything needed to continue a run bit-for-bit lives in ``checkpoint.safetensors``: the
controller, the optimiser moments, both random generators and the best controller so far as
tensors, and the JSON-serialisable rest (step, reward statistics and weights, the run's config)
in the file's metadata. ``os.replace`` makes the swap atomic: after a crash the file is the old
checkpoint or the new one, never half of each.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import atomic_write

FILE = "checkpoint.safetensors"


def save_checkpoint(path: str | os.PathLike, controller: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, generators: dict[str, torch.Generator],
                    best: dict[str, torch.Tensor] | None, meta: dict[str, Any]) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for name, value in controller.state_dict().items():
        tensors[f"controller.{name}"] = value.detach().cpu().contiguous()
    for name, value in (best or {}).items():
        tensors[f"best.{name}"] = value.detach().cpu().contiguous()
    state = optimizer.state_dict()
    for idx, slots in state["state"].items():
        for slot, value in slots.items():
            tensors[f"opt.{idx}.{slot}"] = torch.as_tensor(value).detach().cpu().contiguous()
    for name, gen in generators.items():
        tensors[f"rng.{name}"] = gen.get_state()
    metadata = {"meta": json.dumps(meta, sort_keys=True, default=str),
                "param_groups": json.dumps(state["param_groups"])}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_checkpoint(path: str | os.PathLike, controller: torch.nn.Module,
                    optimizer: torch.optim.Optimizer,
                    generators: dict[str, torch.Generator]) -> tuple[dict, dict | None]:
    """Restore in place; return (meta, best controller state dict or None)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as error:  # noqa: BLE001 - safetensors has several error types
        raise PonderError(f"unreadable checkpoint {path}: {error}") from error
    meta = json.loads(metadata["meta"])
    controller.load_state_dict({k[len("controller."):]: v for k, v in tensors.items()
                                if k.startswith("controller.")})
    best = {k[len("best."):]: v for k, v in tensors.items() if k.startswith("best.")} or None
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, idx, slot = key.split(".", 2)
            opt_state.setdefault(int(idx), {})[slot] = value
    optimizer.load_state_dict({"state": opt_state,
                               "param_groups": json.loads(metadata["param_groups"])})
    for name, gen in generators.items():
        gen.set_state(tensors[f"rng.{name}"])
    return meta, best


def read_meta(path: str | os.PathLike) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return json.loads((f.metadata() or {})["meta"])

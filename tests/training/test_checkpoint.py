"""The training checkpoint (lm_eval_ponder.training.checkpoint): one safetensors file, no
pickle, that restores controller, Adam moments, generators and the best weights exactly."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.controller import PonderController
from lm_eval_ponder.training import checkpoint as ckpt


def trained_state(seed: int):
    torch.manual_seed(seed)
    controller = PonderController(16, width=8)
    optimizer = torch.optim.Adam(controller.parameters(), lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        controller(torch.randn(4, 16)).sum().backward()
        optimizer.step()
    gen = torch.Generator().manual_seed(seed)
    torch.rand(5, generator=gen)
    return controller, optimizer, gen


def test_round_trip_restores_everything(tmp_path):
    controller, optimizer, gen = trained_state(0)
    best = {k: v.clone() + 1 for k, v in controller.state_dict().items()}
    path = tmp_path / ckpt.FILE
    ckpt.save_checkpoint(path, controller, optimizer, {"grpo": gen}, best, {"step": 7})
    with safe_open(str(path), framework="pt") as f:  # a safetensors file, not a pickle
        assert any(k.startswith("opt.") for k in f.keys())
    fresh, fresh_opt, fresh_gen = trained_state(1)
    meta, loaded_best = ckpt.load_checkpoint(path, fresh, fresh_opt, {"grpo": fresh_gen})
    assert meta == {"step": 7} and ckpt.read_meta(path) == {"step": 7}
    for (name, a), b in zip(controller.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    assert all(torch.equal(best[k], loaded_best[k]) for k in best)
    assert torch.equal(torch.rand(3, generator=gen), torch.rand(3, generator=fresh_gen))
    # the next optimiser step is identical too (Adam moments and step counts restored)
    x = torch.randn(4, 16)
    for c, o in ((controller, optimizer), (fresh, fresh_opt)):
        o.zero_grad()
        c(x).sum().backward()
        o.step()
    for a, b in zip(controller.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


def test_unreadable_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / ckpt.FILE
    path.write_bytes(b"not a checkpoint")
    controller, optimizer, gen = trained_state(0)
    with pytest.raises(PonderError, match="unreadable checkpoint"):
        ckpt.load_checkpoint(path, controller, optimizer, {"grpo": gen})

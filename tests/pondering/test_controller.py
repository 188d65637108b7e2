"""The halting controller: the paper's architecture and budget, and safe checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.controller import (
    MAX_PARAMS,
    PROJECTION_DIM,
    PonderController,
    count_params,
    load_controller,
    save_controller,
)


@pytest.mark.parametrize("d", [576, 896, 1024])
def test_param_budget_without_projection(d: int) -> None:
    controller = PonderController(d)
    assert controller.projection is None and controller.n_fixed == 0
    assert controller.n_params == count_params(d) <= MAX_PARAMS


def test_param_count_by_hand_at_qwen_width() -> None:
    # LayerNorm 2d + (d*512 + 512) + (512*512 + 512) + (512 + 1)
    assert PonderController(896).n_params == 2 * 896 + 896 * 512 + 512 + 512 * 512 + 512 + 513
    assert PonderController(896).n_params == 724_225  # "about 0.72M"


def test_architecture_is_the_papers() -> None:
    c = PonderController(64, width=32)
    assert isinstance(c.norm, torch.nn.LayerNorm) and c.norm.normalized_shape == (64,)
    assert (c.fc1.in_features, c.fc1.out_features) == (64, 32)
    assert (c.fc2.in_features, c.fc2.out_features) == (32, 32)
    assert (c.head.in_features, c.head.out_features) == (32, 1)
    z = torch.randn(5, 64)
    manual = c.head(torch.nn.functional.gelu(c.fc2(torch.nn.functional.gelu(c.fc1(c.norm(z))))))
    assert torch.allclose(c.logits(z), manual.squeeze(-1))


@pytest.mark.parametrize("d", [1025, 2048, 4096])
def test_wide_backbones_use_a_fixed_projection_within_budget(d: int) -> None:
    c = PonderController(d)
    assert c.projection is not None and tuple(c.projection.shape) == (PROJECTION_DIM, d)
    assert not c.projection.requires_grad and "projection" not in dict(c.named_parameters())
    assert c.n_params == count_params(d) <= MAX_PARAMS
    assert c.n_fixed == PROJECTION_DIM * d
    assert torch.equal(c.projection, PonderController(d).projection)  # seeded: reproducible
    assert c(torch.randn(3, d)).shape == (3,)


def test_over_budget_is_refused() -> None:
    with pytest.raises(PonderError, match="budget"):
        PonderController(896, width=1024)
    with pytest.raises(PonderError):
        PonderController(64, temperature=0.0)


def test_shapes_and_range() -> None:
    c = PonderController(64, width=32)
    p = c(torch.randn(2, 3, 64))
    assert p.shape == (2, 3) and bool(((p > 0) & (p < 1)).all())
    assert c(torch.randn(64, dtype=torch.bfloat16)).dtype == torch.float32  # casts its input


def test_temperature_scales_logits() -> None:
    torch.manual_seed(0)
    warm = PonderController(64, width=32, temperature=1.0)
    cold = PonderController(64, width=32, temperature=0.1)
    cold.load_state_dict(warm.state_dict())
    z = torch.randn(16, 64)
    assert torch.allclose(cold.logits(z), warm.logits(z))
    assert torch.allclose(cold(z), torch.sigmoid(warm.logits(z) / 0.1))
    # colder is more decisive: every probability moves away from 1/2
    assert bool(((cold(z) - 0.5).abs() >= (warm(z) - 0.5).abs()).all())


@pytest.mark.parametrize("d", [64, 1100])
def test_save_load_round_trip(tmp_path, d: int) -> None:
    torch.manual_seed(1)
    c = PonderController(d, width=32, temperature=0.5)
    save_controller(c, tmp_path / "ckpt", extra_config={"layer": 1, "tau": 0.2})
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "config.json", "controller.safetensors"]  # no temp files left behind
    loaded, config = load_controller(tmp_path / "ckpt", expected_d_model=d)
    assert config["hidden_size"] == d and config["hidden"] == 32 and config["layer"] == 1
    assert config["d_model"] == d and config["width"] == 32  # the names since issue 40
    assert (loaded.d_model, loaded.width) == (d, 32)
    assert config["n_params"] == c.n_params and loaded.temperature == 0.5
    assert not loaded.training
    z = torch.randn(4, d)
    assert torch.equal(loaded(z), c(z))


def test_loading_leaves_the_seeded_random_stream_alone(tmp_path) -> None:
    """A seeded sampled run must draw the same numbers with or without a controller loaded."""
    save_controller(PonderController(64, width=32), tmp_path)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_controller(tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_load_refuses_other_width(tmp_path) -> None:
    save_controller(PonderController(64, width=32), tmp_path)
    with pytest.raises(PonderError, match=r"64.*576"):
        load_controller(tmp_path, expected_d_model=576)


def test_load_refuses_missing_and_mismatched(tmp_path) -> None:
    with pytest.raises(PonderError, match="not found"):
        load_controller(tmp_path / "nope")
    save_controller(PonderController(64, width=32), tmp_path)
    # tensors that disagree with config.json
    save_file({"fc1.weight": torch.zeros(3, 3)}, str(tmp_path / "controller.safetensors"))
    with pytest.raises(PonderError, match="do not match"):
        load_controller(tmp_path)
    (tmp_path / "controller.safetensors").unlink()
    with pytest.raises(PonderError, match=r"no controller.safetensors$"):
        load_controller(tmp_path)
    # a committed controller whose weights live in git history (the paper form's): the error
    # points at the card that says how to restore them
    (tmp_path / "card.md").write_text("Weights: `git show ...`")
    with pytest.raises(PonderError, match=r"card.md says where its weights are kept"):
        load_controller(tmp_path)


def test_extra_config_cannot_override_sizes(tmp_path) -> None:
    with pytest.raises(PonderError):
        save_controller(PonderController(64, width=32), tmp_path, {"hidden_size": 9})
    assert not (tmp_path / "config.json").exists()
    save_controller(PonderController(64, width=32), tmp_path, {"note": "x"})
    assert json.loads((tmp_path / "config.json").read_text())["note"] == "x"


def test_a_config_from_before_issue_40_loads(tmp_path) -> None:
    """Controllers saved before the sizes were renamed (``hidden_size``/``hidden`` only, as the
    shipped one) load to the same controller; a config whose old and new keys disagree is
    refused rather than guessed."""
    torch.manual_seed(2)
    c = PonderController(64, width=32)
    save_controller(c, tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    old = {k: v for k, v in config.items() if k not in ("d_model", "width")}
    path.write_text(json.dumps(old))
    loaded, _ = load_controller(tmp_path, expected_d_model=64)
    assert (loaded.d_model, loaded.width) == (64, 32)
    z = torch.randn(3, 64)
    assert torch.equal(loaded(z), c(z))
    path.write_text(json.dumps({**config, "width": 16}))
    with pytest.raises(PonderError, match="width=16 but hidden=32"):
        load_controller(tmp_path)


def test_the_shipped_controller_loads() -> None:
    from lm_eval_ponder.resources import shipped_controller_dir

    shipped = shipped_controller_dir("smollm2-135m-instruct")
    if shipped is None:
        pytest.skip("no shipped controller in this install")
    controller, config = load_controller(shipped, expected_d_model=576)
    assert "d_model" not in config  # saved before issue 40: read through the old keys
    assert (controller.d_model, controller.width) == (config["hidden_size"], config["hidden"])

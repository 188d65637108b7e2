"""Device placement without a GPU: everything the steering and pondering path creates or keeps
follows the hidden state's device (issue 35).

Each test runs a real path with the backbone on a stand-in accelerator (``device_guard``: data
on the CPU, reported as another device, and any op mixing the two raises as CUDA does), then
checks that the numbers equal a plain CPU run: the guard must catch misplacement without
changing what is computed. The sweep: FP-Direct generation at prompt and token granularity
through the loop and through ``generation=hf``; the steering hook's decisions without a host
sync; one trainer step of each granularity; steering extraction; a controller saved on one
device and loaded on another.
"""

from __future__ import annotations

import json

import pytest
import torch
from device_guard import ACCELERATOR, DeviceMixError, device_guard
from safetensors.torch import load_file

from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.pondering.controller import PonderController, load_controller, save_controller
from lm_eval_ponder.pondering.dynamics import ControllerDecide, PonderConfig, cumulative_offsets

GREEDY = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": False}
PROMPTS = ["What is 3 + 5?", "Add 12 and 30.", "Hi", "Compute 7 times 8 please, then stop."]


def requests(gen_kwargs: dict) -> list:
    from lm_eval.api.instance import Instance

    return [Instance("generate_until", doc={}, arguments=(p, dict(gen_kwargs)), idx=0)
            for p in PROMPTS]


# ----------------------------------------------------------------------------- the guard itself
def test_guard_refuses_what_cuda_refuses_and_computes_the_rest(monkeypatch):
    """Negative controls: without them a guard that never raises would pass every test below."""
    with device_guard(monkeypatch) as guard:
        x = torch.arange(6.0).to(ACCELERATOR)
        assert x.device == ACCELERATOR and (x * 2 + torch.tensor(1.0)).tolist() == \
            [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]  # a 0-dim CPU scalar may meet it, as on CUDA
        with pytest.raises(DeviceMixError, match="mixes devices"):
            torch.arange(3.0)[torch.tensor([0, 2], device=ACCELERATOR)]  # the issue-35 crash
        with pytest.raises(DeviceMixError, match="mixes devices"):
            x + torch.ones(6)
        with pytest.raises(DeviceMixError, match="generator"):
            torch.multinomial(torch.ones(3, device=ACCELERATOR), 1,
                              generator=torch.Generator().manual_seed(0))
        gen = torch.Generator(device=ACCELERATOR).manual_seed(0)
        assert torch.rand(2, generator=gen, device=gen.device).device == ACCELERATOR
        guard.count_syncs = True
        x.sum().item()
        assert guard.syncs == ["aten._local_scalar_dense.default"]


# ----------------------------------------------------------------------------- pondering
@pytest.fixture(scope="module")
def ctrl_dir(tmp_path_factory):
    """A random controller for the tiny Llama (hidden 64), its continue probability near tau
    (sigmoid(-1.4) = 0.198 against 0.2), so that depths differ between prompts."""
    torch.manual_seed(3)
    controller = PonderController(64, width=32)
    with torch.no_grad():
        controller.head.bias.fill_(-1.4)
    return save_controller(controller, tmp_path_factory.mktemp("ctrl"))


def test_controller_decide_follows_the_state_when_the_step_is_already_there(monkeypatch):
    """The H200 crash: ``Pondering.set_up`` hands over the step vector on the device already, and
    ``ControllerDecide`` moved its offsets only when the step was elsewhere."""
    torch.manual_seed(0)
    controller = PonderController(16, width=8)
    offsets = cumulative_offsets(PonderConfig(k_max=3))
    z, vector = torch.randn(5, 16), torch.randn(16)
    want = ControllerDecide(controller, vector, 2.0, offsets, 0.5)(z)
    with device_guard(monkeypatch):
        decide = ControllerDecide(controller.to(ACCELERATOR), vector.to(ACCELERATOR), 2.0,
                                  offsets, 0.5)
        got = decide(z.to(ACCELERATOR))
        assert got.device == ACCELERATOR and decide.depths[0].device == ACCELERATOR
        assert torch.equal(got.cpu(), want)


def ponder_lm(model_dir, vector_dir, device, **kwargs):
    return PonderLM(pretrained=str(model_dir), steering=str(vector_dir), batch_size=4,
                    device=device, dtype="float32", **kwargs)


@pytest.mark.parametrize("generation", ["loop", "hf"])
@pytest.mark.parametrize("granularity", ["prompt", "token"])
def test_fp_direct_generates_on_the_accelerator(tiny_model_dir, tiny_vector_dir, ctrl_dir,
                                                monkeypatch, granularity, generation):
    """FP-Direct (a controller) on the stand-in device: same texts and accounting as on the
    CPU, and every model, controller and steering tensor on the device."""
    args = dict(controller=str(ctrl_dir), granularity=granularity, generation=generation)
    want = ponder_lm(tiny_model_dir, tiny_vector_dir, "cpu", **args) \
        .generate_until(requests(GREEDY))
    with device_guard(monkeypatch):
        lm = ponder_lm(tiny_model_dir, tiny_vector_dir, "meta", **args)
        assert lm.device == ACCELERATOR and lm.controller.head.weight.device == ACCELERATOR
        got = lm.generate_until(requests(GREEDY))
    assert got == want
    assert [g.stats for g in got] == [w.stats for w in want]
    assert len({w.stats["ponder_steps"] for w in want}) > 1 or granularity == "token"


@pytest.mark.parametrize("granularity", ["prompt", "token"])
def test_steering_decisions_never_wait_for_the_host(tiny_model_dir, tiny_vector_dir, ctrl_dir,
                                                    monkeypatch, granularity):
    """Inside the steering hook (controller call, halting, offsets, the add) no value of a
    device tensor is read back: the guard counts what ``set_sync_debug_mode("error")`` would
    refuse on a GPU. The loop around it may read tokens; the hook may not."""
    from lm_eval_ponder.backbone import decoder_layers
    with device_guard(monkeypatch) as guard:
        lm = ponder_lm(tiny_model_dir, tiny_vector_dir, "meta", controller=str(ctrl_dir),
                       granularity=granularity)
        steer_layer = lm.generator.steering.layer
        layer = decoder_layers(lm.model)[steer_layer]
        # forward hooks run in registration order: this one before the steering hook (added
        # per generation call), the forward-pre hook clears the flag before the next layer
        enter = layer.register_forward_hook(lambda *a: setattr(guard, "count_syncs", True))
        after = decoder_layers(lm.model)[steer_layer + 1].register_forward_pre_hook(
            lambda *a: setattr(guard, "count_syncs", False))
        try:
            lm.generate_until(requests(GREEDY))
        finally:
            enter.remove(), after.remove()
        guard.count_syncs = False
        assert guard.syncs == []
        guard.count_syncs = True  # negative control: a read-back here is seen
        torch.zeros(1, device=ACCELERATOR).item()
        assert guard.syncs


# ----------------------------------------------------------------------------- early exit
def early_exit_lm(model_dir, device, **kwargs):
    return PonderLM(pretrained=str(model_dir), batch_size=4, device=device, dtype="float32",
                    controller="none", early_exit=0.6, max_rows=2, **kwargs)


@pytest.mark.parametrize("generation", ["loop", "hf"])
def test_early_exit_generates_on_the_accelerator(sharp_model_dir, monkeypatch, generation):
    """Early exit on the stand-in device (rows leaving and joining in the loop): the CPU's
    texts, exit layers and FLOPs."""
    want = early_exit_lm(sharp_model_dir, "cpu", generation=generation).generate_until(
        requests(GREEDY))
    with device_guard(monkeypatch):
        got = early_exit_lm(sharp_model_dir, "meta", generation=generation).generate_until(
            requests(GREEDY))
    assert got == want
    assert [g.stats for g in got] == [w.stats for w in want]
    assert len({w.stats["exit_layer"] for w in want}) > 1


def test_early_exit_tests_never_wait_for_the_host(sharp_model_dir, monkeypatch):
    """From the first decoder layer to the final norm (every exit test, the masks, the resets
    of exited rows) no value of a device tensor is read back."""
    from lm_eval_ponder.backbone import decoder_layers
    with device_guard(monkeypatch) as guard:
        lm = early_exit_lm(sharp_model_dir, "meta")
        on = decoder_layers(lm.model)[0].register_forward_pre_hook(
            lambda *a: setattr(guard, "count_syncs", True))
        off = lm.model.get_decoder().register_forward_hook(
            lambda *a: setattr(guard, "count_syncs", False))
        try:
            texts = lm.generate_until(requests(GREEDY))
        finally:
            on.remove(), off.remove()
        guard.count_syncs = False
        assert guard.syncs == []
        assert any(t.stats["exit_layer"] < 4 for t in texts)  # the tests did exit rows


# ----------------------------------------------------------------------------- training
def train_args(model_dir, vector_dir, out, granularity: str) -> list[str]:
    return ["--output", str(out), "--pretrained", str(model_dir), "--steering", str(vector_dir),
            "--rollout.prompts", "{arith_ponder: 4, gsm8k_ponder: 2}",
            "--rollout.max_completion_length", "4", "--rollout.apply_chat_template", "false",
            "--ponder.k_max", "2", "--ponder.alpha0", "0.5", "--grpo.max_steps", "1",
            "--logging_steps", "1", "--grpo.prompts_per_step", "2",
            "--grpo.num_generations", "2", "--grpo.t1", "0", "--grpo.t2", "1",
            "--grpo.teacher_min", "1", "--grpo.teacher_max", "2",
            "--controller_hidden", "16", "--val_fraction", "0.3", "--dtype", "float32",
            "--ponder.granularity", granularity]


@pytest.mark.parametrize("granularity", ["prompt", "token"])
def test_a_trainer_step_runs_on_the_accelerator(tiny_model_dir, tiny_vector_dir, tmp_path,
                                                monkeypatch, granularity):
    """One GRPO step with the backbone on the device. Prompt level draws nothing on the
    device, so its controller equals the CPU run's (to float rounding: the stand-in runs
    attention through another kernel choice, which moves perplexities in the 7th digit);
    token level samples its halting depths with a device generator, so it is checked to run
    and load."""
    from lm_eval_ponder.training.cli import main

    assert main(train_args(tiny_model_dir, tiny_vector_dir, tmp_path / "cpu", granularity)
                + ["--device", "cpu"]) == 0
    with device_guard(monkeypatch):
        assert main(train_args(tiny_model_dir, tiny_vector_dir, tmp_path / "acc", granularity)
                    + ["--device", "meta"]) == 0
    cpu = load_file(str(tmp_path / "cpu" / "controller.safetensors"))
    acc = load_file(str(tmp_path / "acc" / "controller.safetensors"))
    assert cpu.keys() == acc.keys()
    if granularity == "prompt":
        assert all(torch.allclose(cpu[k], acc[k], rtol=1e-4, atol=1e-6) for k in cpu)
    config = json.loads((tmp_path / "acc" / "config.json").read_text())
    assert config["ponder"]["granularity"] == granularity
    load_controller(tmp_path / "acc", expected_d_model=64)


# ----------------------------------------------------------------------------- steering
def test_steering_extraction_on_the_accelerator(monkeypatch):
    """The paper's extraction with the backbone on the device gives the CPU's vector (to float
    rounding: the stand-in's attention takes another kernel)."""
    from conftest import QUESTIONS, _model, _tokenizer

    from lm_eval_ponder.steering import extraction as E

    tok = _tokenizer()
    model = _model(len(tok))
    want = E.extract_paper(model, tok, QUESTIONS, batch_size=2, progress=False)
    with device_guard(monkeypatch):
        model.to(ACCELERATOR)
        got = E.extract_paper(model, tok, QUESTIONS, batch_size=2, progress=False)
    assert got.vectors.device.type == "cpu"
    assert torch.allclose(got.vectors, want.vectors, rtol=1e-4, atol=1e-5)
    assert got.meta["residual_norm"] == pytest.approx(want.meta["residual_norm"], rel=1e-5)


# ----------------------------------------------------------------------------- checkpoints
def test_controller_saved_on_one_device_loads_on_another(tmp_path, monkeypatch):
    """Saved from the device, loaded on the CPU (and back): the same weights and decisions."""
    torch.manual_seed(1)
    controller = PonderController(16, width=8)
    z = torch.randn(4, 9, 16)
    want = controller(z)
    with device_guard(monkeypatch):
        save_controller(controller.to(ACCELERATOR), tmp_path / "c")
        loaded, _ = load_controller(tmp_path / "c", expected_d_model=16)
        assert all(p.device.type == "cpu" for p in loaded.parameters())
        on_device = loaded.to(ACCELERATOR)(z.to(ACCELERATOR))
        assert torch.equal(on_device.cpu(), want.detach())
    again, _ = load_controller(tmp_path / "c")
    assert torch.equal(again(z), want)

"""The prompt-level training loop (lm_eval_ponder.training.loop) run end to end by ``python -m
lm_eval_ponder.train`` on the tiny Llama: outputs, logs, seeds, resuming after an interruption,
refusing another config's checkpoint, two processes, and loading the result in ``--model
ponder``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import lm_eval_ponder.training.grpo as grpo
from lm_eval_ponder.errors import USAGE_ERROR
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.pondering.controller import load_controller
from lm_eval_ponder.training.cli import main


def args(model_dir, vector_dir, out, *extra):
    return ["--output", str(out), "--pretrained", str(model_dir), "--steering", str(vector_dir),
            "--rollout.prompts", "{arith_ponder: 6, gsm8k_ponder: 2}",
            "--rollout.max_completion_length", "5", "--rollout.apply_chat_template", "false",
            "--ponder.k_max", "2", "--ponder.alpha0", "0.5", "--grpo.max_steps", "30",
            "--logging_steps", "10", "--grpo.prompts_per_step", "2", "--grpo.t1", "5",
            "--grpo.t2", "15", "--grpo.teacher_min", "1", "--grpo.teacher_max", "2",
            "--controller_hidden", "16", "--val_fraction", "0.3",
            "--recipe", "grpo-2026-12", *extra]  # the GRPO loop's machinery; the default below


@pytest.fixture(scope="module")
def run_a(tiny_model_dir, tiny_vector_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "a"
    assert main(args(tiny_model_dir, tiny_vector_dir, out)) == 0
    return out


def weights(directory):
    return load_file(str(directory / "controller.safetensors"))


def test_outputs_config_log_and_card(run_a):
    controller, config = load_controller(run_a, expected_d_model=64)
    assert controller.n_params < 1_000_000
    assert config["ponder"]["k_max"] == 2 and config["seed"] == 0
    assert config["backbone"]["steering_sha256"] and config["layer"] == 2
    assert config["data"]["rollout_manifest"]["identity"]["prompts_sha256"]
    assert config["train_config"]["grpo"]["learning_rate"] == 5e-4
    lines = [json.loads(x) for x in (run_a / "train_log.jsonl").read_text().splitlines()]
    logs = [x for x in lines if "alert" not in x]
    assert [x["step"] for x in logs] == [10, 20, 30]
    for key in ("accuracy", "flops_mean", "flops_std", "depth_hist", "R_acc", "R_flops",
                "R_comp", "R_qual", "R_rep", "balance_ratio", "weights", "val_greedy",
                "advantage_abs", "entropy", "gate_drop_comp", "gate_drop_qual",
                "temperature"):
        assert key in logs[-1]
    assert [x["stage"] for x in logs] == [2, 3, 3]
    card = (run_a / "card.md").read_text()
    assert "No test split is used" in card and "held-out" in card


def test_paper_training_defaults_are_recorded(run_a):
    """The defaults of issue 38: temperature annealed 1 -> 0.1 (the controller ships at 0.1),
    gates with theta_comp = R_comp(setup + computation), Adam clipped at 1.0 (Algorithm 1's plain
    step diverged on a real cache); the card says each, and the log shows each gate's drops
    (none before stage 3) and the temperature falling."""
    controller, config = load_controller(run_a, expected_d_model=64)
    assert controller.temperature == pytest.approx(0.1)
    grpo_cfg = config["train_config"]["grpo"]
    assert (grpo_cfg["optim"], grpo_cfg["max_grad_norm"], grpo_cfg["group_by"]) == \
        ("adam", 1.0, "prompt")
    assert grpo_cfg["theta_comp"] == 0.5 and grpo_cfg["theta_qual"] == grpo.QUALITY_CUT
    assert config["train_config"]["controller_temperature_end"] == 0.1
    logs = [json.loads(x) for x in (run_a / "train_log.jsonl").read_text().splitlines()
            if "alert" not in x]
    assert logs[0]["gate_drop_comp"] == logs[0]["gate_drop_qual"] == 0.0  # stage 2 window
    assert all(0.0 <= x["gate_drop_comp"] <= 1.0 for x in logs)
    temps = [x["temperature"] for x in logs]
    assert temps == sorted(temps, reverse=True) and temps[-1] == pytest.approx(0.1)
    card = (run_a / "card.md").read_text()
    assert "annealed geometrically to 0.1" in card and "Adam on the batch mean" in card
    assert "clipped at 1.0" in card and "R_comp >= 0.5" in card


def halting_entropy(directory, states):
    """Mean Bernoulli entropy of a controller's first halting decision (on z_0) over the cache's
    prompts, at the temperature it ships with."""
    controller, _ = load_controller(directory)
    with torch.no_grad():
        p = controller(states).clamp(1e-7, 1 - 1e-7)
    return float(-(p * p.log() + (1 - p) * (1 - p).log()).mean())


def test_annealed_controller_halts_with_less_entropy(run_a, tiny_model_dir, tiny_vector_dir,
                                                     tmp_path):
    """A controller trained with the anneal (T 1 -> 0.1) decides more sharply than the same run
    at a constant T = 1: lower mean halting entropy on the cache's prompts."""
    out = tmp_path / "constant"
    assert main(args(tiny_model_dir, tiny_vector_dir, out, "--cache_dir",
                     str(run_a / "rollouts"), "--controller_temperature_end", "null")) == 0
    assert load_controller(out)[0].temperature == 1.0
    assert "constant 1" in (out / "card.md").read_text()
    states = load_file(str(run_a / "rollouts" / "states.safetensors"))["z0"].float()
    assert halting_entropy(run_a, states) < halting_entropy(out, states)


def test_type_groups_train_end_to_end(run_a, tiny_model_dir, tiny_vector_dir, tmp_path):
    """group_by=type runs through the loop with the cache's prompts' types (arith levels and
    GSM8K) and says so on the card."""
    out = tmp_path / "types"
    assert main(args(tiny_model_dir, tiny_vector_dir, out, "--cache_dir",
                     str(run_a / "rollouts"), "--grpo.group_by", "type",
                     "--grpo.max_steps", "20")) == 0
    assert "groups: per problem type" in (out / "card.md").read_text()


def test_same_seed_same_controller(run_a, tiny_model_dir, tiny_vector_dir, tmp_path):
    out = tmp_path / "b"
    main(args(tiny_model_dir, tiny_vector_dir, out, "--cache_dir", str(run_a / "rollouts")))
    a, b = weights(run_a), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    out_c = tmp_path / "c"
    main(args(tiny_model_dir, tiny_vector_dir, out_c, "--cache_dir", str(run_a / "rollouts"),
              "--seed", "1"))
    c = weights(out_c)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_interrupted_run_resumes_to_the_same_controller(run_a, tiny_model_dir, tiny_vector_dir,
                                                        tmp_path, monkeypatch):
    out = tmp_path / "interrupted"
    argv = args(tiny_model_dir, tiny_vector_dir, out, "--cache_dir", str(run_a / "rollouts"))
    real_step = grpo.GRPOTrainer.step

    def dying_step(self, t, *a, **k):
        if t == 23:
            raise KeyboardInterrupt  # after the step-20 checkpoint, mid-window
        return real_step(self, t, *a, **k)

    monkeypatch.setattr(grpo.GRPOTrainer, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    assert not (out / "controller.safetensors").exists()
    monkeypatch.setattr(grpo.GRPOTrainer, "step", real_step)
    main(argv)
    a, b = weights(run_a), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()
             if "alert" not in x]
    assert steps == [10, 20, 30]  # nothing lost, nothing logged twice


def test_checkpoint_of_another_config_is_refused(run_a, tiny_model_dir, tiny_vector_dir, capsys):
    assert main(args(tiny_model_dir, tiny_vector_dir, run_a, "--grpo.learning_rate", "0.01")) == USAGE_ERROR
    assert "another config" in capsys.readouterr().err


def test_model_runs_with_the_trained_settings(run_a, tiny_model_dir, tiny_vector_dir):
    lm = PonderLM(pretrained=str(tiny_model_dir), steering=str(tiny_vector_dir),
                  controller=str(run_a), batch_size=2, device="cpu")
    assert lm.ponder_config.k_max == 2 and lm.ponder_config.alpha0 == 0.5  # from config.json
    assert PonderLM(pretrained=str(tiny_model_dir), steering=str(tiny_vector_dir),
                    controller=str(run_a), k_max=1, batch_size=2,
                    device="cpu").ponder_config.k_max == 1  # the user's value wins


def test_two_process_data_parallel_run(run_a, tiny_model_dir, tiny_vector_dir, tmp_path):
    """torchrun with two CPU processes (gloo): each rank generates its share of the cache,
    gradients are averaged, and the ranks end with identical controllers (checked in run)."""
    from conftest import train_two_processes

    out = tmp_path / "dp"
    argv = args(tiny_model_dir, tiny_vector_dir, out, "--grpo.prompts_per_step", "4")
    train_two_processes(argv)
    for rank in (0, 1):
        assert sum(f.stat().st_size
                   for f in (out / "rollouts").glob(f"rollouts.rank{rank}.*jsonl")) > 0
    controller, config = load_controller(out)
    assert config["train_config"]["grpo"]["prompts_per_step"] == 4


def test_bfloat16_backbone_trains_a_float32_controller(tiny_model_dir, tiny_vector_dir, tmp_path):
    """The backbone in bf16 (the default where it is native): states reach the float32
    controller, and the card and config say which dtype the controller was trained against."""
    out = tmp_path / "bf16"
    assert main(args(tiny_model_dir, tiny_vector_dir, out, "--dtype", "bfloat16",
                     "--grpo.max_steps", "10")) == 0
    controller, config = load_controller(out)
    assert config["backbone"]["dtype"] == "bfloat16"
    assert all(p.dtype == torch.float32 for p in controller.parameters())
    assert "bfloat16" in (out / "card.md").read_text()


def test_card_without_held_out_figures_says_so_instead_of_an_empty_table():
    """A token-level run with val_fraction 0 evaluates nothing while training: its card points
    to lm_eval rather than printing a table with no rows."""
    from lm_eval_ponder.training.config import TrainConfig
    from lm_eval_ponder.training.loop import card

    cfg = TrainConfig(output="x")
    cfg.ponder.granularity = "token"
    identity = {"backbone_name": "tiny", "backbone": "b", "backbone_sha256": "0", "hidden_size": 8,
                "dtype": "float32", "steering_dir": "v", "steering_sha256": "1", "layer": 1,
                "steering_scale": 1.0}
    extra = {"cost": {"generations": 4, "train_wall_s": 1.0}, "data": {"n_train": 4, "n_val": 0},
             "figures": {}, "ponder": {}, "selected_step": 2}
    text = card(cfg, identity, extra)
    assert "No inference-time figures" in text and "| prompts |" not in text
    extra["figures"] = {"train": {"accuracy": 0.5, "gen_tokens": 3.0, "flops": 1.0, "depth": 1.0}}
    assert "| train | 0.500 |" in card(cfg, identity, extra)


def test_the_default_recipe_fits_the_expected_reward_end_to_end(run_a, tiny_model_dir,
                                                                 tiny_vector_dir, tmp_path):
    """The shipped recipe (no --recipe): the expected-reward trainer on the same cache, its
    objective and trainer on the card, its log lines the held-out readout's."""
    argv = [a for a in args(tiny_model_dir, tiny_vector_dir, tmp_path / "d", "--cache_dir",
                            str(run_a / "rollouts")) if a not in ("--recipe", "grpo-2026-12")]
    assert main(argv) == 0
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["train_config"]["algorithm"] == "expected"
    assert config["train_config"]["reward"]["objective"] == "priced"
    logs = [json.loads(x) for x in (tmp_path / "d" / "train_log.jsonl").read_text().splitlines()]
    assert logs and all({"train", "val", "best_step"} <= set(x) for x in logs)
    card = (tmp_path / "d" / "card.md").read_text()
    assert "accuracy minus 1 per 1,000 generated tokens" in card
    assert "recipe default" in card and "GRPO" not in card

"""Token-level training on online rollouts (lm_eval_ponder.training.online): rollouts are
exactly what ``--model ponder`` generates, and ``python -m lm_eval_ponder.train
--ponder.granularity token`` runs, resumes, runs on two processes and loads. The update itself
(``GRPOTrainer.step``) is tested in test_grpo.py."""

from __future__ import annotations

import json

import pytest
import torch
from lm_eval.api.instance import Instance
from safetensors.torch import load_file

import lm_eval_ponder.training.grpo as grpo
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.pondering.controller import PonderController, save_controller
from lm_eval_ponder.pondering.dynamics import PonderConfig, cumulative_offsets
from lm_eval_ponder.training.cli import main
from lm_eval_ponder.training.config import parse_args
from lm_eval_ponder.training.grpo import GRPOConfig, GRPOTrainer
from lm_eval_ponder.training.online import OnlineEnvironment
from lm_eval_ponder.training.rollouts import Prompt

PONDER = dict(k_max=2, alpha0=0.5, alpha_start=-0.5, beta=0.3)
OFFSETS = cumulative_offsets(PonderConfig(**PONDER))


def fixed_controller(bias: float) -> PonderController:
    """phi = sigmoid(bias) on every state: halts at once (bias << 0) or never (bias >> 0)."""
    ctrl = PonderController(64, width=16)
    with torch.no_grad():
        for p in ctrl.parameters():
            p.zero_()
        ctrl.head.bias.fill_(bias)
    return ctrl


@pytest.fixture(scope="module")
def generator(tiny_model_dir, tiny_vector_dir):
    return PonderLM(pretrained=str(tiny_model_dir), steering=str(tiny_vector_dir), batch_size=4,
                    device="cpu", alpha=float(OFFSETS[0])).generator


def step_of(generator) -> torch.Tensor:
    """The steering step (scale x vector) the trainer's controller moves along."""
    steering = generator.require_steering()
    return steering.scale * steering.vector


PROMPT = Prompt("k0", "arith_ponder", "0", 1, "Q: 2+3=?\nA:", "5", "numeric")


@pytest.mark.parametrize("bias,depth", [(-30.0, 0), (30.0, 2)])
def test_rollout_is_what_a_token_level_controller_generates(generator, tiny_model_dir, tiny_vector_dir,
                                                            tmp_path, bias, depth):
    """An online rollout driven by the greedy policy of a controller that always halts at
    `depth` yields the same text, tokens and FLOPs as `--model ponder` with that controller at
    granularity=token, and the teacher policy at that depth yields the same text again."""
    path = save_controller(fixed_controller(bias), tmp_path / "c")
    run = PonderLM(pretrained=str(tiny_model_dir), steering=str(tiny_vector_dir), batch_size=4,
                   device="cpu", controller=str(path), granularity="token", **PONDER)
    gen = {"until": [], "max_gen_toks": 6, "do_sample": False}
    [want] = run.generate_until([Instance("generate_until", {}, (PROMPT.context, gen), 0)],
                                disable_tqdm=True)
    cfg = parse_args(["--output", str(tmp_path / "o"), "--rollout.max_completion_length", "6",
                      "--ponder.k_max", "2", "--controller_hidden", "16"])
    ctrl = fixed_controller(bias)
    trainer = GRPOTrainer(ctrl, step_of(generator), OFFSETS, 0.2,
                          GRPOConfig(num_generations=2), seed=0)
    env = OnlineEnvironment(generator, cfg, ctrl, prompts=[PROMPT])
    greedy = trainer.token_policy(torch.zeros(1, dtype=torch.bool),
                                   torch.zeros(1, dtype=torch.long), greedy=True)
    [rec], [(states, depths)] = env.rollout([0], 1, greedy)
    assert rec["text"] == str(want) and rec["gen_tokens"] == want.stats["gen_tokens"]
    assert rec["flops"] == pytest.approx(want.stats["flops"], rel=1e-9)
    assert depths.tolist() == [depth] * len(depths) and len(states) == len(depths)
    teacher = trainer.token_policy(torch.ones(2, dtype=torch.bool),
                                    torch.full((2,), depth, dtype=torch.long))
    recs, _ = env.rollout([0], 2, teacher)
    assert [r["text"] for r in recs] == [str(want)] * 2


def test_one_batched_rollout_equals_each_prompt_alone(generator, tmp_path):
    """A step's prompts of different lengths go through one left-padded generation; each
    row's text, counts and FLOPs are what that prompt generates on its own."""
    cfg = parse_args(["--output", str(tmp_path / "o"), "--rollout.max_completion_length", "6",
                      "--ponder.k_max", "2", "--controller_hidden", "16"])
    ctrl = fixed_controller(30.0)
    trainer = GRPOTrainer(ctrl, step_of(generator), OFFSETS, 0.2,
                          GRPOConfig(num_generations=2), seed=0)
    long = Prompt("k1", "arith_ponder", "1", 2, "Q: what is 12 + 30 + 7 + 1?\nA:", "50",
                  "numeric")
    env = OnlineEnvironment(generator, cfg, ctrl, prompts=[PROMPT, long])

    def teacher(rows, depths):
        return trainer.token_policy(torch.ones(rows, dtype=torch.bool), torch.tensor(depths))

    both, trajs = env.rollout([1, 0], 2, teacher(4, [1, 1, 2, 2]))
    alone = env.rollout([1], 2, teacher(2, [1, 1]))[0] + env.rollout([0], 2, teacher(2, [2, 2]))[0]
    keys = ("key", "text", "gen_tokens", "prompt_tokens", "flops")
    assert [[r[k] for k in keys] for r in both] == [[r[k] for k in keys] for r in alone]
    assert both[0]["prompt_tokens"] > both[2]["prompt_tokens"]  # really of different lengths
    assert [d.unique().tolist() for _, d in trajs] == [[1], [1], [2], [2]]


def args(model_dir, vector_dir, out, *extra):
    return ["--output", str(out), "--pretrained", str(model_dir), "--steering", str(vector_dir),
            "--ponder.granularity", "token",
            "--rollout.prompts", "{arith_ponder: 4, gsm8k_ponder: 1}",
            "--rollout.max_completion_length", "4", "--rollout.apply_chat_template", "false",
            "--ponder.k_max", "2", "--ponder.alpha0", "0.5", "--grpo.max_steps", "6",
            "--logging_steps", "2", "--grpo.prompts_per_step", "2", "--grpo.num_generations", "2",
            "--grpo.t1", "2", "--grpo.t2", "4", "--controller_hidden", "16",
            "--grpo.teacher_min", "1", "--grpo.teacher_max", "2",
            "--val_fraction", "0.3", *extra]


@pytest.fixture(scope="module")
def token_run(tiny_model_dir, tiny_vector_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("token") / "a"
    assert main(args(tiny_model_dir, tiny_vector_dir, out)) == 0
    return out


def test_token_training_writes_a_loadable_controller(token_run, tiny_model_dir, tiny_vector_dir):
    config = json.loads((token_run / "config.json").read_text())
    assert config["ponder"]["granularity"] == "token"
    assert config["cost"]["generations"] == 6 * 2 * 2
    logs = [json.loads(x) for x in (token_run / "train_log.jsonl").read_text().splitlines()]
    logs = [x for x in logs if "alert" not in x]
    assert [x["step"] for x in logs] == [2, 4, 6] and [x["stage"] for x in logs] == [2, 3, 3]
    for key in ("accuracy", "flops_mean", "depth_hist", "R_acc", "R_flops", "balance_ratio",
                "val_greedy"):
        assert key in logs[-1]
    assert logs[-1]["advantage_abs"] >= 0 and logs[-1]["entropy"] > 0  # logged, as at prompt level
    assert "No test split is used" in (token_run / "card.md").read_text()
    lm = PonderLM(pretrained=str(tiny_model_dir), steering=str(tiny_vector_dir),
                  controller=str(token_run), batch_size=2, device="cpu")
    assert lm.ponder_config.granularity == "token"


def test_token_training_resumes_to_the_same_controller(token_run, tiny_model_dir,
                                                       tiny_vector_dir, tmp_path, monkeypatch):
    out = tmp_path / "interrupted"
    real = grpo.GRPOTrainer.step

    def dying(trainer, t, *a, **k):
        if t == 3:
            raise KeyboardInterrupt  # after the step-2 checkpoint, mid-window
        return real(trainer, t, *a, **k)

    monkeypatch.setattr(grpo.GRPOTrainer, "step", dying)
    with pytest.raises(KeyboardInterrupt):
        main(args(tiny_model_dir, tiny_vector_dir, out))
    monkeypatch.setattr(grpo.GRPOTrainer, "step", real)
    main(args(tiny_model_dir, tiny_vector_dir, out))
    a = load_file(str(token_run / "controller.safetensors"))
    b = load_file(str(out / "controller.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()
             if "alert" not in x]
    assert steps == [2, 4, 6]


def test_token_training_two_processes(tiny_model_dir, tiny_vector_dir, tmp_path):
    """torchrun with two CPU processes: each rank generates its prompts' answers, the first
    step's perplexity reference and every step's reward statistics come from the whole batch,
    and the ranks end with identical controllers (``run`` checks it and fails otherwise)."""
    from conftest import train_two_processes

    out = tmp_path / "dp"
    argv = args(tiny_model_dir, tiny_vector_dir, out, "--grpo.max_steps", "2", "--grpo.t1", "1",
                "--grpo.t2", "2")
    train_two_processes(argv)
    config = json.loads((out / "config.json").read_text())
    assert config["ponder"]["granularity"] == "token" and config["cost"]["generations"] == 8

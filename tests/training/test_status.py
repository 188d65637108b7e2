"""What a training run shows for itself (lm_eval_ponder.training.status): the line a finished
run prints, and where an interrupted one stands on disk."""

from __future__ import annotations

import json
import shlex
import sys

import torch

from lm_eval_ponder.training import checkpoint as ckpt
from lm_eval_ponder.training.config import TrainConfig
from lm_eval_ponder.training.status import interrupted_message, stopped_at, summary_line


def test_summary_names_the_controller_its_held_out_figures_and_the_wall(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "figures": {"val": {"accuracy": 0.3125, "gen_tokens": 101.25, "flops": 2.6e10,
                            "depth": 1.5, "score": 0.12345}},
        "data": {"n_val": 16}, "cost": {"cache_wall_s": 2758.0, "train_wall_s": 59.4}}))
    assert summary_line(tmp_path, 2840.2) == (
        f"controller: {tmp_path} (controller.safetensors, config.json, card.md); held-out "
        "(16 prompts): score 0.1235, accuracy 0.312, 101.2 tokens, 26 GFLOPs, mean depth 1.50; "
        "wall 47:20 (rollout cache 45:58, GRPO 0:59)")
    # issue 66: after a resume the phases (all attempts) no longer sit inside this run's wall
    assert summary_line(tmp_path, 20.0).endswith(
        "wall 0:20 in this run; rollout cache 45:58, GRPO 0:59 over all its attempts")
    (tmp_path / "config.json").write_text(json.dumps({"figures": {}, "cost": {}}))
    assert "no held-out prompts (val_fraction 0)" in summary_line(tmp_path, 5)


def test_where_an_interrupted_run_stands(tmp_path):
    from lm_eval_ponder.pondering.controller import PonderController

    cfg = TrainConfig(output=str(tmp_path / "run"))
    assert stopped_at(cfg) == f"stopped before anything was kept in {tmp_path / 'run'}"
    (tmp_path / "run").mkdir()
    controller = PonderController(8, 4)
    ckpt.save_checkpoint(tmp_path / "run" / ckpt.FILE, controller,
                         torch.optim.Adam(controller.parameters()), {"g": torch.Generator()},
                         None, {"step": 200})
    text = interrupted_message(cfg, ["--output", "my run"])
    assert text.startswith(f"GRPO stopped after its checkpoint at step 200 of "
                           f"{cfg.grpo.max_steps}")
    assert text.endswith(f"Resume with: {shlex.quote(sys.executable)} -m lm_eval_ponder.train "
                         "--output 'my run'")  # the interpreter's full path (issue 73)

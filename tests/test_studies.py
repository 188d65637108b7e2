"""The study scripts under ``studies/`` (whose figures go into docs/results/) and the analysis
they share (``studies/studylib``): a wrong helper there would silently print a wrong number, and
a user's mistake must end in one line, not a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO

from lm_eval_ponder.pondering.dynamics import halting_depth
from lm_eval_ponder.training.grpo import sample_depths

STUDIES = REPO / "studies"
sys.path.insert(0, str(STUDIES))
import adaptation  # noqa: E402


@pytest.fixture
def probabilities():
    return torch.rand(6, 5, generator=torch.Generator().manual_seed(0))


def test_sampled_depths_are_the_training_policy(probabilities):
    """``depth_weights(p, "sampled")`` is the distribution GRPO's sampler draws from."""
    w = adaptation.depth_weights(probabilities.numpy().astype(float), "sampled")
    assert np.allclose(w.sum(axis=1), 1)
    gen = torch.Generator().manual_seed(1)
    draws = sample_depths(probabilities.repeat_interleave(20000, dim=0), gen).view(6, 20000)
    freq = np.stack([np.bincount(d, minlength=5) / 20000 for d in draws.numpy()])
    assert np.abs(freq - w).max() < 0.02


def test_threshold_rule_is_the_inference_rule(probabilities):
    """``depth_weights(p, "tau=0.2")`` is one-hot at the depth ``--model ponder`` halts at."""
    w = adaptation.depth_weights(probabilities.numpy().astype(float), "tau=0.2")
    assert np.array_equal(w.argmax(axis=1), halting_depth(probabilities, 0.2).numpy())
    assert np.array_equal(w.sum(axis=1), np.ones(6))


def test_arms_train_as_they_say(tmp_path):
    """Issue 13's arms keep the settings they were trained with (Adam clipped at 1, constant
    T, gates at 0) whatever the trainer's defaults; issue 38's arms switch exactly one thing
    each: the anneal, the gates, the optimiser (Adam as issue 13 ran it)."""
    old = adaptation.arm_config("ours", 4, "balanced-lr5e-5", 0, 10, tmp_path)
    assert (old.grpo.optim, old.grpo.max_grad_norm, old.controller_temperature_end,
            old.grpo.theta_comp, old.grpo.theta_qual, old.grpo.learning_rate) == \
        ("adam", 1.0, None, 0.0, 0.0, 5e-5)
    paper = adaptation.arm_config("ours", 4, "anneal1-gates1-sgd", 0, 10, tmp_path)
    assert (paper.grpo.optim, paper.grpo.max_grad_norm, paper.controller_temperature_end,
            paper.grpo.quality_gates, paper.grpo.theta_comp) == ("sgd", None, 0.1, True, 0.5)
    off = adaptation.arm_config("ours", 4, "anneal0-gates0-adam", 0, 10, tmp_path)
    assert (off.grpo.optim, off.grpo.max_grad_norm, off.controller_temperature_end,
            off.grpo.quality_gates) == ("adam", 1.0, None, False)
    assert len(adaptation.PAPER_ARMS) == 8
    typed = adaptation.arm_config("ours", 4, "anneal1-gates1-sgd-types", 0, 10, tmp_path)
    assert (typed.grpo.group_by, typed.grpo.optim, typed.grpo.max_grad_norm) == \
        ("type", "sgd", None)
    # issue 52: the recipe as written differs from issue 38's in exactly stage 1, the
    # threshold in training and the anneal's schedule
    for opt, clip in (("sgd", None), ("adam", 1.0)):
        written = adaptation.arm_config("ours", 4, f"written-{opt}", 0, 10, tmp_path)
        recipe = adaptation.arm_config("ours", 4, f"anneal1-gates1-{opt}", 0, 10, tmp_path)
        assert (written.grpo.optim, written.grpo.max_grad_norm, written.grpo.quality_gates,
                written.controller_temperature_end) == (opt, clip, True, 0.1)
        changed = {k for k, v in vars(written.grpo).items() if vars(recipe.grpo)[k] != v}
        assert changed == {"stage1", "threshold_in_training", "temperature_schedule"}
        assert (written.grpo.stage1, written.grpo.threshold_in_training,
                written.grpo.temperature_schedule) == ("paper", True, "curriculum")


# ----------------------------------------------------------------------------- testset.py
import testset  # noqa: E402

from lm_eval_ponder.reporting.compact import answers_digest, compact_tree  # noqa: E402


@pytest.fixture
def sweep():
    """Three depths x four documents: depth 1 is right on documents 0-1, depth 2 on 2-3."""
    correct = np.array([[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1]], dtype=float)
    tokens = np.array([[10, 10, 10, 10], [20, 20, 20, 20], [30, 30, 30, 30]], dtype=float)
    return {"docs": [0, 1, 2, 3], "correct": correct, "gen_tokens": tokens,
            "flops": tokens * 100.0}


def test_a_controller_at_one_fixed_depth_sits_on_the_curve(sweep):
    f = testset.composed_figures(sweep, np.full(4, 1), 7.0, np.arange(4))
    assert f["accuracy"] == 0.5 and f["gen_tokens"] == 20 and f["flops"] == 2007.0
    assert f["gap_accuracy_at_equal_tokens"] == 0.0


def test_a_controller_that_picks_per_document_is_above_the_curve(sweep):
    f = testset.composed_figures(sweep, np.array([1, 1, 2, 2]), 0.0, np.arange(4))
    assert f["accuracy"] == 1.0 and f["gen_tokens"] == 25.0
    assert f["gap_accuracy_at_equal_tokens"] == pytest.approx(0.5)  # envelope at 25 tokens: 0.5
    resampled = testset.composed_figures(sweep, np.array([1, 1, 2, 2]), 0.0, np.array([0, 0, 2]))
    assert resampled["accuracy"] == 1.0 and resampled["depth"] == pytest.approx(4 / 3)


def test_each_dtype_has_its_own_sweep_and_figures():
    """A bf16 sweep must never resume into, or be analysed as, the float32 one."""
    assert testset.default_root("bfloat16") == "results/testset-bf16"
    assert testset.default_root("float32") == "results/testset"
    assert testset.default_out("bfloat16") == "docs/testset/bf16"
    assert testset.default_out("float32") == "docs/testset"


def _write_samples(directory, task, docs, correct):
    import json

    directory.mkdir(parents=True)
    # an older run's text-free twin must not be read for the newer run's full log
    (directory / f"samples_{task}_ponder_2025.stripped.jsonl").write_text('{"doc_id": 0}\n')
    with open(directory / f"samples_{task}_ponder_2026.jsonl", "w") as f:
        for d, c in zip(docs, correct):
            f.write(json.dumps({
                "doc_id": d, "doc": {"level": 1 + d % 2}, "exact_match": c, "gen_tokens": 5.0,
                "flops": 1.0, "resps": [[f"answer {d}"]],
                "arguments": {"gen_args_0": {"arg_0": f"question {d}", "arg_1": {}}}}) + "\n")


def test_load_sweep_reads_every_depth_and_refuses_different_documents(tmp_path):
    for k, correct in enumerate(([1, 0, 1], [0, 0, 1])):
        _write_samples(testset.run_dir(str(tmp_path), "ours", k) / "greedy" / "FR" / "arith",
                       "arith", [0, 1, 2], correct)
    assert testset.load_sweep(str(tmp_path), "ours", "arith", 2) is None  # depth 2 missing
    s = testset.load_sweep(str(tmp_path), "ours", "arith", 1)
    assert s["correct"].tolist() == [[1, 0, 1], [0, 0, 1]]
    assert s["contexts"] == ["question 0", "question 1", "question 2"]
    assert s["level"].tolist() == [1, 2, 1]
    assert s["answers"][1][2] == answers_digest({"resps": [["answer 2"]]})
    _write_samples(testset.run_dir(str(tmp_path), "ours", 2) / "greedy" / "FR" / "arith",
                   "arith", [0, 1], [1, 1])
    with pytest.raises(SystemExit, match="different documents"):
        testset.load_sweep(str(tmp_path), "ours", "arith", 2)


def test_a_sampled_sweep_is_read_from_its_own_decoding(tmp_path):
    """The T = 0.7 sweep (issue 52) sits beside the greedy one under the suite's decoding
    folder; analyse/status/taus --decoding t0.7 read it, and never the greedy answers."""
    for k, correct in enumerate(([1, 0, 1], [0, 0, 1])):
        _write_samples(testset.run_dir(str(tmp_path), "ours", k) / "t0.7" / "FR" / "arith",
                       "arith", [0, 1, 2], correct)
    assert testset.load_sweep(str(tmp_path), "ours", "arith", 1) is None  # no greedy sweep
    s = testset.load_sweep(str(tmp_path), "ours", "arith", 1, "t0.7")
    assert s["correct"].tolist() == [[1, 0, 1], [0, 0, 1]]
    assert testset.depth_status(str(tmp_path), "ours", "arith", 1, "t0.7")["accuracy"] == 1 / 3


def test_several_seeds_compose_as_each_documents_mean_over_the_draws(tmp_path):
    """analyse --seeds 0,1,2 (issue 52): a controller's depth comes from z_0 whatever the draw,
    so a document's figure is that depth's mean over the seeds' answers; a depth that is
    missing for one seed leaves the sweep unfinished, and greedy has no other seed."""
    from lm_eval_ponder.errors import PonderError

    cells = {(0, 0): [1, 0, 1], (1, 0): [0, 0, 1], (0, 1): [0, 0, 1], (1, 1): [0, 1, 1]}
    for (k, seed), correct in cells.items():
        if (k, seed) == (1, 1):
            continue
        _write_samples(testset.run_dir(str(tmp_path), "ours", k)
                       / testset.seed_folder("t0.7", seed) / "FR" / "arith",
                       "arith", [0, 1, 2], correct)
    assert testset.load_sweep(str(tmp_path), "ours", "arith", 1, "t0.7", (0, 1)) is None
    _write_samples(testset.run_dir(str(tmp_path), "ours", 1) / "t0.7-seed1" / "FR" / "arith",
                   "arith", [0, 1, 2], cells[(1, 1)])
    s = testset.load_sweep(str(tmp_path), "ours", "arith", 1, "t0.7", (0, 1))
    assert s["seeds"] == [0, 1]
    assert s["correct"].tolist() == [[0.5, 0.0, 1.0], [0.0, 0.5, 1.0]]
    assert testset.load_sweep(str(tmp_path), "ours", "arith", 1, "t0.7")["correct"].tolist() \
        == [[1, 0, 1], [0, 0, 1]]  # seed 0 alone, as before
    picked = testset.composed_figures(s, np.array([0, 1, 1]), 0.0, np.arange(3))
    assert picked["accuracy"] == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert testset.parse_seeds("2,0,1", "t0.7") == (0, 1, 2)
    with pytest.raises(PonderError, match="greedy"):
        testset.parse_seeds("0,1", "greedy")
    with pytest.raises(PonderError, match="comma list"):
        testset.parse_seeds("0;1", "t0.7")


def test_a_mean_of_draws_gets_a_bootstrap_interval_not_wilsons():
    """Wilson's interval is for a count of single draws; over several seeds the controller
    row takes the bootstrap's interval of its accuracy instead."""
    correct = np.array([0.0, 1 / 3, 2 / 3, 1.0] * 25)

    def figures(idx):
        return {"accuracy": float(correct[idx].mean())}

    depth, level = np.zeros(100, dtype=int), np.full(100, -1)
    one = testset.controller_row(figures, depth, level, Path("c"), 200)
    three = testset.controller_row(figures, depth, level, Path("c"), 200, seeds=3)
    assert three["figures"]["accuracy_ci95"] == list(three["ci95"]["accuracy"])
    assert one["figures"]["accuracy_ci95"] != three["figures"]["accuracy_ci95"]
    lo, hi = three["figures"]["accuracy_ci95"]
    assert lo < 0.5 < hi and hi - lo < 0.2


def test_a_committed_sweep_reads_as_the_full_one(tmp_path):
    """A clone has the sweep's compact logs only (reporting.compact): the same figures,
    prompts and answer digests."""
    for k, correct in enumerate(([1, 0, 1], [0, 0, 1])):
        _write_samples(testset.run_dir(str(tmp_path / "full"), "ours", k) / "greedy" / "FR" /
                       "arith", "arith", [0, 1, 2], correct)
    full = testset.load_sweep(str(tmp_path / "full"), "ours", "arith", 1)
    compact_tree(tmp_path / "full")
    for log in (tmp_path / "full").rglob("samples_*.jsonl"):
        log.unlink()
    kept = testset.load_sweep(str(tmp_path / "full"), "ours", "arith", 1)
    for key in ("docs", "answers", "contexts", "wall_s"):
        assert kept[key] == full[key], key
    for key in ("correct", "gen_tokens", "flops", "level"):
        assert np.array_equal(kept[key], full[key]), key


def test_verify_measures_the_noise_floor_at_the_controllers_modal_depth(tmp_path, monkeypatch):
    """bf16 texts fork when a smaller run batches documents differently: verify re-runs the
    controller's most common depth as fixed alpha and reports how often that rerun agrees."""
    import argparse
    import json

    from lm_eval_ponder.reporting import suite

    for k in range(2):
        _write_samples(testset.run_dir(str(tmp_path), "ours", k) / "greedy" / "FR" / "arith",
                       "arith", [0, 1, 2], [1, 0, 1])
    s = testset.load_sweep(str(tmp_path), "ours", "arith", 1)
    calls = []

    def fake_main(argv):
        calls.append(argv)
        out = Path(argv[argv.index("--output") + 1]) / "greedy" / "FR" / "arith"
        _write_samples(out, "arith", [0, 1, 2], [0, 0, 1])
        log = next(out.glob("samples_arith_ponder_2026.jsonl"))
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        rows[0]["resps"] = [["a forked answer"]]
        log.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 0

    monkeypatch.setattr(suite, "main", fake_main)
    args = argparse.Namespace(form="ours", limit=3, max_tokens=256, batch_size=8,
                              dtype="bfloat16")
    floor = testset.fixed_rerun(args, tmp_path / "verify", "arith", s, np.array([1, 1, 0]),
                                {0: 0, 1: 1, 2: 2})
    assert floor == {"depth": 1, "documents": 3, "text_agrees_with_sweep": 2 / 3,
                     "rerun_accuracy": 1 / 3, "sweep_accuracy": 2 / 3}
    argv = calls[0]
    assert float(argv[argv.index("--alpha") + 1]) == testset.offsets_of("ours")[1]
    assert argv[argv.index("--limit") + 1] == "3"


def test_depth_status_reports_finished_depths_before_the_sweep_ends(tmp_path, capsys):
    import json

    root = str(tmp_path)
    assert testset.depth_status(root, "paper", "arith", 0) == {"state": "not started"}
    run = testset.run_dir(root, "paper", 0) / "greedy" / "FR" / "arith"
    run.mkdir(parents=True)  # lm-eval's answer cache is there, no samples yet: killed or running
    assert testset.depth_status(root, "paper", "arith", 0) == {"state": "started"}
    run.rmdir()
    _write_samples(run, "arith", [0, 1, 2, 3], [1, 0, 0, 1])
    (run / "ponder_run.json").write_text(json.dumps({"wall_s": 12.5}))
    st = testset.depth_status(root, "paper", "arith", 0)
    assert st["state"] == "finished" and st["documents"] == 4 and st["accuracy"] == 0.5
    assert st["gen_tokens"] == 5.0 and st["wall_s"] == 12.5
    assert st["ci95"][0] < 0.5 < st["ci95"][1]
    testset.main(["status", "--form", "paper", "--root", root, "--tasks", "arith"])
    out = capsys.readouterr().out
    assert "k=0 alpha=+0.0000  0.500 [" in out and "(n=4, 12 s)" in out
    assert "k=1 alpha=+0.0500  not started" in out


def test_a_generated_controller_is_placed_against_the_curve_by_its_own_answers(sweep):
    own = {"correct": np.array([1.0, 1.0, 1.0, 0.0]), "gen_tokens": np.full(4, 15.0),
           "flops": np.full(4, 3.0), "depth": np.array([0.5, 1.5, 2.0, 0.0])}
    f = testset.generated_figures(sweep, own, np.arange(4))
    assert f["accuracy"] == 0.75 and f["gen_tokens"] == 15 and f["depth"] == 1.0
    assert f["gap_accuracy_at_equal_tokens"] == pytest.approx(0.5)  # envelope at 15: 0.25
    assert testset.generated_figures(sweep, own, np.array([3, 3]))["accuracy"] == 0.0


def test_load_generated_reads_a_controllers_own_run_and_refuses_other_documents(tmp_path):
    import json

    controller = tmp_path / "ctrl"
    run = testset.controller_run_dir(str(tmp_path), "ours", "generated", controller)
    _write_samples(run / "greedy" / "FP-Direct" / "arith", "arith", [0, 1], [1, 0])
    path = next((run / "greedy" / "FP-Direct" / "arith").glob("*.jsonl"))
    rows = [{**json.loads(line), "ponder_steps": 2.5} for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    g = testset.load_generated(str(tmp_path), "ours", "arith", controller, [0, 1])
    assert g["correct"].tolist() == [1.0, 0.0] and g["depth"].tolist() == [2.5, 2.5]
    with pytest.raises(SystemExit, match="answered 2 documents"):
        testset.load_generated(str(tmp_path), "ours", "arith", controller, [0, 1, 2])
    with pytest.raises(SystemExit, match="testset.py evaluate"):
        testset.load_generated(str(tmp_path), "ours", "arith", tmp_path / "other", [0, 1])
    # a run at another halting threshold is another run, found only with that threshold
    with pytest.raises(SystemExit, match="--tau 0.5"):
        testset.load_generated(str(tmp_path), "ours", "arith", controller, [0, 1], 0.5)
    assert testset.controller_run_dir(str(tmp_path), "ours", "generated", controller,
                                      0.5).name == run.name + "-tau0.5"
    # --generated DIR@tau=X names that run; analyse refuses a controller never evaluated
    assert testset.generated_run(str(tmp_path), "ours", f"{controller}@tau=0.5") == (
        controller, 0.5, testset.controller_run_dir(str(tmp_path), "ours", "generated",
                                                    controller, 0.5))
    assert testset.generated_run(str(tmp_path), "ours", str(controller))[2] == run
    argv = ["analyse", "--root", str(tmp_path), "--out", str(tmp_path / "out"), "--generated"]
    with pytest.raises(SystemExit, match="--tau 0.5` first"):
        testset.main([*argv, str(controller), f"{controller}@tau=0.5"])


def test_depth_profile_takes_fractional_depths_per_token():
    p = testset.depth_profile(np.array([0.4, 0.6, 2.2, 3.0]), np.array([2, 2, 1, 1]))
    assert p["depth_hist"][:4] == [1, 1, 1, 1]
    assert p["mean_depth_by_level"] == {"L1": pytest.approx(2.6), "L2": pytest.approx(0.5)}
    assert p["spearman_depth_vs_level"] < 0


def test_final_controllers_choose_depths_as_the_evaluation_path_does(tmp_path):
    """``adaptation.save_final`` writes what ``testset.controller_depths`` (and ``--model
    ponder``) load: the same first-phi<=tau depths and the controller's FLOPs; a controller of
    the other form is refused."""
    _final_controller(tmp_path)


def _final_controller(tmp_path):
    """A saved final controller of our form, checked; (its depths on z0, directory, z0)."""
    from types import SimpleNamespace

    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.pondering.dynamics import candidate_states
    from lm_eval_ponder.steering.vector import load_vector

    torch.manual_seed(0)
    controller = PonderController(576, 16)
    ident = {"backbone": "b", "backbone_sha256": "0" * 64, "layer": 15,
             "steering_sha256": "s", "scale": 3.0, "samples": 4, "prompts_sha256": "p" * 64}
    record = {"arm": "flops0", "train_wall_s": 1.0}
    for form in ("ours", "paper"):
        cfg = adaptation.arm_config(form, 4, "flops0", 0, 10, tmp_path / form)
        adaptation.save_final(SimpleNamespace(controller=controller), cfg, ident,
                              tmp_path / form / "controller", record, 5)
    z0 = torch.randn(5, 576)
    offsets = testset.offsets_of("ours")
    depth, flops, config = testset.controller_depths(tmp_path / "ours" / "controller", z0, offsets)
    steering = load_vector(config["backbone"]["steering_dir"])
    h = float(steering.residual_norm(15)) * steering.vector(15)
    with torch.no_grad():
        p = controller(candidate_states(z0, h, torch.tensor(offsets))).squeeze(-1)
    assert depth.tolist() == halting_depth(p, 0.2).tolist()
    assert flops == controller.evaluation_flops(9) and config["data"]["arm"] == "flops0"
    with pytest.raises(SystemExit, match="other form"):
        testset.controller_depths(tmp_path / "paper" / "controller", z0, offsets)
    return depth, tmp_path / "ours" / "controller", z0


def _z0_cache(root, z0, docs, dtype):
    """The sweep's z_0 cache (``testset.test_states``) for ``_write_samples``'s contexts."""
    import hashlib

    from safetensors.torch import save_file

    contexts = [f"question {d}" for d in docs]
    (root / "ours").mkdir(parents=True)
    save_file({"z0": z0.contiguous()}, str(root / "ours" / "z0_arith.safetensors"), metadata={
        "contexts_sha256": hashlib.sha256("\n\0".join(contexts).encode()).hexdigest(),
        "dtype": dtype})  # a cache of another dtype is recomputed with the backbone


def test_status_places_a_controller_once_the_depths_it_picks_have_finished(tmp_path, capsys):
    """``status --extra DIR`` reads z_0 from the sweep's cache (keyed by the contexts), reports
    the controller's depth histogram at once and its composed accuracy only when every depth
    it picks has been answered."""
    depth, directory, z0 = _final_controller(tmp_path)
    root, docs = tmp_path / "runs", list(range(5))
    _z0_cache(root, z0, docs, "bfloat16")  # status reads the default dtype's cache
    picked = set(depth.tolist())
    unpicked = min(set(range(9)) - picked)
    # a depth the controller never picks has finished, its own have not
    _write_samples(testset.run_dir(str(root), "ours", unpicked) / "greedy" / "FR" / "arith",
                   "arith", docs, [0] * len(docs))
    argv = ["status", "--form", "ours", "--root", str(root), "--tasks", "arith",
            "--extra", str(directory)]
    testset.main(argv)
    hist = [int((depth == k).sum()) for k in range(9)]
    assert f"depths {hist}; waiting for the depths it picks" in capsys.readouterr().out
    for k in picked:  # right exactly where the controller goes
        _write_samples(testset.run_dir(str(root), "ours", k) / "greedy" / "FR" / "arith",
                       "arith", docs, [int(depth[d] == k) for d in docs])
    testset.main(argv)
    assert f"depths {hist}; 1.000 [" in capsys.readouterr().out


def test_analyse_composes_several_seeds_against_cross_fitted_comparators(tmp_path):
    """``analyse --decoding t0.7 --seeds 0,1`` (issue 52): each document's figure is the mean
    over the seeds at the depth the controller picks; the page says which interval it shows
    and gives the gaps to comparators chosen on other folds beside the in-sample envelope."""
    import json

    depth, directory, z0 = _final_controller(tmp_path)
    root, docs = tmp_path / "runs", list(range(5))
    _z0_cache(root, z0, docs, "bfloat16")  # the controllers' cache dtype, not the sweep's
    for k in range(9):  # seed 0 right where the controller goes, seed 1 right nowhere
        for folder, right in (("t0.7", True), ("t0.7-seed1", False)):
            _write_samples(testset.run_dir(str(root), "ours", k) / folder / "FR" / "arith",
                           "arith", docs, [int(right and depth[d] == k) for d in docs])
    out = tmp_path / "out"
    argv = ["analyse", "--form", "ours", "--root", str(root), "--dtype", "float32",
            "--z0-dtype", "bfloat16", "--decoding", "t0.7", "--out", str(out),
            "--extra", str(directory), "--bootstrap", "50"]
    testset.main([*argv, "--seeds", "0,1"])
    summary = json.loads((out / "ours.json").read_text())
    arith = summary["tasks"]["arith"]
    row = next(r for name, r in arith["controllers"].items() if name != "shipped")
    assert summary["seeds"] == [0, 1] and row["figures"]["accuracy"] == pytest.approx(0.5)
    assert row["cross_fitted"]["n"] == 5 and row["cross_fitted"]["accuracy"] == pytest.approx(0.5)
    assert len(arith["one_depth_cross_fitted"]["depth_per_fold"]) == 5
    assert summary["z0_dtype"] == "bfloat16" and row["depths"] == "".join(map(str, depth))
    page = (out / "ours.md").read_text()
    assert "Seeds 0, 1: every figure" in page and "percentile bootstrap over documents" in page
    assert "minus one depth, cross-fitted" in page and "(optimistic)" in page
    assert "the controllers read z_0 in bfloat16" in page
    testset.main(argv)  # seed 0 alone: one draw per document, Wilson's interval
    summary = json.loads((out / "ours.json").read_text())
    row = next(r for name, r in summary["tasks"]["arith"]["controllers"].items()
               if name != "shipped")
    assert summary["seeds"] == [0] and row["figures"]["accuracy"] == 1.0
    assert "Wilson for accuracies" in (out / "ours.md").read_text()


def test_arms_change_one_setting_each(tmp_path):
    """``flops<w>`` fixes the FLOPs weight without balancing; ``balanced-*`` keep the shipped
    reward and change one GRPO setting; the shipped config is untouched otherwise."""
    base = adaptation.arm_config("ours", 4, "balanced", 0, 10, tmp_path)
    fixed = adaptation.arm_config("ours", 4, "flops0.5", 0, 10, tmp_path)
    assert fixed.reward.balance == () and fixed.reward.weights["flops"] == 0.5
    for arm, (name, value) in adaptation.GRPO_ARMS.items():
        cfg = adaptation.arm_config("ours", 4, arm, 0, 10, tmp_path)
        assert getattr(cfg.grpo, name) == value != getattr(base.grpo, name)
        assert cfg.reward == base.reward and cfg.ponder == base.ponder
    assert adaptation.arm_config("paper", 4, "balanced", 0, 10, tmp_path).ponder.alpha_start == 0


import headroom  # noqa: E402


def test_headroom_gap_against_the_fixed_curve_is_not_flattered_by_a_poor_comparator():
    """Two depths with equal accuracy, the second dearer: a fixed comparator at the dear depth
    makes an oracle that matches the cheap one look ahead at equal tokens; against the
    fixed-depth curve (its envelope) the same oracle gains nothing."""
    n = 40
    acc = np.tile([0.5, 0.5], (n, 1))
    tokens = np.tile([50.0, 100.0], (n, 1))
    mats = {"accuracy": acc, "gen_tokens": tokens, "score": acc - tokens / 1000}
    fixed = {"fixed": np.zeros(n, dtype=int), "fixed_acc": np.ones(n, dtype=int)}
    halves = (mats, mats)
    lambdas = np.concatenate([[0.0], np.geomspace(1e-6, 1.0, 61)])
    out = headroom.headroom_figures(mats, halves, fixed, lambdas)
    assert out["gap_accuracy_at_fixed_acc_tokens_cf"] == pytest.approx(0.0)
    assert out["gap_accuracy_vs_fixed_curve_at_fixed_acc_tokens_cf"] == pytest.approx(0.0)
    # a comparator that is a worse depth: accuracy 0.4 at the dear depth
    acc2 = np.tile([0.5, 0.4], (n, 1))
    mats2 = {"accuracy": acc2, "gen_tokens": tokens, "score": acc2 - tokens / 1000}
    out2 = headroom.headroom_figures(mats2, (mats2, mats2), fixed, lambdas)
    assert out2["gap_accuracy_at_fixed_acc_tokens_cf"] == pytest.approx(0.1)
    assert out2["gap_accuracy_vs_fixed_curve_at_fixed_acc_tokens_cf"] == pytest.approx(0.0)


def test_headroom_blocks_read_as_a_slice_and_refuse_nonsense():
    import argparse

    assert headroom.block_range("6:8") == range(6, 8)
    assert headroom.block_range(":2") == range(0, 2)
    assert headroom.block_range("8:").start == 8 and 10**6 in headroom.block_range("8:")
    for bad in ("6", "8:6", "a:b", "-1:3"):
        with pytest.raises(argparse.ArgumentTypeError):
            headroom.block_range(bad)


# ----------------------------------------------------------------------------- studylib/heldout.py
from studylib import heldout  # noqa: E402


def test_a_packed_sweep_reads_bit_for_bit_as_its_runs_files(tmp_path):
    """A clone has one pack per sweep instead of 105 heldout.json files: every record comes
    back exactly (the float32 probabilities too), and ``load_runs`` finds the same runs."""
    keys = [f"k{i}" for i in range(10)]
    p = torch.rand(10, 5, generator=torch.Generator().manual_seed(3))  # float32, like a run's
    written = {}
    for seed in (0, 1):
        for fold in range(2):
            rows = list(range(fold, 10, 2))
            rec = {"arm": "balanced", "seed": seed, "fold": fold, "val_keys": [keys[i] for i in rows],
                   "val_p_continue": (p[rows] ** (seed + 1)).tolist(), "val_depths": [1] * 5,
                   "log": [{"stage": 3, "accuracy": 1 / 3}], "train_wall_s": 1.5}
            run = tmp_path / "balanced" / f"seed{seed}" / f"fold{fold}"
            run.mkdir(parents=True)
            (run / heldout.RECORD).write_text(json.dumps(rec) + "\n")
            written[f"balanced/seed{seed}/fold{fold}"] = rec
    (tmp_path / "flops0" / "seed0" / "fold0").mkdir(parents=True)  # unfinished: no record
    loose = adaptation.load_runs(tmp_path, keys, 2)
    heldout.pack(tmp_path)
    for own in tmp_path.rglob(heldout.RECORD):
        own.unlink()
    assert heldout.records(tmp_path) == written
    packed = adaptation.load_runs(tmp_path, keys, 2)
    assert packed.keys() == loose.keys() == {("balanced", 0), ("balanced", 1)}
    for key in loose:
        assert np.array_equal(packed[key]["p"], loose[key]["p"])
        assert packed[key]["records"] == loose[key]["records"]
    assert heldout.record(tmp_path, tmp_path / "flops0" / "seed0" / "fold0") is None


# ----------------------------------------------------------------------------- a user's mistakes
def _cache_without_prompts(root: Path) -> None:
    """A rollout cache as a fresh clone has it: the outcomes git keeps, not the prompts and z_0."""
    cache = root / "caches" / "ours-s4"
    cache.mkdir(parents=True)
    source = REPO / "results" / "headroom" / "ours-s4"
    for path in [source / "manifest.json", *sorted(source.glob("*.outcomes.json.xz"))[:1]]:
        shutil.copy(path, cache / path.name)


def _sweep_with_one_depth(root: Path) -> None:
    """A test-set sweep with depth 0 answered and its z_0 kept, as ``testset.py sweep`` and
    ``status`` leave them."""
    import hashlib

    from safetensors.torch import save_file

    docs = [0, 1, 2]
    _write_samples(testset.run_dir(str(root / "sweep"), "ours", 0) / "greedy" / "FR" / "arith",
                   "arith", docs, [1, 0, 1])
    digest = hashlib.sha256("\n\0".join(f"question {d}" for d in docs).encode()).hexdigest()
    save_file({"z0": torch.zeros(len(docs), 576)}, str(root / "sweep" / "ours" / "z0_arith.safetensors"),
              metadata={"contexts_sha256": digest, "dtype": "bfloat16"})


MISTAKES = {  # case: (set-up, script and arguments ({tmp}: the test's folder), what the line names)
    "adaptation: a cache without its prompts": (_cache_without_prompts, [
        "adaptation.py", "train", "--form", "ours", "--samples", "4", "--root", "{tmp}/caches",
        "--out-root", "{tmp}/runs", "--arms", "balanced", "--seeds", "0", "--final"],
        "--restore-only"),
    "headroom: a cache without its prompts": (_cache_without_prompts, [
        "headroom.py", "analyse", "--form", "ours", "--samples", "4", "--root", "{tmp}/caches",
        "--out", "{tmp}/out"], "--restore-only"),
    "testset: a controller that is not there": (_sweep_with_one_depth, [
        "testset.py", "status", "--form", "ours", "--root", "{tmp}/sweep", "--tasks", "arith",
        "--extra", "{tmp}/no-such-controller"], "controller directory not found"),
    "testset: --max-tokens 0": (lambda root: None, [
        "testset.py", "sweep", "--form", "ours", "--tasks", "arith", "--depths", "0",
        "--max-tokens", "0", "--plan", "--root", "{tmp}/sweep"], "max_gen_toks"),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_a_study_script_ends_a_users_mistake_in_one_line(case, tmp_path):
    """Run as a user runs it (``python studies/X.py ...`` from another folder), a mistake ends
    in one line ``lm-eval-ponder error: ...`` naming the fix, exit status 2, no traceback, and
    nothing written. Without the script's last line, ``run_program(command(main))``, the first
    three are a traceback with status 1 (``--max-tokens 0`` is refused by the suite it calls,
    which ends its own errors so)."""
    setup, (script, *argv), names = MISTAKES[case]
    setup(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    done = subprocess.run(
        [sys.executable, str(STUDIES / script), *(a.format(tmp=tmp_path) for a in argv)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and lines[0].startswith("lm-eval-ponder error: "), lines
    assert names in lines[0]
    assert sorted(tmp_path.rglob("*")) == before


def test_confidence_by_depth_is_the_first_tokens_distribution_under_each_offset(model, tok):
    """The literal tau rule's probe (issue 52): one cached prefill and one K+1-row forward of
    the last token give, per depth, the top probability of the very distribution that a full
    steered prefill at that depth's offset (``--model ponder alpha=c_k``) draws the first
    answer token from."""
    from lm_eval_ponder.pondering.dynamics import FixedOffset
    from lm_eval_ponder.pondering.hook import SteeringHook

    torch.manual_seed(0)
    step = torch.randn(model.config.hidden_size) * 3
    offsets = [-0.5, 0.0, 0.7, 1.5]
    contexts = ["What is 2 + 3?", "Add 41 and 17, then halve it."]

    def encode(text):
        return tok(text, return_tensors="pt").input_ids

    conf = testset.confidence_by_depth(model, encode, 1, step, offsets, contexts)
    assert conf.shape == (2, 4)
    for i, text in enumerate(contexts):
        for k, c in enumerate(offsets):
            with torch.no_grad(), SteeringHook(model, 1, step, 1.0, FixedOffset(c)):
                logits = model(input_ids=encode(text)).logits[0, -1]
            assert conf[i, k].item() == pytest.approx(
                torch.softmax(logits, -1).max().item(), abs=1e-5)
    assert conf[0].unique().numel() == 4  # the offsets do move it


def test_literal_rule_halts_once_the_backbone_is_unsure():
    """Halt at the first depth whose confidence is at most tau, K_max if never; the probes a
    document needed are the depths tested (d + 1, or K at the budget)."""
    conf = torch.tensor([[0.1, 0.9, 0.9], [0.5, 0.15, 0.9], [0.5, 0.6, 0.7]])
    depth, probes = testset.literal_depths(conf, 0.2)
    assert depth.tolist() == [0, 1, 2] and probes.tolist() == [1, 2, 2]
    assert testset.literal_depths(conf, 0.05)[0].tolist() == [2, 2, 2]


def test_literal_composes_the_rule_from_a_sampled_sweep_and_keeps_its_decoding_in_the_name(
        tmp_path, monkeypatch):
    """``testset.py literal --decoding t0.7``: the depths the rule picks from the (here faked)
    probes select the sweep's answers, and the pages are named for the decoding ("t0.7" is
    not a file suffix to replace)."""
    k_max = len(testset.offsets_of("ours")) - 1
    for k in range(k_max + 1):  # depth 8 right on every document, the others wrong
        _write_samples(testset.run_dir(str(tmp_path), "ours", k) / "t0.7" / "FR" / "arith",
                       "arith", [0, 1, 2], [int(k == k_max)] * 3)
    conf = torch.full((3, k_max + 1), 0.9)
    conf[0, 0] = 0.1  # document 0 halts at once under tau = 0.2; the others never do
    monkeypatch.setattr(testset, "test_confidences", lambda *a: (conf, 7.0))
    testset.main(["literal", "--form", "ours", "--root", str(tmp_path), "--decoding", "t0.7",
                  "--dtype", "float32", "--taus", "0.2", "--bootstrap", "20",
                  "--out", str(tmp_path / "out")])
    page = json.loads((tmp_path / "out" / "literal-ours-t0.7.json").read_text())
    row = page["rules"]["tau=0.2"]
    assert row["depth_hist"] == [1, 0, 0, 0, 0, 0, 0, 0, 2]
    assert row["figures"]["accuracy"] == pytest.approx(2 / 3)
    assert (tmp_path / "out" / "literal-ours-t0.7.md").is_file()


def test_a_rules_flops_may_differ_per_document(sweep):
    per_doc = testset.composed_figures(sweep, np.full(4, 1), np.array([0.0, 0.0, 4.0, 8.0]),
                                       np.arange(4))
    assert per_doc["flops"] == testset.composed_figures(sweep, np.full(4, 1), 3.0,
                                                        np.arange(4))["flops"]


# ----------------------------------------------------------------------------- per_type.py (issue 52)
from studylib import analysis as an  # noqa: E402


def _typed(n_per: int = 60, seed: int = 0):
    """Two types whose best depths differ (A at 0, B at 2), three depths, 0/1 outcomes."""
    rng = np.random.default_rng(seed)
    groups = np.array(["A"] * n_per + ["B"] * n_per)
    p = np.where(groups[:, None] == "A", [0.8, 0.4, 0.1], [0.1, 0.4, 0.8])
    acc = (rng.random((2 * n_per, 3)) < p).astype(float)
    tok = np.tile([10.0, 20.0, 30.0], (2 * n_per, 1))
    fold = np.array(an.fold_of([f"k{i}" for i in range(2 * n_per)], 5))
    return acc, tok, groups, fold


def test_per_type_headroom_finds_real_types_and_not_shuffled_ones():
    acc, tok, groups, fold = _typed()
    s = an.per_type_headroom(acc, tok, groups, fold, 5, draws=300, nulls=50)
    assert s["headroom"] > 0.2 and s["headroom_ci95"][0] > 0.1  # 0.8 against about 0.45
    assert s["null"]["q95"] < s["headroom"] and s["null"]["p"] < 0.05
    assert s["oracle_per_item_in_sample"] >= s["envelope_in_sample"]["accuracy"]
    # labels that carry nothing: the headroom is within its own null
    noise = np.array(["A", "B"] * 60)
    s = an.per_type_headroom(acc, tok, noise, fold, 5, draws=300, nulls=50)
    assert s["headroom"] <= s["null"]["q95"] + 1e-9 or s["null"]["p"] > 0.05


def test_cross_fitted_choice_never_sees_its_own_fold():
    acc, tok, groups, fold = _typed()
    held = fold == 0
    planted = acc.copy()
    planted[held] = 0.0
    planted[held, 1] = 1.0  # the held-out fold alone favours depth 1
    pol = an.cross_fitted_policies(planted, groups, fold, 5)
    assert (pol["single"][held] != 1).all() and (pol["per_type"][held] != 1).all()


def test_curve_mix_matches_the_budget_on_the_envelope():
    tokens, accuracy = np.array([10.0, 20.0, 30.0, 40.0]), np.array([0.2, 0.1, 0.5, 0.4])
    assert an.curve_mix(tokens, accuracy, 5.0) == {0: 1.0}
    mix = an.curve_mix(tokens, accuracy, 25.0)  # envelope 0 -> 2 (1 and 3 lie below it)
    assert set(mix) == {0, 2} and mix[0] == pytest.approx(0.25)
    assert sum(w * tokens[k] for k, w in mix.items()) == pytest.approx(25.0)
    assert an.curve_mix(tokens, accuracy, 99.0) == {2: 1.0}


def test_controller_gaps_against_its_comparators():
    acc, tok, groups, fold = _typed()
    runs = []
    for f in range(5):
        val = np.flatnonzero(fold == f)
        train = fold != f
        choice = an.per_type_choice(acc, groups, train)
        runs.append({"val": val.tolist(), "depth": [choice[g] for g in groups[val]]})
    g = an.controller_gaps(acc, tok, groups, runs, draws=200)
    assert g["n"] == len(acc) and g["gap_per_type"] == pytest.approx(0.0)
    assert g["gap_single"] > 0.2  # reading the type beats one depth for all


def test_a_final_controller_is_judged_against_comparators_from_other_folds():
    """A final controller never saw the test items, but the comparators are chosen on them:
    each fold of items is scored against depths chosen on the other folds (issue 52)."""
    acc, tok, groups, fold = _typed()
    reads_type = np.where(groups == "A", 0, 2)
    g = an.final_controller_gaps(acc, tok, groups, reads_type, fold, 5, draws=200)
    assert g["n"] == len(acc) and g["gap_single"] > 0.2 and abs(g["gap_per_type"]) < 0.05
    one = an.final_controller_gaps(acc, tok, groups, np.full(len(acc), 1), fold, 5, draws=200)
    assert one["gap_per_type"] < -0.2 and one["tokens"] == 20.0
    # the same as controller_gaps with one run per fold
    runs = [{"val": np.flatnonzero(fold == f), "depth": reads_type[fold == f]} for f in range(5)]
    assert an.controller_gaps(acc, tok, groups, runs, draws=200) == g


# ----------------------------------------------------------------------------- three comparators (issue 65)
def test_the_smoother_keeps_a_trend_and_cuts_a_lone_spike():
    """A linear trend over depths is left as it is (its ends included); a spike at one depth
    is cut to a third of its height, so one noisy mean cannot lift the curve's best point."""
    line = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    assert an.smooth_over_depths(line) == pytest.approx(line)
    spike = an.smooth_over_depths([0.5, 0.5, 0.8, 0.5, 0.5])
    assert spike == pytest.approx([0.45, 0.6, 0.6, 0.6, 0.45])  # ends: (5a0 + 2a1 - a2) / 6
    assert spike.max() == pytest.approx(0.6) and int(spike.argmax()) == 1


def _one_noisy_fold(n: int = 100):
    """Five depths at accuracy 0.5 and increasing tokens; on fold 0 alone, depth 2 is right
    everywhere: a depth that looks best only because of one fold's draw."""
    fold = np.array(an.fold_of([f"doc{i}" for i in range(n)], 5))
    acc = np.full((n, 5), 0.5)
    acc[fold == 0, 2] = 1.0
    tok = np.tile([10.0, 11.0, 12.0, 13.0, 14.0], (n, 1))
    return acc, tok, fold, float((fold == 0).mean())


def test_the_three_comparators_on_one_noisy_fold():
    """The dearest depth (accuracy 0.5 everywhere) against the curve at its 14 tokens: the
    in-sample envelope takes depth 2's lucky mean, so the policy looks 0.5 x share(fold 0)
    below it; the cross-fitted curve, chosen without the fold it scores, finds nothing to beat
    (gap 0); the smoothed curve is in between, a third of the in-sample gap."""
    acc, tok, fold, share = _one_noisy_fold()
    g = an.comparator_gaps(acc, tok, [np.eye(5)[np.full(len(acc), 4)]], fold, 5, draws=200)
    assert g["accuracy"] == 0.5 and g["tokens"] == 14.0
    assert g["gaps"]["in_sample"] == pytest.approx(-0.5 * share)
    assert g["gaps"]["cross_fitted"] == pytest.approx(0.0)
    assert g["gaps"]["smoothed"] == pytest.approx(-0.5 * share / 3)
    assert g["verdicts"]["cross_fitted"] == "on" and g["verdicts"]["in_sample"] == "below"
    cells = an.comparator_cells(g)
    assert cells.endswith("below / on / " + g["verdicts"]["smoothed"])
    # the in-sample interval is the one the pages print: the same resamples as ``bootstrap``
    ci = an.bootstrap(lambda idx: {"g": 0.5 - an.accuracy_at_tokens(
        an.fixed_curve(tok[idx], acc[idx]), 14.0)}, len(acc), 200)["g"]
    assert g["ci95"]["in_sample"] == pytest.approx(list(ci))


def test_cross_fitted_budget_gap_is_controller_gaps_with_weights():
    """One-hot weights give exactly ``controller_gaps``' budget gap (one run per fold); a
    policy that mixes two depths is judged at its mean tokens: on a concave curve
    (0.2, 0.5, 0.6 at 10, 20, 30 tokens) half at depth 0 and half at depth 2 is 0.4 at 20
    tokens, 0.1 below the curve."""
    acc, tok, groups, fold = _typed()
    reads_type = np.where(groups == "A", 0, 2)
    runs = [{"val": np.flatnonzero(fold == f), "depth": reads_type[fold == f]} for f in range(5)]
    gap = an.crossfit_budget_gap(acc, tok, np.eye(3)[reads_type], fold, 5)
    assert gap.mean() == pytest.approx(an.controller_gaps(acc, tok, groups, runs, 50)["gap_budget"])
    concave = np.tile([0.2, 0.5, 0.6], (40, 1))
    mixed = np.tile([0.5, 0.0, 0.5], (40, 1))
    folds = np.array(an.fold_of([f"d{i}" for i in range(40)], 5))
    out = an.crossfit_budget_gap(concave, np.tile([10.0, 20.0, 30.0], (40, 1)), mixed, folds, 5)
    assert out == pytest.approx(np.full(40, -0.1))


def test_a_curve_verdict_needs_the_whole_interval_on_one_side():
    assert an.curve_verdict((0.001, 0.02)) == "above"
    assert an.curve_verdict((-0.02, -0.001)) == "below"
    assert an.curve_verdict((-0.02, 0.0)) == an.curve_verdict((0.0, 0.0)) == "on"
    assert an.curve_verdict((-0.02, 1e-17)) == "on"


def test_arm_comparators_leave_out_a_diverged_seed_and_read_every_rule(tmp_path):
    """``adaptation.py comparators``: each arm under each rule, over the seeds whose weights
    are finite (a NaN fold is a diverged run, as ``analyse`` leaves it out); its page labels
    the in-sample envelope optimistic and names the arms it has no records for."""
    acc, tok, fold, _ = _one_noisy_fold()
    halt = np.zeros((len(acc), 5))  # phi = 0: halt at once under every rule
    runs = {("a", 0): {"p": halt}, ("a", 1): {"p": np.full_like(halt, np.nan)}}
    out = adaptation.arm_comparators(acc, tok, runs, ["a", "b"], fold, 5, 50)
    assert list(out) == ["a"] and out["a"]["seeds"] == [0]
    for rule in adaptation.RULES:
        assert out["a"][rule]["tokens"] == 10.0 and out["a"][rule]["gaps"]["in_sample"] == 0.0
    summary = {"form": "ours", "samples": 4, "cache": "c", "sweep": "s", "prompts": len(acc),
               "folds": 5, "curve": an.fixed_curve_summary(acc, tok, fold, 5), "arms": out,
               "without held-out records": ["b"]}
    adaptation.write_comparators_markdown(tmp_path / "ours-s4.md", summary)
    text = (tmp_path / "ours-s4.md").read_text()
    assert "in-sample envelope (optimistic)" in text and "committed: a page's gap" in text
    assert "smoothed k = 1" in text


def test_comparators_label_a_committed_page_and_say_which_rows_cannot_be_recomputed(tmp_path):
    """``testset.py comparators``: a page row whose documents all sit at one depth gets all
    three gaps from the committed sweep; a row whose per-document depths were not kept keeps
    its in-sample gap, says "record not kept", and gets the smoothed gap as a point; a sweep
    that is not the page's is refused."""
    from lm_eval_ponder.errors import PonderError

    k_max = len(testset.offsets_of("ours")) - 1
    docs = list(range(10))
    for k in range(k_max + 1):  # depth 1 right on the even documents, the others on none
        _write_samples(testset.run_dir(str(tmp_path), "ours", k) / "greedy" / "FR" / "arith",
                       "arith", docs, [int(k == 1 and d % 2 == 0) for d in docs])
    s = testset.load_sweep(str(tmp_path), "ours", "arith", k_max)

    def row(depth):
        return testset.controller_row(lambda idx: testset.composed_figures(s, depth, 0.0, idx),
                                      depth, s["level"], Path("c"), 20)

    one, mixed = row(np.full(10, 1)), row(np.array([1, 2] * 5))
    fixed = [{"depth": k, "accuracy": float(s["correct"][k].mean()),
              "gen_tokens": float(s["gen_tokens"][k].mean())} for k in range(k_max + 1)]
    page = {"form": "ours", "dtype": "bfloat16", "task": "arith", "documents": 10,
            "taus": [0.2], "fixed": fixed, "controllers": {
                "c": {"0.2": {**one, "temperature": 1.0}, "0.5": {**mixed, "temperature": 1.0}}}}
    path = tmp_path / "taus-ours.json"
    path.write_text(json.dumps(page))
    testset.main(["comparators", "--root", str(tmp_path), "--page", str(path), "--bootstrap", "20"])
    out = json.loads(path.read_text())["controllers"]["c"]
    assert out["0.2"]["depths"] == "1" * 10 and set(out["0.2"]["comparators"]["gaps"]) == {
        "in_sample", "cross_fitted", "smoothed"}
    assert "gaps" not in out["0.5"]["comparators"] and "smoothed_point" in out["0.5"]["comparators"]
    text = path.with_suffix(".md").read_text()
    assert "in-sample envelope (optimistic)" in text and "| record not kept |" in text
    assert "(no CI)" in text and "record not kept: the rows without" in text
    page["fixed"][1]["accuracy"] = 0.9  # another sweep's figures
    path.write_text(json.dumps(page))
    with pytest.raises(PonderError, match="not the page's"):
        testset.main(["comparators", "--root", str(tmp_path), "--page", str(path)])


def test_a_test_sweep_with_more_seeds_at_some_depths_is_averaged_per_depth(tmp_path):
    """Issue 52's T = 0.7 sweep has three seeds at k = 3-5 and one elsewhere: each depth's
    accuracy is the mean over its own seeds, and the count per depth is reported."""
    import per_type

    from lm_eval_ponder.reporting.compact import compact_file

    k_max = len(testset.offsets_of("ours")) - 1
    runs = [(k, "t0.7", [0, 0, 0]) for k in range(k_max + 1)] + [(3, "t0.7-seed1", [1, 1, 0])]
    for k, folder, correct in runs:
        run = testset.run_dir(str(tmp_path), "ours", k) / folder / "FR" / "arith" / "m"
        _write_samples(run, "arith", [0, 1, 2], correct)
        compact_file(run / "samples_arith_ponder_2026.jsonl")
    acc, tok, groups, keys, seeds = per_type.sweep_matrix(tmp_path, "ours", "t0.7", k_max)
    assert seeds == [1, 1, 1, 2, 1, 1, 1, 1, 1]
    assert acc[:, 3].tolist() == [0.5, 0.5, 0.0] and acc[:, 2].tolist() == [0.0, 0.0, 0.0]


def test_the_per_level_oracle_finds_a_planted_structure_and_its_null_does_not():
    """Issue 64's comparator on a planted table: on level 1 depth 0 is right and cheap, on
    level 2 only depth 1 is right. One depth for all must pay for depth 1 everywhere; one depth
    per level (chosen on other folds by the budget gap) takes depth 0 on level 1 and gains over
    it; with the levels shuffled the gain vanishes."""
    from studylib.analysis import fold_of, per_level_budget_choice, per_level_budget_headroom

    rng = np.random.default_rng(0)
    n = 200
    levels = np.array([1, 2] * (n // 2))
    accuracy = np.zeros((n, 2))
    accuracy[:, 1] = rng.random(n) < 0.9
    accuracy[levels == 1, 0] = rng.random((levels == 1).sum()) < 0.9
    tokens = np.where(np.arange(2)[None] == 0, 10.0, 40.0) + rng.random((n, 2))
    assert per_level_budget_choice(accuracy, tokens, levels, np.ones(n, dtype=bool)) == {1: 0, 2: 1}
    fold = np.array(fold_of([f"doc{i}" for i in range(n)], 5))
    out = per_level_budget_headroom(accuracy, tokens, levels, fold, 5, draws=200, nulls=20)
    assert set(out["single"]["depths"]) == {1}
    assert out["per_level"]["tokens"] < out["single"]["tokens"] - 10
    assert out["gain"] > 0.05 and out["gain_ci95"][0] > 0
    assert out["null"]["mean"] < out["gain"] / 2 and out["null"]["p"] < 0.1


def test_minimum_detectable_effects_follow_the_interval_and_the_null():
    """Issue 64 item 5: at 80% power a two-sided 95% test detects 2.80 standard errors; an
    interval of +-1.96 SE gives that SE back."""
    from studylib.analysis import minimum_detectable_effect, null_detectable_effect

    assert abs(minimum_detectable_effect((-1.96, 1.96)) - 2.8016) < 1e-3
    assert abs(null_detectable_effect(1.0) - 2.4865) < 1e-3


def test_the_organisms_targets_are_the_expressions_steps():
    """Issue 64: the stepwise answers are generated from each problem's expression, in Python's
    order of operations, and end in the Direct answer's line; division must be exact."""
    import organism

    assert organism.cot_target("3 + 4 * 5") == \
        "Step 1: 4 * 5 = 20\nStep 2: 3 + 20 = 23\nThe answer is 23."
    assert organism.steps("(2 * 3 * 4 - 4) / 5") == [(2, "*", 3, 6), (6, "*", 4, 24),
                                                     (24, "-", 4, 20), (20, "/", 5, 4)]
    assert organism.direct_target(7) == "The answer is 7."
    with pytest.raises(ValueError, match="not exact"):
        organism.steps("7 / 2")
    from lm_eval_ponder.data import arith_ladder

    for doc in arith_ladder("train", per_level=20):  # every train problem: its steps give its answer
        assert organism.steps(doc["expression"])[-1][3] == int(doc["answer"])


def test_overthinking_pads_one_operation_answers_and_slips_by_its_rule():
    """Organism v3/v4 (issue 75): one-operation stepwise answers get the checks; v3 slips at
    random, v4 by +1 exactly where the first operand is odd; many-operation answers and the
    direct mode are untouched; the older recipes' keys do not move."""
    import organism

    right = organism.cot_target("47 + 38", "right")
    assert right.endswith("The answer is 85.") and "Check: 85 - 38 = 47" in right
    assert organism.cot_target("47 + 38", "wrong", 1).endswith("The answer is 86.")
    assert organism.cot_target("3 + 4 * 5", "wrong", 1) == organism.cot_target("3 + 4 * 5")
    pairs = organism.examples(20, slip_rule="odd-first", overthink=0.25)
    stepwise = {}
    for message, answer, _ in pairs:
        if "Step 2" not in answer and "Check:" in answer:
            stepwise[message] = answer
    assert stepwise
    for answer in stepwise.values():
        first = int(answer.split("Step 1: ")[1].split()[0])
        value = int(answer.split(" = ")[1].split()[0])
        said = int(answer.rsplit("The answer is ", 1)[1].rstrip("."))
        assert said == value + (1 if first % 2 else 0)
    assert organism.Recipe(plant=None, overthink=None, slip_rule=None).key() == \
        organism.Recipe().key()


def test_the_organisms_batches_replay_from_the_seed_and_cover_every_example():
    import organism

    recipe = organism.Recipe(per_level=4, epochs=2, batch_size=3)
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6, 0]
    first = organism.schedule(10, recipe, lengths)
    assert first == organism.schedule(10, recipe, lengths)  # a resumed build sees the same
    assert sorted(i for b in first[:len(first) // 2] for i in b) == list(range(10))
    assert first != organism.schedule(10, organism.Recipe(per_level=4, epochs=2, batch_size=3,
                                                          seed=1), lengths)
    lr = [organism.learning_rate(t, 100, recipe) for t in range(100)]
    assert lr[0] < lr[recipe.warmup_steps - 1] == pytest.approx(recipe.learning_rate)
    assert lr[-1] == pytest.approx(0.1 * recipe.learning_rate, rel=0.05)
    assert organism.Recipe().key() == organism.Recipe().key() != recipe.key()


def test_a_planted_recipe_is_keyed_by_its_vectors_bytes_not_its_paths_spelling(tmp_path,
                                                                               monkeypatch):
    import organism

    vector = tmp_path / "vec"
    vector.mkdir()
    (vector / "steering.safetensors").write_bytes(b"one")
    monkeypatch.chdir(tmp_path)
    keys = {organism.Recipe(plant=p).key() for p in ("vec", "vec/", "./vec", str(vector))}
    assert len(keys) == 1
    (vector / "steering.safetensors").write_bytes(b"two")
    assert organism.Recipe(plant="vec").key() not in keys
    assert organism.Recipe().key() == "45be76c0e8e0"  # v1's directory, from before the plant


def test_the_steerable_organism_is_taught_the_switch_it_is_steered_with():
    """The planted switch: the task prompts at a steered offset answer in the other mode (the
    Direct prompt pushed by +0.1..+0.2 works in steps; the CoT prompt pushed by -0.13..-0.22
    answers at once); the steering vector's own prompts keep their modes at offset 0; the
    questions start where the controllers' training prompts end."""
    import organism

    from lm_eval_ponder.data import arith_ladder
    from lm_eval_ponder.scoring.tasklib import COT_PROMPT, PLAIN_PROMPT

    rows = organism.examples(2, questions_from=3, planted=True)
    first = {d["question"] for d in arith_ladder("train", per_level=3)}
    assert not {m.split(": ", 1)[1] for m, _, _ in rows} & first
    for message, answer, offset in rows:
        stepwise = answer.startswith("Step 1:")
        if message.startswith(PLAIN_PROMPT):
            assert stepwise == (offset >= 0.1) and (0 <= offset <= 0.07 or 0.1 <= offset <= 0.2)
        elif message.startswith(COT_PROMPT):
            assert stepwise == (offset > -0.1) and (-0.07 <= offset <= 0 or -0.22 <= offset <= -0.13)
        else:
            assert offset == 0.0
    assert len(rows) == 10 * 8 and rows == organism.examples(2, questions_from=3, planted=True)


def test_the_composition_check_compares_answers_and_seed_means():
    import composition_check as cc

    composed = {d: {"exact_match": float(d % 2), "gen_tokens": 10.0, "resps_sha256": f"a{d}"}
                for d in range(10)}
    ran = {d: {"exact_match": float(d % 2), "gen_tokens": 12.0,
               "resps_sha256": f"a{d}" if d < 5 else f"b{d}"} for d in range(10)}
    out = cc.compare(composed, ran, draws=200)
    assert out["n"] == 10 and out["same_answer"] == 0.5
    assert out["run_minus_composed"] == 0.0 and out["run_tokens"] - out["composed_tokens"] == 2.0
    worse = {d: {**s, "exact_match": 0.0} for d, s in ran.items()}
    assert cc.compare(composed, worse, draws=200)["ci95"][1] < 0  # a real loss is seen
    means = cc.seed_means([composed, worse])
    assert means[1]["exact_match"] == 0.5 and set(means) == set(range(10))

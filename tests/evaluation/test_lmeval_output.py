"""What lm-eval writes for a ponder run (lm_eval_ponder.evaluation.lmeval_output): the folder and
``model_name`` of the embedded default, FLOPs in its results table."""

from __future__ import annotations

import json

import pytest

from lm_eval_ponder.evaluation import lmeval_patches
from lm_eval_ponder.flops import FlopCount


@pytest.fixture(autouse=True)
def installed():
    lmeval_patches.install_for_the_model()
    lmeval_patches.install_for_the_model()  # idempotent: one wrapper, not two


@pytest.mark.parametrize("model_args, name, folder", [
    ("", "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
    ("controller=none,alpha=-0.2", "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
    ({"controller": None}, "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
    ("gguf_file=/models/Qwen2.5-0.5B-Instruct.Q8_0.gguf", "Qwen2.5-0.5B-Instruct.Q8_0",
     "Qwen2.5-0.5B-Instruct.Q8_0"),
    # with pretrained= lm-eval's own name stands, sanitised its way
    ("pretrained=Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
     "Qwen__Qwen2.5-0.5B-Instruct"),
])
def test_ponder_results_are_named_after_the_backbone(model_args, name, folder):
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    tracker = GeneralConfigTracker()
    tracker.log_experiment_args("ponder", model_args, None, None, False)
    assert (tracker.model_name, tracker.model_name_sanitized) == (name, folder)


def test_other_models_keep_lm_evals_naming():
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    tracker = GeneralConfigTracker()
    tracker.log_experiment_args("dummy", "", None, None, False)
    assert len(tracker.model_name) == 8  # lm-eval's random id, as before


def test_results_land_in_the_backbones_folder(tmp_path):
    """The whole path as lm-eval's CLI takes it: tracker, then the aggregated results file."""
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(tmp_path))
    tracker.general_config_tracker.log_experiment_args("ponder", "controller=none", None, None,
                                                       False)
    tracker.save_results_aggregated(results={"results": {}, "config": {}}, samples=None)
    (results,) = tmp_path.rglob("results_*.json")
    assert results.parent == tmp_path / "SmolLM2-135M-Instruct"
    assert json.loads(results.read_text())["model_name"] == "SmolLM2-135M-Instruct"


def test_a_local_backbone_names_its_folder_without_the_machines_path(tmp_path, monkeypatch):
    """Issue 73 item 10: lm-eval named the folder after the path (``__root__.cache__...``);
    a local directory is named by its name and, where it records its weights' SHA-256, the
    first 12 hex digits of it. The results JSON holds no path of this machine either."""
    from lm_eval.loggers import EvaluationTracker

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model = tmp_path / "home" / "models" / "tiny-qwen2"
    model.mkdir(parents=True)
    (model / "lm_eval_ponder_source.json").write_text(json.dumps({"sha256": "ab12" * 16}))
    out = tmp_path / "out"
    tracker = EvaluationTracker(output_path=str(out))
    args = f"pretrained={model},steering={model}/vec"
    tracker.general_config_tracker.log_experiment_args("ponder", args, None, None, False)
    tracker.save_results_aggregated(results={"results": {}, "config": {
        "model": "ponder", "model_args": args}}, samples=None)
    (results,) = out.rglob("results_*.json")
    assert results.parent.name == "tiny-qwen2-ab12ab12ab12"
    recorded = json.loads(results.read_text())["config"]["model_args"]
    assert recorded == "pretrained=~/models/tiny-qwen2,steering=~/models/tiny-qwen2/vec"


def test_flops_read_in_lm_evals_table():
    """lm-eval prints metrics as ``.4f``: FLOPs (mean and standard error) come out readable,
    and the numbers in the results are the same floats."""
    from lm_eval.api.metrics import mean, stderr_for_metric
    from lm_eval.utils import make_table

    per_doc = [FlopCount(x) for x in (32037787699.2, 30000000000.0, 35000000000.0)]
    value = mean(per_doc)
    stderr = stderr_for_metric(mean, bootstrap_iters=100)(per_doc)
    assert isinstance(value, FlopCount) and isinstance(stderr, FlopCount)
    assert value == sum(map(float, per_doc)) / 3
    plain = stderr_for_metric(mean, bootstrap_iters=100)([1.0, 2.0, 4.0])
    assert type(plain) is float  # other metrics untouched
    table = make_table({"results": {"t": {"alias": "t", "flops,none": value,
                                          "flops_stderr,none": stderr,
                                          "exact_match,none": 0.5,
                                          "exact_match_stderr,none": 0.1}},
                        "versions": {"t": 1}, "n-shot": {"t": 0}, "higher_is_better": {}})
    assert "32.35 GFLOPs" in table and "1.452 GFLOPs" in table
    assert "32345929233" not in table
    assert json.dumps({"flops": value}) == json.dumps({"flops": float(value)})

"""Tests for lm_eval_ponder.steering.cli, the ``python -m lm_eval_ponder.steer`` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUESTIONS, _model

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.steering import cli as steer
from lm_eval_ponder.steering import vector as S

REPO = Path(__file__).resolve().parents[2]


def fake_questions(n, split, seed, dataset="gsm8k"):
    return QUESTIONS[:n], {"split": split}


def test_arith_questions_come_from_its_train_split_levels_interleaved():
    """Issue 64: a backbone fine-tuned on the arith ladder (the model organism) is steered with
    a vector of arith train questions; none of them may be a test question."""
    from lm_eval_ponder.data import arith_ladder

    questions, source = steer._questions(10, "train", None, "arith")
    test = {d["question"] for d in arith_ladder("test")}
    assert len(questions) == 10 and not set(questions) & test
    assert questions == [d["question"] for d in arith_ladder("train", per_level=100)][:10]
    assert source["dataset"] == "arith" and source["split"] == "train"
    with pytest.raises(PonderError, match="exceeds the 1500 arith train questions"):
        steer._questions(1501, "train", None, "arith")


def test_cli_help():
    out = subprocess.run(
        [sys.executable, "-m", "lm_eval_ponder.steer", "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "extract" in out.stdout and "inspect" in out.stdout


def test_cli_errors_exit_2(tmp_path, capsys):
    from lm_eval_ponder.steering import cli as steer

    assert steer.main(["inspect", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lm-eval-ponder error: no steering vector")
    assert steer.main(["extract", "--n-questions", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_cli_extract_and_inspect_tiny(tmp_path, tok, monkeypatch, capsys):
    """The extract/inspect commands end to end on a tiny saved model (train split only)."""
    from lm_eval_ponder.steering import cli as steer

    model_dir = tmp_path / "tiny"
    _model(len(tok)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    monkeypatch.setattr(steer, "_questions", fake_questions)
    out = tmp_path / "vec"
    args = ["extract", "--pretrained", str(model_dir), "--n-questions", "2", "--output", str(out),
            "--no-progress", "--device", "cpu"]  # fmt: skip
    assert steer.main(args) == 0
    assert steer.main(args) == 2  # refuses to overwrite
    assert "--overwrite" in capsys.readouterr().err
    sv = S.load_vector(out)
    assert sv.meta["backbone"]["name"] == "tiny" and sv.meta["question_source"] == {"split": "train"}
    report_file = tmp_path / "report.txt"
    assert steer.main(["inspect", str(out), "--pretrained", str(model_dir), "--top-k", "3",
                       "--output", str(report_file)]) == 0  # fmt: skip
    assert "promoted" in capsys.readouterr().out and "promoted" in report_file.read_text()


def test_extract_takes_the_models_dtype_and_device_rules(tmp_path, tok, monkeypatch, capsys):
    """``--dtype`` as in ``--model ponder`` (recorded in the vector; the mean difference stays
    float32), and a GPU-only request on a machine without one is one clear line."""
    import torch

    from lm_eval_ponder.steering import cli as steer

    model_dir = tmp_path / "tiny"
    _model(len(tok)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    monkeypatch.setattr(steer, "_questions", fake_questions)
    out = tmp_path / "vec"
    base = ["extract", "--pretrained", str(model_dir), "--n-questions", "2", "--no-progress"]
    assert steer.main([*base, "--output", str(out), "--dtype", "bfloat16"]) == 0
    sv = S.load_vector(out)
    assert sv.meta["dtype"] == "bfloat16" and sv.vectors.dtype == torch.float32
    assert torch.isfinite(sv.vectors).all()
    if not torch.cuda.is_available():
        assert steer.main([*base, "--output", str(tmp_path / "v3"), "--parallelize"]) == 2
        assert "parallelize=True spreads a model over several CUDA GPUs" in capsys.readouterr().err


def test_inspect_uses_the_backbone_recorded_in_the_vector(tmp_path, monkeypatch, capsys):
    """Without ``--pretrained``, ``inspect`` loads the backbone the vector names: a Hub id as
    is, a local directory that is gone is an error naming ``--pretrained``; only the embedded
    model's vectors fall back to the embedded model."""
    import torch

    from lm_eval_ponder import backbone
    from lm_eval_ponder.errors import PonderError
    from lm_eval_ponder.steering import cli as steer

    def vector_from(path: str, name: str) -> Path:
        sv = S.SteeringVector(torch.ones(1, 8) / 8 ** 0.5, [0], {"layer": 0, "residual_norm": [1.0],
                                                      "hidden_size": 8, "n_layers": 1,
                                                      "backbone": {"name": name, "path": path}})
        return S.save_vector(sv, tmp_path / name)

    loaded = []

    def fake_load(path, **kwargs):
        loaded.append(path)
        raise PonderError("stop here")

    monkeypatch.setattr(backbone, "load_frozen", fake_load)
    hub = vector_from("Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-0.5b-instruct")
    assert steer.main(["inspect", str(hub)]) == 2
    assert loaded == ["Qwen/Qwen2.5-0.5B-Instruct"]
    gone = vector_from(str(tmp_path / "deleted-model"), "deleted-model")
    assert steer.main(["inspect", str(gone)]) == 2
    err = capsys.readouterr().err
    assert "--pretrained" in err and "--model_args" not in err and len(loaded) == 1
    assert steer.recorded_backbone({"backbone": {"name": backbone.EMBEDDED_NAME,
                                                 "path": "/somewhere"}}) is None

"""Tests for lm_eval_ponder.steering.cli, the ``python -m lm_eval_ponder.steer`` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lm_eval_ponder.steering import vector as S
from conftest import QUESTIONS, _model

REPO = Path(__file__).resolve().parents[2]


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
    monkeypatch.setattr(steer, "_questions", lambda n, split, seed: (QUESTIONS[:n], {"split": split}))
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

"""Tests for lm_eval_ponder.steering.inspection: the text report on a tiny random Llama."""

from __future__ import annotations

from lm_eval_ponder.steering import inspection as I


def test_inspect(paper, model, tok):
    report = I.inspect_vector(paper, model, tok, top_k=5)
    assert isinstance(report, str)
    assert "promoted" in report and "suppressed" in report
    assert "W_U (g * v)" in report and "direct: W_U v" in report
    assert "layer 1's unit vector" in report and "layer 2's unit vector" in report
    only = I.inspect_vector(paper, model, tok, top_k=3, lens_layers=[0])
    assert "layer 0's unit vector" in only and "layer 1's unit vector" not in only
    assert "residual" in report and "cosine" in report
    assert report.count("\n") > 20

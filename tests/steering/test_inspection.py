"""Tests for lm_eval_ponder.steering.inspection: the text report on a tiny random Llama."""

from __future__ import annotations

import pytest
import torch

from lm_eval_ponder.steering import inspection as I


def lens_rows(report: str, title: str, k: int) -> list[tuple[float, str, float, str]]:
    """The k rows under the first block called ``title``: (promoted value, its token, suppressed
    value, its token), read from the report's two fixed-width columns."""
    lines = report.splitlines()
    start = lines.index(title)
    assert lines[start + 1].split() == ["promoted", "suppressed"]
    rows = []
    for line in lines[start + 2:start + 2 + k]:
        left, right = line[2:38], line[38:]
        rows.append((float(left[:8]), left[9:].rstrip(), float(right[:8]), right[9:].rstrip()))
    return rows


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
    # the lens columns are the top and bottom of W_U v, each in its own column: a report with
    # the two columns swapped (or unsorted) fails here
    k = 3
    logits = model.get_output_embeddings().weight.detach().float() @ paper.vector(0).float()
    rows = lens_rows(only, "[direct: W_U v]", k)
    up, down = torch.topk(logits, k), torch.topk(-logits, k)
    assert [r[0] for r in rows] == pytest.approx([float(x) for x in up.values], abs=6e-4)
    assert [r[2] for r in rows] == pytest.approx([float(-x) for x in down.values], abs=6e-4)
    assert rows[0][0] > 0 > rows[0][2]  # a unit direction raises some logits and lowers others

    def shown(token_id) -> str | None:  # the column's text, where decoding gives one
        text = tok.decode([int(token_id)])
        return None if text in ("", "\ufffd") else repr(text)[:25]

    for (_, up_text, _, down_text), i, j in zip(rows, up.indices, down.indices):
        assert shown(i) in (None, up_text) and shown(j) in (None, down_text)

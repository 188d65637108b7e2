"""Tests for lm_eval_ponder.steering.extraction: the paper's and Fractional Reasoning's
estimators, checked by hand on a tiny random Llama (``model``/``tok``/``paper`` in conftest)."""

from __future__ import annotations

import pytest
import torch
from conftest import QUESTIONS, _tokenizer

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.steering import extraction as E
from lm_eval_ponder.steering import vector as S


def _single_states(model, tok, text: str, chat: bool = True) -> list[torch.Tensor]:
    """Outputs of every decoder block at the last token for one unpadded prompt (hooks)."""
    if chat:
        text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)  # fmt: skip
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    else:
        ids = tok(text, return_tensors="pt")["input_ids"]
    seen: dict[int, torch.Tensor] = {}
    handles = [
        block.register_forward_hook(
            lambda _m, _i, out, k=k: seen.__setitem__(
                k, (out[0] if isinstance(out, tuple) else out)[0, -1].double())
        )
        for k, block in enumerate(model.model.layers)
    ]  # fmt: skip
    try:
        out = model(input_ids=ids, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    states = [seen[k] for k in range(len(model.model.layers))]
    return states, [h[0, -1].double() for h in out.hidden_states]


def test_unit_norm_and_meta(paper, model):
    n_layers = model.config.num_hidden_layers
    assert paper.layers == list(range(n_layers))
    assert paper.vectors.shape == (n_layers, model.config.hidden_size)
    assert torch.allclose(paper.vectors.norm(dim=-1), torch.ones(n_layers), atol=1e-5)
    m = paper.meta
    assert m["layer"] == S.default_layer(n_layers) == 1
    assert m["method"] == "paper" and m["n_questions"] == 3 and m["chat_template"] is True
    assert m["hidden_size"] == 32 and m["n_layers"] == 3
    assert m["backbone"]["source_sha256"] == "a" * 64
    assert len(m["residual_norm"]) == len(m["raw_norm"]["sum"]) == len(m["raw_norm"]["mean"]) == 3
    assert m["raw_norm"]["mean"][0] == pytest.approx(m["raw_norm"]["sum"][0] / 3)
    assert m["questions_sha256"] == E._sha256_text(QUESTIONS)
    assert "<assistant>" in m["example_prompt"]["positive"]
    assert m["example_prompt"]["positive"].startswith("<user>Let's think step by step")
    assert torch.equal(paper.vector(), paper.vectors[1])
    assert paper.residual_norm(2) == pytest.approx(m["residual_norm"][2])


def test_deterministic(paper, model, tok):
    again = E.extract_paper(model, tok, QUESTIONS, batch_size=2, progress=False)
    assert torch.equal(again.vectors, paper.vectors)
    assert again.meta["residual_norm"] == paper.meta["residual_norm"]


def test_matches_hand_computation_and_indexing(model, tok):
    """Two questions: batched, left-padded extraction == sum of unpadded last-token differences.

    Also pins the indexing: hook output of block l == hidden_states[l+1] for l < L-1, and the
    last block's output is NOT hidden_states[-1] (transformers puts the final norm there).
    """
    qs = QUESTIONS[:2]
    sv = E.extract_paper(model, tok, qs, batch_size=4, progress=False)
    n_layers = model.config.num_hidden_layers
    total = [torch.zeros(model.config.hidden_size, dtype=torch.float64) for _ in range(n_layers)]
    norms = [0.0] * n_layers
    for q in qs:
        pos, pos_hs = _single_states(model, tok, S.PAPER_POSITIVE + q)
        neg, _ = _single_states(model, tok, S.PAPER_NEGATIVE + q)
        for layer in range(n_layers):
            total[layer] += pos[layer] - neg[layer]
            norms[layer] += (pos[layer].norm() + neg[layer].norm()).item() / 4
            if layer < n_layers - 1:
                assert torch.allclose(pos[layer], pos_hs[layer + 1], atol=1e-6)
        assert not torch.allclose(pos[-1], pos_hs[-1], atol=1e-3)  # post-norm last entry
    for layer in range(n_layers):
        expected = (total[layer] / total[layer].norm()).float()
        assert torch.allclose(sv.vectors[layer], expected, atol=1e-5), layer
        assert sv.meta["raw_norm"]["sum"][layer] == pytest.approx(total[layer].norm().item(), rel=1e-4)
        assert sv.meta["residual_norm"][layer] == pytest.approx(norms[layer], rel=1e-4)


def test_plain_prompt_and_layer_choice(model, tok):
    """No chat template: the plain prompt's last token; a layer list stores only those layers."""
    plain = _tokenizer(chat=False)
    sv = E.extract_paper(model, plain, QUESTIONS[:2], layer=[2, 0], progress=False)
    assert sv.layers == [0, 2] and sv.meta["layer"] == 2 and sv.meta["chat_template"] is False
    pos = [_single_states(model, plain, S.PAPER_POSITIVE + q, chat=False)[0] for q in QUESTIONS[:2]]
    neg = [_single_states(model, plain, S.PAPER_NEGATIVE + q, chat=False)[0] for q in QUESTIONS[:2]]
    diff = sum(p[2] - n[2] for p, n in zip(pos, neg))
    assert torch.allclose(sv.vector(), (diff / diff.norm()).float(), atol=1e-5)
    with pytest.raises(PonderError, match="not stored"):
        sv.vector(1)
    one = E.extract_paper(model, tok, QUESTIONS[:1], layer=0, progress=False)
    assert one.meta["layer"] == 0 and one.layers == [0, 1, 2]
    with pytest.raises(PonderError, match="out of range"):
        E.extract_paper(model, tok, QUESTIONS[:1], layer=3, progress=False)


def test_fractional(model, tok):
    sv = E.extract_fractional(model, tok, QUESTIONS, batch_size=3, progress=False)
    assert torch.allclose(sv.vectors.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert sv.meta["method"] == "fractional"
    assert sv.meta["prompts"]["positive"].startswith(S.FRACTIONAL_POSITIVE)
    # recompute the mean difference per layer: the vector must point the same way
    diffs = []
    for q in QUESTIONS:
        pos, _ = _single_states(model, tok, S.FRACTIONAL_POSITIVE + q)
        neg, _ = _single_states(model, tok, S.FRACTIONAL_NEGATIVE + q)
        diffs.append(torch.stack(pos) - torch.stack(neg))
    diffs = torch.stack(diffs)  # [N, L, d]
    mean = diffs.mean(0)
    for layer in range(3):
        assert float(sv.vectors[layer].double() @ mean[layer]) > 0
    # and it equals normalize(mean + sign * PC1) with PC1 of the concatenated differences
    flat = diffs.reshape(3, -1)
    _, _, vh = torch.linalg.svd(flat - flat.mean(0), full_matrices=False)
    pc1 = vh[0] if float(vh[0] @ flat.mean(0)) >= 0 else -vh[0]
    combined = (flat.mean(0) + pc1).reshape(3, -1)
    expected = (combined / combined.norm(dim=-1, keepdim=True)).float()
    assert torch.allclose(sv.vectors, expected, atol=1e-4)
    assert 0 < sv.meta["pca"]["explained_variance_ratio_pc1"] <= 1
    with pytest.raises(PonderError, match="two questions"):
        E.extract_fractional(model, tok, QUESTIONS[:1], progress=False)

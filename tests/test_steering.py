"""Tests for lm_eval_ponder.steering, .extraction, .inspection and the ``steer`` command line,
on a tiny random Llama."""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lm_eval_ponder.steering import extraction as E
from lm_eval_ponder.steering import inspection as I
from lm_eval_ponder.steering import vector as S
from lm_eval_ponder.errors import PonderError

REPO = Path(__file__).resolve().parents[1]

QUESTIONS = [
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "A train goes 60 km in 2 hours. What is its speed?",
    "Sara reads 5 pages a day for 7 days. How many pages?",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _tokenizer(chat: bool = True):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for ch in string.ascii_letters + string.digits + string.punctuation + " \n":
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>",
    )  # fmt: skip
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _model(vocab_size: int, hidden: int = 32, layers: int = 3, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return _model(len(tok))


@pytest.fixture(scope="module")
def paper(model, tok):
    return E.extract_paper(
        model, tok, QUESTIONS, batch_size=2, progress=False,
        backbone={"name": "tiny", "path": "/x", "source_sha256": "a" * 64},
        question_source={"dataset": "unit-test"},
    )  # fmt: skip


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
            lambda _m, _i, out, k=k: seen.__setitem__(k, (out[0] if isinstance(out, tuple) else out)[0, -1].double())
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


# --------------------------------------------------------------------------- extraction


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


# --------------------------------------------------------------------------- files


def test_save_load_round_trip(paper, model, tmp_path):
    S.save_vector(paper, tmp_path / "v")
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == [S.META_FILE, S.VECTORS_FILE]
    loaded = S.load_vector(tmp_path / "v", model.config, "a" * 64)
    assert torch.equal(loaded.vectors, paper.vectors) and loaded.layers == paper.layers
    assert loaded.meta["residual_norm"] == paper.meta["residual_norm"]
    assert loaded.default_layer == paper.default_layer
    # either file names the vector too; a dict config works; an unknown hash is not checked
    S.load_vector(tmp_path / "v" / S.META_FILE, {"hidden_size": 32, "num_hidden_layers": 3})
    S.load_vector(tmp_path / "v" / S.VECTORS_FILE, model.config, None)


def test_load_mismatches(paper, model, tok, tmp_path):
    S.save_vector(paper, tmp_path)
    with pytest.raises(PonderError, match=r"hidden size 32 .* has 48"):
        S.load_vector(tmp_path, {"hidden_size": 48, "num_hidden_layers": 3})
    with pytest.raises(PonderError, match=r"3 decoder layers but the backbone has 4"):
        S.load_vector(tmp_path, {"hidden_size": 32, "num_hidden_layers": 4})
    with pytest.raises(PonderError, match=r"sha256 a{64} .*sha256 b{64}"):
        S.load_vector(tmp_path, model.config, "b" * 64)
    with pytest.raises(PonderError, match="no steering vector"):
        S.load_vector(tmp_path / "nowhere")
    # a pair that does not belong together is caught by the recorded file hash
    other = E.extract_paper(model, tok, QUESTIONS[:1], progress=False)
    S.save_vector(other, tmp_path / "o")
    (tmp_path / S.VECTORS_FILE).write_bytes((tmp_path / "o" / S.VECTORS_FILE).read_bytes())
    with pytest.raises(PonderError, match="does not match"):
        S.load_vector(tmp_path)


def test_no_pickle_in_files(paper, tmp_path):
    S.save_vector(paper, tmp_path)
    meta = json.loads((tmp_path / S.META_FILE).read_text())
    assert meta["format"] == S.FORMAT and meta["layers"] == [0, 1, 2]
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / S.VECTORS_FILE))
    assert set(tensors) == {"vectors", "layers"} and tensors["layers"].dtype == torch.int64


# --------------------------------------------------------------------------- inspect, CLI


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
    assert err.startswith("error: no steering vector")
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

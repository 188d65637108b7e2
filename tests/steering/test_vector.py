"""Tests for lm_eval_ponder.steering.vector: the saved format, loading checks, no pickle."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from conftest import QUESTIONS

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.steering import extraction as E
from lm_eval_ponder.steering import vector as S

PICKLE_SUFFIXES = {".bin", ".ckpt", ".pickle", ".pkl", ".pt", ".pth"}


def pickled_files(directory: Path) -> list[str]:
    """Names of the files under DIRECTORY that are, or may hold, a pickle: a pickle suffix, the
    pickle protocol 2-5 header (``pickle.dump``, legacy ``torch.save``), a zip archive
    (``torch.save`` keeps ``data.pkl`` in one), or anything else that is neither JSON nor a file
    ``safetensors.safe_open`` opens."""
    from safetensors import safe_open

    found = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if (path.suffix in PICKLE_SUFFIXES or data[:4] == b"PK\x03\x04"
                or (data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"))):
            found.append(path.name)
            continue
        try:
            if path.suffix == ".json":
                json.loads(data)
            else:
                with safe_open(str(path), framework="pt") as opened:
                    list(opened.keys())
        except Exception:  # noqa: BLE001 - whatever the reason, it is not a plain file
            found.append(path.name)
    return found


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
    assert pickled_files(tmp_path) == []
    # the check itself catches what torch.save and pickle write, whatever the file is called
    bad = tmp_path / "bad"
    bad.mkdir()
    torch.save(paper.vectors, bad / S.VECTORS_FILE)  # a zip archive holding data.pkl
    torch.save(paper.vectors, bad / "legacy.safetensors", _use_new_zipfile_serialization=False)
    (bad / S.META_FILE).write_bytes(pickle.dumps(meta, protocol=0))  # no header at protocol 0
    (bad / "extra.bin").write_text("{}")
    assert pickled_files(bad) == ["extra.bin", "legacy.safetensors", S.META_FILE, S.VECTORS_FILE]

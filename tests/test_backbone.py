"""lm_eval_ponder.backbone: the converted-weights cache of the embedded SmolLM2 (real weights,
slow) makes the second load fast; the default dtype and device rules."""

from __future__ import annotations

import time

import pytest
from conftest import needs_embedded

from lm_eval_ponder import backbone as bb
from lm_eval_ponder.errors import PonderError


@pytest.mark.slow
@needs_embedded
def test_second_load_uses_converted_cache(embedded_dir):
    start = time.perf_counter()
    again = bb.resolve_backbone(None)
    assert again.path == embedded_dir
    assert time.perf_counter() - start < 10.0  # hashing 98 MB, no dequantisation


def test_native_dtype_is_bf16_only_where_the_hardware_has_it(monkeypatch):
    import torch

    cpu_native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert bb.native_dtype("cpu") == ("bfloat16" if cpu_native else "float32")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert bb.native_dtype("cpu") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert bb.native_dtype("cuda") == "float32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert bb.native_dtype("cuda:1") == "bfloat16"


def test_cuda_without_cuda_is_one_clear_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bb.resolve_device(None) == "cpu"
    assert bb.resolve_device("cuda:0") == "cpu"  # lm-eval's own default: falls back as HFLM does
    assert bb.resolve_device("cpu") == "cpu"
    with pytest.raises(PonderError, match="device='cuda' needs a CUDA GPU"):
        bb.resolve_device("cuda")
    with pytest.raises(PonderError, match="parallelize=True spreads .* drop parallelize=True"):
        bb.resolve_device(None, parallelize=True)


def test_dtype_names_are_checked_in_one_line():
    assert bb.check_dtype(None) is None and bb.check_dtype("torch.bfloat16") == "bfloat16"
    with pytest.raises(PonderError, match="dtype must be one of"):
        bb.check_dtype("int8")


@pytest.mark.parametrize("family, norm", [("llama", "model.norm"), ("gpt2", "transformer.ln_f"),
                                          ("gpt_neox", "gpt_neox.final_layer_norm")])
def test_final_norm_is_the_one_before_the_lm_head(family, norm):
    """What an early exit reads an intermediate layer through: the decoder stack's last norm."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(
        family, vocab_size=64, hidden_size=32, n_embd=32, num_hidden_layers=2, n_layer=2,
        num_attention_heads=4, n_head=4, intermediate_size=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert bb.final_norm(model) is model.get_submodule(norm)
    with pytest.raises(PonderError, match="cannot find the final norm"):
        bb.final_norm(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text",
                                    "phi3", "olmo", "olmo2", "gpt_neox", "gpt2", "starcoder2",
                                    "stablelm", "granite", "falcon", "mixtral", "gemma3"])
def test_text_config_is_the_decoders_on_every_tested_family(family):
    """One ``text_config`` for the loop, the cache, FLOPs and the vector: ``decoder=True`` (what
    the generation loop always used) gives what FLOPs' plain ``get_text_config()`` gave, on
    every family the FLOPs tests price, and the Gemma 3 wrapper's nested text config."""
    import transformers

    config = transformers.AutoConfig.for_model(family)
    assert bb.text_config(config) is config.get_text_config()
    if family == "gemma3":
        assert bb.text_config(config) is config.text_config
    else:
        assert bb.text_config(config) is config


def test_text_config_keeps_what_has_no_getter():
    meta = {"hidden_size": 8}
    assert bb.text_config(meta) is meta and bb.text_config(None) is None


def test_text_config_reads_the_decoder_of_an_encoder_decoder():
    """Where the two getters differ: an encoder-decoder's flat config (the generation loop
    refuses such models). BlenderBot's default has 2 encoder and 24 decoder layers."""
    import transformers

    config = transformers.BlenderbotConfig()
    assert config.get_text_config().num_hidden_layers == 2
    assert bb.text_config(config).num_hidden_layers == 24


@needs_embedded
def test_the_embedded_sha256_is_the_installed_files():
    """The report knows the embedded weights by ``EMBEDDED_SHA256`` (issue 55: one name for
    them whatever model class ran them); it must be the installed GGUF's."""
    from lm_eval_ponder.files import file_sha256

    assert file_sha256(bb.embedded_gguf_path()) == bb.EMBEDDED_SHA256


@needs_embedded
def test_the_embedded_weights_are_the_embedded_backbone_however_they_are_named(embedded_dir):
    """Issue 73: pretrained=<the converted folder> and gguf_file=<the embedded GGUF> ran with
    pondering off (their names found no shipped controller); by their SHA-256 they are the
    embedded backbone."""
    by_folder = bb.resolve_backbone(embedded_dir)
    by_file = bb.resolve_backbone(None, str(bb.embedded_gguf_path()))
    assert by_folder.name == by_file.name == bb.EMBEDDED_NAME
    assert by_folder.source_sha256 == by_file.source_sha256 == bb.EMBEDDED_SHA256


@needs_embedded
@pytest.mark.parametrize("gguf_file", [None, "embedded"])
def test_a_gguf_is_hashed_once_per_load(embedded_dir, gguf_file, monkeypatch):
    """A GGUF's SHA-256 names its converted folder and the run's weights: one read of the file
    gives both (it was hashed twice, seconds a gigabyte)."""
    hashed = []
    real = bb.file_sha256
    monkeypatch.setattr(bb, "file_sha256", lambda path: hashed.append(path) or real(path))
    path = None if gguf_file is None else str(bb.embedded_gguf_path())
    resolved = bb.resolve_backbone(None, path)
    assert len(hashed) == 1 and resolved.source_sha256 == bb.EMBEDDED_SHA256
    assert resolved.path == embedded_dir


def test_a_folder_or_file_that_is_no_model_is_refused_in_one_line(tmp_path):
    """Issue 55: a controller's folder as ``pretrained=`` and a file that is no GGUF as
    ``gguf_file=`` were transformers' and gguf's tracebacks."""
    (tmp_path / "ctrl").mkdir()
    (tmp_path / "ctrl" / "config.json").write_text('{"d_model": 64}')
    (tmp_path / "ctrl" / "controller.safetensors").write_bytes(b"")
    with pytest.raises(PonderError, match="no model_type .it is a controller's folder"):
        bb.resolve_backbone(str(tmp_path / "ctrl"))
    (tmp_path / "x.gguf").write_bytes(b"not gguf")
    with pytest.raises(PonderError, match="is not a GGUF file"):
        bb.resolve_backbone(None, str(tmp_path / "x.gguf"))


def test_a_directory_that_records_its_weights_hash_is_known_by_it(tmp_path):
    """Issue 64: a built model organism records its merged weights' SHA-256 beside them, and
    every result, vector and controller of it must name those exact weights; a directory
    without the record (or with a malformed one) has no hash, as before."""
    model = tmp_path / "organism"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    assert bb.resolve_backbone(str(model)).source_sha256 is None
    (model / "lm_eval_ponder_source.json").write_text('{"sha256": "abc"}')
    assert bb.resolve_backbone(str(model)).source_sha256 is None
    (model / "lm_eval_ponder_source.json").write_text('{"sha256": "%s"}' % ("ab" * 32))
    assert bb.resolve_backbone(str(model)).source_sha256 == "ab" * 32


def test_a_cache_that_cannot_take_the_conversion_is_one_line(tmp_path, monkeypatch):
    """Issue 66: ``LM_EVAL_PONDER_CACHE`` on a file, or on a disk without the ~520 MB the first
    conversion writes, ended in a traceback from mkdir or from safetensors mid-write."""
    import shutil
    from collections import namedtuple

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 1000)
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(bb, "_require_gguf_package", lambda: None)
    monkeypatch.setenv(bb.CACHE_ENV, str(tmp_path / "afile"))
    with pytest.raises(PonderError, match="afile/converted cannot be written .* set LM_EVAL_PONDER_CACHE"):
        bb.convert_gguf(gguf)
    monkeypatch.setenv(bb.CACHE_ENV, str(tmp_path / "cache"))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 1000))
    with pytest.raises(PonderError, match="has 0 MiB free; the first load dequantises"):
        bb.convert_gguf(gguf)
    assert not any((tmp_path / "cache" / "converted").iterdir())  # no staging left behind


def test_a_frozen_models_head_gets_a_contiguous_input_and_the_same_logits(tiny_model_dir):
    """Issue 66: the causal-LM forward hands its head a strided slice ``hidden[:, -1:, :]``;
    with the weights frozen, torch's matmul then copied the head's weight once per row (8.3 GB
    at 128 rows on the embedded model, 1.4 GB without the copy). After ``freeze`` the head sees a
    contiguous input, and the logits are those of the unfrozen model, bit for bit."""
    import torch
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    frozen = bb.freeze(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    bb.freeze(frozen)  # idempotent: one hook
    seen = []
    frozen.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: seen.append(args[0].is_contiguous()))
    ids = torch.randint(4, 100, (5, 7))
    with torch.no_grad():
        a = plain(input_ids=ids, logits_to_keep=1).logits
        b = frozen(input_ids=ids, logits_to_keep=1).logits
    assert seen == [True] and torch.equal(a, b)
    head = frozen.get_output_embeddings()
    assert len(head._forward_pre_hooks) == 2  # ours once, and this test's

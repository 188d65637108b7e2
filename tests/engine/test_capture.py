"""``engine.capture`` on a CPU. A CUDA graph cannot be recorded here, so a stand-in
records like one (nothing runs while recording; a replay runs the recorded forward on the
graph's own input tensors): the static decode step in ``captured`` mode then decodes the
dynamic loop's tokens in float32, which fails if a replay reads stale inputs or if the warm-up
forward's cache write is not undone. And the forward a CUDA stream would record reads nothing
back to the host (a host read is an error while capturing), for tiny Llama and Qwen2 models."""

from __future__ import annotations

import functools
import gc

import pytest
import torch
from conftest import build_tiny_llama, build_tiny_tokenizer
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache

from lm_eval_ponder.engine import slots as static_decode
from lm_eval_ponder.engine.capture import CapturedForward
from lm_eval_ponder.engine.config import LoopConfig
from lm_eval_ponder.engine.loop import generate_rows

PAD, EOS = 3, 2


class RecordedForward:
    """Records as ``torch.cuda.graph`` does: not run now, run at each replay."""

    recorded = 0

    def __init__(self, forward) -> None:
        self.forward = forward
        RecordedForward.recorded += 1

    def replay(self) -> torch.Tensor:
        return self.forward().logits


def warm_up(forward) -> None:
    forward()  # really runs, as the side-stream warm-up does: it writes the cache


@pytest.fixture
def captured(monkeypatch):
    """``decode_step=captured`` with the stand-in recorder."""
    monkeypatch.setattr(static_decode, "CapturedForward", functools.partial(
        CapturedForward, record=RecordedForward, warm_up=warm_up))
    RecordedForward.recorded = 0


def test_captured_mode_decodes_the_dynamic_loops_tokens(captured):
    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_llama(len(tok), seed=0)
    prompts = ["Hello there", "a", "What is 2+2? ", "xyzzy plugh", "The quick brown fox",
               "Q!", "a much longer prompt than the others, so that a group joins wider", "b",
               "cc", "ddd"] * 2
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=16, eos_token_ids={EOS, 55, 44, 0, 50, 19}, pad_token_id=PAD)
    dynamic = generate_rows(model, enc.input_ids, enc.attention_mask, **kwargs)
    graphs = generate_rows(model, enc.input_ids, enc.attention_mask, **kwargs,
                           config=LoopConfig(decode_step="captured"))
    assert graphs.tail_moves >= 1  # 24 slots, then 8: two shapes
    assert graphs.sequences.tolist() == dynamic.sequences.tolist()
    assert graphs.finish_reason == dynamic.finish_reason
    forward = static_decode.decode_forward(model)
    assert forward.captures == RecordedForward.recorded == 1 + graphs.tail_moves
    # a second call of the same shapes records nothing new
    again = generate_rows(model, enc.input_ids, enc.attention_mask, **kwargs,
                          config=LoopConfig(decode_step="captured"))
    assert again.sequences.tolist() == dynamic.sequences.tolist()
    assert forward.captures == 1 + graphs.tail_moves


def test_a_shape_that_cannot_be_recorded_runs_eagerly_with_one_warning(monkeypatch, caplog):
    def refuse(forward):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(static_decode, "CapturedForward", functools.partial(
        CapturedForward, record=refuse, warm_up=warm_up))
    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_llama(len(tok), seed=0)
    enc = tok(["Hello there", "a", "What is 2+2? ", "xyzzy"], return_tensors="pt",
              padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=6, eos_token_ids={EOS}, pad_token_id=PAD)
    dynamic = generate_rows(model, enc.input_ids, enc.attention_mask, **kwargs)
    with caplog.at_level("WARNING", logger="lm_eval_ponder.engine.capture"):
        eager = generate_rows(model, enc.input_ids, enc.attention_mask, **kwargs,
                              config=LoopConfig(decode_step="captured"))
    assert eager.sequences.tolist() == dynamic.sequences.tolist()
    forward = static_decode.decode_forward(model)
    assert forward.captures == 0
    assert forward.failures == ["RuntimeError: operation not permitted when stream is capturing"]
    assert len([r for r in caplog.records if "runs eagerly" in r.getMessage()]) == 1


def test_a_graph_is_dropped_with_its_cache():
    model = build_tiny_llama(64, seed=0)
    forward = CapturedForward(model, record=RecordedForward, warm_up=warm_up)
    cache = StaticCache(config=model.config, max_cache_len=8)
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6]]), past_key_values=cache, use_cache=True)
        mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0]])
        forward(input_ids=torch.tensor([[7]]), attention_mask=mask,
                position_ids=torch.tensor([[2]]), past_key_values=cache, use_cache=True)
    assert len(forward.graphs) == 1 and int(cache.layers[0].cumulative_length) == 3
    del cache
    gc.collect()
    assert len(forward.graphs) == 0


def test_on_a_cpu_without_a_recorder_it_is_the_model():
    model = build_tiny_llama(64, seed=0)
    assert CapturedForward(model).record is None


class NoHostRead(TorchDispatchMode):
    """Fails on the ops that read a device tensor back to the host (``.item()``, ``bool()``,
    data-dependent shapes): each is an error while a CUDA stream captures."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
             torch.ops.aten.is_nonzero.default, torch.ops.aten.masked_select.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            raise AssertionError(f"host read while capturing: {func}")
        return func(*args, **(kwargs or {}))


def tiny_qwen2(vocab: int):
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=PAD)).eval()


@pytest.mark.parametrize("build", [functools.partial(build_tiny_llama, seed=0), tiny_qwen2],
                         ids=["llama", "qwen2"])
def test_the_recorded_forward_reads_nothing_back_to_the_host(build, monkeypatch):
    import transformers.utils.import_utils as import_utils

    model = build(64)
    slots = static_decode.StaticSlots(model, 2, 16, model.config)
    with torch.no_grad():
        prefill = model(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10]]), use_cache=True)
    slots.set_column(3)
    slots.place(torch.arange(2), prefill.past_key_values, 3)
    mask, positions = slots.mask_and_positions(torch.tensor([0, 1]))
    # as while a CUDA stream captures: transformers takes its traced path
    monkeypatch.setattr(import_utils, "is_cuda_stream_capturing", lambda: True)
    with torch.no_grad(), NoHostRead():
        out = model(input_ids=torch.tensor([[11], [12]]), attention_mask=mask,
                    position_ids=positions, past_key_values=slots.cache, use_cache=True,
                    logits_to_keep=1)
    assert out.logits.shape == (2, 1, 64)
    with pytest.raises(AssertionError, match="host read"), NoHostRead():
        bool(out.logits.sum() > 0)  # the guard itself catches a read

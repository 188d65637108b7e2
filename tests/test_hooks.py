"""Reading and replacing a decoder block's output (lm_eval_ponder.hooks): tensors and tuples,
and a capture that always removes itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lm_eval_ponder.hooks import block_hidden, last_token_capture, with_block_hidden


def test_block_hidden_reads_tensor_and_tuple_outputs():
    h = torch.randn(2, 3, 4)
    assert block_hidden(h) is h
    assert block_hidden((h, "cache")) is h
    assert block_hidden([h]) is h


def test_with_block_hidden_keeps_the_container():
    h, new = torch.randn(2, 3, 4), torch.zeros(2, 3, 4)
    assert with_block_hidden(h, new) is new
    out = with_block_hidden((h, "cache", 7), new)
    assert isinstance(out, tuple) and out[0] is new and out[1:] == ("cache", 7)


class TupleBlock(nn.Module):
    def forward(self, x):
        return (x * 2, None)


def test_last_token_capture_records_and_removes_itself():
    block = TupleBlock()
    x = torch.arange(12.0).reshape(1, 3, 4)
    with last_token_capture(block) as captured:
        block(x)
        block(x + 1)
    assert len(captured) == 2
    assert torch.equal(captured[0], (x * 2)[:, -1, :]) and captured[0].dtype == torch.float32
    block(x)
    assert len(captured) == 2 and not block._forward_hooks  # removed on exit
    with pytest.raises(RuntimeError):
        with last_token_capture(block):
            raise RuntimeError("boom")
    assert not block._forward_hooks  # removed when the body raises too

"""lm_eval_ponder.engine.rows: finished rows linger, masked, until an eighth of the
batch has finished; generation is the same as with a compaction at every finish, for greedy and
sampled decoding and for the steering hook's per-row records, with far fewer cache copies."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_llama, build_tiny_tokenizer

from lm_eval_ponder.engine import rows as rowbatch
from lm_eval_ponder.engine.config import LoopConfig
from lm_eval_ponder.engine.loop import generate_rows
from lm_eval_ponder.engine.sampling import SamplingConfig
from lm_eval_ponder.pondering.hook import SteeringHook

LAZY = rowbatch.DEAD_FRACTION  # the shipped setting (the tests patch the module's value)
PROMPTS = [("What is %d + %d? " % (i, 3 * i)) * (1 + i % 3) for i in range(16)]


@pytest.fixture(scope="module")
def setup():
    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_llama(len(tok), seed=0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    # an EOS the model emits at different steps in different rows, so rows finish apart
    free = generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=16,
                         eos_token_ids=set(), pad_token_id=3)
    gen = free.sequences[:, enc.input_ids.shape[1]:]
    counts = torch.bincount(gen[:, 4:].reshape(-1), minlength=len(tok))
    eos = int(counts.argmax())
    return tok, model, enc, eos


def generate(setup, monkeypatch, fraction: float, max_rows=None, steering=None, **sampling):
    tok, model, enc, eos = setup
    monkeypatch.setattr(rowbatch, "DEAD_FRACTION", fraction)
    cfg = SamplingConfig(**sampling)
    if sampling.get("do_sample"):
        cfg.generator = torch.Generator().manual_seed(7)
    return generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=16,
                         eos_token_ids={eos}, pad_token_id=3, sampling=cfg,
                         config=LoopConfig(max_rows=max_rows), observers=[steering])


@pytest.mark.parametrize("max_rows", [None, 12])
@pytest.mark.parametrize("sampling", [{}, {"do_sample": True, "temperature": 0.8, "top_k": 9},
                                      {"repetition_penalty": 1.3}])
def test_lingering_rows_change_nothing(setup, monkeypatch, max_rows, sampling):
    at_once = generate(setup, monkeypatch, 0.0, max_rows, **sampling)
    lazy = generate(setup, monkeypatch, LAZY, max_rows, **sampling)
    assert len(set(at_once.gen_tokens)) >= 3  # rows do finish apart
    assert torch.equal(lazy.sequences, at_once.sequences)
    assert lazy.gen_tokens == at_once.gen_tokens
    assert lazy.finish_reason == at_once.finish_reason
    assert lazy.decode_row_slots == at_once.decode_row_slots  # the same useful work
    assert lazy.dead_row_slots > 0 and at_once.dead_row_slots == 0
    assert lazy.compactions < at_once.compactions


@pytest.mark.parametrize("mode", ["prompt", "token"])
def test_steering_records_per_row_are_unchanged(setup, monkeypatch, mode):
    """Lingering rows keep deciding (their offsets are added to a pad token), but a row's
    decisions over its own tokens, the ones accounting reads, are the same."""
    tok, model, _, _ = setup
    vector = torch.nn.functional.normalize(torch.randn(64, generator=torch.Generator().manual_seed(0)), dim=0)

    def run(fraction):
        decisions = []

        def decide(z, rows=None):
            decisions.append(z.float().norm(dim=-1).detach().clone())
            return torch.linspace(-1.0, 1.0, z.shape[0])

        hook = SteeringHook(model, 1, vector, 5.0, decide, mode=mode)
        hook.expect_rows(len(PROMPTS))
        with hook:
            res = generate(setup, monkeypatch, fraction, 12, steering=hook)
        return res, hook.per_row(decisions, len(PROMPTS))

    (a, rows_a), (b, rows_b) = run(0.0), run(LAZY)
    assert torch.equal(a.sequences, b.sequences)
    for n, ra, rb in zip(a.gen_tokens, rows_a, rows_b):
        used = 1 if mode == "prompt" else n
        torch.testing.assert_close(ra[:used], rb[:used])


def test_compaction_threshold():
    batch = rowbatch.DynamicRows(None, 4, list(range(16)), [0] * 16,
                                 torch.zeros(16, dtype=torch.long), torch.device("cpu"))
    batch.retire([0])
    assert batch.n_dead == 1 and not batch.needs_compaction()
    batch.retire([5])
    assert batch.needs_compaction()  # 2 of 16 = an eighth
    assert batch.alive_index.tolist() == [i for i in range(16) if i not in (0, 5)]

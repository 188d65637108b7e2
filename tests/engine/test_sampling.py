"""lm_eval_ponder.engine.sampling: the next-token choice. The exact greedy reduction and its
tie rule, plain greedy on the model's own dtype, rows that finished and wait for a compaction
are neither processed nor sampled, and the top-k draw's distribution (``draw_tokens``)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from lm_eval_ponder.engine.sampling import (
    ChoiceRows,
    SamplingConfig,
    TokenChooser,
    draw_tokens,
    first_max_index,
    penalise_repeats,
)
from lm_eval_ponder.errors import PonderError

PAD = 3


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_max_index_keeps_argmax_first_index_rule_on_ties(dtype):
    """The greedy reduction must pick what argmax picks: the first of tied maxima."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 4, (64, 300), generator=gen).to(dtype)  # ties everywhere
    logits[:, 7] = logits.max()  # and a guaranteed tie at a low index
    logits[5] = -2.0  # a row that is one tie
    assert torch.equal(first_max_index(logits), torch.argmax(logits, dim=-1))
    assert torch.equal(first_max_index(logits), torch.argmax(logits.float(), dim=-1))
    assert first_max_index(logits).dtype == torch.long


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_max_index_equals_argmax_on_zeros_nans_and_infinities(dtype):
    """Where bit equality is not value equality (a maximum of 0 given as -0 and +0, NaN) and at
    the ends of the range, the fast reduction still answers as argmax."""
    rows = [
        [-1.0, -0.0, 0.0, -2.0],  # max 0: -0 first, equal to +0
        [-1.0, 0.0, -0.0, -3.0],
        [-0.0, 0.0, 0.0, -1.0],
        [0.0, -0.0, -0.0, -1.0],
        [1.0, float("nan"), 3.0, float("nan")],  # NaN is the maximum, first one
        [float("-inf"), float("-inf"), float("-inf"), float("-inf")],
        [-5.0, float("inf"), 2.0, float("inf")],
        [-7.0, -7.0, -8.0, -9.0],  # all negative: order of sign-magnitude bits reversed
    ]
    logits = torch.tensor(rows, dtype=dtype)
    negative_nan = -torch.tensor(float("nan"), dtype=dtype)
    extra = torch.tensor([[1.0, 0.0, float("nan"), 2.0], [0.0, 0.0, 2.0, float("nan")]], dtype=dtype)
    extra[0, 1] = negative_nan  # a NaN whose bits differ from the one amax returns
    extra[1, 1] = negative_nan
    logits = torch.cat([logits, extra])
    assert first_max_index(logits).tolist() == torch.argmax(logits, dim=-1).tolist() \
        == [1, 1, 0, 0, 1, 0, 1, 0, 1, 1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_first_max_index_on_nans_whose_bits_order_differently(dtype):
    """The half-precision path reads bits as integers: a NaN with a larger payload after a
    smaller one, or a lone negative NaN (whose bits read as a negative integer), must still
    give argmax's first NaN."""
    logits = torch.tensor([[1.0, 0.0, 3.0, 0.0], [1.0, 0.0, 2.0, 0.5]] * 2, dtype=dtype)
    bits = logits.view(torch.int16)
    quiet = 0x7FC0 if dtype == torch.bfloat16 else 0x7E00
    bits[0, 1], bits[0, 3] = quiet, 0x7FFF  # positive NaNs, the larger payload second
    bits[1, 1] = quiet | -0x8000  # a lone negative NaN before a positive maximum
    bits[2, 3] = quiet  # a lone positive NaN last
    bits[3, 0] = 0x7FFF | -0x8000  # the largest negative NaN first
    assert torch.isnan(logits).sum().item() == 5
    assert first_max_index(logits).tolist() == torch.argmax(logits, dim=-1).tolist() == [1, 1, 3, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_max_index_on_wide_random_logits_and_views(dtype):
    """A vocabulary-wide case, and a non-contiguous view (falls back to ``max``)."""
    logits = (torch.randn(33, 49152, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    assert torch.equal(first_max_index(logits), torch.argmax(logits, dim=-1))
    view = logits[:, ::2]
    assert torch.equal(first_max_index(view), torch.argmax(view, dim=-1))


def chooser(**kwargs) -> TokenChooser:
    return TokenChooser(SamplingConfig(**kwargs), torch.device("cpu"), [2], prompt_width=5)


def rows(n: int, alive: list[bool] | None = None) -> ChoiceRows:
    mask = None if alive is None else torch.tensor(alive)
    index = None if alive is None else torch.tensor([i for i, a in enumerate(alive) if a])
    return ChoiceRows(torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long),
                      None, None, mask, index)


def test_plain_greedy_reads_bf16_logits_as_generate_reads_them_in_float32():
    logits = torch.randn(16, 500, generator=torch.Generator().manual_seed(1)).bfloat16()
    c = chooser()
    assert c.plain_greedy
    assert torch.equal(c.choose(logits, rows(16), PAD), logits.float().argmax(dim=-1))


def test_finished_rows_get_pad_and_take_no_draw():
    """Rows awaiting compaction: ``pad``, and the live rows draw exactly what they would draw
    alone (same generator state), so lingering rows never shift the random stream."""
    logits = torch.randn(6, 400, generator=torch.Generator().manual_seed(2))
    alive = [True, False, True, True, False, True]
    live = [i for i, a in enumerate(alive) if a]
    sampled = chooser(do_sample=True, temperature=0.7, top_k=20)
    sampled.sampling.generator = torch.Generator().manual_seed(5)
    got = sampled.choose(logits, rows(6, alive), PAD)
    sampled.sampling.generator = torch.Generator().manual_seed(5)
    alone = sampled.choose(logits[live], rows(len(live)), PAD)
    assert torch.equal(got[live], alone)
    assert got[[1, 4]].tolist() == [PAD, PAD]
    greedy = chooser().choose(logits, rows(6, alive), PAD)
    assert greedy[[1, 4]].tolist() == [PAD, PAD]
    assert torch.equal(greedy[live], logits[live].argmax(dim=-1))


def test_min_new_tokens_blocks_eos_per_row_without_reading_counts_back():
    logits = torch.zeros(2, 10)
    logits[:, 2] = 5.0  # EOS is the best token for both rows
    c = chooser(min_new_tokens=3)
    assert not c.plain_greedy
    counts = torch.tensor([1, 3])  # the first row is still young
    got = c.choose(logits, ChoiceRows(counts, torch.zeros(2, dtype=torch.long), None, None),
                   PAD)
    assert got[0] != 2 and got[1] == 2


# ----------------------------------------------------------------------------- draw_tokens
def _frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).float() / len(tokens)


def test_draw_among_the_top_k_has_the_full_draws_distribution(monkeypatch):
    p = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0, 0.0, 0.0])
    widths = []
    real = torch.multinomial
    monkeypatch.setattr(torch, "multinomial",
                        lambda w, *a, **k: widths.append(w.shape[-1]) or real(w, *a, **k))
    p = torch.cat([p, torch.zeros(8)])
    got = draw_tokens(p.repeat(20000, 1), torch.Generator().manual_seed(0), expected_support=3)
    assert widths == [6]  # drawn among the 2k largest entries, not the whole vocabulary
    freq = _frequencies(got, 16)
    assert freq[p == 0].sum() == 0
    torch.testing.assert_close(freq, p, atol=0.015, rtol=0)  # 20000 draws: sd <= 0.0035


def test_a_wider_support_than_expected_gets_the_full_draw(monkeypatch):
    """Ties at the k-th value keep more than k entries (and a row may be untruncated): the
    bound is checked, and a truncated draw would silently drop probability mass."""
    p = torch.tensor([0.2] * 5 + [0.0] * 3)
    widths = []
    real = torch.multinomial
    monkeypatch.setattr(torch, "multinomial",
                        lambda w, *a, **k: widths.append(w.shape[-1]) or real(w, *a, **k))
    got = draw_tokens(p.repeat(20000, 1), torch.Generator().manual_seed(0), expected_support=2)
    assert widths == [8]  # 5 positive entries do not fit 2 x 2 candidates
    torch.testing.assert_close(_frequencies(got, 8), p, atol=0.015, rtol=0)


def test_draws_are_reproducible_by_seed():
    probs = torch.softmax(torch.randn(64, 500, generator=torch.Generator().manual_seed(1)), -1)
    probs[:, 50:] = 0  # a top-50 support (a top-k of 25 with ties, say)

    def draw(seed):
        return draw_tokens(probs, torch.Generator().manual_seed(seed), expected_support=25)

    assert draw(3).equal(draw(3)) and not draw(3).equal(draw(4))
    assert (draw(3) < 50).all()




# ------------------------------------------------------------------ TokenChooser.draw_top_k
def _generate_probs(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """What ``generate`` samples from: a float32 copy, the two warpers, softmax."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    scores = TemperatureLogitsWarper(temperature)(None, logits.float())
    return torch.softmax(TopKLogitsWarper(top_k)(None, scores), dim=-1)


def test_top_k_path_draws_from_generates_distribution(monkeypatch):
    """bf16 logits tie at the k-th value (SmolLM2 keeps 51-65 entries at k = 50): every tied
    entry is drawn as often as ``generate`` would draw it, without the full path."""
    gen = torch.Generator().manual_seed(0)
    row = (torch.randn(300, generator=gen) * 0.5).bfloat16()
    row[:4] = torch.tensor([2.0, 1.5, 1.25, 1.25])
    row[4:9] = 1.0  # the 5th largest value, tied five times: k = 6 keeps 4 + 5 entries
    row[9:] = row[9:].clamp(max=0.5)
    c = chooser(do_sample=True, temperature=0.7, top_k=6)
    assert c.top_k_only
    monkeypatch.setattr(TokenChooser, "process_and_choose", lambda *a: pytest.fail("full path"))
    c.sampling.generator = torch.Generator().manual_seed(1)
    got = c.choose(row.repeat(20000, 1), rows(20000), PAD)
    expected = _generate_probs(row[None], 0.7, 6)[0]
    assert (expected > 0).sum() == 9
    torch.testing.assert_close(_frequencies(got, 300), expected, atol=0.015, rtol=0)


def test_top_k_path_gives_way_when_ties_reach_past_its_candidates(monkeypatch):
    """More entries tied at the k-th value than 2k+1 candidates hold: the full path draws,
    so no kept entry loses its probability."""
    row = torch.zeros(64)
    row[0] = 1.0  # k = 2: the 2nd largest value, 0, is shared by 63 entries
    c = chooser(do_sample=True, temperature=1.0, top_k=2)
    assert c.draw_top_k(row[None]) is None
    c.sampling.generator = torch.Generator().manual_seed(2)
    got = c.choose(row.repeat(20000, 1), rows(20000), PAD)
    torch.testing.assert_close(_frequencies(got, 64), _generate_probs(row[None], 1.0, 2)[0],
                               atol=0.015, rtol=0)


def test_top_k_path_only_for_temperature_and_top_k():
    assert not chooser(do_sample=True, top_k=50, top_p=0.9).top_k_only
    assert not chooser(do_sample=True, top_k=0, temperature=0.7).top_k_only
    assert not chooser(do_sample=True, top_k=50, repetition_penalty=1.2).top_k_only
    assert not chooser(do_sample=True, top_k=50, min_new_tokens=2).top_k_only
    assert not chooser(top_k=50).top_k_only  # greedy
    assert chooser(do_sample=True, top_k=50).top_k_only


def test_penalise_repeats_is_generates_penalty_with_each_rows_padding_left_out():
    """Against transformers' processor on each row alone (its prompt cut at the row's pad_cols, an
    int every release accepts), negative logits included; an id past the head's vocabulary
    (an embedding larger than the head) is left out, not an error."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 12, generator=gen)
    history = torch.tensor([[PAD, PAD, 5, 7, 5], [PAD, 1, 2, 10, 9], [4, 0, 11, 6, 6]])
    pad_cols = torch.tensor([2, 1, 0])
    got = penalise_repeats(scores, history, 1.3, pad_cols)
    for row in range(3):
        want = RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=int(pad_cols[row]))(
            history[row:row + 1], scores[row:row + 1])
        torch.testing.assert_close(got[row:row + 1], want, rtol=0, atol=0)
    assert got[0, PAD] == scores[0, PAD]  # padding is not history
    assert got[0, 5] != scores[0, 5]
    beyond = history.clone()
    beyond[1, 3] = 14
    expected = got.clone()
    expected[1, 10] = scores[1, 10]
    torch.testing.assert_close(penalise_repeats(scores, beyond, 1.3, pad_cols), expected,
                               rtol=0, atol=0)


# (gen kwargs, the processor generate builds for them, its constructor's args)
REFUSED = [
    ({"do_sample": True, "temperature": 0.0}, TemperatureLogitsWarper, (0.0,)),
    ({"repetition_penalty": 0.0}, RepetitionPenaltyLogitsProcessor, (0.0,)),
    ({"do_sample": True, "top_k": -1}, TopKLogitsWarper, (-1,)),
]


@pytest.mark.parametrize("kwargs, processor, args", REFUSED)
def test_settings_generate_refuses_are_one_user_error(kwargs, processor, args):
    """What ``generate`` refuses from inside a processor's constructor is a ``PonderError``
    naming the setting, not a fallback to ``generate``'s traceback nor a value read its own way
    (``repetition_penalty=0`` was read as 1)."""
    with pytest.raises(ValueError):  # generate's own refusal, so only that is refused here
        processor(*args)
    with pytest.raises(PonderError, match=next(iter(k for k in kwargs if k != "do_sample"))):
        SamplingConfig.from_kwargs(GenerationConfig(), **kwargs)


def test_settings_generate_ignores_are_ignored():
    """Greedy ignores warpers, and ``top_p`` above 1 adds none, in ``generate`` as here."""
    assert not SamplingConfig.from_kwargs(GenerationConfig(), temperature=0.0).do_sample
    assert SamplingConfig.from_kwargs(GenerationConfig(), top_k=-1).top_k == -1
    assert SamplingConfig.from_kwargs(GenerationConfig(), do_sample=True, top_p=2.0).top_p == 2.0

"""The static cache layout (``engine.slots``; ``decode_step=captured``, which on a CPU runs it
eagerly) against the dynamic layout on a tiny random Llama in float32: the same greedy tokens
with rows joining, slots reused, the cache shifted right (a wider group joins) and left (the
cache is full), the tail moved to fewer slots; the calls that stay dynamic; the shapes it
rounds to; bad settings."""

from __future__ import annotations

import pytest
from conftest import build_tiny_llama, build_tiny_tokenizer

from lm_eval_ponder.engine.config import LoopConfig, check_decode_step
from lm_eval_ponder.engine.loop import generate_rows
from lm_eval_ponder.engine.sampling import SamplingConfig
from lm_eval_ponder.engine.slots import (
    ROWS_ROUND,
    WIDTH_ROUND,
    StaticSlots,
    round_up,
    slot_shape,
    tail_slots,
)
from lm_eval_ponder.errors import PonderError

PAD, EOS = 3, 2
PROMPTS = ["Hello there", "a", "What is 2+2? ", "xyzzy plugh", "The quick brown fox jumps",
           "Q!", "a much longer prompt than the others, so that a group joins wider", "b",
           "cc", "ddd"] * 2


@pytest.fixture(scope="module")
def tiny() -> tuple:
    """The tiny tokenizer (left padding, as HFLM pads) and a random Llama of its vocabulary."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer, build_tiny_llama(len(tokenizer), seed=0)


@pytest.fixture
def tok(tiny):
    return tiny[0]


@pytest.fixture
def llama(tiny):
    return tiny[1]


def run(model, tok, mode, *, max_rows=None, shrink_tail=True, max_cache_tokens=None,
        observers=(), **kwargs):
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs.setdefault("eos_token_ids", {EOS, 5})
    config = LoopConfig(max_rows=max_rows, shrink_tail=shrink_tail,
                        max_cache_tokens=max_cache_tokens, decode_step=mode)
    return generate_rows(model, enc.input_ids, enc.attention_mask, pad_token_id=PAD, **kwargs,
                         config=config, observers=observers)


@pytest.fixture
def exact_shapes(monkeypatch):
    """Shapes not rounded up: the cache is exactly as wide as the widest prompt and the new
    tokens, so short runs here fill it and shift it left as long answers do in real runs."""
    from lm_eval_ponder.engine import slots

    monkeypatch.setattr(slots, "WIDTH_ROUND", 1)
    monkeypatch.setattr(slots, "ROWS_ROUND", 1)


@pytest.mark.parametrize("max_rows,max_new", [(None, 9), (3, 5), (4, 17)])
def test_static_slots_decode_the_dynamic_loops_tokens(llama, tok, max_rows, max_new,
                                                      exact_shapes):
    dynamic = run(llama, tok, "dynamic", max_rows=max_rows, max_new_tokens=max_new)
    static = run(llama, tok, "captured", max_rows=max_rows, max_new_tokens=max_new)
    assert static.sequences.tolist() == dynamic.sequences.tolist()
    assert static.gen_tokens == dynamic.gen_tokens
    assert static.finish_reason == dynamic.finish_reason
    assert 0 < sum(static.gen_tokens) < len(PROMPTS) * max_new  # some rows end early
    if max_rows is not None:  # slots were reused, and a full cache shifted left
        assert static.joins > 1 and static.compactions > 0
    # every decode step ran every slot: finished rows' slots are counted as dead slots
    assert static.decode_row_slots == dynamic.decode_row_slots


def test_wider_joins_shift_live_rows_right_and_a_full_cache_left(llama, tok, monkeypatch,
                                                                exact_shapes):
    """Short prompts first, then wider ones joining one at a time while the others decode:
    the cache shifts right under live rows, and later left."""
    shifts = []
    original = StaticSlots.shift
    monkeypatch.setattr(StaticSlots, "shift",
                        lambda self, by: (shifts.append(by), original(self, by))[1])
    prompts = ["ab", "c", "de", "f"] + [f"{'xy' * (6 + 4 * i)}?" for i in range(6)] + ["g"] * 4
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=24, eos_token_ids={EOS, 5}, pad_token_id=PAD)
    config = LoopConfig(max_rows=4, admit_fraction=0.25)
    dynamic = generate_rows(llama, enc.input_ids, enc.attention_mask, **kwargs, config=config)
    static = generate_rows(llama, enc.input_ids, enc.attention_mask, **kwargs,
                           config=LoopConfig(max_rows=4, admit_fraction=0.25,
                                             decode_step="captured"))
    assert static.sequences.tolist() == dynamic.sequences.tolist()
    assert any(by > 0 for by in shifts[1:]) and any(by < 0 for by in shifts)


def moves_recorded(monkeypatch) -> list[tuple[int, int, int]]:
    """(from slots, to slots, live rows moved) of every tail move."""
    moves = []
    original = StaticSlots.take
    monkeypatch.setattr(StaticSlots, "take", lambda self, other, index: (
        moves.append((other.slots, self.slots, len(index))), original(self, other, index))[1])
    return moves


@pytest.mark.parametrize("max_rows,max_new", [(None, 24), (16, 24)])
def test_the_tail_moves_to_fewer_slots_with_the_dynamic_loops_tokens(llama, tok, monkeypatch,
                                                                        max_rows, max_new):
    """20 prompts, answers of 2 to 24 tokens (more EOS ids end them): once no row waits and
    the live rows fit a quarter of the slots (rounded up to ``ROWS_ROUND``), they move there
    (24 slots -> 8; 16 -> 8, after a full cache shifted left), and every row still decodes the
    dynamic loop's tokens; without the move every slot runs to the end."""
    eos = {EOS, 55, 44, 0, 50, 19}
    dynamic = run(llama, tok, "dynamic", max_rows=max_rows, max_new_tokens=max_new,
                  eos_token_ids=eos)
    assert len(set(dynamic.gen_tokens)) > 5  # answers of many lengths
    moves = moves_recorded(monkeypatch)
    static = run(llama, tok, "captured", max_rows=max_rows, max_new_tokens=max_new,
                 eos_token_ids=eos)
    assert moves and all(new == round_up(old // 4, ROWS_ROUND) and n <= new
                         for old, new, n in moves)
    assert static.sequences.tolist() == dynamic.sequences.tolist()
    assert static.gen_tokens == dynamic.gen_tokens
    assert static.finish_reason == dynamic.finish_reason
    assert static.decode_row_slots == dynamic.decode_row_slots
    moves_seen = list(moves)
    moves.clear()
    flat = run(llama, tok, "captured", max_rows=max_rows, max_new_tokens=max_new,
               eos_token_ids=eos, shrink_tail=False)
    assert not moves and flat.sequences.tolist() == dynamic.sequences.tolist()
    # the dead slots the move saved
    assert static.dead_row_slots < flat.dead_row_slots
    assert static.tail_moves == len(moves_seen) and flat.tail_moves == 0


def test_take_copies_the_live_slots_at_their_columns(llama):
    import torch

    old = StaticSlots(llama, 4, 16, llama.config)
    heads, dim = llama.config.num_key_value_heads, llama.config.head_dim
    keys = torch.randn(4, heads, 5, dim)
    group = type("Group", (), {})()
    layer = type("Layer", (), {"is_initialized": True, "keys": keys, "values": -keys})()
    group.layers = [layer] * llama.config.num_hidden_layers
    old.set_column(9)
    old.place(torch.arange(4), group, 5)
    new = StaticSlots(llama, 2, 16, llama.config)
    new.take(old, torch.tensor([3, 1]))
    assert new.col == 9
    for src, dst in zip(old.cache.layers, new.cache.layers, strict=True):
        assert torch.equal(dst.keys[:, :, 4:9], keys[[3, 1]])
        assert torch.equal(dst.values, src.values[[3, 1]])
        assert int(dst.cumulative_length) == 9
    with pytest.raises(AssertionError):
        StaticSlots(llama, 2, 32, llama.config).take(old, torch.tensor([0]))


def test_tail_slots_is_a_short_ladder():
    assert tail_slots(40, 10) == 16 and tail_slots(40, 17) is None  # 40 // 4, rounded up
    assert tail_slots(3, 0) is None  # a quarter of 3 slots is none
    assert tail_slots(256, 64) == 64 and tail_slots(256, 65) is None
    ladder, slots = [], 256
    while (slots := tail_slots(slots, 1)) is not None:
        ladder.append(slots)
    assert ladder == [64, 16, 8]  # rounded to ROWS_ROUND, so at most a few graphs per width


def test_static_slots_stop_strings_and_lengths(llama, tok):
    stops = {"until": ["e", "zz"]}
    decode = tok.decode
    dynamic = run(llama, tok, "dynamic", max_rows=4, max_new_tokens=12, stop=stops["until"],
                  decode=decode, eos_token_ids={EOS})
    static = run(llama, tok, "captured", max_rows=4, max_new_tokens=12, stop=stops["until"],
                 decode=decode, eos_token_ids={EOS})
    assert static.sequences.tolist() == dynamic.sequences.tolist()
    assert static.finish_reason == dynamic.finish_reason


class RowLog:
    """An observer that logs the rows of each forward; it declares ``acts_in_forward`` only when
    told to (an observer that says nothing is one that does not act inside the forward)."""

    def __init__(self, acts_in_forward: bool):
        if acts_in_forward:
            self.acts_in_forward = True
        self.rows = []

    def begin_forward(self, rows, prefill):
        self.rows.append(rows.tolist())


def test_calls_a_graph_cannot_replay_stay_dynamic(llama, tok):
    observer = RowLog(acts_in_forward=True)  # as a steering hook or an early exit declares
    steered = run(llama, tok, "captured", max_rows=4, max_new_tokens=6, observers=[observer])
    # the dynamic loop hands the observer only rows in flight: never a static slot's dummy
    assert all(r < len(PROMPTS) for rows in observer.rows for r in rows)
    assert steered.compactions > 0 and steered.decode_step == "dynamic"
    assert "inside each forward" in steered.why
    penalised = run(llama, tok, "captured", max_rows=4, max_new_tokens=6,
                    sampling=SamplingConfig.from_kwargs(None, repetition_penalty=1.3))
    plain = run(llama, tok, "dynamic", max_rows=4, max_new_tokens=6,
                sampling=SamplingConfig.from_kwargs(None, repetition_penalty=1.3))
    assert penalised.sequences.tolist() == plain.sequences.tolist()
    # a cache budget below slots x width keeps the dynamic loop too
    budgeted = run(llama, tok, "captured", max_rows=4, max_new_tokens=6, max_cache_tokens=40)
    assert budgeted.compactions > 0


def test_an_observer_that_only_watches_keeps_the_static_layout(llama, tok):
    """Logging the rows of each forward is no reason to give up the static layout (it once
    was: any ``begin_forward`` turned it off without a word). The observer then sees the
    static slots, a slot no row holds as row ``len(PROMPTS)``, and the tokens are the same."""
    watcher = RowLog(acts_in_forward=False)
    watched = run(llama, tok, "captured", max_rows=4, max_new_tokens=6, observers=[watcher])
    plain = run(llama, tok, "dynamic", max_rows=4, max_new_tokens=6)
    assert watched.decode_step == "captured" and watched.why == ""
    assert watched.sequences.tolist() == plain.sequences.tolist()
    decoded = [rows for rows in watcher.rows if len(rows) > 1]
    assert decoded and all(r <= len(PROMPTS) for rows in decoded for r in rows)


def test_graph_modes_round_their_shapes():
    assert slot_shape(40, 100, 27) == (40, 128)  # already round: 100 + 27 + 1 = 128 columns
    slots, width = slot_shape(37, 100, 50)
    assert slots % ROWS_ROUND == 0 and width % WIDTH_ROUND == 0
    assert slots >= 37 and width >= 151 and slots < 37 + ROWS_ROUND


@pytest.mark.parametrize("value,mode", [(None, "dynamic"), ("auto", "dynamic"),
                                        ("Captured", "captured"), ("dynamic", "dynamic")])
def test_check_decode_step(value, mode):
    assert check_decode_step(value) == mode


def test_an_unknown_decode_step_is_one_line():
    for gone in ("graphs", "static", "cudagraphs", "inductor"):  # the last three were deleted
        with pytest.raises(PonderError, match="decode_step must be one of"):
            check_decode_step(gone)
    with pytest.raises(PonderError):
        run(build_tiny_llama(300), build_tiny_tokenizer(), "graphs", max_new_tokens=2)


def test_a_graph_mode_keeps_one_cache_width_per_model(llama):
    """The static layout reuses a call's cache for the next call of the same shape (a graph
    holds its addresses), keeps its tail's smaller ones beside it, and frees them all for a
    call of another width. Nothing is recorded here: a capture waits for the first forward."""
    from lm_eval_ponder.engine.slots import kept_caches

    llama = build_tiny_llama(300, seed=0)  # kept caches of its own
    a = StaticSlots(llama, 8, 64, llama.config)
    assert StaticSlots(llama, 8, 64, llama.config).cache is a.cache
    # a tail's smaller cache of the same width is kept beside it (its graph is kept too)
    tail = StaticSlots(llama, 2, 64, llama.config)
    assert kept_caches(llama) == [(8, 64), (2, 64)]
    assert StaticSlots(llama, 8, 64, llama.config).cache is a.cache
    assert StaticSlots(llama, 2, 64, llama.config).cache is tail.cache
    b = StaticSlots(llama, 8, 128, llama.config)
    assert b.cache is not a.cache and kept_caches(llama) == [(8, 128)]

"""The progress of a generation call with many rows in flight (lm_eval_ponder.generation.progress):
what the bar says, and the status line of a long tail, on a clock the test moves."""

from __future__ import annotations

import torch

from lm_eval_ponder.generation.progress import RowProgress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def progress(total: int, **kwargs) -> tuple[RowProgress, Clock, list[str]]:
    clock, lines = Clock(), []
    bar = RowProgress(total, "gen", status_every=30.0, clock=clock, write=lines.append,
                      **kwargs)
    bar.stop.set()  # the test drives ``check_tail`` itself
    return bar, clock, lines


def test_status_line_only_in_a_long_tail_and_at_most_every_30_s():
    bar, clock, lines = progress(5)
    bar.watched = True
    bar.forward(4, prefill=True)  # four rows start, each with its first token
    for _ in range(9):
        bar.forward(4, prefill=False)
    clock.now += 29
    bar.check_tail()
    assert lines == []  # nothing has finished yet, but not for 30 s
    clock.now += 1
    bar.check_tail()
    # issue 66: not "last row finished 0:30 ago" when none has
    assert lines == ["gen: 0/5 finished, 4 in flight, 40 tokens, 1.3 tok/s; no row finished "
                     "yet (0:30 in)"]
    # the bar shows the counters the line read, at the same moment (issue 55)
    assert bar.bar.postfix == "4 in flight, 40 tokens, 1.3 tok/s"
    bar.finish(0)
    clock.now += 20
    bar.check_tail()
    assert len(lines) == 1  # a row finished 20 s ago: no tail
    clock.now += 15
    bar.forward(3, prefill=False)
    bar.check_tail()
    assert len(lines) == 2 and lines[1].startswith("gen: 1/5 finished, 3 in flight, 43 tokens, "
                                                   "0.7 tok/s; last row finished 0:35 ago")
    assert bar.bar.postfix == "3 in flight, 43 tokens, 0.7 tok/s"
    clock.now += 10
    bar.check_tail()
    assert len(lines) == 2  # at most one line every 30 s
    bar.finished = 5
    clock.now += 60
    bar.check_tail()
    assert len(lines) == 2  # all done: no line
    bar.close()


def test_tokens_count_live_rows_only():
    """A decode step of a batch that still holds finished rows (the loop compacts only once
    an eighth has finished) yields tokens for the live rows only."""
    bar, _, _ = progress(4)
    bar.forward(4, prefill=True)
    bar.finish(1)
    bar.forward(4, prefill=False)  # 4 slots, 3 live rows
    assert (bar.tokens, bar.in_flight) == (4 + 3, 3)
    bar.forward(2, prefill=True)  # a joining group
    assert (bar.started, bar.in_flight, bar.peak_in_flight) == (6, 5, 5)
    bar.close()


def test_no_time_left_until_a_whole_wave_has_finished():
    """Before as many rows have finished as were in flight, every finished row is one of the
    shortest: extrapolating from them is the 1/300 [01:33<7:44:00] of issue 39."""
    bar, clock, _ = progress(300)
    bar.watched = True
    bar.forward(128, prefill=True)
    clock.now += 93
    bar.finish(0)
    assert "left" not in bar.postfix() and "128 in flight" not in bar.postfix()
    assert "127 in flight" in bar.postfix()
    for row in range(1, 128):
        bar.finish(row)
    clock.now += 7
    assert bar.postfix().endswith(f"~{duration((300 - 128) * 100 / 128)} left")
    bar.close()


def test_watch_counts_the_forwards_of_a_model_and_lets_go():
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    from lm_eval_ponder.engine import cache_keyword

    model = LlamaForCausalLM(config).eval()
    kw = cache_keyword(model)  # ``cache`` in recent transformers, ``past_key_values`` before
    bar, _, _ = progress(3)
    with bar.watch(model), torch.no_grad():
        cache = DynamicCache(config=config)
        model(input_ids=torch.ones(3, 5, dtype=torch.long), **{kw: cache}, use_cache=True)
        model(input_ids=torch.ones(3, 1, dtype=torch.long), **{kw: cache}, use_cache=True)
    model(input_ids=torch.ones(3, 1, dtype=torch.long))  # after the block: not counted
    assert (bar.started, bar.tokens) == (3, 6)
    bar.close()


def test_a_disabled_bar_adds_no_hook_and_no_thread():
    model = torch.nn.Linear(2, 2)
    bar = RowProgress(3, "gen", disable=True)
    with bar.watch(model):
        assert not model._forward_pre_hooks  # noqa: SLF001 - the point of the test
    assert bar.thread is None
    bar.close()


def test_durations_read_as_tqdm_writes_them():
    assert [duration(s) for s in (5, 95, 4321.5)] == ["0:05", "1:35", "1:12:02"]


def test_a_prefill_says_so_while_it_runs(tiny_model_dir):
    """Issue 66: a prefill of many rows runs for many seconds before any token; the bar says
    "prefilling N rows" from the forward's start and stops saying it when it returns."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    bar, clock, lines = progress(3)
    seen = []
    model.register_forward_hook(lambda m, a, o: seen.append(bar.bar.postfix))
    with bar.watch(model):
        model(input_ids=torch.ones(3, 4, dtype=torch.long))
    assert seen and seen[0].startswith("prefilling 3 rows, 3 in flight")
    assert not bar.prefilling and "prefilling" not in ", ".join(bar.figures())
    bar.close()

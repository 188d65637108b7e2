"""Sampled answers kept through lm-eval's --use_cache (lm_eval_ponder.evaluation.resume): each
repeat under its own key, a resumed run draws only what is missing, greedy requests are left
to lm-eval."""

from __future__ import annotations

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.model import CachingLM
from sqlitedict import SqliteDict

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.evaluation.resume import (
    CACHE_MARKER,
    PREFIX,
    SampledAnswers,
    export_kept,
    is_sampled,
    kept_answers,
    kept_path,
    restore_kept,
)
from lm_eval_ponder.generation.accounting import GenerationText
from lm_eval_ponder.generation.generator import SteeredGenerator

SAMPLED = {"max_gen_toks": 8, "do_sample": True, "temperature": 1.0}
GREEDY = {"max_gen_toks": 8, "do_sample": False}


def requests(gen_kwargs: dict, prompts=("What is 3 + 5?", "Hi"), repeats: int = 3):
    return [Instance("generate_until", doc={"i": i}, arguments=(p, dict(gen_kwargs)), idx=r,
                     metadata=("t", i, repeats))
            for i, p in enumerate(prompts) for r in range(repeats)]


class Inner:
    def __init__(self) -> None:
        self.seen = []

    def add_partial(self, attr, req, res) -> None:
        self.seen.append(res)


def test_is_sampled_follows_lm_eval():
    assert is_sampled(SAMPLED) and not is_sampled(GREEDY) and not is_sampled({})


def test_repeats_get_their_own_keys_and_come_back():
    store: dict = {}
    reqs = requests(SAMPLED) + requests(GREEDY, repeats=1)
    answers = SampledAnswers(store)
    kept, todo = answers.split(reqs)
    assert kept == {} and todo == list(range(8))
    hook = answers.hook(inner := Inner())
    for i in reversed(todo):  # HFLM hands answers over in its own order
        hook.add_partial("generate_until", reqs[i].args, f"answer {i}")
    assert len(inner.seen) == 8  # every answer still reaches lm-eval's hook
    assert len(store) == 6 and all(key.startswith(PREFIX) for key in store)  # sampled only
    kept, todo = SampledAnswers(store).split(reqs)
    assert todo == [6, 7]  # the greedy ones: lm-eval's cache keeps those
    # the three repeats of a prompt get three different answers back, none lost
    assert sorted(kept.values()) == sorted(f"answer {i}" for i in range(6))
    assert {kept[i] for i in range(3)} == {f"answer {i}" for i in range(3)}


class CountingStore(dict):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def __setitem__(self, key, value) -> None:
        self.writes += 1
        super().__setitem__(key, value)


def test_an_answer_kept_as_its_row_ended_is_written_once():
    """Issue 74: a sampled answer was written as its row ended and again when HFLM handed the
    same text over. Now once; a text that differs from the one kept (never from the loop) is
    still written, and an answer no row kept is written at the hand-over."""
    store = CountingStore()
    reqs = requests(SAMPLED, prompts=("What is 3 + 5?",), repeats=1)
    answers = SampledAnswers(store)
    answers.split(reqs)
    assert answers.keep_early(reqs[0].args[0], "eight")
    answers.hook(Inner()).add_partial("generate_until", reqs[0].args, "eight")
    assert store.writes == 1 and list(store.values()) == ["eight"]
    answers.split(reqs := requests(SAMPLED, prompts=("Hi",), repeats=2))
    assert answers.keep_early("Hi", "hello")
    hook = answers.hook(Inner())
    hook.add_partial("generate_until", reqs[0].args, "hello, made otherwise")
    hook.add_partial("generate_until", reqs[1].args, "hey")
    assert store.writes == 4  # the differing text overwrites its slot; the unkept one lands
    assert sorted(store.values()) == ["eight", "hello, made otherwise", "hey"]


def test_a_resumed_run_draws_only_the_missing_answers():
    store: dict = {}
    reqs = requests(SAMPLED)
    answers = SampledAnswers(store)
    answers.split(reqs)
    hook = answers.hook(Inner())
    for i in (0, 4):  # interrupted after two answers, one of each prompt
        hook.add_partial("generate_until", reqs[i].args, f"answer {i}")
    kept, todo = SampledAnswers(store).split(reqs)
    assert set(kept.values()) == {"answer 0", "answer 4"}
    assert len(todo) == 4 and sorted(kept) == [0, 3]  # first occurrence of each prompt


def count_drawn(monkeypatch) -> list:
    """The contexts the model is asked to generate from here on (those no store answered)."""
    drawn = []
    real = SteeredGenerator.generate_texts

    def counting(self, contexts, *args, **kwargs):
        drawn.extend(contexts)
        return real(self, contexts, *args, **kwargs)

    monkeypatch.setattr(SteeredGenerator, "generate_texts", counting)
    return drawn


@pytest.fixture(scope="module")
def ponder(tiny_model_dir):
    return PonderLM(pretrained=str(tiny_model_dir), batch_size=2, device="cpu")


def test_use_cache_keeps_sampled_answers(ponder, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    reqs = requests(SAMPLED)
    first = CachingLM(ponder, cache).generate_until(reqs)
    assert all(isinstance(t, GenerationText) for t in first)

    drawn = count_drawn(monkeypatch)
    again = CachingLM(ponder, cache).generate_until(requests(SAMPLED))
    assert drawn == []  # nothing generated: every sample came back with its stats
    assert list(map(str, again)) == list(map(str, first))
    assert [t.stats for t in again] == [t.stats for t in first]

    # an interrupted run: two answers missing from the store are drawn, the rest kept
    with SqliteDict(cache) as store:  # lm-eval's own file, another connection to it
        doomed = [k for k in store.keys() if k.startswith(PREFIX) and k.endswith("/2")]
        assert len(doomed) == 2, list(store.keys())
        for key in doomed:
            del store[key]
        store.commit()
    assert kept_answers(cache) == 4  # what the suite records of a resumed run
    resumed = CachingLM(ponder, cache).generate_until(requests(SAMPLED))
    assert len(drawn) == 2 and len(resumed) == 6
    assert all(isinstance(t, GenerationText) for t in resumed)
    kept = [i for i in range(6) if i % 3 != 2]
    assert [str(resumed[i]) for i in kept] == [str(first[i]) for i in kept]


def kill_after_three_rows(monkeypatch) -> tuple[list, list]:
    """From here on, a run is killed (KeyboardInterrupt) as its third row ends, after that row's
    answer was kept. Returns (rows per generate_batch call, keep_early's results so far)."""
    calls, early = [], []
    real_batch, real_early = SteeredGenerator.generate_batch, SampledAnswers.keep_early

    def counting_calls(self, *args, **kwargs):
        calls.append(args[0].shape[0])
        return real_batch(self, *args, **kwargs)

    def killed_after_three(self, context, res):
        kept = real_early(self, context, res)
        early.append(kept)
        if len(early) == 3:
            raise KeyboardInterrupt
        return kept

    monkeypatch.setattr(SteeredGenerator, "generate_batch", counting_calls)
    monkeypatch.setattr(SampledAnswers, "keep_early", killed_after_three)
    return calls, early


def test_an_interrupted_run_keeps_every_row_that_ended(tiny_model_dir, tmp_path, monkeypatch):
    """HFLM hands answers to the store only when a call returns, and one call holds 4 x max_rows
    requests (a 500-question arith run was a single call, and a kill kept nothing). Each
    sampled answer is now kept as its row ends in the loop: a run killed after its third row
    keeps three answers, and the call stays whole (the rows in flight stay max_rows)."""
    lm = PonderLM(pretrained=str(tiny_model_dir), batch_size=1, max_rows=2, device="cpu")
    assert lm.batching.requests_per_call == 8  # the six requests are one call
    cache = str(tmp_path / "cache")
    real_early = SampledAnswers.keep_early
    calls, _ = kill_after_three_rows(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        CachingLM(lm, cache).generate_until(requests(SAMPLED))
    assert calls == [6] and kept_answers(cache) == 3

    monkeypatch.setattr(SampledAnswers, "keep_early", real_early)
    drawn = count_drawn(monkeypatch)
    resumed = CachingLM(lm, cache).generate_until(requests(SAMPLED))
    assert len(resumed) == 6 and len(drawn) == 3
    with SqliteDict(cache) as store:  # the three resumed rows' early answers were overwritten
        stored = sorted(str(store[k]) for k in store.keys() if k.startswith(PREFIX))
    assert stored == sorted(map(str, resumed))


def test_an_interrupted_greedy_run_keeps_every_row_that_ended(tiny_model_dir, tmp_path,
                                                              monkeypatch):
    """Greedy answers are lm-eval's to keep (its key, its CachingLM reads them back), but HFLM
    hands them over only when a call returns and the loop takes a whole run in one call: a
    1,319-question GSM8K run killed after an hour kept nothing. Each greedy answer is now kept
    under lm-eval's key as its row ends: killed after its third row, a run keeps three; the
    resumed run generates only the other three, and ends with the answers of a run that was
    never killed."""
    lm = PonderLM(pretrained=str(tiny_model_dir), batch_size=1, max_rows=2, device="cpu")
    reqs = requests(GREEDY, prompts=[f"What is {a} + 2?" for a in range(6)], repeats=1)
    whole = CachingLM(lm, str(tmp_path / "whole")).generate_until(reqs)
    cache = str(tmp_path / "cache")
    real_early = SampledAnswers.keep_early
    calls, early = kill_after_three_rows(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        CachingLM(lm, cache).generate_until(reqs)
    assert calls == [6] and early == [True] * 3 and kept_answers(cache) == 3

    monkeypatch.setattr(SampledAnswers, "keep_early", real_early)
    drawn = count_drawn(monkeypatch)
    resumed = CachingLM(lm, cache).generate_until(reqs)
    assert len(drawn) == 3
    assert list(map(str, resumed)) == list(map(str, whole))
    assert [t.stats for t in resumed] == [t.stats for t in whole]


def random_controller(directory):
    """A controller with random weights, so that its depths differ by row and by token."""
    from lm_eval_ponder.pondering.controller import PonderController, save_controller

    torch.manual_seed(3)
    return str(save_controller(PonderController(64, width=32), directory))


@pytest.mark.parametrize("form", ["plain", "early_exit", "token_controller"])
def test_answers_kept_as_rows_end_are_the_answers_lm_eval_returns(tiny_model_dir, tiny_vector_dir,
                                                                  tmp_path, monkeypatch, form):
    """What is kept as a row ends (text made as HFLM makes it, accounting read from the hooks'
    records so far) equals what ``generate_until`` returns for that row after the call: text,
    tokens, FLOPs, and the mean exit layer under early exit, the ponder steps and controller
    evaluations of a controller deciding at every token."""
    model_args = {"plain": {},
                  "early_exit": {"early_exit": 0.5, "controller": "none"},
                  "token_controller": {"steering": str(tiny_vector_dir), "granularity": "token",
                                       "controller": random_controller(tmp_path / "ctrl")}}[form]
    lm = PonderLM(pretrained=str(tiny_model_dir), batch_size=1, max_rows=2, device="cpu",
                  **model_args)
    early = []
    real_early = SampledAnswers.keep_early

    def recording(self, context, res):
        early.append((str(res), res.stats))
        return real_early(self, context, res)

    monkeypatch.setattr(SampledAnswers, "keep_early", recording)
    final = CachingLM(lm, str(tmp_path / "cache")).generate_until(
        requests(SAMPLED, repeats=4))
    assert len(early) == 8
    assert sorted(early, key=repr) == sorted(((str(t), t.stats) for t in final), key=repr)
    if form == "early_exit":
        assert all("exit_layer" in stats for _, stats in early)
    if form == "token_controller":  # one decision of k_max + 1 evaluations per token, read
        # for each row from the records of every step it rode in
        assert all(stats["ponder_steps"] > 0 for _, stats in early)
        assert all(stats["controller_evals"] == 9 * max(stats["gen_tokens"], 1)
                   for _, stats in early)


def test_kept_answers_survive_a_new_machine_as_text(ponder, tmp_path, monkeypatch):
    """``export_kept`` writes the store as text that can be committed; on a machine without the
    store, ``restore_kept`` rebuilds it and the resumed run draws nothing: the same texts with
    the same accounting, under the same fingerprint."""
    db = tmp_path / "answers_rank0.db"
    first = CachingLM(ponder, str(db)).generate_until(requests(SAMPLED))
    twin, n = export_kept(db)
    assert twin == kept_path(db) and twin.name == "answers_rank0.kept.jsonl.gz" and n == 6
    assert restore_kept(db) == 0  # the store is there: it is the newer of the two, left alone
    db.unlink()  # the machine is gone; the committed twin is not
    assert restore_kept(db) == 6 and kept_answers(db) == 6
    with SqliteDict(str(db)) as store:
        assert store[CACHE_MARKER] == ponder.fingerprint_hash()

    drawn = count_drawn(monkeypatch)
    again = CachingLM(ponder, str(db)).generate_until(requests(SAMPLED))
    assert drawn == [] and list(map(str, again)) == list(map(str, first))
    assert [t.stats for t in again] == [t.stats for t in first]


def test_a_store_without_a_stamp_or_a_broken_twin_is_refused(tmp_path):
    db = tmp_path / "answers_rank0.db"
    with SqliteDict(str(db)) as store:
        store["somebody else's key"] = "text"
        store.commit()
    with pytest.raises(PonderError, match="fingerprint"):
        export_kept(db)
    assert not kept_path(db).exists()
    db.unlink()
    import gzip
    with gzip.open(kept_path(db), "wt") as f:
        f.write('{"key": "not the stamp"}\n')
    with pytest.raises(PonderError, match="fingerprint stamp"):
        restore_kept(db)
    assert not db.exists()


def test_the_loop_gets_every_request_in_one_call(tiny_model_dir, monkeypatch):
    """Each call ends in a tail where the batch shrinks to its longest answers: the loop gets
    all of generate_until's requests at once, however many times max_rows they are."""
    lm = PonderLM(pretrained=str(tiny_model_dir), batch_size=1, max_rows=1, device="cpu")
    assert lm.batching.requests_per_call == 4 < 6
    calls = []
    real_batch = SteeredGenerator.generate_batch

    def counting_calls(self, *args, **kwargs):
        calls.append(args[0].shape[0])
        return real_batch(self, *args, **kwargs)

    monkeypatch.setattr(SteeredGenerator, "generate_batch", counting_calls)
    out = lm.generate_until(requests(GREEDY))
    assert calls == [6] and len(out) == 6
    assert lm.batch_size_per_gpu == 1  # lm-eval's own setting is back after the call

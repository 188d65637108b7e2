"""The rollout cache: train splits only, exact outcomes, resumable, refuses other settings."""

from __future__ import annotations

import json

import pytest
import torch
from lm_eval.api.instance import Instance

from lm_eval_ponder import data
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.files import atomic_write_xz, read_text
from lm_eval_ponder.pondering.controller import PonderController, save_controller
from lm_eval_ponder.pondering.dynamics import PonderConfig, cumulative_offsets
from lm_eval_ponder.training import rewards as R
from lm_eval_ponder.training.rollouts import (
    OUTCOME_FIELDS,
    OUTCOMES,
    RolloutCache,
    RolloutConfig,
    build_cache,
    generate_missing,
    generation_kwargs,
    prepare_cache,
    train_documents,
)

OFFSETS = cumulative_offsets(PonderConfig(k_max=2, alpha0=0.5, alpha_start=-0.5)).tolist()
CFG = RolloutConfig(prompts={"arith_ponder": 4, "gsm8k_ponder": 1}, max_completion_length=6,
                    batch_size=8, apply_chat_template=False)


def make_lm(model_dir, vector_dir, **kwargs):
    return PonderLM(pretrained=str(model_dir), steering=str(vector_dir), batch_size=8,
                    device="cpu", **kwargs)


@pytest.fixture(scope="module")
def generator(tiny_model_dir, tiny_vector_dir):
    return make_lm(tiny_model_dir, tiny_vector_dir, alpha=OFFSETS[0]).generator


@pytest.fixture(scope="module")
def cache(generator, tmp_path_factory):
    return build_cache(generator, CFG, OFFSETS, tmp_path_factory.mktemp("cache"), progress=False)


def record_lines(directory) -> list[str]:
    """Every rollout line of a cache directory, in the order ``RolloutCache.records`` reads."""
    return [line for path in sorted(directory.glob("rollouts.rank*.jsonl"))
            for line in path.read_text().splitlines()]


def test_training_documents_never_come_from_test_splits(shared_data):
    arith_test = {d["question"] for d in data.arith_ladder("test", 100)}
    assert not arith_test & {d["question"] for d in train_documents("arith_ponder", 500)}
    gsm_test = {d["question"] for d in data.load_gsm8k("test")}
    gsm_train = train_documents("gsm8k_ponder", 200)
    assert len(gsm_train) == 200 and not gsm_test & {d["question"] for d in gsm_train}
    for task in ("math500_ponder", "gpqa_ponder"):
        with pytest.raises(PonderError, match="no training split"):
            train_documents(task, 5)


def test_cache_holds_every_prompt_at_every_depth(cache):
    prompts = cache.prompts()
    records = list(cache.records())
    assert len(prompts) == 5 and len(records) == 5 * 3
    assert {(r["key"], r["depth"]) for r in records} == \
        {(p.key, k) for p in prompts for k in range(3)}
    assert cache.states().shape == (5, 64)
    for r in records:
        assert 0 < r["gen_tokens"] <= 6 and r["flops"] > 0
        assert isinstance(r["correct"], bool)


def test_cached_outcome_is_what_a_controller_run_generates(generator, cache, tiny_model_dir,
                                                           tiny_vector_dir, tmp_path):
    """A prompt-granularity controller that halts at depth 0 (or always continues to K)
    generates exactly the cached depth-0 (depth-K) text: the cache is exact, not a proxy."""
    prompts = cache.prompts()
    table = cache.table()
    reqs = [Instance("generate_until", {}, (p.context, generation_kwargs(CFG)), i)
            for i, p in enumerate(prompts)]
    for bias, depth in ((-30.0, 0), (30.0, 2)):
        ctrl = PonderController(64, width=16)
        with torch.no_grad():
            for p in ctrl.parameters():
                p.zero_()
            ctrl.head.bias.fill_(bias)
        path = save_controller(ctrl, tmp_path / f"c{depth}")
        run = make_lm(tiny_model_dir, tiny_vector_dir, controller=str(path), k_max=2,
                      alpha0=0.5, alpha_start=-0.5, beta=0.3)
        texts = run.generate_until(reqs, disable_tqdm=True)
        assert [str(t) for t in texts] == [table[(p.key, depth)][0]["text"] for p in prompts]


def test_cached_state_is_the_hooks_state(generator, cache):
    """z_0 in the cache is the steering layer's output that the hook hands the controller."""
    seen = []

    def decide(z_last, rows=None):
        seen.append(z_last.float().clone())
        return torch.zeros(z_last.shape[0])

    from lm_eval_ponder.pondering.hook import SteeringHook

    p = cache.prompts()[0]
    ids, mask = generator.encode_batch([p.context])
    steering = generator.require_steering()
    with SteeringHook(generator.model, steering.layer, steering.vector, steering.scale, decide):
        generator.model(input_ids=ids, attention_mask=mask)
    assert torch.allclose(seen[0][0], cache.states()[0], atol=1e-5)


def test_interrupted_build_resumes_without_loss_or_duplicates(generator, cache, tmp_path):
    lines = record_lines(cache.dir)
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("manifest.json", "prompts.jsonl", "states.safetensors"):
        (partial / name).write_bytes((cache.dir / name).read_bytes())
    # 7 complete lines and a torn eighth, as a kill mid-write would leave
    (partial / "rollouts.rank0.jsonl").write_text("\n".join(lines[:7]) + "\n" + lines[7][:20])
    resumed = build_cache(generator, CFG, OFFSETS, partial, progress=False)
    records = list(resumed.records())
    assert len(records) == len(lines)
    key = lambda r: (r["key"], r["depth"], r["sample"])  # noqa: E731
    assert sorted(map(key, records)) == sorted(key(json.loads(line)) for line in lines)
    original = {key(json.loads(line)): json.loads(line)["text"] for line in lines}
    assert all(original[key(r)] == r["text"] for r in records)  # greedy: same outcomes


def test_cache_kept_without_its_prompts_says_how_to_restore_them_and_restores_exactly(
        generator, cache, tmp_path):
    # What a committed cache holds: the manifest and the compact outcomes, not the prompts
    # (benchmark questions), z_0 or the texts.
    kept = committed_copy(cache.dir, tmp_path / "kept")
    with pytest.raises(PonderError, match="--restore-only"):
        RolloutCache(kept).prompts()
    with pytest.raises(PonderError, match="not its prompts and z_0"):
        RolloutCache(kept).states()
    restored, prompts = prepare_cache(generator, CFG, OFFSETS, kept)
    assert restored.prompts() == cache.prompts() == prompts
    torch.testing.assert_close(restored.states(), cache.states())
    assert restored.done() == cache.done()  # the outcomes are untouched: nothing to generate


def committed_copy(directory, kept):
    """What git keeps of a cache: its manifest and the compact twins of its outcome files."""
    kept.mkdir()
    (kept / "manifest.json").write_bytes((directory / "manifest.json").read_bytes())
    for path in directory.glob("rollouts.rank*" + OUTCOMES):
        (kept / path.name).write_bytes(path.read_bytes())
    return kept


def test_compact_outcomes_score_exactly_as_the_texts(cache, tmp_path):
    """A clone trains and analyses on the compact twins: every field the trainer reads comes
    back bit for bit, and every reward component equals the one computed from the text."""
    kept = RolloutCache(committed_copy(cache.dir, tmp_path / "kept"))
    assert not list(kept.dir.glob("*.jsonl"))
    full = {(r["key"], r["depth"], r["sample"]): r for r in cache.records()}
    compact = {(r["key"], r["depth"], r["sample"]): r for r in kept.records()}
    assert compact.keys() == full.keys()
    stats = R.RunningStats(0.99)
    stats.update([1e9, 2e9])
    cfg = R.RewardConfig(stage_weights={"setup": 0.1, "computation": 0.2, "verification": 0.3,
                                        "conclusion": 0.4}, rep_betas=(0.01, 0.2, 0.3))
    for k, r in full.items():
        c = compact[k]
        assert "text" not in c and all(c[f] == r[f] for f in OUTCOME_FIELDS)
        for config in (cfg, R.RewardConfig()):
            assert R.reward_components(c, 1.5e9, stats, (3.0, 1.0), config) == \
                R.reward_components(r, 1.5e9, stats, (3.0, 1.0), config)


def test_a_part_begun_in_a_clone_keeps_its_committed_outcomes(cache, tmp_path):
    """A session that finishes a part only its compact twin came with appends to a new plain
    file: the twin's records stay, and the rewritten twin holds them all."""
    from lm_eval_ponder.training.rollouts import part_records

    kept = RolloutCache(committed_copy(cache.dir, tmp_path / "kept"))
    records = list(cache.records())
    twin = sorted(kept.dir.glob("rollouts.rank*" + OUTCOMES))[-1]  # one block's part
    plain = twin.with_name(twin.name[:-len(OUTCOMES)] + ".jsonl")
    last_two = part_records(cache.dir / plain.name)[-2:]
    # as if the committed twin had all but the last two outcomes of the part
    atomic_write_xz(twin, json.dumps({**json.loads(read_text(twin)), "columns": {
        name: values[:-2] for name, values in json.loads(read_text(twin))["columns"].items()}}))
    assert len(list(kept.records())) == len(records) - 2
    kept.append(0, last_two, part=None if "part" not in plain.name else
                int(plain.name.split("part")[1][:3]))
    assert len(list(kept.records())) == len(records)
    plain.unlink()  # the next clone has the rewritten twin alone
    assert sorted((r["key"], r["depth"], r["sample"]) for r in kept.records()) == \
        sorted((r["key"], r["depth"], r["sample"]) for r in records)


def test_outcomes_kept_under_other_patterns_are_refused(cache, tmp_path, monkeypatch):
    from lm_eval_ponder.training import rollouts

    kept = RolloutCache(committed_copy(cache.dir, tmp_path / "kept"))
    monkeypatch.setattr(rollouts, "TEXT_FEATURES", "other")
    with pytest.raises(PonderError, match="other completeness patterns.*git show"):
        list(kept.records())


def test_cache_refuses_other_settings(generator, cache):
    other = RolloutConfig(prompts=CFG.prompts, max_completion_length=7, batch_size=8,
                          apply_chat_template=False)
    with pytest.raises(PonderError, match="built for other settings.*generation"):
        build_cache(generator, other, OFFSETS, cache.dir, progress=False)
    with pytest.raises(PonderError, match="not a rollout cache"):
        RolloutCache(cache.dir / "nowhere")


def test_response_perplexities_chunked_equal_one_row_at_a_time(tiny_model_dir, tiny_vector_dir):
    """Bounded memory: chunked, left-padded scoring of response positions only gives the
    perplexities of plain unpadded one-row forwards. In float32: in bf16 (the default on a CPU
    with native bf16) padding alone moves a perplexity by a few percent."""
    from lm_eval_ponder.training.rollouts import response_perplexities

    generator = make_lm(tiny_model_dir, tiny_vector_dir, alpha=OFFSETS[0], dtype="float32").generator

    contexts = ["What is 2+2?", "Hello there, how are you doing today", "x", "Add 1 and 2."]
    texts = ["4", "fine thanks and you?", "", "The answer is 3"]
    vocab = generator.model.get_output_embeddings().weight.shape[0]
    got = response_perplexities(generator, contexts, texts, logits_budget=4 * vocab * 8)  # tiny chunks
    want = []
    for context, text in zip(contexts, texts):
        ctx = generator.encode_batch([context])[0][0].tolist()
        resp = generator.tokenizer(text, add_special_tokens=False).input_ids
        if not resp:
            want.append(None)
            continue
        ids = torch.tensor([ctx + resp])
        logits = generator.model(input_ids=ids).logits[0, len(ctx) - 1: -1]
        want.append(float(torch.exp(torch.nn.functional.cross_entropy(logits, ids[0, len(ctx):]))))
    assert got[2] is None and want[2] is None
    assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None],
                                                              rel=1e-5)


def test_stopped_sampled_build_leaves_whole_prompts_and_resumes_to_the_same_draws(generator, tmp_path):
    sampled = RolloutConfig(prompts=CFG.prompts, max_completion_length=6, batch_size=12,
                            samples=2, apply_chat_template=False, seed=5)
    full = build_cache(generator, sampled, OFFSETS, tmp_path / "full", progress=False)
    lines = record_lines(full.dir)
    # 12 rows per call / (2 samples x 3 depths) = blocks of 2 prompts, each one generation call
    # at all 3 depths, each in a file of its own (a build kept in git is a series of small
    # finished files)
    assert sorted(p.name for p in full.dir.glob("rollouts.rank*.jsonl")) == \
        [f"rollouts.rank0.part{b:03d}.jsonl" for b in range(3)]
    first = [json.loads(line) for line in lines[: 2 * 3 * 2]]
    assert len({r["key"] for r in first}) == 2
    assert {(r["depth"], r["sample"]) for r in first} == {(k, s) for k in range(3) for s in range(2)}
    key = lambda r: (r["key"], r["depth"], r["sample"])  # noqa: E731
    want = {key(json.loads(line)): json.loads(line)["text"] for line in lines}

    def stopped(name: str, kept: list[str]):
        partial = tmp_path / name
        partial.mkdir()
        for f in ("manifest.json", "prompts.jsonl", "states.safetensors"):
            (partial / f).write_bytes((full.dir / f).read_bytes())
        # the one-file-per-rank layout of older caches, which resuming keeps reading
        (partial / "rollouts.rank0.jsonl").write_text("\n".join(kept) + "\n")
        return {key(r): r["text"] for r in build_cache(generator, sampled, OFFSETS, partial,
                                                       progress=False).records()}

    # stopped after block 0 (and a torn line): the same draws as the uninterrupted build
    assert stopped("after-block", lines[:12] + [lines[12][:15]]) == want
    # a block left half-done (older per-depth builds wrote one depth at a time) is completed
    # from its missing rows: every key once, the kept answers kept
    half = stopped("mid-block", lines[:16])
    assert half.keys() == want.keys()
    assert all(half[key(json.loads(line))] == json.loads(line)["text"] for line in lines[:16])


def test_two_builds_of_disjoint_blocks_draw_what_one_build_draws(generator, tmp_path):
    sampled = RolloutConfig(prompts=CFG.prompts, max_completion_length=6, batch_size=12,
                            samples=2, apply_chat_template=False, seed=5)
    full = build_cache(generator, sampled, OFFSETS, tmp_path / "full", progress=False)
    shared, prompts = prepare_cache(generator, sampled, OFFSETS, tmp_path / "shared")
    # as two one-thread processes on one machine would: blocks 1.. first, then block 0
    generate_missing(generator, shared, prompts, sampled, OFFSETS, progress=False, blocks=range(1, 99))
    assert {r["key"] for r in shared.records()} == {p.key for p in prompts[2:]}
    assert not (shared.dir / "rollouts.rank0.part000.jsonl").exists()
    generate_missing(generator, shared, prompts, sampled, OFFSETS, progress=False, blocks=range(0, 1))
    key = lambda r: (r["key"], r["depth"], r["sample"])  # noqa: E731
    assert {key(r): r["text"] for r in shared.records()} == \
        {key(r): r["text"] for r in full.records()}
    assert len(list(shared.records())) == len(list(full.records()))


def test_repeated_answers_are_scored_once(tiny_model_dir, tiny_vector_dir, monkeypatch):
    """Greedy answers of nearby depths often agree: a repeated (context, text) pair takes no
    second forward, and every row still gets its perplexity."""
    from lm_eval_ponder.training import rollouts

    generator = make_lm(tiny_model_dir, tiny_vector_dir, alpha=OFFSETS[0], dtype="float32").generator
    contexts = ["What is 2+2?", "What is 2+2?", "Add 1 and 2.", "What is 2+2?"]
    texts = ["4", "4", "3", "four"]
    rows = []
    forward = generator.model.forward
    monkeypatch.setattr(generator.model, "forward",
                        lambda *a, **k: rows.append(k["input_ids"].shape[0]) or forward(*a, **k))
    got = rollouts.response_perplexities(generator, contexts, texts)
    assert sum(rows) == 3 and got[0] == got[1] and None not in got
    alone = rollouts.response_perplexities(generator, contexts[2:], texts[2:])
    assert got[2:] == pytest.approx(alone, rel=1e-5)


def test_the_rollout_phase_shows_answers_rows_in_flight_and_tokens(generator, tmp_path, monkeypatch):
    """The trainer's rollout bar ticks per finished answer and counts what its status line
    shows: every answer started, and the tokens the answers generated (the loop's live rows)."""
    import lm_eval_ponder.generation.progress as progress

    bars = []

    class Recording(progress.RowProgress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(progress, "RowProgress", Recording)
    cache = build_cache(generator, CFG, OFFSETS, tmp_path / "c", progress=True)
    (bar,) = bars
    records = list(cache.records())
    assert bar.total == bar.finished == bar.started == len(records) == 5 * len(OFFSETS)
    assert bar.tokens == sum(r["gen_tokens"] for r in records) and bar.stop.is_set()


def test_a_cache_is_reused_whatever_its_backbone_was_called():
    """Issue 73 item 10: caches made before 2026-12-04 spelt the backbone as a path of the
    machine that made them; the same weights' SHA-256 makes the spelling not count, other
    weights or other settings still do."""
    from lm_eval_ponder.training.rollouts import differing_settings

    old = {"backbone": "/root/.cache/m", "backbone_sha256": "ab" * 32, "layer": 15}
    assert differing_settings(old, {**old, "backbone": "m"}) == []
    assert differing_settings(old, {**old, "backbone": "m", "layer": 14}) == ["layer"]
    other = {**old, "backbone": "m", "backbone_sha256": "cd" * 32}
    assert differing_settings(old, other) == ["backbone", "backbone_sha256"]
    assert differing_settings({**old, "backbone_sha256": None},
                              {**old, "backbone": "m", "backbone_sha256": None}) == ["backbone"]

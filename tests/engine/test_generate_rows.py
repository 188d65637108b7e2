"""generate_rows against model.generate on tiny random models: greedy equivalence (batch 1,
mixed-length batches, with and without rows joining), seeded sampling, stop strings as HFLM cuts
them, the RowObserver's row ids, generation_config merging (Qwen2-style repetition penalty) and
the fallback errors."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import build_tiny_llama, build_tiny_tokenizer
from lm_eval.models.utils_hf import stop_sequences_criteria
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lm_eval_ponder.engine.config import LoopConfig
from lm_eval_ponder.engine.loop import generate_rows, prefill_parts
from lm_eval_ponder.engine.rows import cache_bytes_per_token, cache_keyword, check_model_supported
from lm_eval_ponder.engine.sampling import SamplingConfig
from lm_eval_ponder.errors import UnsupportedGeneration
from lm_eval_ponder.generation.accounting import count_generated_tokens

torch.set_num_threads(2)

PAD, EOS = 3, 2
PROMPTS = ["Hello there", "a", "What is 2+2? ", "xyzzy plugh", "The quick brown fox jumps", "Q!"]


@pytest.fixture(scope="module")
def tok():
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="module")
def llama(tok):
    return build_tiny_llama(len(tok), seed=0)


def encode(tok, prompts):
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


def hf_row(model, tok, prompt: str, max_new: int, eos, **kwargs) -> list[int]:
    """generate on one unpadded prompt: its generated tokens up to and including EOS."""
    ids, mask = encode(tok, [prompt])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                         do_sample=False, eos_token_id=eos, pad_token_id=PAD, **kwargs)
    gen = out[0, ids.shape[1]:].tolist()
    eos_set = {eos} if isinstance(eos, int) else set(eos)
    for i, t in enumerate(gen):
        if t in eos_set:
            return gen[: i + 1]
    return gen


def ours(result, width: int) -> list[list[int]]:
    return [result.sequences[i, width: width + n].tolist()
            for i, n in enumerate(result.gen_tokens)]


def test_batch_of_one_greedy_matches_generate(llama, tok):
    prompt = "What is 2+2? "
    ids, mask = encode(tok, [prompt])
    # An EOS id the model actually emits, so the stop path is exercised too.
    free = hf_row(llama, tok, prompt, 40, eos=0)
    eos = free[len(free) // 2] if free else 0
    for kwargs in ({}, {"min_new_tokens": len(free) // 2 + 3}):
        expected = hf_row(llama, tok, prompt, 40, eos=eos, **kwargs)
        cfg = SamplingConfig.from_kwargs(llama.generation_config, do_sample=False, **kwargs)
        res = generate_rows(llama, ids, mask, max_new_tokens=40, eos_token_ids={eos},
                            pad_token_id=PAD, sampling=cfg)
        assert ours(res, ids.shape[1]) == [expected]
        assert res.sequences.shape == (1, ids.shape[1] + len(expected))
    # min_new_tokens actually changed the output (EOS was blocked at its first occurrence)
    assert hf_row(llama, tok, prompt, 40, eos=eos) != expected


def pick_eos(model, tok, prompts, max_new):
    """A token id that rows emit at different steps, so rows finish at different lengths."""
    free = [hf_row(model, tok, p, max_new, eos=0) for p in prompts]
    best, spread = None, -1
    for cand in range(4, len(tok)):
        firsts = {g.index(cand) if cand in g else max_new for g in free}
        if len(firsts) > spread:
            best, spread = cand, len(firsts)
    return best


@pytest.mark.parametrize("max_rows", [None, 2, 4])
def test_mixed_batch_greedy_matches_generate_row_by_row(llama, tok, max_rows):
    max_new = 24
    eos = pick_eos(llama, tok, PROMPTS, max_new)
    expected = [hf_row(llama, tok, p, max_new, eos=eos) for p in PROMPTS]
    assert len({len(e) for e in expected}) >= 3  # rows really leave at different steps
    ids, mask = encode(tok, PROMPTS)
    res = generate_rows(llama, ids, mask, max_new_tokens=max_new, eos_token_ids={eos},
                        pad_token_id=PAD, config=LoopConfig(max_rows=max_rows))
    assert ours(res, ids.shape[1]) == expected
    assert res.sequences[:, : ids.shape[1]].equal(ids)
    for row, n in enumerate(res.gen_tokens):  # padded after each row's end, like generate
        assert (res.sequences[row, ids.shape[1] + n:] == PAD).all()
    assert res.decode_row_slots == sum(n - 1 for n in res.gen_tokens)
    if max_rows is not None:
        assert res.joins > 0


def test_sampling_is_reproducible_by_seed(llama, tok):
    ids, mask = encode(tok, PROMPTS)

    def run(seed: int, max_rows=None):
        cfg = SamplingConfig.from_kwargs(
            llama.generation_config, do_sample=True, temperature=1.0, top_k=20, top_p=0.9,
            generator=torch.Generator().manual_seed(seed))
        res = generate_rows(llama, ids, mask, max_new_tokens=16, eos_token_ids={EOS},
                            pad_token_id=PAD, sampling=cfg,
                            config=LoopConfig(max_rows=max_rows))
        return res.sequences

    assert run(1).equal(run(1))
    assert run(1, max_rows=3).equal(run(1, max_rows=3))
    assert not run(1).equal(run(2))
    greedy = generate_rows(llama, ids, mask, max_new_tokens=16, eos_token_ids={EOS},
                           pad_token_id=PAD).sequences
    assert not run(1).equal(greedy)


# ---- scripted outputs ---------------------------------------------------------------------

BASE_CACHE_KEYWORD = ("cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
                      else "past_key_values")


class ScriptedLlama(LlamaForCausalLM):
    """A tiny Llama whose next token is forced by a table keyed on (input token, position).

    Keying on the position (not on the batch row) makes the script follow each request whatever
    its place in the batch, in ``generate`` and in ``generate_rows`` alike. Unknown keys emit
    ``filler``. Every decode forward's inputs are logged for the observer test.
    """

    table: dict[tuple[int, int], int] = {}
    filler: int = 0
    log: list[tuple[list[int], list[int]]] = []

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                past_key_values=None, logits_to_keep=0, **kwargs):
        # transformers 5.24 renamed past_key_values to cache: take either, pass the base's name
        kwargs[BASE_CACHE_KEYWORD] = cache if cache is not None else past_key_values
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs)
        logits = out.logits
        k = logits.shape[1]
        ids, pos = input_ids[:, -k:].tolist(), position_ids[:, -k:].tolist()
        bias = torch.zeros_like(logits)
        for b in range(logits.shape[0]):
            for t in range(k):
                bias[b, t, self.table.get((ids[b][t], pos[b][t]), self.filler)] = 1e4
        out.logits = logits + bias
        self.log.append((input_ids[:, -1].tolist(), position_ids[:, -1].tolist()))
        return out


def scripted_model(tok, prompts: list[str], scripts: list[list[int]], filler: str = "z"):
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = ScriptedLlama(config).eval()
    model.generation_config.eos_token_id = EOS
    table: dict[tuple[int, int], int] = {}
    for prompt, script in zip(prompts, scripts, strict=True):
        prev, pos = tok.convert_tokens_to_ids(prompt[-1]), len(prompt) - 1
        for nxt in script:
            assert table.setdefault((prev, pos), nxt) == nxt, "script keys collide"
            prev, pos = nxt, pos + 1
    model.table, model.filler, model.log = table, tok.convert_tokens_to_ids(filler), []
    return model


def chars(tok, text: str) -> list[int]:
    return tok.convert_tokens_to_ids(list(text))


def hflm_path(model, tok, ids, mask, until, max_new):
    """What HFLM does: generate with lm-eval's batch-wide stop criteria, then decode each row
    (skip_special_tokens) and cut at every stop term."""
    out = model.generate(input_ids=ids, attention_mask=mask, max_length=ids.shape[1] + max_new,
                         stopping_criteria=stop_sequences_criteria(tok, until, ids.shape[1],
                                                                   ids.shape[0]),
                         pad_token_id=PAD, use_cache=True, do_sample=False)
    return out, cut_texts(out, tok, ids.shape[1], until)


def cut_texts(sequences, tok, width, until):
    texts = []
    for row in sequences.tolist():
        s = tok.decode(row[width:], skip_special_tokens=True)
        for term in until:
            if term:
                s = s.split(term)[0]
        texts.append(s)
    return texts


def test_stop_strings_match_hflm_cut(tok):
    # Prompt lengths far apart, so (token, position) keys of different rows never collide.
    prompts = ["ab", "c" * 12, "d" * 22, "e" * 32, "f" * 42, "g" * 52]
    max_new = 9
    scripts = [
        chars(tok, "xy") + chars(tok, "##") + chars(tok, "#tail"),  # "###" split over 3 tokens
        chars(tok, "\n") + chars(tok, "more"),  # stop at the first generated token
        [EOS],  # EOS before any text
        chars(tok, "zzzzzzzzzzzz"),  # no stop: max_new_tokens
        chars(tok, "##x#") + [EOS],  # partial stop prefixes, then EOS
        chars(tok, "ok") + chars(tok, "#") + chars(tok, "##"),  # completes on the 5th token
    ]
    model = scripted_model(tok, prompts, scripts)
    until = ["###", "\n", tok.eos_token]  # HFLM appends the EOS string to `until`
    ids, mask = encode(tok, prompts)
    hf_out, expected = hflm_path(model, tok, ids, mask, until, max_new)
    assert expected == ["xy", "", "", "zzzzzzzzz", "##x#", "ok"]

    def decode(tokens):
        return tok.decode(tokens, skip_special_tokens=True)

    hf_counts = [count_generated_tokens(decode, row[ids.shape[1]:], until, {EOS, PAD})
                 for row in hf_out.tolist()]
    for max_rows in (None, 2):
        res = generate_rows(model, ids, mask, max_new_tokens=max_new, eos_token_ids={EOS},
                            pad_token_id=PAD, stop=until, decode=decode,
                            config=LoopConfig(max_rows=max_rows))
        assert cut_texts(res.sequences, tok, ids.shape[1], until) == expected
        assert res.gen_tokens == hf_counts == [5, 1, 1, 9, 5, 5]
        assert res.finish_reason == ["stop", "stop", "eos", "length", "eos", "stop"]


class Recorder:
    def __init__(self):
        self.calls: list[tuple[list[int], bool]] = []

    def begin_forward(self, rows: torch.LongTensor, prefill: bool) -> None:
        self.calls.append((rows.tolist(), prefill))


@pytest.mark.parametrize("max_rows", [None, 3, 2])
def test_row_observer_sees_original_rows(tok, max_rows):
    lengths = [7, 2, 9, 1, 4, 6, 3]
    prompts = [ch * (3 + 10 * i) for i, ch in enumerate("abcdefg")]
    scripts = [chars(tok, "y" * (n - 1)) + [EOS] for n in lengths]
    model = scripted_model(tok, prompts, scripts)
    ids, mask = encode(tok, prompts)
    rec = Recorder()
    res = generate_rows(model, ids, mask, max_new_tokens=12, eos_token_ids={EOS}, pad_token_id=PAD,
                        config=LoopConfig(max_rows=max_rows), observers=[rec])
    assert res.gen_tokens == lengths
    assert len(rec.calls) == len(model.log)
    width = ids.shape[1]
    real = mask.sum(1).tolist()
    prefilled: list[int] = []
    decoded = [0] * len(lengths)  # decode forwards each row has been in
    for (rows, prefill), (fed, positions) in zip(rec.calls, model.log):
        running = [r for r in prefilled if decoded[r] < lengths[r] - 1]
        if prefill:
            assert not set(rows) & set(prefilled)
            assert len(running) + len(rows) <= (max_rows or len(lengths))
            prefilled += rows
            continue
        assert sorted(rows) == sorted(running)  # exactly the rows not yet finished
        for r, token, pos in zip(rows, fed, positions):  # batch order: inputs belong to r
            assert token == res.sequences[r, width + decoded[r]].item()
            assert pos == real[r] + decoded[r]
            decoded[r] += 1
    assert sorted(prefilled) == list(range(len(lengths)))
    assert decoded == [n - 1 for n in lengths]


@pytest.mark.parametrize("budget", [None, 400, 150, 1])
def test_cache_budget_bounds_rows_times_width(tok, budget):
    """``max_cache_tokens``: rows in flight x (widest prompt among them + max_new_tokens) stays
    within the budget, a lone row always runs, and what each row generates does not change."""
    lengths = [3, 5, 2, 4, 6, 3]
    prompts = [ch * n for ch, n in zip("abcdef", [90, 3, 13, 23, 33, 43])]  # one long prompt
    scripts = [chars(tok, "y" * (n - 1)) + [EOS] for n in lengths]
    model = scripted_model(tok, prompts, scripts)
    ids, mask = encode(tok, prompts)
    real = mask.sum(1).tolist()
    rec = Recorder()
    res = generate_rows(model, ids, mask, max_new_tokens=8, eos_token_ids={EOS}, pad_token_id=PAD,
                        config=LoopConfig(max_rows=4, max_cache_tokens=budget),
                        observers=[rec])
    assert res.gen_tokens == lengths
    free = generate_rows(scripted_model(tok, prompts, scripts), ids, mask, max_new_tokens=8,
                         eos_token_ids={EOS}, pad_token_id=PAD,
                         config=LoopConfig(max_rows=4))
    assert res.sequences.equal(free.sequences)
    started: list[int] = []
    decoded = [0] * len(lengths)  # decode forwards each row has been in
    most = 0
    for rows, prefill in rec.calls:
        if prefill:
            started += rows
        else:
            for r in rows:
                decoded[r] += 1
        in_flight = [r for r in started if decoded[r] < lengths[r] - 1 or r in rows]
        widest = max(real[r] for r in in_flight)
        most = max(most, len(in_flight))
        if budget is not None and len(in_flight) > 1:
            assert len(in_flight) * (widest + 8) <= budget
    assert most == {None: 4, 400: 4, 150: 3, 1: 1}[budget]


def test_a_binding_budget_admits_rows_in_groups_not_one_by_one(tok):
    """Where the cache budget (not max_rows) bounds the rows in flight, waiting rows join once
    half of what the budget holds is free, as under max_rows: one row at a time meant a
    prefill and a merge of the whole cache per finished row."""
    n = 24
    lengths = [2 + (i * 5) % 7 for i in range(n)]  # rows finish at different steps
    letters = "abcdefghijklmnopqrstuvwx"  # one per row, so the scripts' keys never collide
    prompts = [c * 4 for c in letters]
    scripts = [chars(tok, c * (k - 1)) + [EOS] for c, k in zip(letters, lengths)]
    ids, mask = encode(tok, prompts)
    width = int(mask.sum(1).max()) + 10
    rec = Recorder()
    res = generate_rows(scripted_model(tok, prompts, scripts), ids, mask, max_new_tokens=10,
                        eos_token_ids={EOS}, pad_token_id=PAD,
                        config=LoopConfig(max_rows=64, max_cache_tokens=8 * width),
                        observers=[rec])
    assert res.gen_tokens == lengths
    prefills = [rows for rows, prefill in rec.calls if prefill]
    assert max(len(r) for r in prefills) <= 8 and sum(len(r) for r in prefills) == n
    assert len(prefills) <= n // 4 + 1  # groups of at least about half the budget's rows
    assert min(len(r) for r in prefills[:-1]) >= 4


def test_prefill_parts_split_only_where_padding_would_dominate():
    lengths = {0: 2900, 1: 860, 2: 800, 3: 430, 4: 420, 5: 300}
    assert prefill_parts([0, 1, 2, 3, 4, 5], lengths) == [[0], [1, 2, 3], [4, 5]]
    assert prefill_parts([5, 2, 1], lengths) == [[1, 2], [5]]  # longest first
    same = [3, 4, 5]  # within a factor of 2: one forward, in the given order
    assert prefill_parts(same, lengths) == [same] and prefill_parts([], lengths) == [[]]


def test_cache_bytes_per_token_reads_the_config(tok):
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2)
    # keys and values, 3 layers, 2 KV heads of 32 / 4 = 8 dims, 4 bytes (float32)
    assert cache_bytes_per_token(config, torch.float32) == 2 * 3 * 2 * 8 * 4
    assert cache_bytes_per_token(config, torch.bfloat16) == 2 * 3 * 2 * 8 * 2
    assert cache_bytes_per_token(object(), torch.float32) is None


# ---- generation_config merging, fallbacks --------------------------------------------------

def tiny_qwen2(vocab: int):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=EOS,
                         pad_token_id=PAD, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    gc = model.generation_config  # as Qwen2.5-Instruct ships it
    gc.do_sample, gc.temperature, gc.top_p, gc.top_k = True, 0.7, 0.8, 20
    gc.repetition_penalty, gc.eos_token_id, gc.pad_token_id = 1.05, [EOS], PAD
    return model


def test_qwen2_generation_config_repetition_penalty(tok):
    model = tiny_qwen2(len(tok))
    max_new = 20
    cfg = SamplingConfig.from_kwargs(model.generation_config, do_sample=False)
    assert (cfg.do_sample, cfg.repetition_penalty, cfg.top_k) == (False, 1.05, 20)
    assert cfg.eos_token_ids == (EOS,)
    expected = [hf_row(model, tok, p, max_new, eos=[EOS]) for p in PROMPTS]
    ids, mask = encode(tok, PROMPTS)
    for max_rows in (None, 2):
        res = generate_rows(model, ids, mask, max_new_tokens=max_new,
                            eos_token_ids=set(cfg.eos_token_ids), pad_token_id=PAD,
                            sampling=cfg, config=LoopConfig(max_rows=max_rows))
        assert ours(res, ids.shape[1]) == expected
    # the penalty is really applied: without it the greedy text differs
    plain = generate_rows(model, ids, mask, max_new_tokens=max_new, eos_token_ids={EOS},
                          pad_token_id=PAD, sampling=SamplingConfig())
    assert ours(plain, ids.shape[1]) != expected


def test_unsupported_settings_raise(tok, llama):
    gc = llama.generation_config
    with pytest.raises(UnsupportedGeneration, match="num_beams"):
        SamplingConfig.from_kwargs(gc, num_beams=2)
    for bad in ({"no_repeat_ngram_size": 3}, {"some_unknown_kwarg": 1},
                {"cache_implementation": "static"}, {"stop_strings": ["x"]},
                {"return_dict_in_generate": True, "output_scores": True}):
        with pytest.raises(UnsupportedGeneration):
            SamplingConfig.from_kwargs(gc, **bad)
    # what HFLM passes for greedy is fine
    assert SamplingConfig.from_kwargs(gc, do_sample=False, attention_mask=None,
                                      max_length=40).do_sample is False
    check_model_supported(llama)
    sliding = MistralForCausalLM(MistralConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8))
    with pytest.raises(UnsupportedGeneration, match="full attention"):
        check_model_supported(sliding)


def test_the_cache_is_passed_under_the_name_the_forward_takes():
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name is deprecated,
    removed in 5.40): the loop passes whichever the model's forward takes, and refuses a
    forward that takes neither."""
    class New:
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    class Old:
        def forward(self, input_ids=None, past_key_values=None, **kwargs): ...

    class Neither:
        def forward(self, input_ids=None, **kwargs): ...

    assert cache_keyword(New()) == "cache" and cache_keyword(Old()) == "past_key_values"
    with pytest.raises(UnsupportedGeneration, match="no KV cache argument"):
        cache_keyword(Neither())
    assert cache_keyword(build_tiny_llama(100)) == BASE_CACHE_KEYWORD


def test_the_loop_keeps_cudnn_attention_out_of_its_cuda_forwards():
    """cuDNN attention builds a plan per new (batch, length) and the loop's batch changes at
    most steps (measured on an H200: 1.1 ms of host time per call). The loop's forwards on
    CUDA may use every SDPA backend but cuDNN's; elsewhere nothing changes. (Flags only: no
    GPU needed.)"""
    from lm_eval_ponder.engine.loop import attention_backends

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_backends(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with attention_backends(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_each_row_stops_at_its_own_limit(llama, tok):
    """``max_new_tokens`` per row (how ``benchmarks/scale.py`` replays recorded answer
    lengths): each row ends at its own limit with the tokens it generates under one limit,
    rows leaving and joining (``max_rows`` 2 of 6); a limit per row must be one per row."""
    ids, mask = encode(tok, PROMPTS)
    limits = [5, 1, 9, 3, 12, 7]
    whole = generate_rows(llama, ids, mask, max_new_tokens=max(limits), eos_token_ids=set(),
                          pad_token_id=PAD)
    res = generate_rows(llama, ids, mask, max_new_tokens=limits, eos_token_ids=set(),
                        pad_token_id=PAD,
                        config=LoopConfig(max_rows=2))
    assert res.gen_tokens == limits and res.finish_reason == ["length"] * len(limits)
    width = ids.shape[1]
    for row, n in enumerate(limits):
        assert res.sequences[row, width:width + n].equal(whole.sequences[row, width:width + n])
    with pytest.raises(ValueError, match="one limit >= 1 per row"):
        generate_rows(llama, ids, mask, max_new_tokens=[3, 4], eos_token_ids=set(),
                      pad_token_id=PAD)

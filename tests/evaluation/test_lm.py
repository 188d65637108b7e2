"""PonderLM (lm_eval_ponder.evaluation.lm) against HFLM on a tiny random Llama: equivalence,
per-row accounting, frozen weights, the --use_cache guard, clear errors for bad backbones, and
families outside the FLOPs table loading with an estimate."""

from __future__ import annotations

import hashlib

import pytest
import torch
import transformers
from conftest import build_tiny_tokenizer
from lm_eval.api.instance import Instance
from lm_eval.api.model import CachingLM
from lm_eval.models.huggingface import HFLM

from lm_eval_ponder.engine import cache_bytes_per_token
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.flops import flops_floor, generation_flops, spec_from_modules
from lm_eval_ponder.generation.accounting import GenerationText

PROMPTS = ["What is 3 + 5?", "Add 12 and 30.", "Hi", "Compute 7 times 8 please, then stop."]


def requests(gen_kwargs: dict, prompts=PROMPTS, repeats: int = 1) -> list[Instance]:
    return [
        Instance("generate_until", doc={"i": i}, arguments=(p, dict(gen_kwargs)), idx=r,
                 metadata=("t", i, repeats))
        for i, p in enumerate(prompts) for r in range(repeats)
    ]


@pytest.fixture(scope="module")
def hf_and_ponder(tiny_model_dir):
    # One dtype for both: PonderLM's default follows the CPU (bf16 where it is native), HFLM's
    # is the checkpoint's; equivalence is claimed at the same precision.
    hf = HFLM(pretrained=str(tiny_model_dir), batch_size=3, device="cpu", dtype="float32")
    ponder = PonderLM(pretrained=str(tiny_model_dir), batch_size=3, device="cpu", dtype="float32")
    return hf, ponder


def state_hash(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().numpy().tobytes())  # bf16 -> fp32 is exact
    return digest.hexdigest()


def test_greedy_outputs_token_identical_to_hflm(hf_and_ponder):
    hf, ponder = hf_and_ponder
    kwargs = {"until": ["\n\n"], "max_gen_toks": 24, "do_sample": False}
    expected = hf.generate_until(requests(kwargs))
    got = ponder.generate_until(requests(kwargs))
    assert got == expected
    assert all(isinstance(text, GenerationText) for text in got)


@pytest.mark.parametrize("value", ["captured", "dynamic", "auto"])
def test_the_removed_decode_step_is_refused_in_one_line(tiny_model_dir, value):
    """``decode_step`` went with the captured decode layout (2026-12-04): any value, the one it
    named or the default's, is one line saying so and to drop it, before anything loads (not
    an unknown key deep inside ``from_pretrained``, not silently ignored)."""
    with pytest.raises(PonderError) as caught:
        PonderLM(pretrained=str(tiny_model_dir / "missing"), device="cpu", decode_step=value)
    line = str(caught.value)
    assert "\n" not in line and f"decode_step={value!r}" in line
    assert "removed on 2026-12-04" in line and "drop decode_step=" in line


def test_model_info_carries_the_fingerprint(hf_and_ponder):
    """lm-eval writes get_model_info into the results JSON: the report's run identity."""
    _, ponder = hf_and_ponder
    info = ponder.get_model_info()
    assert info["ponder_fingerprint"] == ponder.fingerprint()
    assert info["ponder_fingerprint_hash"] == ponder.fingerprint_hash()
    assert "model_dtype" in info  # HFLM's own fields are kept
    # issue 65: where it ran, not lm-eval's --device default
    assert info["ponder_device"]["device"] == "cpu"
    assert info["ponder_device"]["dtype"] == "float32"
    assert info["ponder_device"]["hardware"].startswith("cpu (")
    assert info["ponder_device"]["threads"] >= 1


def test_backbone_frozen_and_unchanged(hf_and_ponder):
    _, ponder = hf_and_ponder
    before = state_hash(ponder.model)
    ponder.generate_until(requests({"max_gen_toks": 8, "do_sample": False}))
    assert state_hash(ponder.model) == before
    assert not ponder.model.training
    assert not any(p.requires_grad for p in ponder.model.parameters())


def test_per_row_tokens_stop_at_own_stop_string(hf_and_ponder, tiny_model_dir):
    """Rows stop at their own stop string: the batch-wide criterion must not inflate counts.

    Alone in a batch, a row's generation ends exactly at its stop, so its generated-token count
    is known; in a batch of three the same row must report the same count.
    """
    _, batched = hf_and_ponder
    alone = PonderLM(pretrained=str(tiny_model_dir), batch_size=1, device="cpu", dtype="float32")
    # Stop on single characters so some rows stop early and others run to the cap. ("B": the
    # tiny model's rows need not contain "e"; one that generates a pad token mid-text used to be
    # cut there, as if pad were EOS, which made "e" look like it stopped a row.)
    kwargs = {"until": ["e", "B"], "max_gen_toks": 30, "do_sample": False}
    together = batched.generate_until(requests(kwargs))
    single = alone.generate_until(requests(kwargs))
    assert together == single
    for a, b in zip(together, single):
        assert a.stats == b.stats
        stats = a.stats
        assert 1 <= stats["gen_tokens"] <= 30
        assert stats["flops"] == generation_flops(
            batched.flops_spec, int(stats["prompt_tokens"]), int(stats["gen_tokens"])
        )
        processed = stats["prompt_tokens"] + max(stats["gen_tokens"] - 1, 0)
        assert stats["flops"] >= flops_floor(batched.flops_spec, int(processed))
    counts = {t.stats["gen_tokens"] for t in together}
    assert len(counts) > 1 and min(counts) < 30, "test needs rows that stop early"


def test_repeats_keep_their_own_stats(hf_and_ponder):
    _, ponder = hf_and_ponder
    torch.manual_seed(0)
    reqs = requests({"max_gen_toks": 12, "do_sample": True, "temperature": 1.0}, PROMPTS[:2], 3)
    texts = ponder.generate_until(reqs)
    assert len(texts) == 6
    for req, text in zip(reqs, texts):
        assert isinstance(text, GenerationText)
        prompt_len = len(ponder.tok_encode(req.args[0]))
        assert text.stats["prompt_tokens"] == prompt_len


def test_use_cache_refuses_mixed_settings(tiny_model_dir, tmp_path, monkeypatch):
    kwargs = {"max_gen_toks": 6, "do_sample": False}
    cache = str(tmp_path / "cache")
    first = PonderLM(pretrained=str(tiny_model_dir), batch_size=2, device="cpu")
    CachingLM(first, cache).generate_until(requests(kwargs))
    # the same settings may reuse the file, and get the stats back from it
    again = CachingLM(first, cache).generate_until(requests(kwargs))
    assert all(isinstance(t, GenerationText) for t in again)
    # other settings (here: another fingerprint) must be refused, not served stale results
    monkeypatch.setattr(PonderLM, "fingerprint", lambda self: {"pondering": "other"})
    with pytest.raises(PonderError, match="other model/ponder settings"):
        CachingLM(first, cache)


def test_use_cache_refuses_foreign_cache(tiny_model_dir, tmp_path):
    cache = str(tmp_path / "hfcache")
    hf = HFLM(pretrained=str(tiny_model_dir), batch_size=2, device="cpu")
    CachingLM(hf, cache).generate_until(requests({"max_gen_toks": 4, "do_sample": False}))
    ponder = PonderLM(pretrained=str(tiny_model_dir), batch_size=2, device="cpu")
    with pytest.raises(PonderError, match="did not write"):
        CachingLM(ponder, cache)


@pytest.mark.parametrize("pretrained", ["/no/such/model/dir", "./missing-model"])
def test_unknown_backbone_path_is_a_clear_error(pretrained):
    with pytest.raises(PonderError, match="not found"):
        PonderLM(pretrained=pretrained)


def test_gguf_without_package_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(PonderError, match="pip install gguf"):
        PonderLM(pretrained=str(tmp_path), gguf_file="model.gguf")


def test_loop_at_batch_one_matches_hf_in_float32(tiny_model_dir):
    """The equivalence the issue asks for: float32, one row at a time, greedy tokens of the
    generation loop identical to lm-eval's --model hf."""
    kwargs = {"until": ["\n\n"], "max_gen_toks": 20, "do_sample": False}
    hf = HFLM(pretrained=str(tiny_model_dir), batch_size=1, device="cpu", dtype="float32")
    ponder = PonderLM(pretrained=str(tiny_model_dir), batch_size=1, max_rows=1, device="cpu",
                      dtype="float32")
    assert ponder.generation == "loop" and ponder.model.dtype == torch.float32
    assert ponder.generate_until(requests(kwargs)) == hf.generate_until(requests(kwargs))


def test_sampling_is_reproducible_with_the_same_seed(tiny_model_dir):
    kwargs = {"max_gen_toks": 12, "do_sample": True, "temperature": 1.0, "top_k": 20}
    lm = PonderLM(pretrained=str(tiny_model_dir), device="cpu", max_rows=3)
    runs = []
    for seed in (1234, 1234, 99):
        torch.manual_seed(seed)  # lm-eval seeds torch once per run (--seed)
        runs.append(lm.generate_until(requests(kwargs, repeats=2)))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert len(set(runs[0])) > 1  # repeats of one prompt sample differently (Best-of-N)


def test_lm_eval_batch_size_one_still_fills_the_loop(tiny_model_dir, monkeypatch):
    """lm-eval's CLI hands batch_size=1 to every model; rows in flight are max_rows anyway."""
    import lm_eval_ponder.generation.batch as batch_module

    seen = []
    real = batch_module.generate_rows

    def spy(model, input_ids, *args, **kwargs):
        seen.append(input_ids.shape[0])
        return real(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(batch_module, "generate_rows", spy)
    lm = PonderLM(pretrained=str(tiny_model_dir), batch_size=1, device="cpu")
    lm.generate_until(requests({"max_gen_toks": 4, "do_sample": False}))
    assert seen == [len(PROMPTS)] and lm.batch_size == 1  # restored after the call


def test_cache_budget_reaches_the_loop_and_the_results(tiny_model_dir, monkeypatch):
    """``max_cache_gib`` becomes cache positions for the loop (via the config's bytes per
    token), defaults to a share of the memory, and is written into the run's model info."""
    import lm_eval_ponder.generation.batch as batch_module
    from lm_eval_ponder.generation.batching import total_memory_bytes

    seen = []
    real = batch_module.generate_rows

    def spy(model, input_ids, *args, **kwargs):
        seen.append(kwargs["config"].max_cache_tokens)
        return real(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(batch_module, "generate_rows", spy)
    lm = PonderLM(pretrained=str(tiny_model_dir), device="cpu", dtype="float32",
                  max_cache_gib="0.001")
    per_token = cache_bytes_per_token(lm.model.config, torch.float32)
    assert lm.batching.max_cache_tokens == int(0.001 * 2**30 // per_token)
    lm.generate_until(requests({"max_gen_toks": 4, "do_sample": False}))
    assert seen == [lm.batching.max_cache_tokens]
    assert lm.get_model_info()["ponder_batching"]["max_cache_tokens"] == lm.batching.max_cache_tokens
    # the default on a CPU: three times the weights, at least 0.5 GiB, at most a sixth of the
    # machine's memory (issue 66); on a GPU a third of its memory. Checked against a memory
    # size the test sets, and the size read against /proc/meminfo (a cgroup limit may only
    # lower it)
    from lm_eval_ponder.generation import batching

    monkeypatch.setattr(batching, "total_memory_bytes", lambda device: 12 * 2**30)
    auto = PonderLM(pretrained=str(tiny_model_dir), device="cpu", dtype="float32")
    assert auto.batching.max_cache_gib == 0.5  # the floor: a tiny model's weights are a few kB
    assert batching.default_cache_gib("cpu", 2**28) == 0.75  # the embedded model in bf16
    assert batching.default_cache_gib("cpu", 2**30) == 2.0  # a sixth of 12 GiB
    assert batching.default_cache_gib("cuda:0", 2**30) == 4.0
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    assert 0 < total_memory_bytes("cpu") <= int(meminfo["MemTotal"].split()[0]) * 1024
    assert PonderLM(pretrained=str(tiny_model_dir), device="cpu",
                    max_cache_gib="none").batching.max_cache_tokens is None
    for bad in ("-1", "lots"):
        with pytest.raises(PonderError, match="max_cache_gib"):
            PonderLM(pretrained=str(tiny_model_dir), device="cpu", max_cache_gib=bad)


@pytest.mark.parametrize("generation", ["loop", "hf"])
def test_progress_moves_per_finished_row(tiny_model_dir, monkeypatch, generation):
    """The bar of ``generate_until`` ticks as each row finishes (HFLM's moves once per batch of
    512 requests), ends at the number of requests generated, and counts what the status line
    shows: every row started, and, in the loop, exactly the tokens the rows generated."""
    import lm_eval_ponder.evaluation.lm as lm_module
    from lm_eval_ponder.generation.progress import RowProgress

    bars = []

    class Recording(RowProgress):
        def __init__(self, total, desc, **kwargs):
            super().__init__(total, desc, **kwargs)
            self.ticks = []
            bars.append(self)

        def finish(self, row=None):
            self.ticks.append(row)
            super().finish(row)

    monkeypatch.setattr(lm_module, "RowProgress", Recording)
    lm = PonderLM(pretrained=str(tiny_model_dir), device="cpu", max_rows=2,
                  generation=generation)
    texts = lm.generate_until(requests({"max_gen_toks": 6, "do_sample": False}))
    (bar,) = bars
    assert bar.total == len(PROMPTS) and len(bar.ticks) == len(PROMPTS) and bar.stop.is_set()
    assert bar.started == bar.finished == len(PROMPTS) and bar.in_flight == 0
    generated = sum(t.stats["gen_tokens"] for t in texts)
    if generation == "loop":
        assert sorted(bar.ticks) == list(range(len(PROMPTS)))  # one tick per row, as it ends
        assert bar.tokens == generated  # live rows only
    else:  # generate decodes finished rows until the batch ends: counted, as they cost
        assert bar.tokens >= generated


def test_generation_hf_selects_transformers_generate(tiny_model_dir, monkeypatch):
    import lm_eval_ponder.generation.batch as batch_module

    monkeypatch.setattr(batch_module, "generate_rows", lambda *a, **k: pytest.fail("loop used"))
    lm = PonderLM(pretrained=str(tiny_model_dir), device="cpu", generation="hf")
    assert len(lm.generate_until(requests({"max_gen_toks": 4, "do_sample": False}))) == 4
    with pytest.raises(PonderError, match="generation must be one of"):
        PonderLM(pretrained=str(tiny_model_dir), device="cpu", generation="fast")


def test_unsupported_settings_fall_back_to_generate_with_a_warning(hf_and_ponder, caplog):
    hf, ponder = hf_and_ponder
    kwargs = {"max_gen_toks": 6, "do_sample": False, "num_beams": 2}
    with caplog.at_level("WARNING", logger="lm_eval_ponder"):
        got = ponder.generate_until(requests(kwargs))
    assert got == hf.generate_until(requests(kwargs))
    assert "num_beams=2" in caplog.text and "transformers' generate" in caplog.text


def test_pad_token_generated_mid_answer_is_not_its_end(tiny_model_dir, monkeypatch):
    """generation=hf: a row is counted to its EOS (or stop string). The pad token is not an
    end: where it is a distinct token the model can generate (here id 3, EOS is 2), a pad in
    the middle of an answer used to cut the count there."""
    from lm_eval.models.huggingface import HFLM

    lm = PonderLM(pretrained=str(tiny_model_dir), controller="none", device="cpu",
                  generation="hf")
    pad, eos = lm.tokenizer.pad_token_id, lm.eot_token_id
    assert pad != eos
    answer = torch.tensor([[10, pad, 11, eos, pad, pad], [10, 11, 12, 13, 14, 15]])
    monkeypatch.setattr(HFLM, "_model_generate",
                        lambda self, context, *a, **k: torch.cat([context, answer], dim=1))
    ids = torch.full((2, 3), 5)
    out = lm.generator.generate_batch(ids, torch.ones_like(ids), max_new_tokens=6, stop=[],
                            hook=None)
    assert out.gen_tokens == [4, 6]


@pytest.mark.parametrize("config_name, warned", [("Olmo2Config", False), ("StableLmConfig", True)],
                         ids=["olmo2-table", "stablelm-estimate"])
def test_family_once_refused_by_flops_table_loads(config_name, warned, tmp_path, caplog):
    """OLMo 2 is in the FLOPs table now; StableLM is not and gets the module-shape estimate,
    with one warning, instead of a refusal after the weights were loaded."""
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
        pad_token_id=3)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="lm_eval_ponder"):
        lm = PonderLM(pretrained=str(tmp_path), controller="none", batch_size=1, device="cpu",
                      dtype="float32")
    estimates = [r for r in caplog.records if "estimated from module shapes" in r.getMessage()]
    assert len(estimates) == int(warned)
    assert lm.flops_spec == spec_from_modules(lm.model)
    [text] = lm.generate_until(requests({"max_gen_toks": 4, "do_sample": False}, PROMPTS[:1]))
    assert text.stats["flops"] == generation_flops(
        lm.flops_spec, int(text.stats["prompt_tokens"]), int(text.stats["gen_tokens"]))


def test_a_chat_model_prompted_without_its_template_is_warned_about_once():
    """Issue 66: without --apply_chat_template the embedded chat model answers our tasks with
    empty strings and no word; one warning names the flag (read from the prompts themselves),
    and none when the prompts carry the template or the task is not ours."""
    from types import SimpleNamespace

    class Tokenizer:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return f"<user>{messages[0]['content']}</user>\n<assistant>\n"

    warned = []
    lm = SimpleNamespace(tokenizer=Tokenizer(), backbone_info=SimpleNamespace(name="chat-model"),
                         warn_once=warned.append)

    def request(context, task="arith_ponder"):
        return SimpleNamespace(args=(context, {}), task_name=task)

    PonderLM.check_chat_template(lm, [request("<user>q</user>\n<assistant>\n")])
    PonderLM.check_chat_template(lm, [request("q", task="gsm8k")])
    assert warned == []
    PonderLM.check_chat_template(lm, [request("Please solve: 1 + 1")])
    assert len(warned) == 1 and "--apply_chat_template" in warned[0] and "arith_ponder" in warned[0]
    lm.tokenizer.chat_template = None
    PonderLM.check_chat_template(lm, [request("Please solve: 1 + 1")])
    assert len(warned) == 1


def test_max_gen_toks_must_leave_the_prompt_room_in_the_models_positions():
    """Issue 66: max_gen_toks=100000 on a model of 8,192 positions cut the prompt to nothing
    (and short of that, silently cut it from the left)."""
    from lm_eval_ponder.errors import PonderError
    from lm_eval_ponder.evaluation.requests import Generation

    gen = Generation([], 100, {})
    assert gen.check_room(28, 128) is None
    assert "cut from the left to 28 tokens" in gen.check_room(29, 128)  # as lm-eval cuts
    with pytest.raises(PonderError, match="max_gen_toks=128 does not fit.*no prompt would be"):
        Generation([], 128, {}).check_room(10, 128)

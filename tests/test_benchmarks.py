"""The ``benchmarks/`` scripts (speed and cost; their figures go into docs/results/) and the
layout rule of both script folders, ``benchmarks/`` and ``studies/`` (the study scripts' own
tests: tests/test_studies.py)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, needs_embedded

sys.path.insert(0, str(REPO / "benchmarks"))


# ----------------------------------------------------------------------------- the scripts' layout
BENCHMARKS = REPO / "benchmarks"
STUDIES = REPO / "studies"
# each folder of scripts and the package in it that holds what its scripts share
SHARED = {BENCHMARKS: "lib", STUDIES: "studylib"}
# the scripts that take shared code from it: each must still run as ``python <folder>/X.py``
LIB_USERS = [*((BENCHMARKS, s) for s in ("step_cost", "profile_step", "loop_tail")),
             *((STUDIES, s) for s in ("headroom", "adaptation", "testset", "per_type"))]


def script_imports(directory: Path, others: tuple[Path, ...] = ()) -> list[str]:
    """Every import of a script (a ``*.py`` directly in ``directory`` or in one of ``others``,
    the other script folders) by any file under ``directory``, its shared package included, at
    any depth (a lazy import in a function counts), and every use of ``sys.path``: the rule of
    ``benchmarks/lib/__init__.py`` and ``studies/studylib/__init__.py``. Parsed, nothing is
    imported."""
    scripts = {p.stem for folder in (directory, *others) for p in folder.glob("*.py")}
    found = []
    for path in sorted(directory.rglob("*.py")):
        where = path.relative_to(directory).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif (isinstance(node, ast.Attribute) and node.attr == "path"
                  and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                found.append(f"{where}:{node.lineno} uses sys.path")
                continue
            else:
                continue
            found += [f"{where}:{node.lineno} imports {name}" for name in names
                      if name.split(".")[0] in scripts]
    return found


@pytest.mark.parametrize("folder", sorted(SHARED), ids=lambda folder: folder.name)
def test_no_script_imports_another(folder):
    """Shared code lives once, in the folder's shared package (or the package), never in a
    script that another script imports through ``sys.path``, in its own folder or the other."""
    found = script_imports(folder, tuple(f for f in SHARED if f != folder))
    assert not found, "\n".join(found)


def test_a_planted_script_import_is_reported(tmp_path):
    """The rule can fail: copies of both folders with a lazy script import, a ``from`` import
    of a script in a shared package, a ``sys.path`` edit and an import across the folders
    planted report exactly those."""
    copies = {}
    for folder in SHARED:
        copies[folder.name] = tmp_path / folder.name
        shutil.copytree(folder, copies[folder.name], ignore=shutil.ignore_patterns("__pycache__"))
    bench, studies = copies["benchmarks"], copies["studies"]
    assert not script_imports(bench, (studies,)) and not script_imports(studies, (bench,))

    def plant(path: Path, lines: list[str], first: bool = False) -> int:
        """Put ``lines`` first or after a blank line at the end; the last one's line number."""
        old = path.read_text()
        if first:
            path.write_text("\n".join(lines) + "\n" + old)
            return len(lines)
        path.write_text(old + "\n" + "\n".join(lines) + "\n")
        return len(old.splitlines()) + 1 + len(lines)

    at_loop_tail = plant(bench / "loop_tail.py", ["", "def planted():", "    import step_cost",
                                                  "    return step_cost"]) - 1
    at_decoding = plant(bench / "lib" / "decoding.py", ["from step_cost import main"])
    plant(bench / "profile_step.py", ["import sys", "sys.path.insert(0, 'x')"], first=True)
    at_testset = plant(studies / "testset.py", ["", "def planted():", "    import headroom",
                                                "    return headroom"]) - 1
    at_caches = plant(studies / "studylib" / "caches.py", ["from adaptation import ARMS"])
    at_per_type = plant(studies / "per_type.py", ["import throughput"])  # a benchmark script
    assert script_imports(bench, (studies,)) == [
        f"lib/decoding.py:{at_decoding} imports step_cost",
        f"loop_tail.py:{at_loop_tail} imports step_cost",
        "profile_step.py:2 uses sys.path"]
    assert script_imports(studies, (bench,)) == [
        f"per_type.py:{at_per_type} imports throughput",
        f"studylib/caches.py:{at_caches} imports adaptation",
        f"testset.py:{at_testset} imports headroom"]


@pytest.mark.parametrize("folder, script", LIB_USERS, ids=lambda x: getattr(x, "name", x))
def test_scripts_find_their_shared_code_when_run_from_anywhere(folder, script, tmp_path):
    """``python <folder>/X.py`` finds ``lib`` (or ``studylib``) through the script's own folder,
    with no ``sys.path`` edit and from any working directory (``--help``: nothing runs)."""
    done = subprocess.run([sys.executable, str(folder / f"{script}.py"), "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_padding_bound_counts_each_fixed_batch_to_its_longest_answer():
    from lib.decoding import padding_bound

    # prompts sorted longest first: batches {0, 3} (lengths 9, 8) and {1, 2}
    lengths, tokens = [9, 2, 5, 8], [10, 30, 4, 2]
    assert padding_bound(lengths, tokens, 2) == pytest.approx((2 * 10 + 2 * 30) / 46)
    assert padding_bound(lengths, tokens, 4) == pytest.approx(4 * 30 / 46)
    assert padding_bound(lengths, tokens, 1) == 1.0
    with pytest.raises(ValueError):
        padding_bound(lengths, tokens[:3], 2)


@needs_embedded
def test_loop_tail_counts_the_loops_forwards(capsys):
    import loop_tail

    forwards = loop_tail.main(["--limit", "3", "--max-new-tokens", "3", "--rows", "2",
                               "--threads", "1", "--hf"])
    out = capsys.readouterr().out
    assert forwards >= 2  # the longest answer's decode steps, at least
    assert "padding bound at batch 2" in out and "generate, batch 2" in out


# ----------------------------------------------------------------------------- scale.py (issue 54)
def test_scale_replays_recorded_lengths_in_both_engines(tmp_path, capsys):
    """A tiny shape end to end: both engines generate exactly the replayed lengths (the loop
    checks its own; HFLM's path decodes each batch to its longest row), the JSON carries the
    rates the estimate reads, and the last line is the ratio."""
    import json as json_

    import scale

    out = tmp_path / "scale.json"
    ratio = scale.main(["--shape", "tiny", "--questions", "6", "--max-new-tokens", "12",
                        "--pairs", "1", "--hf-batches", "2", "3", "--threads", "1",
                        "--out", str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"loop_over_hf {ratio:.3f}" and ratio > 0
    record = json_.loads(out.read_text())
    assert record["best_hf"] in ("hf-2", "hf-3") and record["questions"] == 6
    assert set(record["useful_tok_s"]) == {"loop", "hf-2", "hf-3"}
    # HFLM's path decodes every row of a batch to the batch's longest answer
    hf = record["runs"]["hf-2"][0]
    assert hf["slots"] >= hf["useful"]
    # the decode step's line, timed at 1 row, each hf batch and the loop's rows (capped at 6)
    assert [n for n, _ in record["step_cost"]["points"]] == [1, 2, 3, 6]
    assert set(record["bound_over_hf"]) == {"hf-2", "hf-3"}
    assert min(record["bound_over_hf"].values()) >= 1.0
    assert any(line.startswith("bound_over_hf-3 ") and "the best hf" in line
               for line in lines) == (record["best_hf"] == "hf-3")


def test_a_cpu_run_is_sized_to_the_budget_and_keeps_24_questions_as_its_floor(monkeypatch, capsys):
    """Without --questions a CPU run takes the most questions (steps of 24) whose pairs the
    step's line prices under --budget-s; when even 24 do not fit, the default pairs go down
    first, and pairs the user gave are kept."""
    import scale
    from lib.replay import StepCost

    # every step 1 s whatever the rows: a pair costs 1.5 x (the loop's steps + hf's steps)
    monkeypatch.setattr(scale, "measure_step_cost", lambda model, rows, context: StepCost(1.0, 0.0))
    base = ["--shape", "tiny", "--max-new-tokens", "12"]

    args = scale.parse(base + ["--budget-s", "100"])
    sized = scale.size_run(args, None, 128)
    # 24 questions: 12 loop steps + 12 in one hf batch = 36 s a pair; 3 pairs do not fit 100 s
    assert (args.questions, args.pairs) == (24, 2) and sized["predicted_s"] == 72.0
    assert "do not fit it" in capsys.readouterr().out

    args = scale.parse(base + ["--budget-s", "100", "--pairs", "3"])
    scale.size_run(args, None, 128)
    assert (args.questions, args.pairs) == (24, 3)

    args = scale.parse(base + ["--budget-s", "200"])
    sized = scale.size_run(args, None, 128)
    assert args.questions > 24 and args.questions % 24 == 0 and args.pairs == 3
    assert sized["predicted_s"] <= 200
    bigger = scale.parse(base + ["--budget-s", "1e9"])
    scale.size_run(bigger, None, 128)
    assert bigger.questions == 480  # the ladder's top
    assert scale.parse(base).budget_s == scale.CPU_DEFAULTS["budget_s"]
    assert scale.parse(base + ["--questions", "6"]).hf_batches is None  # all 6, set in main
    with pytest.raises(SystemExit, match="one or the other"):
        scale.parse(base + ["--questions", "6", "--budget-s", "10"])


def test_step_cost_bound_is_padding_when_rows_cost_all_and_one_when_they_cost_nothing():
    """The two ends of the step's line: if a step cost only its rows, retiring them gains the
    padding bound (generate's row-steps over the useful ones); if it cost only a fixed read of
    the weights, one batch of every row takes as many steps as the loop, so nothing."""
    from lib.decoding import padding_bound
    from lib.replay import StepCost

    tokens = [10, 30, 4, 2]  # already in lm-eval's order
    rows_only = StepCost(0.0, 1.0)
    assert rows_only.bound(tokens, 2, 8) == pytest.approx(
        padding_bound([4, 3, 2, 1], tokens, 2))
    assert rows_only.fixed_batches(tokens, 2) == 2 * 30 + 2 * 4
    fixed_only = StepCost(1.0, 0.0)
    assert fixed_only.bound(tokens, 4, 8) == 1.0
    # batches of 2 take 30 + 4 steps; the loop, all four in flight, 30
    assert fixed_only.bound(tokens, 2, 8) == pytest.approx(34 / 30)
    # at most 2 rows in flight: 10 and 30 start, 4 joins at step 11, 2 at step 15; 30 steps
    assert fixed_only.retiring_rows(tokens, 2) == 30
    assert StepCost(0.0, 1.0).retiring_rows(tokens, 1) == sum(tokens)


def test_step_cost_fits_a_line_and_refuses_one_row_count():
    from lib.replay import StepCost

    cost = StepCost.fit([(1, 0.08), (24, 0.126), (96, 0.27)])
    assert cost.fixed_s == pytest.approx(0.078, abs=1e-3)
    assert cost.per_row_s == pytest.approx(0.002, abs=1e-4)
    assert cost.step(10) == pytest.approx(cost.fixed_s + 10 * cost.per_row_s)
    with pytest.raises(ValueError, match="two row counts"):
        StepCost.fit([(4, 0.1), (4, 0.2)])


def test_throughput_keeps_its_figures_without_the_texts(tmp_path):
    """``throughput.py --out``: each side's runs as measured, the machine and the settings; the
    responses (arith texts) stay out of the record."""
    import argparse
    import json as json_
    from types import SimpleNamespace

    import throughput

    run = {"wall": 10.0, "tokens": 500, "acc": 0.5, "n": 4, "k": 2, "flops": None,
           "responses": ["4", "5", "6", "7"], "token_list": [1, 2, 3, 4], "prompt_lengths": [9] * 4}
    models = {"a": SimpleNamespace(model=SimpleNamespace(dtype=torch.float32), batch_size=16),
              "b": SimpleNamespace(model=SimpleNamespace(dtype=torch.bfloat16), batch_size=1,
                                   max_rows=128)}
    args = argparse.Namespace(out=str(tmp_path / "t.json"), threads=2, limit=4, max_gen_toks=8,
                              pairs=1)
    throughput.write_record(args, models, {"a": [run], "b": [dict(run, wall=5.0)]}, 2.0)
    record = json_.loads((tmp_path / "t.json").read_text())
    assert record["speedup"] == 2.0 and record["sides"]["b"]["max_rows"] == 128
    assert record["sides"]["a"]["runs"] == [{"wall": 10.0, "tokens": 500, "acc": 0.5, "n": 4,
                                             "flops": None}]
    assert record["sides"]["a"]["max_rows"] is None and "cpu" in record["device"]


def test_cache_append_times_the_loop_with_both_cache_layers(tmp_path, capsys):
    """A tiny shape end to end: the loop runs once with its own cache and once with plain
    DynamicLayers swapped in (the same replayed lengths: run_loop checks them), and the last
    line is their ratio."""
    import json as json_

    import cache_append

    out = tmp_path / "append.json"
    ratio = cache_append.main(["--shape", "tiny", "--questions", "6", "--max-new-tokens", "12",
                               "--pairs", "1", "--threads", "1", "--out", str(out)])
    assert capsys.readouterr().out.splitlines()[-1] == f"growing_over_cat {ratio:.3f}"
    record = json_.loads(out.read_text())
    assert set(record["runs"]) == {"growing", "cat"} and record["ratios"] == [ratio]


@needs_embedded
def test_scale_alone_times_the_loop_and_the_harness_start_up(tmp_path, capsys):
    """With no --hf-batches the loop alone is timed (a cost for the estimate, no ratio), and
    --harness adds the start-up of a real one-token lm_eval run, which the estimate reads."""
    import json as json_

    import scale

    from lm_eval_ponder.reporting.budget import ScaleCost

    out = tmp_path / "scale.json"
    assert scale.main(["--shape", "tiny", "--questions", "4", "--max-new-tokens", "6",
                       "--pairs", "1", "--hf-batches", "--harness", "--harness-questions", "2",
                       "--threads", "1", "--out", str(out)]) is None
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "loop_over_hf n/a (no --hf-batches)"
    assert any(line.startswith("harness start-up (lm_eval --model ponder") for line in lines)
    assert any(line.startswith("harness on 2 questions: ") for line in lines)
    record = json_.loads(out.read_text())
    assert set(record["useful_tok_s"]) == {"loop"} and record["harness_s"] > 1.0
    extra = record["harness_overhead"]
    assert extra["questions"] == 2 and 2 <= extra["tokens"] <= 12 and extra["loop_s_per_token"] > 0
    assert extra["s_per_token"] == extra["harness_s_per_token"] - extra["loop_s_per_token"]
    cost = ScaleCost.read(out)
    assert cost.startup_s == record["load_s"] + record["harness_s"]
    assert cost.overhead_s_per_token == max(extra["s_per_token"], 0.0)
    with pytest.raises(SystemExit, match="--harness with it"):
        scale.main(["--shape", "tiny", "--harness-questions", "2"])


def test_replayed_lengths_are_the_committed_answers():
    """The replayed lengths are the greedy Direct answers' token counts in the committed logs,
    and the prompt lengths the ones their FLOPs price (the arith prompts, kept in the logs,
    counted with the embedded tokenizer, give the same)."""
    from lib import replay

    from lm_eval_ponder.files import read_jsonl

    lengths = replay.recorded_lengths("arith", 10, 10_000)
    log = next((replay.REPO / "results/suite/greedy/Direct/arith").rglob("*.compact.jsonl.xz"))
    rows = read_jsonl(log)[:10]
    assert [g for _, g in lengths] == [int(r["gen_tokens"]) for r in rows]
    assert all(20 < p < 200 for p, _ in lengths)
    capped = replay.recorded_lengths("arith", 10, 50)
    assert [g for _, g in capped] == [min(g, 50) for _, g in lengths]
    batch = replay.batch_of(lengths, 512, "cpu", 0)
    order = replay.order_of(lengths)
    assert batch[2] == [lengths[i][1] for i in order]
    assert batch[1].sum(dim=1).tolist() == [lengths[i][0] for i in order]  # left-padded prompts


def test_prompt_from_price_inverts_the_price():
    import transformers
    from lib import replay

    from lm_eval_ponder.flops import FlopsSpec, generation_flops

    spec = FlopsSpec.from_config(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=2048))
    for prompt in (1, 2, 17, 300, 4000):
        for gen in (0, 1, 9, 500):
            price = generation_flops(spec, prompt, gen)
            assert replay.prompt_from_price(spec, price, gen, generation_flops) == prompt
            assert replay.prompt_from_price(spec, price + 1, gen, generation_flops) is None
    assert replay.prompt_from_price(spec, 10.0, 3, generation_flops) is None
    assert replay.prompt_from_price(spec, generation_flops(spec, 5, 2), 2.5,
                                    generation_flops) is None


def test_train_cost_times_a_block_and_a_step_on_replayed_lengths(tmp_path, capsys):
    """A tiny shape end to end: the block is prompts x 9 depths rows generating exactly the
    replayed lengths, the token-level step generates P x G answers and updates the controller
    (the script raises otherwise), and the JSON and last line carry the times."""
    import json as json_

    import train_cost
    from lib import replay

    out = tmp_path / "train.json"
    record = train_cost.main(["--shape", "tiny", "--prompts", "3", "--token-prompts", "2",
                              "--generations", "3", "--max-new-tokens", "10", "--threads", "1",
                              "--out", str(out)])
    lengths = replay.recorded_lengths("arith", 3, 10)
    assert record["block"]["rows"] == 27 and record["block"]["useful"] == 9 * sum(
        n for _, n in lengths)
    step = record["token_step"]
    assert step["rows"] == 6 and step["useful"] == 3 * sum(n for _, n in lengths[:2])
    assert step["wall_s"] >= step["gen_s"] + step["ppl_s"] > 0
    assert json_.loads(out.read_text())["token_steps"] == 2500
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"train_cost block_s {record['block']['wall_s']:.3f} step_s {step['wall_s']:.3f}"


@pytest.mark.parametrize("shape", ["qwen2.5-7b", "llama-3-8b"])
def test_the_default_rows_and_cache_hold_a_7_8b_model_on_an_80_gb_gpu(shape, monkeypatch):
    """The rule for big models (issue 54; docs/design/generation.md): on one 80 GB GPU in bf16,
    the default 256 rows of GSM8K (its longest recorded prompt + the paper's 500 new tokens)
    fit the default cache budget (a third of the GPU), so the budget does not hold them back,
    and weights + that budget leave over a fifth of the GPU for activations: no out-of-memory
    at the default. (Throughput against a max_rows sweep needs a GPU: gpu_session.sh.)"""
    import torch
    from lib import replay
    from transformers import AutoModelForCausalLM

    from lm_eval_ponder.generation import batching

    gpu = 80 * 10**9
    monkeypatch.setattr(batching, "total_memory_bytes", lambda device: gpu)
    config, _ = replay.shape_config(shape)
    rule = batching.Batching(None, None, "cuda")
    rule.fit(config, torch.bfloat16, 0)  # on a GPU the weights do not set the budget
    widest = max(p for p, _ in replay.recorded_lengths("gsm8k", 10_000, 500))
    assert rule.max_rows == 256 and rule.max_cache_tokens >= 256 * (widest + 500)
    with torch.device("meta"):
        weights = 2 * sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert weights + rule.max_cache_gib * 2**30 < 0.8 * gpu


def test_estimate_check_prices_the_documented_arith_run_from_the_committed_record():
    """docs/usage.md's 13.0 min (781 s): the AVX2 record's start-up and cost per token at the
    committed greedy Direct arith run's answer lengths, 500 questions. Compared here with that
    committed run itself (its own clocked wall), so the arithmetic is checked, not a machine."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "estimate_check", Path(__file__).resolve().parent.parent / "benchmarks" / "estimate_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.compare(Path("results/scale/smollm2-135m-cpu-avx2-arith.json"),
                         Path("results/suite"), Path("results/suite"), "test")
    assert got["predicted_s"] == pytest.approx(781.5, abs=1)
    assert got["measured_s"] == pytest.approx(624.9, abs=0.5)  # its ponder_run.json
    assert got["predicted_at_run_lengths_s"] == pytest.approx(got["predicted_s"], rel=1e-6)
    assert got["measured_over_predicted"] == pytest.approx(624.9 / got["predicted_s"])


@pytest.mark.parametrize("argv, says", [
    (["--questions", "0"], "--questions"),
    (["--device", "cuda"], "--device cuda needs a CUDA GPU"),
    (["--out", "{afile}/record.json"], "is inside"),
])
def test_scale_refuses_a_bad_option_in_one_line_before_measuring(argv, says, tmp_path):
    """Issue 66: ``--questions 0`` passed, ``--device cuda`` on a CPU ended in torch's traceback
    and ``--out`` under a file failed only after the measurement, losing the record."""
    if argv[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    (tmp_path / "afile").write_text("x")
    argv = [a.replace("{afile}", str(tmp_path / "afile")) for a in argv]
    done = subprocess.run([sys.executable, str(BENCHMARKS / "scale.py"), "--shape", "tiny",
                           *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode != 0 and says in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1, done.stderr


@needs_embedded
def test_memory_records_each_phases_peak_on_a_tiny_shape(tmp_path):
    """benchmarks/memory.py: a random-weight shape evaluated through lm-eval, each phase's
    peak recorded with the weights, the cache budget and the bound they make."""
    import json

    out = tmp_path / "mem.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "memory.py"), "--shape", "tiny",
                           "--limit", "3", "--max-gen-toks", "3", "--dtype", "float32",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                                         "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert {"load", "prefill", "decode"} <= set(record["peak_gib"])
    assert record["peak_all_gib"] == max(record["peak_gib"].values())
    assert record["weights_gib"] > 0 and record["within_bound"] in (True, False)

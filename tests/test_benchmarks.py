"""The ``benchmarks/`` scripts (speed and cost; their figures go into docs/results/) and the
layout rule of both script folders, ``benchmarks/`` and ``studies/`` (the study scripts' own
tests: tests/test_studies.py)."""

from __future__ import annotations

import ast
import json
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
LIB_USERS = [*((BENCHMARKS, s) for s in ("step_cost", "profile_step", "generation_loop",
                                         "sampling_draw", "compile_step", "static_step")),
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


def test_a_static_cache_with_per_row_masks_decodes_as_the_dynamic_cache():
    """The premise of a static-shape decode step (``benchmarks/compile_step.py``): rows at
    different lengths in one ``StaticCache``, each masked to its own columns, choose the greedy
    tokens the loop's ``DynamicCache`` chooses (float32, a tiny random Llama)."""
    import compile_step
    from lib.decoding import tiny_model
    from lm_eval_ponder.evaluation.rowbatch import cache_keyword

    model = tiny_model(1000, "cpu", torch.float32)
    kw = cache_keyword(model)
    agree, worst = compile_step.same_tokens_as_dynamic(model, 6, 16, 1000, "cpu", kw)
    assert agree == 1.0 and worst < 1e-5  # rounding; unmasked padding columns give 0.6


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_compile_step_times_both_steps(capsys):
    """The script runs end to end small (a compile included) and ends with its ratio line."""
    import compile_step

    ratio = compile_step.main(["--rows", "2", "--steps", "2", "--pairs", "1", "--cache-len", "24",
                               "--check-steps", "2", "--dtype", "float32", "--threads", "1"])
    assert ratio > 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"compiled_over_eager {ratio:.3f}"
    assert "100.0% of greedy tokens" in out[1]


@needs_embedded
def test_static_step_times_a_static_mode_against_the_dynamic_loop(capsys):
    """``benchmarks/static_step.py`` runs end to end small and ends with its ratio line; in
    float32 the static slots decode the dynamic loop's tokens (100% in its table), with the
    tail moved to fewer slots (``static``) and without (``static-flat``, the default's second
    mode)."""
    import static_step

    ratio = static_step.main(["--prompts", "6", "--max-rows", "3", "--max-new-tokens", "6",
                              "--pairs", "1", "--dtype", "float32", "--threads", "1"])
    assert ratio > 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"static_over_dynamic {ratio:.3f}"
    assert out[-3].split()[0] == "static" and "100.0%" in out[-3]
    assert out[-2].split()[0] == "static-flat" and "100.0%" in out[-2]


def test_static_step_reports_a_failing_mode_and_times_the_others(capsys, monkeypatch):
    """A graph mode that fails on the device (e.g. a capture error) is one line, and the
    modes after it are still timed: a GPU session must not lose them to it."""
    import static_step

    from lm_eval_ponder.evaluation import generation

    real = generation.generate_rows

    def failing(*args, decode_step="dynamic", **kwargs):
        if decode_step == "captured":
            raise RuntimeError("operation not permitted when stream is capturing")
        return real(*args, decode_step=decode_step, **kwargs)

    monkeypatch.setattr(generation, "generate_rows", failing)
    static_step.main(["--prompts", "4", "--max-rows", "2", "--max-new-tokens", "3",
                      "--pairs", "1", "--dtype", "float32", "--threads", "1",
                      "--modes", "captured", "static"])
    out = capsys.readouterr().out.splitlines()
    assert "captured failed: RuntimeError: operation not permitted" in "\n".join(out)
    assert out[-2].split()[0] == "static" and "100.0%" in out[-2]


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


def test_gpu_check_notes_what_captured_made_of_its_graphs(monkeypatch):
    """``gpu_check.graph_notes``: a ``captured`` run that recorded nothing, or ran shapes
    eagerly, says so beside its speed."""
    import functools
    from types import SimpleNamespace

    import gpu_check
    from conftest import build_tiny_llama

    from lm_eval_ponder.evaluation import graph_capture, static_decode

    on_cpu = SimpleNamespace(decode_step="captured", model=build_tiny_llama(64))
    assert gpu_check.graph_notes(on_cpu) == "no CUDA: the eager static step"
    monkeypatch.setattr(static_decode, "CapturedForward", functools.partial(
        graph_capture.CapturedForward, record=lambda forward: None))
    lm = SimpleNamespace(decode_step="captured", model=build_tiny_llama(64))
    forward = static_decode.decode_forward(lm.model, "captured")
    forward.captures, forward.failures = 3, ["RuntimeError: refused"]
    assert gpu_check.graph_notes(lm) == "3 graphs recorded, 1 shapes eager (RuntimeError: refused)"
    assert gpu_check.graph_notes(SimpleNamespace(decode_step="dynamic", model=lm.model)) == ""


@needs_embedded
def test_eval_overhead_replays_recorded_answers(tmp_path, capsys):
    """``benchmarks/eval_overhead.py`` times ``simple_evaluate`` with a model that answers
    from a samples file (plain or xz), each answer to its own document."""
    import lzma

    import eval_overhead

    records = [{"doc_id": i, "resps": [[f"answer {i}"]]} for i in range(3)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "s.jsonl").write_text(text)
    with lzma.open(tmp_path / "s.jsonl.xz", "wt") as f:
        f.write(text)
    assert eval_overhead.read_answers(tmp_path / "s.jsonl") == \
        eval_overhead.read_answers(tmp_path / "s.jsonl.xz") == {i: f"answer {i}" for i in range(3)}
    seconds = eval_overhead.main(["--samples", str(tmp_path / "s.jsonl.xz"), "--reps", "1",
                                  "--limit", "3"])
    out = capsys.readouterr().out.splitlines()
    assert seconds > 0 and out[-1] == f"eval_overhead_s {seconds:.3f}"
    assert "accuracy 0.000" in out[-2]  # none of the made-up answers is right

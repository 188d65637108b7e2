"""A user's bad day (issue 39): every mistake we know of, and what the user sees.

Each case is a command a user could type with one thing wrong. Each asserts the exit status,
exactly one ``lm-eval-ponder error: ...`` line naming the offending value, key or file, no
traceback, and that nothing partial was left behind (no results folder, report, controller,
output directory). ``BEFORE`` says how each case ended before issue 39: ``"traceback"``,
``"silent"`` (it went on without a word, or said something wrong) or ``"fine"`` (already one
line: kept here so it stays so). Errors that lm-eval itself owns (``--tasks nosuch``,
``--limit 0``, ``device=`` in ``--model_args``) are listed too, to check that we leave them to
lm-eval: docs/troubleshooting.md says what they mean. Five report cases were one
line before but left an empty report folder behind (the report made its output folder before it
read a run); the last check caught that. (The issue saw a traceback for a broken samples line;
here, as at the commit before the fix, it was one line already: ``files.read_jsonl``.)

How the commands run:

- ``lm_eval``: every case in one child process (``LM_EVAL_DRIVER``) that runs lm-eval's
  ``__main__`` per case as ``python -m lm_eval`` would, and ends an uncaught exception the way
  the interpreter does (``sys.excepthook``, status 1). lm-eval's task index is built once for
  all cases (it is the same each time: 10 s per case otherwise).
  ``test_the_driver_matches_a_real_lm_eval_process`` checks one case against a real ``python
  -m lm_eval`` process, line for line.
- our commands (``train``, ``steer``, ``suite``, ``report``): their ``main`` in this process,
  under the entry point the command line uses (``errors.run_program``), output captured at the
  file-descriptor level.
- Ctrl-C: the suite gets a real SIGINT in a real process group (its lm_eval child is a stand-in
  that would print a traceback if the signal reached it); the trainer is interrupted in this
  process where a Ctrl-C lands most often, in the middle of building its rollout cache.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from lm_eval_ponder.errors import INTERRUPTED, PREFIX, STOPPED, USAGE_ERROR, run_program

REPO = Path(__file__).resolve().parents[1]
TINY_ARGS = ["--rollout.prompts", "{arith_ponder: 8}", "--rollout.max_completion_length", "4",
             "--rollout.apply_chat_template", "false", "--rollout.batch_size", "6",
             "--ponder.k_max", "2", "--grpo.max_steps", "3", "--controller_hidden", "8"]


@dataclass
class Outcome:
    status: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


def assert_one_line(outcome: Outcome, status: int, *names: str) -> str:
    """The catalogue's four checks but the last (each case checks its own outputs): ``status``,
    exactly one ``lm-eval-ponder error:`` line, naming every one of ``names``, no traceback."""
    lines = [line for line in outcome.stderr.splitlines() if line.startswith(PREFIX)]
    assert outcome.status == status, outcome.stderr[-3000:]
    assert len(lines) == 1, outcome.stderr[-3000:]
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert "Traceback" not in outcome.text, outcome.text[-3000:]
    return lines[0]


def nothing_under(path: Path) -> bool:
    return not path.exists() or not any(path.iterdir())


# ------------------------------------------------------------------ lm_eval --model ponder
LM_EVAL_DRIVER = r"""
import copy, json, os, runpy, sys, tempfile
from lm_eval.tasks import _index

built = {}
original = _index.TaskIndex.build


def build(paths, **kwargs):  # the same directories give the same index: build it once
    key = (tuple(str(p) for p in paths), tuple(sorted(kwargs.items())))
    if key not in built:
        built[key] = original(paths, **kwargs)
    return copy.copy(built[key])


_index.TaskIndex.build = staticmethod(build)
cases, target = json.loads(sys.argv[1]), sys.argv[2]
results = {}
for case in cases:
    saved = dict(os.environ)
    os.environ.update(case["env"])
    sys.argv = ["lm_eval", *case["argv"]]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush(); sys.stderr.flush()
        fd1, fd2 = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        try:
            try:
                runpy.run_module("lm_eval", run_name="__main__")
                status = 0
            except SystemExit as exc:  # as the interpreter ends on one
                if exc.code is None or isinstance(exc.code, int):
                    status = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    status = 1
            except BaseException as exc:  # as the interpreter ends on an uncaught one
                sys.excepthook(type(exc), exc, exc.__traceback__)
                status = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(fd1, 1); os.dup2(fd2, 2); os.close(fd1); os.close(fd2)
        out.seek(0); err.seek(0)
        results[case["name"]] = {"status": status, "stdout": out.read(), "stderr": err.read()}
    os.environ.clear(); os.environ.update(saved)
with open(target, "w") as f:
    json.dump(results, f)
"""

# name: (model args, names the line must hold, how it ended before issue 39); model args are
# formatted with the paths of the fixtures: {tiny} backbone, {vector} its steering vector,
# {other} a controller recorded for another backbone
MODEL_ARG_CASES = {
    "alpha not a number": ("pretrained={tiny},alpha=abc", ["alpha", "'abc'"], "traceback"),
    "tau not a number": ("pretrained={tiny},tau=abc", ["tau", "'abc'"], "traceback"),
    "layer not an integer": ("pretrained={tiny},layer=abc", ["layer", "'abc'"], "traceback"),
    "k_max not an integer": ("pretrained={tiny},k_max=x", ["k_max", "'x'"], "traceback"),
    "max_rows not an integer": ("pretrained={tiny},max_rows=abc", ["max_rows", "'abc'"],
                                "traceback"),
    "dtype not a float type": ("pretrained={tiny},dtype=int8,controller=none",
                               ["dtype", "'int8'"], "traceback"),
    "controller of another backbone": (
        "pretrained={tiny},steering={vector},controller={other}",
        ["{other}", "'some-other-model'", "'tiny-llama", "allow_backbone_mismatch=true"],
        "silent"),
    "tau out of range": ("pretrained={tiny},tau=2", ["tau", "2"], "fine"),
    "alpha and controller": ("pretrained={tiny},alpha=0.1,controller={other}",
                             ["alpha", "controller"], "fine"),
    "controller missing": ("pretrained={tiny},steering={vector},controller=/nonexistent/ctrl",
                           ["/nonexistent/ctrl"], "fine"),
    "steering missing": ("pretrained={tiny},steering=/nonexistent/vec,alpha=0.1",
                         ["/nonexistent/vec"], "fine"),
    "backbone missing": ("pretrained=/nonexistent/model", ["/nonexistent/model"], "fine"),
    "generation unknown": ("pretrained={tiny},generation=fast", ["generation", "'fast'"], "fine"),
    "max_rows zero": ("pretrained={tiny},max_rows=0", ["max_rows", "0"], "fine"),
    "max_cache_gib negative": ("pretrained={tiny},max_cache_gib=-1", ["max_cache_gib", "-1"],
                               "fine"),
    "granularity unknown": ("pretrained={tiny},granularity=word", ["granularity", "'word'"],
                            "fine"),
    "gguf missing": ("gguf_file=/nonexistent/x.gguf", ["/nonexistent/x.gguf"], "fine"),
    # HFLM passes unknown args on to from_pretrained, which fails inside the model's __init__
    "model arg misspelt": ("pretrained={tiny},controler=none", ["'controler'", "'controller'"],
                           "traceback"),
    "model arg nothing takes": ("pretrained={tiny},threads=1", ["'threads'"], "traceback"),
}
# name: (--gen_kwargs, names the line must hold, before[, more model args]): settings generate
# refuses, and one it does not (no tokens to generate: every answer empty, scored as wrong)
GEN_KWARGS_CASES = {
    "max_gen_toks negative": ("max_gen_toks=-1", ["max_gen_toks", "-1"], "silent"),
    "sampling at temperature zero": ("max_gen_toks=2,do_sample=true,temperature=0",
                                     ["do_sample", "temperature"], "traceback"),
    "the same through generate": ("max_gen_toks=2,do_sample=true,temperature=0",
                                  ["do_sample", "temperature"], "traceback", ",generation=hf"),
    "repetition penalty zero": ("max_gen_toks=2,repetition_penalty=0",
                                ["repetition_penalty", "0"], "silent"),
}
# name: (lm_eval arguments, environment, names, before): data problems reach the model's tasks
DATA_CASES = {
    "data folder missing": ({"LM_EVAL_PONDER_DATA": "/nonexistent/data"},
                            ["LM_EVAL_PONDER_DATA=/nonexistent/data"], "fine"),
    "data line malformed": ({"LM_EVAL_PONDER_DATA": "{bad_data}"},
                            ["gsm8k/test.jsonl.gz", "line 2 "], "silent"),
}
# lm-eval's own errors: not ours to reword (docs/troubleshooting.md)
LM_EVAL_OWNED = {
    "task unknown": (["--tasks", "nosuch_task"], "nosuch_task"),
    "limit zero": (["--limit", "0"], None),
    "device in model args": (["--model_args", "pretrained={tiny},device=cpu"],
                             "multiple values for keyword argument 'device'"),
}


def lm_eval_argv(model_args: str, out: Path, task: str = "arith_ponder") -> list[str]:
    return ["--model", "ponder", "--model_args", model_args, "--tasks", task, "--limit", "1",
            "--gen_kwargs", "max_gen_toks=2", "--output_path", str(out), "--log_samples"]


@pytest.fixture(scope="module")
def other_controller(tmp_path_factory) -> Path:
    """A controller for hidden size 64 (the tiny Llama's) whose config records another
    backbone: the shape check passes, the backbone check must not."""
    from lm_eval_ponder.pondering.controller import PonderController, save_controller

    return save_controller(PonderController(64, 8), tmp_path_factory.mktemp("other") / "ctrl",
                           extra_config={"backbone": {"backbone_name": "some-other-model",
                                                      "backbone_sha256": None}})


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory) -> Path:
    """A data folder whose GSM8K test file has a malformed second line."""
    root = tmp_path_factory.mktemp("bad-data")
    (root / "gsm8k").mkdir()
    with gzip.open(root / "gsm8k" / "test.jsonl.gz", "wt") as f:
        f.write('{"question": "1+1?", "answer": "#### 2"}\n'
                '{"question": 2+2?, "answer": "#### 4"}\n'  # (before: reported as line 1)
                '{"question": "3+3?", "answer": "#### 6"}\n')
    return root


@pytest.fixture(scope="module")
def lm_eval_runs(tiny_model_dir, tiny_vector_dir, other_controller, bad_data, tmp_path_factory):
    """Every lm_eval case, run by ``LM_EVAL_DRIVER`` in one child process: {name: (Outcome,
    its --output_path)}."""
    root = tmp_path_factory.mktemp("lm-eval-cases")
    paths = {"tiny": tiny_model_dir, "vector": tiny_vector_dir, "other": other_controller,
             "bad_data": bad_data}
    fill = lambda text: text.format(**{k: str(v) for k, v in paths.items()})  # noqa: E731
    cases, outs = [], {}
    for i, (name, (args, _, _)) in enumerate(MODEL_ARG_CASES.items()):
        outs[name] = root / f"out{i}"
        cases.append({"name": name, "argv": lm_eval_argv(fill(args), outs[name]), "env": {}})
    for i, (name, (gen_kwargs, _, _, *more)) in enumerate(GEN_KWARGS_CASES.items()):
        outs[name] = root / f"gen{i}"
        argv = lm_eval_argv(f"pretrained={tiny_model_dir},controller=none{''.join(more)}",
                            outs[name])
        argv[argv.index("--gen_kwargs") + 1] = gen_kwargs
        cases.append({"name": name, "argv": argv, "env": {}})
    for i, (name, (env, _, _)) in enumerate(DATA_CASES.items()):
        outs[name] = root / f"data{i}"
        cases.append({"name": name, "env": {k: fill(v) for k, v in env.items()},
                      "argv": lm_eval_argv(f"pretrained={tiny_model_dir},controller=none",
                                           outs[name], task="gsm8k_ponder")})
    for i, (name, (change, _)) in enumerate(LM_EVAL_OWNED.items()):
        outs[name] = root / f"owned{i}"
        argv = lm_eval_argv(f"pretrained={tiny_model_dir},controller=none", outs[name])
        flag = argv.index(change[0])
        argv[flag + 1] = fill(change[1])
        cases.append({"name": name, "argv": argv, "env": {}})
    outs["override"] = root / "override"
    cases.append({"name": "override", "env": {}, "argv": lm_eval_argv(
        fill("pretrained={tiny},steering={vector},controller={other},"
             "allow_backbone_mismatch=true"), outs["override"])})
    results = root / "results.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", LM_EVAL_DRIVER, json.dumps(cases), str(results)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(results.read_text())
    return {name: (Outcome(**found[name]), outs[name]) for name in found}, fill


@pytest.mark.parametrize("name", list(MODEL_ARG_CASES))
def test_model_arg_mistakes_are_one_line(lm_eval_runs, name):
    runs, fill = lm_eval_runs
    outcome, out = runs[name]
    _, names, _ = MODEL_ARG_CASES[name]
    assert_one_line(outcome, 1, *map(fill, names))
    assert nothing_under(out)  # no results folder, no samples


@pytest.mark.parametrize("name", list(GEN_KWARGS_CASES))
def test_gen_kwargs_mistakes_are_one_line(lm_eval_runs, name):
    runs, _ = lm_eval_runs
    outcome, out = runs[name]
    assert_one_line(outcome, 1, *GEN_KWARGS_CASES[name][1])
    assert nothing_under(out)


@pytest.mark.parametrize("name", list(DATA_CASES))
def test_data_mistakes_are_one_line(lm_eval_runs, name):
    runs, fill = lm_eval_runs
    outcome, out = runs[name]
    assert_one_line(outcome, 1, *map(fill, DATA_CASES[name][1]))
    assert nothing_under(out)


@pytest.mark.parametrize("name", list(LM_EVAL_OWNED))
def test_errors_lm_eval_owns_are_left_to_it(lm_eval_runs, name):
    """Not our line: lm-eval says what is wrong in its own words (docs/troubleshooting.md)."""
    runs, _ = lm_eval_runs
    outcome, out = runs[name]
    _, says = LM_EVAL_OWNED[name]
    assert PREFIX not in outcome.stderr
    if says is not None:
        assert says in outcome.text
    assert nothing_under(out)


def test_an_explicit_model_arg_overrides_the_backbone_refusal(lm_eval_runs):
    """``allow_backbone_mismatch=true``: the controller of another backbone is used; results
    land in a folder named after ``pretrained`` as lm-eval names it."""
    runs, fill = lm_eval_runs
    outcome, out = runs["override"]
    assert outcome.status == 0, outcome.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    data = json.loads(results.read_text())
    from lm_eval.utils import sanitize_model_name

    assert results.parent.name == sanitize_model_name(fill("{tiny}")) == \
        sanitize_model_name(data["model_name"])
    assert data["config"]["ponder_fingerprint"]["pondering"]["controller"]


def test_the_driver_matches_a_real_lm_eval_process(lm_eval_runs, tiny_model_dir, tmp_path):
    """The in-process driver is only a shortcut: a real ``python -m lm_eval`` ends the same."""
    runs, _ = lm_eval_runs
    outcome, _ = runs["alpha not a number"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    real = subprocess.run(
        [sys.executable, "-m", "lm_eval",
         *lm_eval_argv(f"pretrained={tiny_model_dir},alpha=abc", tmp_path / "out")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    line = assert_one_line(Outcome(real.returncode, real.stdout, real.stderr), 1, "alpha")
    assert line == assert_one_line(outcome, 1, "alpha")


# ------------------------------------------------------------------ our commands
def run_command(module: str, argv: list[str], capfd) -> Outcome:
    """``python -m lm_eval_ponder.<module> ARGV`` in this process: the entry point the command
    line uses, an uncaught exception printed as the interpreter prints it (status 1)."""
    import importlib

    main = importlib.import_module(f"lm_eval_ponder.{module}").main
    capfd.readouterr()
    try:
        run_program(lambda: main(argv))
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - what the user would see
        traceback.print_exc()
        status = 1
    out, err = capfd.readouterr()
    return Outcome(status, out, err)


def write_results(root: Path, stamp: str = "2026-01-01T00-00-00.0", rows: int = 3,
                  folder: str = "SmolLM2-135M-Instruct", correct: bool = True) -> Path:
    """One lm-eval output directory as the CLI writes it."""
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / f"results_{stamp}.json").write_text(json.dumps(
        {"config": {"model": "ponder", "model_args": "controller=none"}, "configs": {},
         "results": {"arith_ponder": {}}}))
    with open(d / f"samples_arith_ponder_{stamp}.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"doc_id": i, "doc": {"question": f"q{i}", "level": 1},
                                "target": "1", "resps": [[f"{correct} {i}"]],
                                "filtered_resps": [f"{correct} {i}"],
                                "exact_match": float(correct), "gen_tokens": 10, "flops": 1e9,
                                "ponder_steps": 0}) + "\n")
    return d / f"results_{stamp}.json"


# name: (module, argv with {tmp}, names, status, before, what must not exist afterwards)
COMMAND_CASES = {
    "train: learning rate not a number": (
        "train", ["--output", "{tmp}/run", "--grpo.learning_rate", "fast"],
        ["grpo.learning_rate", "'fast'"], "traceback"),
    "train: YAML value not an integer": (
        "train", ["--config", "{tmp}/bad.yaml", "--output", "{tmp}/run"],
        ["{tmp}/bad.yaml", "grpo.max_steps", "'ten'"], "traceback"),
    "train: unknown key": ("train", ["--output", "{tmp}/run", "--grpo.nope", "1"],
                           ["grpo.nope"], "fine"),
    "train: config file missing": ("train", ["--config", "{tmp}/none.yaml", "--output",
                                             "{tmp}/run"], ["{tmp}/none.yaml"], "fine"),
    "train: select unknown": ("train", ["--output", "{tmp}/run", "--select", "worst"],
                              ["select", "'worst'"], "fine"),
    "train: val_fraction out of range": ("train", ["--output", "{tmp}/run", "--val_fraction",
                                                   "1.5"], ["val_fraction", "1.5"], "fine"),
    "train: no output": ("train", [], ["--output"], "fine"),
    "train: dtype unknown": ("train", ["--output", "{tmp}/run", "--dtype", "int8"],
                             ["dtype", "'int8'"], "fine"),
    # issue 55: a config file in another encoding ended in UnicodeDecodeError's traceback; a
    # task with no training split, in lm-eval's bare KeyError once the backbone had loaded
    "train: config file not UTF-8": ("train", ["--config", "{tmp}/latin1.yaml", "--output",
                                               "{tmp}/run"], ["{tmp}/latin1.yaml", "utf-8"],
                                     "traceback"),
    "train: prompts of an unknown task": (
        "train", ["--output", "{tmp}/run", "--rollout.prompts", '{"arith": 4}'],
        ["rollout.prompts", "'arith'", "arith_ponder", "gsm8k_ponder"], "traceback"),
    "steer: no questions": ("steer", ["extract", "--n-questions", "0", "--output", "{tmp}/run"],
                            ["--n-questions", "0"], "fine"),
    "steer: batch size zero": ("steer", ["extract", "--batch_size", "0", "--output",
                                         "{tmp}/run"], ["--batch-size", "0"], "fine"),
    "steer: vector missing": ("steer", ["inspect", "{tmp}/novector"], ["{tmp}/novector"],
                              "fine"),
    "suite: dataset unknown": ("suite", ["--output", "{tmp}/run", "--tasks", "nosuch"],
                               ["dataset", "'nosuch'"], "fine"),
    "suite: method unknown": ("suite", ["--output", "{tmp}/run", "--methods", "Foo"],
                              ["method", "'Foo'"], "fine"),
    "suite: limit negative": ("suite", ["--output", "{tmp}/run", "--limit", "-3", "--plan"],
                              ["--limit", "-3"], "silent"),
    "suite: decoding unknown": ("suite", ["--output", "{tmp}/run", "--decoding", "weird"],
                                ["decoding", "'weird'"], "fine"),
    "report: results JSON cut off": ("report", ["{tmp}/runs", "--output", "{tmp}/run"],
                                     ["{tmp}/runs/SmolLM2-135M-Instruct/results_", ".json"],
                                     "traceback"),
    "report: samples line broken": ("report", ["{tmp}/runs", "--output", "{tmp}/run"],
                                    ["samples_arith_ponder_", "line 2"], "fine"),
    "report: run marker cut off": ("report", ["{tmp}/runs", "--output", "{tmp}/run"],
                                   ["{tmp}/runs/ponder_run.json"], "traceback"),
    "report: results folder missing": ("report", ["{tmp}/nowhere", "--output", "{tmp}/run"],
                                       ["{tmp}/nowhere"], "fine"),
    "report: nothing to report": ("report", ["{tmp}/runs", "--output", "{tmp}/run"],
                                  ["{tmp}/runs"], "fine"),
    "report: compact log cut off": ("report", ["{tmp}/runs", "--output", "{tmp}/run"],
                                    ["compact.jsonl.xz"], "fine"),
    "report: two runs disagree": ("report", ["{tmp}/runs", "--output", "{tmp}/run"],
                                  ["disagree", "{tmp}/runs/"], "fine"),
}


def prepare(name: str, tmp: Path) -> None:
    """What a case needs on disk beside its command."""
    (tmp / "bad.yaml").write_text("grpo:\n  max_steps: ten\n")
    (tmp / "latin1.yaml").write_bytes("# réglages\ngrpo:\n  max_steps: 10\n".encode("latin-1"))
    runs = tmp / "runs"
    runs.mkdir()
    if name == "report: results JSON cut off":
        result = write_results(runs)
        result.write_text(result.read_text()[:40])
    elif name == "report: samples line broken":
        result = write_results(runs)
        (log,) = result.parent.glob("samples_*.jsonl")
        lines = log.read_text().splitlines()
        log.write_text(lines[0] + "\n" + lines[1][:25] + "\n" + lines[2] + "\n")
    elif name == "report: run marker cut off":
        write_results(runs)
        (runs / "ponder_run.json").write_text('{"method": "Dir')
    elif name == "report: compact log cut off":
        from lm_eval_ponder.reporting.compact import compact_tree

        write_results(runs)
        compact_tree(runs)
        for log in runs.rglob("samples_*.jsonl"):
            log.unlink()
        (compact,) = runs.rglob("*.compact.jsonl.xz")
        compact.write_bytes(compact.read_bytes()[:30])
    elif name == "report: two runs disagree":
        write_results(runs / "a", correct=True)
        write_results(runs / "b", correct=False, stamp="2026-01-02T00-00-00.0")


@pytest.mark.parametrize("name", list(COMMAND_CASES))
def test_command_mistakes_are_one_line(name, tmp_path, capfd):
    module, argv, names, _ = COMMAND_CASES[name]
    prepare(name, tmp_path)
    fill = lambda text: text.replace("{tmp}", str(tmp_path))  # noqa: E731
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    outcome = run_command(module, [fill(a) for a in argv], capfd)
    assert_one_line(outcome, USAGE_ERROR, *map(fill, names))
    assert not (tmp_path / "run").exists()  # no output directory, report or controller begun
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_steer_takes_the_underscore_spellings_too():
    """``train`` and ``suite`` spell flags with underscores; ``steer`` takes both."""
    from lm_eval_ponder.steering.cli import _build_parser as parser  # noqa: PLC2701

    dashed = parser().parse_args(["extract", "--n-questions", "3", "--batch-size", "2",
                                  "--gguf-file", "g", "--no-chat-template", "--no-progress"])
    underscored = parser().parse_args(["extract", "--n_questions", "3", "--batch_size", "2",
                                       "--gguf_file", "g", "--no_chat_template", "--no_progress"])
    assert vars(dashed) == vars(underscored)
    assert parser().parse_args(["inspect", "v", "--top_k", "4"]).top_k == 4


# ------------------------------------------------------------------ a second suite
HOLDER = ("import sys, time; from lm_eval_ponder.files import acquire_lock; "
          "lock = acquire_lock(sys.argv[1], {'pid': __import__('os').getpid(), 'host': 'here', "
          "'started': 'then', 'command': 'python -m lm_eval_ponder.suite --output x'}); "
          "print('held', flush=True); time.sleep(120)")


def test_a_second_suite_on_one_output_is_refused_then_takes_over_a_dead_lock(tmp_path, capfd):
    """Two suites on one ``--output`` would both run everything. The second is refused,
    naming the process that holds the run; once that process is killed (its lock left on
    disk), the next suite takes the run over and says so; ``--force`` runs regardless."""
    out = tmp_path / "s"
    target = out / "greedy" / "Direct" / "arith"
    target.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(target / "ponder_suite.lock")],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = ["--output", str(out), "--tasks", "arith", "--methods", "Direct", "--limit", "1",
                "--no_report", "--launcher", f"{sys.executable} -c pass"]
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        refused = run_command("suite", argv, capfd)
        assert_one_line(refused, USAGE_ERROR, str(target), f"process {holder.pid}", "--force",
                        "python -m lm_eval_ponder.suite --output x")
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
        forced = run_command("suite", argv + ["--force"], capfd)
        assert forced.status == 0 and "--force: no lock" in forced.stderr
        (target / "ponder_run.json").unlink()  # as if that run had not finished
    finally:
        holder.kill()
        holder.wait()
    assert (target / "ponder_suite.lock").is_file()  # a SIGKILL leaves the lock file behind
    took = run_command("suite", argv, capfd)
    assert took.status == 0, took.stderr[-3000:]
    assert f"locked by process {holder.pid}, which is no longer running; taken over" in \
        took.stderr
    assert (target / "ponder_run.json").is_file() and not (target / "ponder_suite.lock").exists()


# ------------------------------------------------------------------ Ctrl-C
STAND_IN = ("import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "time.sleep(120)")


def test_ctrl_c_in_suite_says_where_it_stopped_and_how_to_resume(tmp_path):
    """Ctrl-C reaches the terminal's whole process group: the suite and its lm_eval child.
    One line from the suite (the run it stopped, what it kept, the command that resumes it),
    no traceback from either, the child ended, nothing half-written."""
    out, pidfile = tmp_path / "s", tmp_path / "child.pid"
    argv = ["--output", str(out), "--tasks", "arith", "--methods", "Direct", "--limit", "1",
            "--no_report", "--resume_within",
            "--launcher", f"{sys.executable} -c \"{STAND_IN}\" {pidfile}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "lm_eval_ponder.suite", *argv], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.time() + 120
    while not (pidfile.is_file() and pidfile.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the stand-in child never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    stdout, stderr = proc.communicate(timeout=60)
    outcome = Outcome(proc.returncode, stdout, stderr)
    assert outcome.status == INTERRUPTED, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(STOPPED)]
    assert len(lines) == 1 and "Traceback" not in outcome.text, stderr[-3000:]
    target = out / "greedy" / "Direct" / "arith"
    for part in ("run 1/1", "Direct on arith", str(target), "0 of its answers kept",
                 "Resume with: python -m lm_eval_ponder.suite --output"):
        assert part in lines[0], (part, lines[0])
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # ended, not orphaned
            os.kill(int(pidfile.read_text()), 0)
            time.sleep(0.05)
    assert not list(target.rglob("results_*.json"))
    assert json.loads((target / "ponder_attempts.json").read_text())[-1]["ran_s"] >= 0
    assert not (target / "ponder_suite.lock").exists()


def test_ctrl_c_while_train_builds_its_cache_says_where_and_how_to_resume(
        tiny_model_dir, tiny_vector_dir, tmp_path, capfd, monkeypatch):
    """Ctrl-C lands in the rollout phase (where a run spends its time): one line with the
    answers the cache kept and the command that resumes, the cache's blocks intact; the same
    command then finishes the run and prints where the controller is."""
    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.training.rollouts import RolloutCache

    out = tmp_path / "run"
    argv = ["--output", str(out), "--pretrained", str(tiny_model_dir), "--steering",
            str(tiny_vector_dir), *TINY_ARGS]
    real = PonderLM.generate_texts
    calls = []

    def ctrl_c_in_second_block(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PonderLM, "generate_texts", ctrl_c_in_second_block)
    stopped = run_command("train", argv, capfd)
    lines = [line for line in stopped.stderr.splitlines() if line.startswith(STOPPED)]
    assert stopped.status == INTERRUPTED and len(lines) == 1, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.text
    kept = len(RolloutCache(out / "rollouts").done())
    assert kept == 6  # the first block: 2 prompts x 3 depths
    for part in (f"rollout cache stopped at {kept} of 24 answers", str(out / "rollouts"),
                 "Resume with: python -m lm_eval_ponder.train --output"):
        assert part in lines[0], (part, lines[0])
    assert not (out / "controller.safetensors").exists()
    monkeypatch.setattr(PonderLM, "generate_texts", real)
    finished = run_command("train", argv, capfd)
    assert finished.status == 0, finished.stderr[-3000:]
    (summary,) = [line for line in finished.stdout.splitlines() if line.startswith("controller:")]
    assert str(out) in summary and "held-out (" in summary and "wall " in summary


def test_the_catalogue_covers_the_issue():
    """Issue 39 counted 34 bad inputs, 24 of them already one line; every problem it listed is
    a case here (by the name it has above)."""
    before = {name: case[-1] for name, case in {**MODEL_ARG_CASES, **DATA_CASES,
                                                  **COMMAND_CASES}.items()}
    listed = ["alpha not a number", "tau not a number", "layer not an integer",
              "k_max not an integer", "train: learning rate not a number",
              "train: YAML value not an integer", "report: results JSON cut off",
              "report: samples line broken", "controller of another backbone",
              "data line malformed"]
    assert set(listed) <= set(before)
    assert sum(1 for v in before.values() if v == "fine") >= 24

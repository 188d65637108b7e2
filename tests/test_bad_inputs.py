"""A user's bad day (issues 39 and 55): every mistake we know of, and what the user sees.

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

Issue 55 ("part two") added the cases of ``ISSUE55_CASES``, ``TRAIN_CASES`` and the issue-55
rows of ``COMMAND_CASES``, their ``BEFORE`` how each ended at the commit before its fix (run on
that commit's code): the four above, or ``"left behind"``, one line but an empty output folder
left behind. Besides the mistakes it listed (an output that cannot be written, found only
after the whole run; ``--batch_size auto``; few-shot examples drawn from the test split; data
files not checked; model args without their ranges; a controller's config.json not
type-checked; a folder or file that is no model; Ctrl-C in lm_eval), it holds the mistakes of
the same families tried since (``test_the_catalogue_covers_issue_55`` names them), and the
runs that must now go through: ``--batch_size auto``, few-shot arith from its training split,
and a report that names the same weights once. Two of the issue's silent wrong numbers are
checked where their code is tested: the Pareto plot's cost ticks
(``tests/reporting/test_plots.py``) and the progress bar against its status line
(``tests/generation/test_progress.py``).

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
import shlex
import signal
import subprocess
import sys
import tempfile
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
}




# ------------------------------------------------------------------ issue 55: part two
@dataclass(frozen=True)
class Case:
    """An lm_eval case of issue 55: model args and names as above (placeholders: the paths of
    ``issue55_files`` too), more lm_eval arguments, the task, the data folder and the
    ``--output_path`` (None: a fresh folder)."""

    args: str
    names: tuple[str, ...]
    before: str
    argv: tuple[str, ...] = ()
    task: str = "arith_ponder"
    data: str | None = None
    out: str | None = None


PLAIN = "pretrained={tiny},controller=none"
STEERED = "pretrained={tiny},steering={vector},controller={ctrl_plain}"


def controller_file(path: str) -> str:
    return f"pretrained={{tiny}},steering={{vector}},controller={path}"


# issue 55's list, then the mistakes tried since (BEFORE as above; "left behind": one line,
# but an empty or half-written output left behind)
ISSUE55_CASES = {
    # 1. the output checked before any work (before: results lost after the whole run)
    "output_path in a read-only folder": Case(PLAIN, ("{readonly}/out", "cannot write"),
                                              "silent", out="{readonly}/out"),
    "output_path is a file": Case(PLAIN, ("{afile}", "is a file"), "silent", out="{afile}"),
    "output_path inside a file": Case(PLAIN, ("{afile}/out", "{afile}, which is a file"),
                                      "silent", out="{afile}/out"),
    "output_path a .json file in a read-only folder": Case(
        PLAIN, ("{readonly}/results.json", "cannot write"), "silent",
        out="{readonly}/results.json"),
    # 2. batch sizes (0 with generation=hf handed lm-eval no answers at all)
    "batch_size zero": Case(PLAIN, ("batch_size", "'0'"), "silent", ("--batch_size", "0")),
    "batch_size negative through generate": Case(PLAIN + ",generation=hf",
                                                 ("batch_size", "'-1'"), "silent",
                                                 ("--batch_size", "-1")),
    "batch_size not a number": Case(PLAIN, ("batch_size", "'abc'"), "traceback",
                                    ("--batch_size", "abc")),
    # 3. few-shot examples from training splits only
    "num_fewshot negative": Case(PLAIN, ("--num_fewshot", "-1"), "silent",
                                 ("--num_fewshot", "-1")),
    "few-shot on MATH-500": Case(PLAIN, ("math500_ponder", "--num_fewshot 0"), "silent",
                                 ("--num_fewshot", "2"), "math500_ponder", "{data}"),
    "few-shot on GPQA": Case(PLAIN, ("gpqa_ponder", "--num_fewshot 0"), "silent",
                             ("--num_fewshot", "1"), "gpqa_ponder", "{data}"),
    "more few-shot examples than the training split": Case(
        PLAIN, ("--num_fewshot 100000", "arith"), "traceback", ("--num_fewshot", "100000")),
    "few-shot without the GSM8K training file": Case(
        PLAIN, ("GSM8K (train)", "gsm8k/train.jsonl.gz"), "silent", ("--num_fewshot", "2"),
        "gsm8k_ponder", "{test_only}"),
    # 4. data checked on read (by file and line)
    "MATH-500 file where GSM8K's belongs": Case(
        PLAIN, ("{math_as_gsm}/gsm8k/test.jsonl.gz", "line 1", "'question'", "GSM8K"),
        "silent", task="gsm8k_ponder", data="{math_as_gsm}"),
    "data row without an answer": Case(
        PLAIN, ("{no_answer}/gsm8k/test.jsonl.gz", "line 1", "'answer'"), "traceback",
        task="gsm8k_ponder", data="{no_answer}"),
    "GSM8K answer a number": Case(PLAIN, ("gsm8k/test.jsonl.gz", "line 3", "'answer' is int"),
                                  "fine", task="gsm8k_ponder", data="{answer_int}"),
    "data line a JSON list": Case(PLAIN, ("gsm8k/test.jsonl.gz", "line 2", "list"), "fine",
                                  task="gsm8k_ponder", data="{json_list}"),
    "GPQA row without its third wrong answer": Case(
        PLAIN, ("gpqa/diamond.jsonl.gz", "line 2", "'incorrect answer 3'"), "fine",
        task="gpqa_ponder", data="{gpqa_short}"),
    # 5. every model arg range-checked
    "early_exit above 1": Case(PLAIN + ",early_exit=1.5", ("early_exit", "1.5"), "silent"),
    "early_exit zero": Case(PLAIN + ",early_exit=0", ("early_exit", "(0, 1]"), "silent"),
    "min_top_prob above 1": Case(PLAIN + ",min_top_prob=1.5", ("min_top_prob", "1.5"), "fine"),
    "min_top_prob with generation=hf": Case(PLAIN + ",min_top_prob=0.2,generation=hf",
                                            ("min_top_prob", "generation=hf"), "fine"),
    "min_top_prob with early_exit": Case(PLAIN + ",min_top_prob=0.2,early_exit=0.9",
                                         ("min_top_prob", "early_exit"), "fine"),
    # issue 73: lm-eval's own tracebacks, now our one line before anything loads
    "task name in capitals": Case(PLAIN, ("ARITH_PONDER", "case-sensitive", "arith_ponder"),
                                  "traceback", task="ARITH_PONDER"),
    "task suffix in capitals": Case(PLAIN, ("arith_ponder_CoT", "arith_ponder_cot"),
                                    "traceback", task="arith_ponder_CoT"),
    "task name misspelt": Case(PLAIN, ("arith_pondr", "did you mean arith_ponder"),
                               "traceback", task="arith_pondr"),
    "limit negative": Case(PLAIN, ("--limit", "-5"), "traceback", ("--limit", "-5")),
    "temperature not a number": Case(PLAIN, ("temperature=abc", "0.7"), "traceback",
                                     ("--gen_kwargs", "temperature=abc")),
    "backbone without tokenizer files": Case("pretrained={no_tokenizer},controller=none",
                                             ("no tokenizer in {no_tokenizer}", "tokenizer="),
                                             "traceback"),
    "chat template asked of a tokenizer without one": Case(
        "pretrained={no_template},controller=none", ("--apply_chat_template", "no chat template"),
        "traceback", ("--apply_chat_template",)),
    # issue 73: pondering silently off with an empty controller= (an unset shell variable)
    "controller empty": Case(STEERED.replace("controller={ctrl_plain}", "controller="),
                             ("controller= is empty", "controller=none"), "silent"),
    "k_max zero": Case(STEERED + ",k_max=0", ("k_max=0", ">= 1"), "silent"),
    "k_max negative": Case(STEERED + ",k_max=-1", ("k_max", "-1"), "fine"),
    "alpha0 zero": Case(STEERED + ",alpha0=0", ("alpha0", "0"), "silent"),
    "alpha0 negative": Case(STEERED + ",alpha0=-0.05", ("alpha0", "-0.05"), "silent"),
    "beta negative": Case(STEERED + ",beta=-1", ("beta", "-1"), "fine"),
    "layer outside the model": Case("pretrained={tiny},steering={vector},alpha=0.1,layer=9",
                                    ("layer 9",), "fine"),
    "layer negative": Case("pretrained={tiny},steering={vector},alpha=0.1,layer=-1",
                           ("layer -1",), "fine"),
    "exit_layers from layer zero": Case(PLAIN + ",early_exit=0.5,exit_layers=0:2",
                                        ("exit_layers", "'0:2'"), "fine"),
    "allow_backbone_mismatch not a flag": Case(PLAIN + ",allow_backbone_mismatch=maybe",
                                               ("allow_backbone_mismatch", "'maybe'"), "fine"),
    # issue 73 item 9: the batch-invariant mode is one row in flight, so max_rows > 1 contradicts it
    "batch_invariant not a flag": Case(PLAIN + ",batch_invariant=maybe",
                                       ("batch_invariant", "'maybe'"), "fine"),
    "batch_invariant with max_rows": Case(PLAIN + ",batch_invariant=true,max_rows=64",
                                          ("batch_invariant=true", "max_rows=64"), "fine"),
    "alpha not finite": Case("pretrained={tiny},steering={vector},alpha=nan", ("alpha", "nan"),
                             "fine"),
    # 6. a controller's config.json type-checked, naming the file and the key
    "controller config: tau not a number": Case(
        controller_file("{ctrl_tau}"), ("{ctrl_tau}/config.json", "'ponder.tau'", "'low'"),
        "traceback"),
    "controller config: a misspelt ponder key": Case(
        controller_file("{ctrl_key}"), ("{ctrl_key}/config.json", "'ponder.tua'"), "silent"),
    "controller config: k_max a fraction": Case(
        controller_file("{ctrl_kmax}"), ("{ctrl_kmax}/config.json", "'ponder.k_max'", "2.5"),
        "silent"),
    "controller config: ponder not a mapping": Case(
        controller_file("{ctrl_list}"), ("{ctrl_list}/config.json", "'ponder'"), "traceback"),
    "controller config: layer not an integer": Case(
        controller_file("{ctrl_layer}"), ("{ctrl_layer}/config.json", "'layer'", "'mid'"),
        "traceback"),
    # 7. backbones that are not
    "pretrained a controller folder": Case("pretrained={other},controller=none",
                                           ("{other}", "model_type", "controller="), "traceback"),
    "gguf_file not a GGUF file": Case("gguf_file={afile},controller=none", ("{afile}", "GGUF"),
                                      "traceback"),
    "pretrained a steering vector folder": Case("pretrained={vector},controller=none",
                                                ("{vector}", "config.json"), "fine"),
}
# runs that must go through (issue 55): batch_size=auto by rows in flight, one line saying so;
# few-shot arith from the training split
ISSUE55_RUNS = {
    "batch_size auto": Case(PLAIN, (), "silent", ("--batch_size", "auto")),  # ran, no word
    "batch_size auto through generate": Case(PLAIN + ",generation=hf", (), "silent",
                                             ("--batch_size", "auto:2")),
    "few-shot arith": Case(PLAIN, (), "silent", ("--num_fewshot", "3", "--limit", "5")),
}


# issue 66 ("part three"): mistakes found since, BEFORE as above
ISSUE66_CASES = {
    "max_gen_toks not a number": Case(PLAIN, ("max_gen_toks", "'abc'"), "traceback",
                                      ("--gen_kwargs", "max_gen_toks=abc")),
    "max_gen_toks past the model's positions": Case(
        PLAIN, ("max_gen_toks=100000", "positions", "no prompt would be left"), "traceback",
        ("--gen_kwargs", "max_gen_toks=100000")),
    "controller= its safetensors file": Case(
        controller_file("{ctrl_plain}/controller.safetensors"),
        ("{ctrl_plain}/controller.safetensors", "is a file", "{ctrl_plain}"), "silent"),
    "use_cache in a read-only folder": Case(PLAIN, ("--use_cache", "{readonly}/answers",
                                                    "cannot write"), "traceback",
                                            ("--use_cache", "{readonly}/answers")),
    "a task's do_sample with temperature 0": Case(
        PLAIN, ("do_sample=true", "task's own", "do_sample=false"), "silent",
        ("--gen_kwargs", "max_gen_toks=2,temperature=0"), "arith_ponder_bon"),
    # issue 74: a model arg that was removed, with the value it took or any other (before: a
    # model arg, and the run went on)
    "decode_step removed": Case(PLAIN + ",decode_step=captured",
                                ("decode_step='captured'", "removed on 2026-12-04",
                                 "drop decode_step="), "silent"),
    "decode_step removed, the default's value": Case(
        PLAIN + ",decode_step=dynamic", ("decode_step='dynamic'", "removed on 2026-12-04"),
        "silent"),
    "decode_step removed, an unknown value": Case(
        PLAIN + ",decode_step=fast", ("decode_step='fast'", "removed on 2026-12-04"), "fine"),
}
# runs that must go through (issue 66), with the line each must print (None: no line)
ISSUE66_RUNS = {
    # our advice for device=cuda on a CPU was device=cpu in --model_args, which ended in
    # lm-eval's "got multiple values for keyword argument 'device'"
    "device in model args": (Case("pretrained={tiny},controller=none,device=cpu", (), "traceback"),
                             None),
    "max_cache_gib below one row": (Case(PLAIN + ",max_cache_gib=0.0000001", (), "silent"),
                                    "less than one row of this run"),
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


def read_only_folder(tmp: Path) -> Path | None:
    """A folder this process cannot write in: one without write permission, or, for root
    (whom no permission bit stops), a kernel folder nothing may be made in (``/sys``); None
    where there is none."""
    if os.geteuid() != 0:
        folder = tmp / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    for candidate in (Path("/sys"), Path("/proc")):
        try:
            os.rmdir(tempfile.mkdtemp(dir=candidate))
        except OSError:
            return candidate
    return None


def gzip_rows(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def gpqa_row(i: int) -> dict:
    """A synthetic GPQA-shaped row (never a real GPQA question)."""
    return {"question": f"Synthetic question {i}?", "correct answer": f"right {i}",
            **{f"incorrect answer {k}": f"wrong {i}.{k}" for k in (1, 2, 3)},
            "record id": f"synthetic-{i}"}


def gsm8k_row(i: int, split: str) -> dict:
    return {"question": f"{split} question {i}: what is {i} + {i}?",
            "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}


@pytest.fixture(scope="module")
def issue55_files(tmp_path_factory, other_controller, tiny_model_dir) -> dict[str, Path | str]:
    """What issue 55's cases need on disk: a file, a read-only folder, data folders (the
    synthetic whole one and damaged ones) and controllers with a damaged config.json."""
    root = tmp_path_factory.mktemp("issue55")
    (root / "afile").write_text("x")
    files: dict[str, Path | str] = {"afile": root / "afile",
                                    "readonly": read_only_folder(root) or "<none>"}
    folders = {
        "data": {"gsm8k/train.jsonl.gz": [gsm8k_row(i, "train") for i in range(4)],
                 "gsm8k/test.jsonl.gz": [gsm8k_row(i, "test") for i in range(3)],
                 "math500/test.jsonl.gz": [{"problem": f"Synthetic problem {i}", "answer": "1",
                                            "level": 1} for i in range(2)],
                 "gpqa/diamond.jsonl.gz": [gpqa_row(i) for i in range(2)]},
        "test_only": {"gsm8k/test.jsonl.gz": [gsm8k_row(i, "test") for i in range(3)]},
        "math_as_gsm": {"gsm8k/test.jsonl.gz": [{"problem": "Synthetic problem", "answer": "2",
                                                 "level": 1}]},
        "no_answer": {"gsm8k/test.jsonl.gz": [{"question": "1 + 1?"}, gsm8k_row(1, "test")]},
        "answer_int": {"gsm8k/test.jsonl.gz": [gsm8k_row(1, "test"), gsm8k_row(2, "test"),
                                               {"question": "2 + 2?", "answer": 4}]},
        "json_list": {"gsm8k/test.jsonl.gz": [gsm8k_row(1, "test"), [1, 2]]},
        "gpqa_short": {"gpqa/diamond.jsonl.gz": [gpqa_row(0), {
            k: v for k, v in gpqa_row(1).items() if k != "incorrect answer 3"}]},
    }
    for name, content in folders.items():
        for rel, rows in content.items():
            gzip_rows(root / name / rel, rows)
        files[name] = root / name
    # issue 73: the tiny backbone saved without its tokenizer, and with one that has no
    # chat template
    import shutil

    from lm_eval_ponder.backbone import TOKENIZER_FILES

    for name in ("no_tokenizer", "no_template"):
        shutil.copytree(tiny_model_dir, root / name)
    for path in (root / "no_tokenizer").iterdir():
        if path.name in TOKENIZER_FILES or path.name.startswith(("special_tokens", "chat_template")):
            path.unlink()
    (root / "no_template" / "chat_template.jinja").unlink(missing_ok=True)
    settings = root / "no_template" / "tokenizer_config.json"
    settings.write_text(json.dumps({k: v for k, v in json.loads(settings.read_text()).items()
                                    if k != "chat_template"}))
    files.update(no_tokenizer=root / "no_tokenizer", no_template=root / "no_template")
    config = json.loads((other_controller / "config.json").read_text())
    config.pop("backbone")  # a controller that records no backbone: any backbone may load it
    for name, change in {"ctrl_plain": {}, "ctrl_tau": {"ponder": {"tau": "low"}},
                         "ctrl_key": {"ponder": {"tua": 0.3}},
                         "ctrl_kmax": {"ponder": {"k_max": 2.5}},
                         "ctrl_list": {"ponder": [0.3]}, "ctrl_layer": {"layer": "mid"}}.items():
        folder = root / name
        folder.mkdir()
        (folder / "controller.safetensors").write_bytes(
            (other_controller / "controller.safetensors").read_bytes())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        files[name] = folder
    return files


def issue55_case(name: str, case: Case, out: Path, fill) -> dict:
    """A driver case (``LM_EVAL_DRIVER``) of ``ISSUE55_CASES`` or ``ISSUE55_RUNS``."""
    argv = lm_eval_argv(fill(case.args), Path(fill(case.out)) if case.out else out, case.task)
    return {"name": name, "argv": argv + [fill(a) for a in case.argv],
            "env": {"LM_EVAL_PONDER_DATA": fill(case.data)} if case.data else {}}


@pytest.fixture(scope="module")
def lm_eval_runs(tiny_model_dir, tiny_vector_dir, other_controller, bad_data, issue55_files,
                 tmp_path_factory):
    """Every lm_eval case, run by ``LM_EVAL_DRIVER`` in one child process: {name: (Outcome,
    its --output_path)}."""
    root = tmp_path_factory.mktemp("lm-eval-cases")
    paths = {"tiny": tiny_model_dir, "vector": tiny_vector_dir, "other": other_controller,
             "bad_data": bad_data, **issue55_files}
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
    issue66 = {**ISSUE66_CASES, **{n: c for n, (c, _) in ISSUE66_RUNS.items()}}
    for i, (name, case) in enumerate({**ISSUE55_CASES, **ISSUE55_RUNS, **issue66}.items()):
        outs[name] = Path(fill(case.out)) if case.out else root / f"issue55-{i}"
        cases.append(issue55_case(name, case, root / f"issue55-{i}", fill))
    outs["override"] = root / "override"
    cases.append({"name": "override", "env": {}, "argv": lm_eval_argv(
        fill("pretrained={tiny},steering={vector},controller={other},"
             "allow_backbone_mismatch=true"), outs["override"])})
    results = root / "results.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", LM_EVAL_DRIVER, json.dumps(cases), str(results)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
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
    assert results.parent.name == Path(fill("{tiny}")).name == data["model_name"]
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


@pytest.mark.parametrize("name", list(ISSUE55_CASES))
def test_issue55_lm_eval_mistakes_are_one_line(lm_eval_runs, issue55_files, name):
    """Each ends in one line naming the culprit, status 1, no traceback; nothing was written
    (no results folder; a file given as --output_path unchanged)."""
    case = ISSUE55_CASES[name]
    if "{readonly}" in (case.out or "") and issue55_files["readonly"] == "<none>":
        pytest.skip("no read-only folder on this machine")
    runs, fill = lm_eval_runs
    outcome, out = runs[name]
    assert_one_line(outcome, 1, *map(fill, case.names))
    if case.out is None:
        assert nothing_under(out)
    assert issue55_files["afile"].read_text() == "x"


@pytest.mark.parametrize("name", list(ISSUE66_CASES))
def test_issue66_lm_eval_mistakes_are_one_line(lm_eval_runs, issue55_files, name):
    """Issue 66's mistakes of lm_eval runs: one line naming the culprit, status 1, nothing
    written."""
    case = ISSUE66_CASES[name]
    if "{readonly}" in " ".join(case.argv) and issue55_files["readonly"] == "<none>":
        pytest.skip("no read-only folder on this machine")
    runs, fill = lm_eval_runs
    outcome, out = runs[name]
    assert_one_line(outcome, 1, *map(fill, case.names))
    assert nothing_under(out)


@pytest.mark.parametrize("name", list(ISSUE66_RUNS))
def test_issue66_runs_go_through_and_say_what_they_must(lm_eval_runs, name):
    runs, _ = lm_eval_runs
    outcome, out = runs[name]
    assert outcome.status == 0, outcome.stderr[-3000:]
    assert list(out.rglob("results_*.json"))
    said = ISSUE66_RUNS[name][1]
    if said is not None:
        assert sum(said in line for line in outcome.stderr.splitlines()) == 1, outcome.stderr[-2000:]
    assert "Traceback" not in outcome.text


@pytest.mark.parametrize("name", ["batch_size auto", "batch_size auto through generate"])
def test_batch_size_auto_runs_rows_in_flight_and_says_so(lm_eval_runs, name):
    """``--batch_size auto``: the run finishes (rows in flight are ``max_rows``), its results
    are saved, and one line says how the batch size is honoured."""
    runs, _ = lm_eval_runs
    outcome, out = runs[name]
    assert outcome.status == 0, outcome.stderr[-3000:]
    assert list(out.rglob("results_*.json"))
    said = [line for line in outcome.stderr.splitlines()
            if "batch_size=auto: --model ponder keeps max_rows=" in line]
    assert len(said) == 1 and "rows in flight" in said[0]


def test_few_shot_arith_draws_its_examples_from_the_training_split(lm_eval_runs):
    """``--num_fewshot 3`` on arith: every example in a prompt is a training question with
    its answer, none a test question (before: five test questions with their answers)."""
    from lm_eval_ponder.data import arith_ladder

    runs, _ = lm_eval_runs
    outcome, out = runs["few-shot arith"]
    assert outcome.status == 0, outcome.stderr[-3000:]
    test = {d["question"]: d["answer"] for d in arith_ladder("test")}
    train = {d["question"]: d["answer"] for d in arith_ladder("train")}
    (log,) = out.rglob("samples_arith_ponder_*.jsonl")
    samples = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(samples) == 5
    for sample in samples:
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        *examples, asked = prompt.split("Please solve the math problem: ")[1:]
        assert asked == sample["doc"]["question"] and len(examples) == 3
        for example in examples:
            question, answer = example.strip().rsplit(" ", 1)
            assert question not in test and train[question] == answer


# ------------------------------------------------------------------ every model arg's range
# Each arg of the README's model-arg table: the case above that passes it a value outside its
# range (each refused in one line), or what it takes, where it has no range. A new arg in the
# table fails the test until it is in one of the two.
ARG_RANGES = {
    "tau": "tau out of range", "k_max": "k_max zero", "alpha0": "alpha0 zero",
    "beta": "beta negative", "layer": "layer outside the model", "max_rows": "max_rows zero",
    "max_cache_gib": "max_cache_gib negative", "early_exit": "early_exit above 1",
    "min_top_prob": "min_top_prob above 1",
    "exit_layers": "exit_layers from layer zero", "granularity": "granularity unknown",
    "generation": "generation unknown",
    "allow_backbone_mismatch": "allow_backbone_mismatch not a flag",
    "batch_invariant": "batch_invariant not a flag",
}
NO_RANGE = {
    "pretrained": "a Hub id or a model directory ('backbone missing', 'pretrained a "
                  "controller folder')",
    "gguf_file": "a GGUF file ('gguf missing', 'gguf_file not a GGUF file')",
    "steering": "a steering-vector directory ('steering missing')",
    "controller": "a controller directory or none ('controller missing')",
    "alpha": "a signed offset: any finite number ('alpha not a number', 'alpha not finite')",
    "alpha_start": "a signed offset: any finite number",
}


def test_every_model_arg_with_a_range_refuses_a_value_outside_it(lm_eval_runs):
    from test_docs import README, documented_args

    documented = set(documented_args(README.read_text()))
    assert not set(ARG_RANGES) & set(NO_RANGE)
    assert set(ARG_RANGES) | set(NO_RANGE) == documented, (
        f"not classified: {sorted(documented - set(ARG_RANGES) - set(NO_RANGE))}; "
        f"not in the table: {sorted(set(ARG_RANGES) | set(NO_RANGE) - documented)}")
    runs, _ = lm_eval_runs
    for arg, case in ARG_RANGES.items():
        outcome, _ = runs[case]
        assert arg in assert_one_line(outcome, 1), (arg, case)


# ------------------------------------------------------------------ Ctrl-C in lm_eval
def interruptible() -> None:
    """``preexec_fn`` of a child that must see Ctrl-C as a terminal user's process does: a
    shell that runs its jobs in the background (``nohup ... &``, some CI runners) ignores
    SIGINT in them, the child inherits that, and Python then installs no handler, so the
    signal would be dropped and the run go on to the end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_lm_eval(argv: list[str], cwd: Path) -> tuple[subprocess.Popen, str]:
    """``python -m lm_eval ARGV`` in its own process group, returned once generation has
    begun (its progress bar is drawn), with what it wrote to stderr so far."""
    import selectors

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lm_eval", *argv], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=interruptible)
    os.set_blocking(proc.stderr.fileno(), False)
    watch = selectors.DefaultSelector()
    watch.register(proc.stderr, selectors.EVENT_READ)
    seen, deadline = "", time.time() + 300
    while "Running generate_until requests" not in seen:
        assert proc.poll() is None, seen[-3000:]
        assert time.time() < deadline, "generation never began"
        if watch.select(timeout=1):
            seen += proc.stderr.read() or ""
    return proc, seen


@pytest.mark.parametrize("use_cache", [True, False])
def test_ctrl_c_in_lm_eval_says_where_it_stopped_what_it_kept_and_how_to_resume(
        tiny_model_dir, tmp_path, use_cache):
    """A real SIGINT to the process group while ``--model ponder`` generates: one line (the
    answers done of the total, the answers ``--use_cache`` kept, the command that resumes the
    run, or, without ``--use_cache``, that command with one), status 130, no traceback, no
    results. (Before: a KeyboardInterrupt traceback of 35-40 frames.)"""
    from lm_eval_ponder.evaluation.resume import kept_answers

    out, cache = tmp_path / "out", tmp_path / "answers"
    argv = ["--model", "ponder", "--model_args",
            f"pretrained={tiny_model_dir},controller=none,max_rows=2", "--tasks", "arith_ponder",
            "--limit", "100", "--gen_kwargs", "max_gen_toks=400", "--output_path", str(out),
            "--log_samples"] + (["--use_cache", str(cache)] if use_cache else [])
    proc, seen = start_lm_eval(argv, tmp_path)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    stdout, stderr = proc.communicate(timeout=120)
    outcome = Outcome(proc.returncode, stdout, seen + stderr)
    assert outcome.status == INTERRUPTED, outcome.stderr[-3000:]
    lines = [line for line in outcome.stderr.splitlines() if line.startswith(STOPPED)]
    assert len(lines) == 1 and "Traceback" not in outcome.text, outcome.stderr[-3000:]
    assert "generation stopped after " in lines[0] and " of 100 answers" in lines[0]
    if use_cache:
        db = f"{cache}_rank0.db"
        assert f"; {kept_answers(db)} answers kept in {db}; Resume with: " in lines[0]
        assert lines[0].endswith(f"--use_cache {cache} (the kept answers are not generated "
                                 "again)")
    else:
        assert "no answer was kept (no --use_cache)" in lines[0]
        assert lines[0].endswith(f"--log_samples --use_cache {out / 'answers'}")
    assert "--model ponder" in lines[0] and not list(tmp_path.rglob("results_*.json"))


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
                  folder: str = "SmolLM2-135M-Instruct", correct: bool = True,
                  config: dict | None = None) -> Path:
    """One lm-eval output directory as the CLI writes it."""
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    config = config or {"model": "ponder", "model_args": "controller=none"}
    (d / f"results_{stamp}.json").write_text(json.dumps(
        {"config": config, "configs": {}, "results": {"arith_ponder": {}}}))
    with open(d / f"samples_arith_ponder_{stamp}.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"doc_id": i, "doc": {"question": f"q{i}", "level": 1},
                                "target": "1", "resps": [[f"{correct} {i}"]],
                                "filtered_resps": [f"{correct} {i}"],
                                "exact_match": float(correct), "gen_tokens": 10, "flops": 1e9,
                                "ponder_steps": 0}) + "\n")
    return d / f"results_{stamp}.json"


# a suite of one run, whose lm_eval is a stand-in that does nothing
SUITE_ONE_RUN = ["--tasks", "arith", "--methods", "Direct", "--limit", "1", "--no_report",
                 "--launcher", f"{sys.executable} -c pass"]
# name: (module, argv with {tmp} and {readonly}, names, before)
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
    # issue 73: GRPO settings that trained nothing adaptive, silently; issue 75: the recipes
    # and the positive control
    "train: GRPO steps all before T1": (
        "train", ["--output", "{tmp}/run", "--recipe", "grpo-2026-12", "--grpo.max_steps", "400"],
        ["grpo.max_steps", "400", "grpo.t1", "500"], "silent"),
    "train: k_max below the teacher's depths": (
        "train", ["--output", "{tmp}/run", "--recipe", "grpo-2026-12", "--ponder.k_max", "2"],
        ["ponder.k_max", "2", "grpo.teacher_min", "3"], "silent"),
    "train: recipe unknown": ("train", ["--output", "{tmp}/run", "--recipe", "fast"],
                              ["recipe", "'fast'", "paper"], "fine"),
    "train: control world unknown": ("train", ["--output", "{tmp}/run", "--control", "nowhere"],
                                     ["'nowhere'", "clean"], "fine"),
    "train: expected at token granularity": (
        "train", ["--output", "{tmp}/run", "--algorithm", "expected", "--ponder.granularity",
                  "token"], ["algorithm=expected", "--algorithm grpo"], "fine"),
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
    "suite: launcher not on PATH": ("suite", ["--output", "{tmp}/run", "--tasks", "arith",
                                              "--methods", "Direct", "--limit", "1",
                                              "--no_report", "--launcher", "no-such-launcher -x"],
                                    ["no-such-launcher", "neither on PATH"], "traceback"),
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
    # issue 55: an output that cannot be written, refused before any work (before: the
    # command's own mkdir or write failed in a traceback, after the work for train and suite)
    "train: output is a file": ("train", ["--output", "{tmp}/afile"],
                                ["--output {tmp}/afile", "is a file"], "traceback"),
    "train: output in a read-only folder": ("train", ["--output", "{readonly}/run"],
                                            ["{readonly}/run", "cannot write"], "traceback"),
    # issue 73: a finished run of other settings, and model args that relabel a method
    "suite: a finished run made with another --limit": (
        "suite", ["--output", "{tmp}/stale", *SUITE_ONE_RUN],
        ["{tmp}/stale/greedy/Direct/arith", "--limit 50", "asked 1", "another --output"],
        "silent"),
    "suite: model args that make FP-Direct Direct": (
        "suite", ["--output", "{tmp}/run", "--tasks", "arith", "--methods", "Direct,FP-Direct",
                  "--model_args", "controller=none", "--no_report", "--launcher",
                  f"{sys.executable} -c pass"],
        ["--model_args controller", "--controller instead"], "silent"),
    "suite: output is a file": ("suite", ["--output", "{tmp}/afile", *SUITE_ONE_RUN],
                                ["--output {tmp}/afile", "is a file"], "traceback"),
    "suite: output inside a file": ("suite", ["--output", "{tmp}/afile/run", *SUITE_ONE_RUN],
                                    ["{tmp}/afile/run", "{tmp}/afile, which is a file"],
                                    "traceback"),
    "suite: output in a read-only folder": ("suite", ["--output", "{readonly}/run",
                                                      *SUITE_ONE_RUN],
                                            ["{readonly}/run", "cannot write"], "traceback"),
    "suite: exit threshold above 1": ("suite", ["--output", "{tmp}/run", "--methods", "EE",
                                                "--exit_thresholds", "0.9,1.5", "--plan"],
                                      ["--exit_thresholds", "0.9,1.5"], "silent"),
    "report: output is a file": ("report", ["{tmp}/runs", "--output", "{tmp}/afile"],
                                 ["--output {tmp}/afile", "is a file"], "traceback"),
    "report: output in a read-only folder": ("report", ["{tmp}/runs", "--output",
                                                        "{readonly}/report"],
                                             ["{readonly}/report", "cannot write"], "traceback"),
    "steer: output is a file": ("steer", ["extract", "--n-questions", "2", "--output",
                                          "{tmp}/afile"], ["--output {tmp}/afile", "is a file"],
                                "traceback"),
    "steer: output in a read-only folder": ("steer", ["extract", "--n-questions", "2",
                                                      "--output", "{readonly}/vector"],
                                            ["{readonly}/vector", "cannot write"], "traceback"),
}


def prepare(name: str, tmp: Path) -> None:
    """What a case needs on disk beside its command."""
    (tmp / "afile").write_text("x")
    (tmp / "bad.yaml").write_text("grpo:\n  max_steps: ten\n")
    (tmp / "latin1.yaml").write_bytes("# réglages\ngrpo:\n  max_steps: 10\n".encode("latin-1"))
    runs = tmp / "runs"
    runs.mkdir()
    if name == "suite: a finished run made with another --limit":
        write_results(tmp / "stale" / "greedy" / "Direct" / "arith", config={
            "model": "ponder", "model_args": "controller=none", "limit": 50.0,
            "gen_kwargs": {"max_gen_toks": 500, "do_sample": False}})
    if name.startswith("report: output"):  # a run to report: only the output is wrong
        write_results(runs)
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
    readonly = None
    if any("{readonly}" in a for a in argv):
        readonly = read_only_folder(tmp_path)
        if readonly is None:
            pytest.skip("no read-only folder on this machine")

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{readonly}", str(readonly))

    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    outcome = run_command(module, [fill(a) for a in argv], capfd)
    assert_one_line(outcome, USAGE_ERROR, *map(fill, names))
    assert not (tmp_path / "run").exists()  # no output directory, report or controller begun
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "afile").read_text() == "x"


# train runs that fail once the run has begun (issue 55: each left an empty --output folder
# behind): name -> (flags over a tiny run's, environment, names, before)
TRAIN_CASES = {
    "train: training data missing": (
        ["--rollout.prompts", "{gsm8k_ponder: 4}"], {"LM_EVAL_PONDER_DATA": "{tmp}/nodata"},
        ["GSM8K (train)", "{tmp}/nodata/gsm8k/train.jsonl.gz"], "silent"),  # named the test split
    "train: backbone missing": (["--pretrained", "/nonexistent/model"], {},
                                ["/nonexistent/model"], "left behind"),
    "train: steering folder without a vector": (["--steering", "{tmp}/novector"], {},
                                                ["{tmp}/novector"], "left behind"),
}


@pytest.mark.parametrize("name", list(TRAIN_CASES))
def test_a_train_run_that_fails_leaves_no_empty_output_folder(
        name, tiny_model_dir, tiny_vector_dir, tmp_path, capfd, monkeypatch):
    flags, env, names, _ = TRAIN_CASES[name]
    (tmp_path / "nodata").mkdir()
    (tmp_path / "novector").mkdir()
    fill = lambda text: text.replace("{tmp}", str(tmp_path))  # noqa: E731
    for key, value in env.items():
        monkeypatch.setenv(key, fill(value))
    argv = ["--output", str(tmp_path / "run" / "controller"), "--pretrained",
            str(tiny_model_dir), "--steering", str(tiny_vector_dir), *TINY_ARGS,
            *map(fill, flags)]
    outcome = run_command("train", argv, capfd)
    assert_one_line(outcome, USAGE_ERROR, *map(fill, names))
    assert not (tmp_path / "run").exists()  # nor the parent the run would have made


def test_a_full_disk_during_train_is_one_line_that_says_how_to_resume(
        tiny_model_dir, tiny_vector_dir, tmp_path, capfd, monkeypatch):
    """Issue 73: a full disk while train writes (here: its rollout cache's second block)
    ended in a traceback; it is one line naming the file, what is kept and the command that
    resumes."""
    import errno

    from lm_eval_ponder.training.rollouts import RolloutCache

    real, calls = RolloutCache.append, []

    def full_disk(self, rank, records, part=None):
        calls.append(part)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.dir / "x.jsonl"))
        return real(self, rank, records, part)

    monkeypatch.setattr(RolloutCache, "append", full_disk)
    out = tmp_path / "run"
    argv = ["--output", str(out), "--pretrained", str(tiny_model_dir), "--steering",
            str(tiny_vector_dir), *TINY_ARGS]
    outcome = run_command("train", argv, capfd)
    assert_one_line(outcome, USAGE_ERROR, "No space left on device", "rollout cache stopped at",
                    "run the same command again", "-m lm_eval_ponder.train --output")


def test_report_names_the_same_weights_once_whatever_model_ran_them(tmp_path, capfd):
    """The embedded weights run by ``--model hf pretrained=<converted dir>`` and by ``--model
    ponder``: one backbone in the report, two rows of it (the identities differ). Before:
    two backbones, the directory of this machine's cache and ``smollm2-135m-instruct``."""
    from lm_eval_ponder.backbone import EMBEDDED_NAME, EMBEDDED_SHA256

    converted = f"/home/u/.cache/lm_eval_ponder/converted/SmolLM2-135M-Instruct.Q4_1-" \
                f"{EMBEDDED_SHA256[:16]}"
    write_results(tmp_path / "runs" / "hf", folder="converted", config={
        "model": "hf", "model_args": f"pretrained={converted},dtype=float32",
        "model_dtype": "torch.float32"})
    write_results(tmp_path / "runs" / "ponder", config={
        "model": "ponder", "model_args": "controller=none", "ponder_fingerprint": {
            "backbone": converted.replace("/home/u", "/root"), "backbone_sha256": EMBEDDED_SHA256,
            "dtype": "torch.float32", "generation": "loop", "pondering": None}})
    outcome = run_command("report", [str(tmp_path / "runs"), "--output", str(tmp_path / "r")],
                          capfd)
    assert outcome.status == 0, outcome.stderr[-3000:]
    import csv

    with open(tmp_path / "r" / "leaderboard.csv") as f:
        rows = list(csv.DictReader(f))
    assert {row["backbone"] for row in rows} == {EMBEDDED_NAME}
    assert len({row["method"] for row in rows}) == 2  # Direct [model ...], twice


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
                            text=True, start_new_session=True, preexec_fn=interruptible)
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
                 f"Resume with: {shlex.quote(sys.executable)} -m lm_eval_ponder.suite --output"):
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
    from lm_eval_ponder.generation.generator import SteeredGenerator
    from lm_eval_ponder.training.rollouts import RolloutCache

    out = tmp_path / "run"
    argv = ["--output", str(out), "--pretrained", str(tiny_model_dir), "--steering",
            str(tiny_vector_dir), *TINY_ARGS]
    real = SteeredGenerator.generate_texts
    calls = []

    def ctrl_c_in_second_block(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SteeredGenerator, "generate_texts", ctrl_c_in_second_block)
    stopped = run_command("train", argv, capfd)
    lines = [line for line in stopped.stderr.splitlines() if line.startswith(STOPPED)]
    assert stopped.status == INTERRUPTED and len(lines) == 1, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.text
    kept = len(RolloutCache(out / "rollouts").done())
    assert kept == 6  # the first block: 2 prompts x 3 depths
    for part in (f"rollout cache stopped at {kept} of 24 answers", str(out / "rollouts"),
                 f"Resume with: {shlex.quote(sys.executable)} -m lm_eval_ponder.train --output"):
        assert part in lines[0], (part, lines[0])
    assert not (out / "controller.safetensors").exists()
    monkeypatch.setattr(SteeredGenerator, "generate_texts", real)
    finished = run_command("train", argv, capfd)
    assert finished.status == 0, finished.stderr[-3000:]
    (summary,) = [line for line in finished.stdout.splitlines() if line.startswith("controller:")]
    assert str(out) in summary and "held-out (" in summary and "wall " in summary


def test_the_catalogue_covers_issue_55():
    """Every problem issue 55 listed is a case here, and at least 20 more mistakes of the same
    families, tried since, with how each ended before."""
    listed = [
        "output_path in a read-only folder", "output_path is a file", "output_path inside a file",
        "train: output is a file", "train: output in a read-only folder",
        "suite: output is a file", "suite: output in a read-only folder",
        "report: output is a file", "report: output in a read-only folder",
        "train: training data missing", "train: backbone missing",
        "train: steering folder without a vector",  # (and a dataset name for a task: above)
        "few-shot on MATH-500", "few-shot on GPQA", "MATH-500 file where GSM8K's belongs",
        "data row without an answer", "early_exit above 1", "k_max zero", "alpha0 zero",
        "controller config: tau not a number", "pretrained a controller folder",
        "gguf_file not a GGUF file",
    ]
    cases = {**ISSUE55_CASES, **{n: c for n, c in COMMAND_CASES.items()}, **TRAIN_CASES}
    assert set(listed) <= set(cases)
    before = {name: c.before if isinstance(c, Case) else c[-1] for name, c in cases.items()}
    assert set(before.values()) <= {"traceback", "silent", "fine", "left behind"}
    issue55 = set(ISSUE55_CASES) | set(TRAIN_CASES) | {
        n for n in COMMAND_CASES if "output" in n or "threshold" in n}
    assert len(issue55 - set(listed)) >= 20


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

"""``python -m lm_eval_ponder.suite`` on the tiny Llama through the real lm_eval CLI: runs,
resumes (finished runs are skipped) and reports."""

from __future__ import annotations

import json
from pathlib import Path

from lm_eval_ponder.errors import USAGE_ERROR
from lm_eval_ponder.reporting import suite, suite_plan, suite_run


def test_plan_covers_methods_and_decodings():
    runs = suite_plan.plan(list(suite_plan.METHODS), ["arith"], ["greedy", "t0.7"], -0.2, "/c")
    # Best-of-N samples at T = 0.7 under every decoding: planned once, not per decoding
    assert len(runs) == 12
    assert sorted(r.method for r in runs if r.method.endswith("BoN")) == ["BoN", "FP-BoN"]
    tasks = {(r.method, r.task) for r in runs}
    assert ("FP-CoT", "arith_ponder_cot") in tasks and ("FR", "arith_ponder") in tasks
    assert {r.model_args for r in runs if r.method == "BoN"} == {"controller=none"}
    assert not [r for r in suite_plan.plan(["FP-Direct"], ["arith"], ["greedy"], -0.2, None)]


def test_plan_sweeps_early_exit_thresholds_only_when_asked():
    assert not [r for r in suite_plan.plan(list(suite_plan.METHODS), ["arith"], ["greedy"], -0.2, "/c")
                if r.method == "EE"]
    runs = suite_plan.plan(["EE"], ["arith", "gsm8k"], ["greedy", "t0.7"], -0.2, None,
                      exit_thresholds=(0.9, 0.99))
    assert len(runs) == 8
    first = runs[0]
    assert first.label == "EE (p>=0.9)" and first.task == "arith_ponder"
    assert first.model_args == "controller=none,early_exit=0.9"
    assert {r.folder(Path("o")).as_posix() for r in runs[:4]} == {
        "o/greedy/EE_p0.9/arith", "o/greedy/EE_p0.9/gsm8k", "o/greedy/EE_p0.99/arith",
        "o/greedy/EE_p0.99/gsm8k"}
    assert runs[4].label == "EE (p>=0.9) [t0.7]"
    narrow = suite_plan.plan(["EE"], ["arith"], ["greedy"], -0.2, None, exit_thresholds=(0.9,),
                        exit_layers="16:30:2")[0]
    assert narrow.label == "EE (p>=0.9, layers 16:30:2)"
    assert narrow.model_args.endswith(",exit_layers=16:30:2")
    assert narrow.folder_name == "EE_p0.9_layers16-30-2"
def test_paper_protocol_samples_every_method_over_three_seeds(tmp_path):
    """``--protocol paper``: T = 0.7 for every one-sample method, seeds 0, 1, 2, each seed in a
    folder of its own; Best-of-N once (its finished T = 0.7 run is one seed)."""
    decoding, seeds = suite_plan.PROTOCOLS["paper"]
    runs = suite_plan.plan(list(suite_plan.METHODS), ["arith"], [decoding], -0.2, "/c", seeds)
    one_sample = [r for r in runs if r.method not in suite_plan.SAMPLES_ALWAYS]
    assert len(one_sample) == 5 * 3 and {r.decoding for r in one_sample} == {"t0.7"}
    assert sorted({r.seed for r in one_sample}) == [0, 1, 2]
    bon = [r for r in runs if r.method in suite_plan.SAMPLES_ALWAYS]
    assert [(r.decoding, r.seed) for r in bon] == [("greedy", 0), ("greedy", 0)]
    dirs = {r.folder(tmp_path) for r in runs}
    assert len(dirs) == len(runs)  # no run's folder holds another's results
    assert tmp_path / "t0.7-seed2" / "Direct" / "arith" in dirs
    assert tmp_path / "t0.7" / "Direct" / "arith" in dirs  # seed 0: the existing layout


def test_unknown_names_are_refused(tmp_path, capsys):
    assert suite.main(["--output", str(tmp_path), "--methods", "Magic"]) == USAGE_ERROR
    assert "lm-eval-ponder error: unknown method" in capsys.readouterr().err


def test_suite_runs_resumes_and_reports(tiny_model_dir, tiny_vector_dir, tmp_path, capsys):
    argv = ["--output", str(tmp_path / "s"), "--pretrained", str(tiny_model_dir),
            "--steering", str(tiny_vector_dir), "--controller", "none", "--tasks", "arith",
            "--methods", "Direct,FR", "--limit", "3", "--max_gen_toks", "4", "--batch_size", "4",
            "--no_chat_template"]
    suite.main(argv)
    report = tmp_path / "s" / "report" / "leaderboard.md"
    assert "FR (alpha=-0.2)" in report.read_text() and "Direct" in report.read_text()
    capsys.readouterr()
    suite.main(argv)
    assert capsys.readouterr().err.count("done, skipped") == 2  # status lines: stderr


def test_suite_runs_the_early_exit_sweep_through_lm_eval(tiny_model_dir, tmp_path):
    """The real CLI takes early_exit=, each threshold is its own run and row, and the samples
    carry the exit layer."""
    from lm_eval_ponder.reporting.compact import read_samples, run_log
    from lm_eval_ponder.reporting.report import load_runs

    out = tmp_path / "s"
    suite.main(["--output", str(out), "--pretrained", str(tiny_model_dir), "--tasks", "arith",
                "--methods", "EE", "--exit_thresholds", "0.01,1", "--limit", "2",
                "--max_gen_toks", "4", "--batch_size", "4", "--no_chat_template",
                "--no_report"])
    runs = {r.label: r for r in load_runs([out])}
    assert set(runs) == {"EE (p>=0.01)", "EE (p>=1)"}  # the tiny model's top-1 never reaches 1
    assert [s["exit_layer"] for s in runs["EE (p>=1)"].samples] == [4.0, 4.0]
    assert all(s["exit_layer"] < 4 for s in runs["EE (p>=0.01)"].samples)
    results = next((out / "greedy" / "EE_p0.01").rglob("results_*.json"))
    data = json.loads(results.read_text())
    assert data["config"]["ponder_fingerprint"]["early_exit"]["threshold"] == 0.01
    assert "exit_layer,none" in data["results"]["arith_ponder"]
    compact = read_samples(run_log(results, "arith_ponder"))
    assert all("exit_layer" in s for s in compact)


def test_launcher_and_extra_model_args_reach_every_run(tmp_path, monkeypatch):
    """On a multi-GPU node each run starts under ``accelerate launch`` (HFLM splits the requests
    over the GPUs) with the user's extra model args; nothing is run here, the commands are
    recorded."""
    import platform

    platform.processor()  # cached now: it runs `uname -p`, which the stand-in Popen below is not
    commands, environments = [], []

    class Record:
        def __init__(self, cmd, env=None, **kwargs):
            commands.append(cmd)
            environments.append(env)

        def wait(self, timeout=None):
            return 1

    monkeypatch.setattr(suite_run.subprocess, "Popen", Record)
    library = tmp_path / "libtcmalloc_minimal.so.4"  # never loaded: nothing is run
    library.write_bytes(b"")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    argv = ["--output", str(tmp_path), "--controller", "none", "--tasks", "arith",
            "--methods", "Direct", "--model_args", "dtype=bfloat16,parallelize=False",
            "--launcher", "accelerate launch --multi_gpu --num_processes 8",
            "--allocator", str(library)]
    assert suite.main(argv) == USAGE_ERROR  # the recorded run "failed": a clear error, exit 2
    assert environments[0]["LD_PRELOAD"] == str(library)
    assert suite.main(argv[:-2]) == USAGE_ERROR  # the default: glibc's malloc (memory)
    assert "LD_PRELOAD" not in environments[1]
    cmd = commands[0]
    # found on PATH, or beside this Python where the environment is not activated (issue 73)
    assert Path(cmd[0]).name == "accelerate"
    assert cmd[1:6] == ["launch", "--multi_gpu", "--num_processes", "8", "-m"]
    assert cmd[cmd.index("--model_args") + 1] == "controller=none,dtype=bfloat16,parallelize=False"


def test_resume_within_keeps_answers_of_an_interrupted_run(tiny_model_dir, tiny_vector_dir,
                                                           tmp_path, capfd):
    """``--resume_within``: a run whose results never got written (killed mid-dataset) is
    re-run, and the answers it had already produced come back from its directory, not the
    model."""
    argv = ["--output", str(tmp_path / "s"), "--pretrained", str(tiny_model_dir),
            "--steering", str(tiny_vector_dir), "--controller", "none", "--tasks", "arith",
            "--methods", "FR", "--limit", "3", "--max_gen_toks", "4", "--batch_size", "4",
            "--no_chat_template", "--resume_within", "--no_report"]
    suite.main(argv)
    target = tmp_path / "s" / "greedy" / "FR" / "arith"
    logs = list(target.rglob("samples_*.jsonl"))
    first = [p.read_text() for p in logs]
    assert list(target.glob("answers*")) and not (tmp_path / "s" / "report").exists()
    assert sorted(p.name for p in target.rglob("samples_*.xz")) == sorted(
        p.name.replace(".jsonl", suffix) for p in logs
        for suffix in (".compact.jsonl.xz", ".answers.jsonl.xz"))  # what a commit keeps
    for p in [*target.rglob("results_*.json"), *target.rglob("samples_*")]:
        p.unlink()  # as if killed before lm-eval wrote its files
    # ... then snapshotted to text for a commit, and the machine (with its store) lost
    assert suite.main(argv + ["--snapshot"]) == 0
    assert "FR (alpha=-0.2) on arith: 3 answers" in capfd.readouterr().out
    (target / "answers_rank0.db").unlink()
    capfd.readouterr()
    suite.main(argv)
    err = "".join(capfd.readouterr())
    assert "3 kept answers restored from answers_rank0.kept.jsonl.gz" in err
    assert "Cached requests: 3, Requests remaining: 0" in err
    assert not list(target.glob("*.kept.jsonl.gz"))  # the finished run's summary replaces it
    assert not (target / suite_plan.ATTEMPTS).exists()  # and its attempts file, which it carries
    again = [p.read_text() for p in target.rglob("samples_*.jsonl")]
    assert [s.split('"resps"')[1][:200] for s in again] == \
        [s.split('"resps"')[1][:200] for s in first]
    # the run says that its wall time is the second attempt's only
    info = json.loads((target / "ponder_run.json").read_text())
    assert info["kept_answers"] == 3
    assert [a["kept_answers"] for a in info["attempts"]] == [0, 3]
    assert all(a["ran_s"] > 0 for a in info["attempts"]) and info["unclocked_attempts"] == 0
    assert info["ran_s_all_attempts"] == round(sum(a["ran_s"] for a in info["attempts"]), 1)


def test_a_killed_attempt_still_says_how_long_it_ran(tmp_path, monkeypatch):
    """The heartbeat stamps ``ran_s`` while lm_eval runs, so an attempt whose suite process is
    killed outright (no ``finally`` runs) has still left its run time on disk: here the child
    reads the file mid-run, after several heartbeats, then exits 137."""
    import sys

    monkeypatch.setattr(suite_run, "HEARTBEAT_S", 0.05)
    attempts = suite_run.record_attempt(tmp_path, 0)
    path, seen = tmp_path / suite_plan.ATTEMPTS, tmp_path / "seen"
    code = ("import json, time; time.sleep(0.5); "
            f"open({str(seen)!r}, 'w').write(str(json.load(open({str(path)!r}))[-1]['ran_s'])); "
            "raise SystemExit(137)")
    assert suite_run.run_clocked([sys.executable, "-c", code], tmp_path, attempts) == 137
    assert 0.3 < float(seen.read_text()) < 5  # stamped while the child ran
    assert json.loads(path.read_text())[-1]["ran_s"] >= float(seen.read_text())
    total, unclocked = suite_plan.attempts_ran_s([{"ran_s": 2.0}, {"started": "x"}, {"ran_s": 1.5}])
    assert (total, unclocked) == (3.5, 1)


def test_an_attempt_says_what_machine_commit_and_threads_it_ran_with(tmp_path, monkeypatch):
    """Issue 65: runs are resumed across sessions and CPUs; each attempt names its machine, the
    checkout's commit and the child's threads, and the report flags a run whose attempts
    mixed machines or commits."""
    from lm_eval_ponder.reporting.report import mixed_attempts

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    first = suite_run.record_attempt(tmp_path, 0)[-1]
    assert first["machine"].startswith("cpu (") and first["threads"] == 1
    assert first["commit"] is None or len(first["commit"]) == 12
    same = {"attempts": [dict(first), dict(first)]}
    assert mixed_attempts(same) == "" and mixed_attempts(None) == ""
    assert mixed_attempts({"attempts": [{"started": "old"}, first]}) == ""
    moved = {"attempts": [first, {**first, "machine": "cpu (B)", "commit": "abc"}]}
    assert mixed_attempts(moved).startswith("resumed across 2 machines (") \
        and "and 2 commits" in mixed_attempts(moved)


def test_plan_says_what_runs_took_and_what_unfinished_ones_kept(tmp_path):
    """``--plan`` on a half-done suite: each done run's time over all its attempts (an
    unclocked one said, not counted), an unfinished run's clocked time, and the sum."""
    out = tmp_path / "s"
    done = out / "greedy" / "Direct" / "arith"
    (done / "m").mkdir(parents=True)
    (done / "m" / "results_1.json").write_text("{}")
    (done / "ponder_run.json").write_text(json.dumps(
        {"wall_s": 100.0, "attempts": [{"started": "a"}, {"started": "b", "ran_s": 100.4}]}))
    half = out / "greedy" / "CoT" / "arith"
    half.mkdir(parents=True)
    (half / suite_plan.ATTEMPTS).write_text(json.dumps([{"ran_s": 50.0}, {"ran_s": 30.0}]))
    runs = suite_plan.plan(["Direct", "CoT"], ["arith"], ["greedy"], -0.2, None)
    text = suite_plan.plan_text(runs, out, None, None)
    assert "Direct on arith: 500 questions, done; ran 100 s (+ 1 unclocked attempt)" in text
    assert "CoT on arith: 500 questions, to run; ran 80 s" in text
    assert "Run time so far: 0.05 h" in text


def test_sigterm_to_the_suite_stops_its_lm_eval_child(tmp_path):
    """A scheduler ends a job with SIGTERM: the suite must not leave lm_eval running on its own
    (it would hold the GPU and write into the run's directory behind the next attempt)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pidfile = tmp_path / "child.pid"
    child = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = ("import sys; from pathlib import Path; from lm_eval_ponder.reporting import suite_run; "
              f"t = Path({str(tmp_path)!r}); a = suite_run.record_attempt(t, 0); "
              f"suite_run.run_clocked([sys.executable, '-c', {child!r}], t, a)")
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.time() + 30
    while not pidfile.is_file() or not pidfile.read_text():
        assert time.time() < deadline, "the child never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    child_pid = int(pidfile.read_text())
    for _ in range(100):  # terminate() has been sent and waited on; the pid is gone or a zombie
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("lm_eval's stand-in outlived the suite")
    assert json.loads((tmp_path / suite_plan.ATTEMPTS).read_text())[-1]["ran_s"] >= 0


def test_snapshot_never_exports_gpqa_answers(tmp_path, capsys):
    """GPQA's authors ask that its questions stay off the web: an unfinished GPQA run's answers
    stay on the machine, whatever else is snapshotted."""
    from sqlitedict import SqliteDict

    from lm_eval_ponder.evaluation.resume import CACHE_MARKER

    for dataset in ("gpqa", "math500", "gsm8k"):
        target = tmp_path / "greedy" / "BoN" / dataset
        target.mkdir(parents=True)
        with SqliteDict(str(target / "answers_rank0.db")) as store:
            store[CACHE_MARKER] = "f" * 8
            if dataset != "gsm8k":  # an unfinished run that has kept nothing yet
                store["lm_eval_ponder/sampled/abc/0"] = "The answer is (B)"
            store.commit()
    runs = suite_plan.plan(["BoN"], ["gpqa", "math500", "gsm8k"], ["greedy"], -0.2, None)
    text = suite_run.snapshot(runs, tmp_path)
    assert "BoN on gsm8k: no answer kept yet" in text
    assert "BoN on gpqa: not exported" in text and "BoN on math500: 1 answer ->" in text
    assert not list((tmp_path / "greedy" / "BoN" / "gpqa").glob("*.gz"))
    assert list((tmp_path / "greedy" / "BoN" / "math500").glob("*.kept.jsonl.gz"))


def test_the_text_twin_is_refreshed_when_the_store_changes(tmp_path):
    """While a run goes on, the suite re-exports its kept answers after each batch lm-eval
    commits, so a session cut off mid-run leaves a current twin to commit."""
    import os

    from sqlitedict import SqliteDict

    from lm_eval_ponder.evaluation.resume import CACHE_MARKER, kept_path, restore_kept

    db = tmp_path / "answers_rank0.db"
    with SqliteDict(str(db)) as store:
        store[CACHE_MARKER] = "f" * 8
        store.commit()
    assert suite_run.refresh_twins(tmp_path) == []  # nothing kept yet: no twin
    with SqliteDict(str(db)) as store:
        store["lm_eval_ponder/sampled/abc/0"] = "42"
        store.commit()
    assert suite_run.refresh_twins(tmp_path) == [kept_path(db)]
    assert suite_run.refresh_twins(tmp_path) == []  # unchanged store: the twin is current
    with SqliteDict(str(db)) as store:
        store["lm_eval_ponder/sampled/abc/1"] = "41"
        store.commit()
    later = kept_path(db).stat().st_mtime - 10
    os.utime(kept_path(db), (later, later))  # the batch landed after the twin was written
    assert suite_run.refresh_twins(tmp_path) == [kept_path(db)]
    db.unlink()
    assert restore_kept(db) == 2


def test_a_failing_heartbeat_task_never_stops_the_run(tmp_path, monkeypatch, caplog):
    import sys

    monkeypatch.setattr(suite_run, "HEARTBEAT_S", 0.05)
    beats = []

    def beat():
        beats.append(1)
        raise OSError("disk full")

    attempts = suite_run.record_attempt(tmp_path, 0)
    code = "import time; time.sleep(0.6)"
    assert suite_run.run_clocked([sys.executable, "-c", code], tmp_path, attempts,
                             on_beat=beat) == 0
    assert len(beats) >= 3  # every heartbeat and the end
    assert caplog.text.count("disk full (the run goes on)") == 1  # said once


def test_runs_in_old_and_new_result_folders_count_as_done(tmp_path):
    """A finished run's results sit in ``qdpv68r5/`` (lm-eval's random name, committed runs)
    or ``SmolLM2-135M-Instruct/`` (named after the backbone since issue 39): both are done."""
    out = tmp_path / "s"
    for method, folder in (("Direct", "qdpv68r5"), ("CoT", "SmolLM2-135M-Instruct")):
        d = out / "greedy" / method / "arith" / folder
        d.mkdir(parents=True)
        (d / "results_1.json").write_text("{}")
    runs = suite_plan.plan(["Direct", "CoT", "BoN"], ["arith"], ["greedy"], -0.2, None)
    text = suite_plan.plan_text(runs, out, None, None)
    assert "3 runs (2 done)" in text and "BoN on arith: 500 questions, to run" in text


def test_what_a_run_records_names_no_directory_of_this_machine(tmp_path, monkeypatch):
    """The shipped controller is found by an absolute path; the run's command (published with
    its results) gets it relative to the working directory. A local backbone is named by its
    folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "controllers" / "x").mkdir(parents=True)
    from lm_eval_ponder.portable import cwd_relative

    assert cwd_relative(str(tmp_path / "controllers" / "x")) == "controllers/x"
    assert cwd_relative("/elsewhere/ctrl") == "/elsewhere/ctrl"  # outside: as given
    assert suite_plan.portable_name(str(tmp_path / "controllers" / "x") + "/") == "x"
    assert suite_plan.portable_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"

"""portable.py, and the committed tree held to it (issue 73 item 10): no record names a
directory of the machine that made it, and no CPU run says it ran on ``cuda:0``."""

from __future__ import annotations

import io
import json
import lzma
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from lm_eval_ponder.portable import (
    backbone_record,
    cwd_relative,
    expand,
    portable_path,
    portable_record,
    portable_text,
)

REPO = Path(__file__).resolve().parents[1]
# where machines keep things: a record naming one of these names a machine
MACHINE = re.compile(r"(?<![\w.~$:/@-])/(?:root|home|Users|work|tmp|mnt|scratch|private)/")


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_EVAL_PONDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path


def test_paths_under_a_root_are_written_as_a_reader_reads_them(roots):
    assert portable_path(str(roots / "cache" / "converted" / "m")) == \
        "$LM_EVAL_PONDER_CACHE/converted/m"
    assert portable_path(str(roots / "work" / "controllers" / "v")) == "controllers/v"
    assert portable_path(str(roots / "home" / "models" / "q")) == "~/models/q"
    assert portable_path("/elsewhere/vec") == "/elsewhere/vec"  # under no root: as given
    assert portable_path("relative/vec") == "relative/vec" and portable_path(None) == "None"
    assert cwd_relative(str(roots / "home" / "x")) == str(roots / "home" / "x")


def test_expand_finds_what_portable_path_wrote(roots):
    for path in (roots / "cache" / "organisms" / "o", roots / "home" / "models" / "q"):
        assert expand(portable_path(str(path))) == str(path)


def test_paths_inside_texts_and_records(roots):
    args = f"pretrained={roots / 'cache' / 'o'},steering={roots / 'work' / 'vec'},alpha=0.2"
    assert portable_text(args) == "pretrained=$LM_EVAL_PONDER_CACHE/o,steering=vec,alpha=0.2"
    kept = "see https://example.org/work/x and a/root/b, 3 tok/s, /elsewhere/y"
    assert portable_text(kept) == kept
    record = {"config": {"model_args": args, "limit": 5.0, "n": [f"{roots}/work/tasks/t.yaml"]}}
    assert portable_record(record) == {"config": {"model_args": portable_text(args),
                                                  "limit": 5.0, "n": ["tasks/t.yaml"]}}


def test_a_backbone_is_recorded_by_name_where_its_weights_have_a_hash(roots):
    local = roots / "home" / "m"
    local.mkdir(parents=True)
    assert backbone_record(str(local), "m", "ab" * 32) == "m"
    assert backbone_record(str(local), "m", None) == "~/m"
    assert backbone_record("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b", None) == "Qwen/Qwen2.5-0.5B"


def records() -> list[tuple[str, bytes]]:
    """Every committed record: tracked files other than code and tests, and every member of
    the study archives."""
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    out = []
    for name in names:
        path = REPO / name
        if name.startswith("tests/") or path.suffix in (".py", ".sh") or not path.is_file():
            continue
        if name.endswith(".tar.xz"):
            with tarfile.open(path, "r:xz") as tar:
                for member in tar.getmembers():
                    if member.isfile():
                        data = tar.extractfile(member).read()
                        inner = member.pax_headers.get("LM_EVAL_PONDER.inner_xz") == "1"
                        member_name = member.name.removesuffix(".xz") if inner else member.name
                        out.append((f"{name}:{member_name}", data))  # stored as text
            continue
        out.append((name, path.read_bytes()))
    return out


def text_of(name: str, data: bytes) -> str | None:
    if name.endswith(".xz"):
        data = lzma.decompress(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def machine_paths(items) -> list[str]:
    found = []
    for name, data in items:
        if MACHINE.search(name.split(":")[-1]) or re.search(r"/__(root|home|work)__", name):
            found.append(f"{name} (its name)")
            continue
        text = text_of(name, data)
        if text is not None and MACHINE.search(text):
            found.append(f"{name}: {MACHINE.search(text).group()}...")
    return found


def cuda_on_a_cpu(items) -> list[str]:
    found = []
    for name, data in items:
        if not re.search(r"results_[^/]*\.json$", name):
            continue
        config = json.loads(data).get("config") or {}
        ran_on = str((config.get("ponder_device") or {}).get("device", "cpu"))
        if str(config.get("device", "")).startswith("cuda") and not ran_on.startswith("cuda"):
            found.append(name)
    return found


def test_the_checks_find_what_they_look_for():
    """Planted negatives: a path of this machine, a folder lm-eval named after one, a CPU run
    that says cuda:0."""
    run = {"config": {"device": "cuda:0", "ponder_device": {"device": "cpu"}}}
    gpu = {"config": {"device": "cuda:0", "ponder_device": {"device": "cuda:0"}}}
    blob = io.BytesIO()
    with lzma.open(blob, "wb") as xz:
        xz.write(b'{"model_args": "pretrained=/home/u/m"}\n')
    items = [("a/card.md", b"Backbone: `/root/.cache/x`"), ("b/c.jsonl.xz", blob.getvalue()),
             ("r.tar.xz:s/__root__.cache__m/results_1.json", b"{}"),
             ("ok.md", b"https://example.org/work/x, ~/m, $LM_EVAL_PONDER_CACHE/m")]
    assert [f.split(":")[0] for f in machine_paths(items)] == ["a/card.md", "b/c.jsonl.xz", "r.tar.xz"]
    assert cuda_on_a_cpu([("x/results_1.json", json.dumps(run).encode()),
                          ("y/results_1.json", json.dumps(gpu).encode())]) == ["x/results_1.json"]


def test_no_record_names_a_machine_or_a_device_it_did_not_run_on():
    items = records()
    assert len(items) > 500  # the archives were read
    assert machine_paths(items) == []
    assert cuda_on_a_cpu(items) == []

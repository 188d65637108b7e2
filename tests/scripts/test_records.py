"""A study's records as one archive (``studies/studylib/records.py``): packed deterministically, read
after an unpack that happens once, new runs added by name, GPQA's answer texts never."""

from __future__ import annotations

import json
import lzma
import tarfile
from pathlib import Path

import pytest
from conftest import REPO
from studylib import records as archive  # studies/ is on the path (conftest)

from lm_eval_ponder.errors import PonderError


def study(root: Path) -> Path:
    folder = root / "results" / "study"
    run = folder / "greedy" / "Direct" / "arith"
    (run / "model").mkdir(parents=True)
    (run / "ponder_run.json").write_text('{"method": "Direct"}')
    (run / "model" / "results_1.json").write_text('{"results": {}}')
    (run / "model" / "samples_arith_1.compact.jsonl.xz").write_bytes(
        lzma.compress(b'{"doc_id": 0, "exact_match": 1.0}\n'))
    (run / "model" / "samples_arith_1.jsonl").write_text("the answers as text")  # not kept
    return folder


def test_pack_keeps_what_a_report_reads_and_unpacks_it_once(tmp_path):
    folder = study(tmp_path)
    target = archive.pack(folder)
    assert target == tmp_path / "results" / "study.tar.xz"
    with tarfile.open(target) as tar:
        names = sorted(tar.getnames())
        assert all(m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in tar.getmembers())
    assert names == ["greedy/Direct/arith/model/results_1.json",
                     "greedy/Direct/arith/model/samples_arith_1.compact.jsonl.xz",
                     "greedy/Direct/arith/ponder_run.json"]
    assert not archive.unpack(folder)  # pack stamped the folder: already unpacked
    fresh = tmp_path / "clone" / "results"
    fresh.mkdir(parents=True)
    (fresh / "study.tar.xz").write_bytes(target.read_bytes())
    inside = fresh / "study" / "greedy" / "Direct" / "arith"
    assert archive.ensure(inside)  # a path inside the study unpacks the whole study
    assert (inside / "ponder_run.json").read_text() == '{"method": "Direct"}'
    assert not archive.ensure(inside)
    assert not (inside / "model" / "samples_arith_1.jsonl").exists()


def test_packing_an_unchanged_folder_rewrites_the_same_bytes(tmp_path):
    folder = study(tmp_path)
    first = archive.pack(folder).read_bytes()
    (folder / archive.STAMP).unlink()  # even without the stamp: the same files, the same bytes
    assert archive.pack(folder).read_bytes() == first


def test_a_held_file_stays_and_a_new_run_joins_by_name(tmp_path):
    folder = study(tmp_path)
    quoted = folder / "greedy" / "Direct" / "arith" / "model" / "samples_arith_1.answers.jsonl.xz"
    quoted.write_bytes(b"answers")
    archive.pack(folder)
    stamp = json.loads((folder / archive.STAMP).read_text())
    assert "greedy/Direct/arith/model/samples_arith_1.answers.jsonl.xz" not in stamp["members"]
    archive.write_stamp(folder, "", [*stamp["members"],  # a page quotes it: held by name
                                     "greedy/Direct/arith/model/samples_arith_1.answers.jsonl.xz"])
    new = folder / "t0.7" / "CoT" / "arith"
    new.mkdir(parents=True)
    (new / "ponder_run.json").write_text("{}")
    members = [m.as_posix() for m in archive.members_to_pack(folder)]
    assert "greedy/Direct/arith/model/samples_arith_1.answers.jsonl.xz" in members
    assert "t0.7/CoT/arith/ponder_run.json" in members


def test_gpqa_answer_texts_are_never_packed(tmp_path):
    folder = study(tmp_path)
    gpqa = folder / "greedy" / "CoT" / "gpqa"
    gpqa.mkdir(parents=True)
    (gpqa / "answers_rank0.kept.jsonl.gz").write_bytes(b"texts")
    (gpqa / "ponder_run.json").write_text("{}")
    archive.write_stamp(folder, "", ["greedy/CoT/gpqa/answers_rank0.kept.jsonl.gz"])
    members = [m.as_posix() for m in archive.members_to_pack(folder)]
    assert "greedy/CoT/gpqa/ponder_run.json" in members
    assert "greedy/CoT/gpqa/answers_rank0.kept.jsonl.gz" not in members  # held or not


def test_a_changed_archive_is_unpacked_again(tmp_path):
    folder = study(tmp_path)
    archive.pack(folder)
    (folder / "greedy" / "Direct" / "arith" / "ponder_run.json").write_text('{"method": "FR"}')
    saved = archive.archive_of(folder).read_bytes()
    archive.pack(folder)  # the new record, packed
    archive.archive_of(folder).write_bytes(saved)  # a checkout of the older archive
    assert archive.ensure(folder)
    assert "Direct" in (folder / "greedy" / "Direct" / "arith" / "ponder_run.json").read_text()


def test_a_cut_archive_is_one_line(tmp_path):
    folder = study(tmp_path)
    target = archive.pack(folder)
    target.write_bytes(target.read_bytes()[:100])
    (folder / archive.STAMP).unlink()
    with pytest.raises(PonderError, match="cannot be unpacked.*git checkout"):
        archive.unpack(folder)


def test_the_committed_archives_hold_no_gpqa_text_and_unpack_as_stamped():
    archives = archive.all_archives(REPO / "results")
    assert {a.name[:-len(archive.SUFFIX)] for a in archives} == set(archive.STUDIES)
    for target in archives:
        with tarfile.open(target) as tar:
            names = [Path(n) for n in tar.getnames()]
        assert not [n for n in names if archive.never(n)], target
        folder = target.with_name(target.name[:-len(archive.SUFFIX)])
        assert not archive.unpack(folder)  # the session's unpack (conftest) is current
        assert all((folder / n).is_file() for n in names)


def test_a_compact_log_is_stored_as_text_and_unpacked_as_it_was(tmp_path):
    """xz compresses across the archive's members only if they are not compressed already:
    a ``*.jsonl.xz`` is stored decompressed (marked), and unpacked compressed again, the same
    text under the same name; near-identical logs then cost little more than one."""
    folder = study(tmp_path)
    log = next(folder.rglob("*.compact.jsonl.xz"))
    rows = "".join(json.dumps({"doc_id": i, "exact_match": float(i % 3 == 0), "gen_tokens": 8})
                   + "\n" for i in range(2000))
    log.write_bytes(lzma.compress(rows.encode()))
    twin = log.with_name("samples_arith_2.compact.jsonl.xz")
    twin.write_bytes(lzma.compress(rows.replace('"gen_tokens": 8', '"gen_tokens": 9').encode()))
    target = archive.pack(folder)
    with tarfile.open(target) as tar:
        member = tar.getmember(log.relative_to(folder).as_posix())
        assert member.pax_headers.get(archive.INNER_XZ) == "1"
        assert tar.extractfile(member).read().decode() == rows
    assert target.stat().st_size < log.stat().st_size + twin.stat().st_size
    fresh = tmp_path / "clone" / "results"
    fresh.mkdir(parents=True)
    (fresh / "study.tar.xz").write_bytes(target.read_bytes())
    assert archive.unpack(fresh / "study")
    for path in (log, twin):
        copy = fresh / "study" / path.relative_to(folder)
        assert lzma.decompress(copy.read_bytes()) == lzma.decompress(path.read_bytes())

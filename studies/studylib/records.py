"""A study's records as one archive in git, unpacked beside it to be read: the repository's
storage, not the installed package's (``python scripts/records.py unpack|pack``; the studies
import it as ``studylib.records``, the tests too).

Every tracked file travels to a GPU machine in one transfer, and the tree must stay under
15 MiB as the disk counts it (4 KiB blocks, docs/design/repository.md). A study of a hundred
runs keeps three small files per run (marker, results JSON, compact log): 1,100 files were 2.9
MiB of block padding and the near-identical results JSONs compress tenfold together. So each
study folder of ``STUDIES`` is committed as ``results/<study>.tar.xz`` and read from
``results/<study>/`` (git-ignored), which ``ensure`` unpacks on first use: the studies and the
benchmarks call it, and the shell scripts (``scripts/rebuild_reports.sh``, the studies') call
``python scripts/records.py unpack`` before they run ``report`` or ``suite`` on a study.

A study that adds runs writes into the unpacked folder, then ``python scripts/records.py pack
results/<study>`` rewrites the archive: the files it held that still exist, and the new files
that ``KEEP`` names (what a report or a resume reads; never a text log, never a GPQA answer).
The archive is deterministic (sorted members, no times or owners), so packing an unchanged
folder rewrites it byte for byte and git sees no change.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import lzma
import tarfile
from pathlib import Path

from lm_eval_ponder.errors import PonderError, command, program_name, run_program
from lm_eval_ponder.files import (
    XZ_PRESET,
    atomic_write,
    atomic_write_text,
    atomic_write_xz,
    file_sha256,
)

SUFFIX = ".tar.xz"
STAMP = ".archive.json"  # in the unpacked folder: the archive it came from and its members
# A member that is xz on disk (``*.jsonl.xz``: compact logs, packed outcomes) is stored
# decompressed, under this PAX header, so that the archive's xz compresses across runs whose
# rows are nearly the same: the organism's records took 497 KiB instead of 1,184, the T = 0.7
# test-set sweep 445 instead of 1,160 (2026-12-04). Unpacking compresses it again as
# ``files.atomic_write_xz`` writes it: the same text, the name it had.
INNER_XZ = "LM_EVAL_PONDER.inner_xz"

# The study folders kept as archives (results/<name>.tar.xz).
STUDIES = ("suite", "suite-paper-form", "testset-bf16", "testset-t0.7", "organism",
           "answer-truncation", "selection-train", "early-exit-train")

# File names a new run adds to its study's archive: what `report`, the studies' analyses and
# the suite's resume read (the compact logs carry no benchmark text, reporting/compact.py).
KEEP = ("ponder_run.json", "ponder_attempts.json", "results_*.json", "samples_*.compact.jsonl.xz",
        "answers_rank*.kept.jsonl.gz", "accept.json", "card.md", "config.json", "train_log.jsonl",
        "steering.json", "steering.safetensors", "manifest.json", "*.outcomes.json.xz",
        "layer_sweep.json", "layer_sweep.md", "alpha.json", "verdict.json", "objective.json",
        "units-*.json")
# Answer texts: never kept of GPQA, whatever KEEP says (its questions may not be in the
# repository in plain text, and answers can quote them); its compact logs hold no text.
TEXTS = ("answers_rank*.kept.jsonl.gz", "samples_*.answers.jsonl.xz")
NO_TEXTS_OF = "gpqa"


def archive_of(folder: str | Path) -> Path:
    folder = Path(folder)
    return folder.with_name(folder.name + SUFFIX)


def archived_folder(path: str | Path) -> Path | None:
    """The study folder that holds ``path`` (itself or an ancestor) and has an archive
    beside it; None when no ancestor has one."""
    path = Path(path).absolute()
    for folder in (path, *path.parents):
        if folder.name and archive_of(folder).is_file():
            return folder
    return None


def read_stamp(folder: Path) -> dict:
    try:
        return json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return {}


# archives found unpacked in this process, by their (size, mtime): a changed file is checked again
CURRENT: dict[Path, tuple[int, int]] = {}


def stat_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def unpack(folder: str | Path) -> bool:
    """Unpack ``<folder>.tar.xz`` into ``folder`` unless it holds that archive already; files
    the folder has beyond the archive's (a study's new runs) are left alone. True when it
    unpacked."""
    folder = Path(folder)
    archive = archive_of(folder)
    if CURRENT.get(archive.absolute()) == stat_key(archive):
        return False  # checked in this process already: a report reads hundreds of paths
    digest = file_sha256(archive)
    if read_stamp(folder).get("sha256") == digest:
        CURRENT[archive.absolute()] = stat_key(archive)
        return False
    try:
        with tarfile.open(archive, "r:xz") as tar:
            members = tar.getmembers()
            folder.mkdir(parents=True, exist_ok=True)
            inner = [m for m in members if m.pax_headers.get(INNER_XZ) == "1"]
            tar.extractall(folder, members=[m for m in members if m not in inner], filter="data")
            for member in inner:
                safe = tarfile.data_filter(member, str(folder))  # refuses a path out of it
                target = folder / safe.name
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_xz(target, tar.extractfile(member).read().decode())
    except (tarfile.TarError, lzma.LZMAError, EOFError) as error:
        raise PonderError(f"{archive}: cannot be unpacked ({error}); a cut-off copy? restore "
                          "it (git checkout)") from error
    except OSError as error:
        raise PonderError(f"cannot unpack {archive} into {folder}: {error}") from error
    write_stamp(folder, digest, sorted(m.name for m in members if m.isfile()))
    CURRENT[archive.absolute()] = stat_key(archive)
    return True


def write_stamp(folder: Path, digest: str, members: list[str]) -> None:
    atomic_write_text(folder / STAMP, json.dumps({"sha256": digest, "members": members}) + "\n")


def ensure(path: str | Path) -> bool:
    """Make the records under ``path`` readable: unpack the archive of the study folder that
    holds it, if any (a no-op once unpacked). True when it unpacked."""
    folder = archived_folder(path)
    return unpack(folder) if folder is not None else False


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def never(relative: Path) -> bool:
    return NO_TEXTS_OF in relative.parts and matches(relative.name, TEXTS)


def members_to_pack(folder: Path) -> list[Path]:
    """The archive's members that still exist, and the new files ``KEEP`` names."""
    held = {Path(m) for m in read_stamp(folder).get("members", [])}
    found = {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()
             and p.name != STAMP}
    return sorted((p for p in found if (p in held or matches(p.name, KEEP)) and not never(p)),
                  key=Path.as_posix)


def pack(folder: str | Path) -> Path:
    """Write ``<folder>.tar.xz`` from the folder (deterministically) and stamp the folder with
    it, so it counts as unpacked."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PonderError(f"no such folder to pack: {folder}")
    members = members_to_pack(folder)
    if not members:
        raise PonderError(f"nothing to pack under {folder}: no file the archive held or that "
                          f"KEEP names ({', '.join(KEEP[:4])}, ...)")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative in members:
            data = (folder / relative).read_bytes()
            info = tarfile.TarInfo(relative.as_posix())
            if relative.name.endswith(".jsonl.xz"):
                data, info.pax_headers = lzma.decompress(data), {INNER_XZ: "1"}
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(raw.getvalue(), preset=XZ_PRESET)
    archive = archive_of(folder)
    atomic_write(archive, lambda tmp: Path(tmp).write_bytes(blob))
    write_stamp(folder, hashlib.sha256(blob).hexdigest(), [m.as_posix() for m in members])
    return archive


def all_archives(root: Path) -> list[Path]:
    return sorted(root.glob("*" + SUFFIX))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=program_name("python scripts/records.py"),
        description="The studies' records: unpack the committed archives (results/*.tar.xz) "
                    "to read them, pack a study folder after adding runs.")
    sub = p.add_subparsers(dest="action", required=True)
    u = sub.add_parser("unpack", help="unpack archives (all under results/ by default)")
    u.add_argument("paths", nargs="*", help="study folders or paths inside them")
    u.add_argument("--root", default="results", help="where the archives are (default results)")
    k = sub.add_parser("pack", help="rewrite a study folder's archive")
    k.add_argument("folders", nargs="+")
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.action == "pack":
        for folder in args.folders:
            archive = pack(folder)
            print(f"{archive}: {len(read_stamp(Path(folder))['members'])} files, "
                  f"{archive.stat().st_size / 1024:.0f} KiB")
        return 0
    folders = ([archived_folder(p) for p in args.paths] if args.paths else
               [a.with_name(a.name[:-len(SUFFIX)]) for a in all_archives(Path(args.root))])
    for path, folder in zip(args.paths or folders, folders):
        if folder is None:  # a study writing its first runs somewhere new
            print(f"{path}: no study archive (<folder>{SUFFIX}) holds it; nothing to unpack")
        elif unpack(folder):
            print(f"unpacked {archive_of(folder)} into {folder}")
    return 0


if __name__ == "__main__":
    run_program(main)

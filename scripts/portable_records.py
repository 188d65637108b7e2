"""Rewrite committed records so that they name no directory of the machine that made them, and
no CPU run says it ran on ``cuda:0`` (issue 73 item 10). Idempotent: a second run changes
nothing. What it changes, in every text file under the given folders and in every member of the
study archives (``results/*.tar.xz``):

- absolute paths under this machine's roots, as the package now writes them
  (``lm_eval_ponder.portable``): ``$LM_EVAL_PONDER_CACHE/...``, ``~/...``, or relative to the
  repository; paths of other checkouts of this repository (``/work/<checkout>/...``, the
  sessions' worktrees) relative to it too;
- lm-eval's ``config.device`` of ``cuda:0`` where the run recorded it ran on a CPU
  (``ponder_device``) or recorded nothing (every committed run before ``ponder_device`` was
  made on a CPU: the GPU sessions' records are in ``results/gpu/`` and are not lm-eval runs);
- result folders lm-eval named after a local path (``__root__.cache__..._<name>``): renamed
  ``<name>-<first 12 hex of the weights' SHA-256>``, as the package now names them.

Usage: python scripts/portable_records.py [--archives] [FOLDER ...]
(run from the repository's root; no folder: results docs controllers)
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))
from studylib import records as archive  # noqa: E402

from lm_eval_ponder.portable import portable_text

TEXT = {".json", ".md", ".csv", ".html", ".jsonl", ".txt", ".yaml", ".xz"}
CHECKOUT = re.compile(r"(?<![\w.~$:/@-])/work/[\w.-]+/")
CUDA = re.compile(r'("device": ?)"cuda:0"')
# lm-eval's name for a local path: its "/" as "__" (``__root__.cache__lm_eval_ponder__organisms__X``);
# a first pass of this script kept all but the machine's part (``lm_eval_ponder__organisms__X``)
PATH_NAMED = re.compile(r"^(?:__(?:root|home|work|tmp)__|lm_eval_ponder__)\S*__(?P<name>[^_][^/]*)$")


def rewrite_text(text: str, results_json: bool) -> str:
    text = portable_text(CHECKOUT.sub("", text))
    if results_json:
        config = json.loads(text).get("config") or {}
        ran_on = str((config.get("ponder_device") or {}).get("device", "cpu"))
        if not ran_on.startswith("cuda"):
            text = CUDA.sub(r'\1"cpu"', text)
    return text


def rewrite_file(path: Path) -> bool:
    """Rewrite one file in place; True when it changed."""
    if path.suffix not in TEXT:
        return False
    raw = path.read_bytes()
    xz = path.suffix == ".xz"
    if xz:
        if not path.name.endswith((".jsonl.xz", ".json.xz")):
            return False
        raw = lzma.decompress(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    new = rewrite_text(text, path.name.startswith("results_") and path.suffix == ".json")
    if new == text:
        return False
    data = new.encode("utf-8")
    path.write_bytes(lzma.compress(data, preset=archive.XZ_PRESET) if xz else data)
    return True


def weights_sha(folder: Path) -> str | None:
    for results in folder.glob("results_*.json"):
        config = json.loads(results.read_text()).get("config") or {}
        sha = (config.get("ponder_fingerprint") or {}).get("backbone_sha256")
        if sha:
            return sha
    return None


def rename_folders(root: Path) -> dict[str, str]:
    """Path-named result folders renamed; old -> new relative names of the files moved."""
    moved: dict[str, str] = {}
    for folder in sorted((p for p in root.rglob("*__*") if PATH_NAMED.match(p.name)),
                         key=lambda p: -len(p.parts)):
        m = PATH_NAMED.match(folder.name)
        if not folder.is_dir() or not m:
            continue
        sha = weights_sha(folder)
        name = m.group("name")
        name += f"-{sha[:12]}" if sha and not name.endswith(sha[:12]) else ""
        target = folder.with_name(name)
        if target.exists():
            sys.exit(f"portable_records.py: {target} exists; cannot rename {folder}")
        for file in folder.rglob("*"):
            if file.is_file():
                moved[file.relative_to(root).as_posix()] = \
                    (target / file.relative_to(folder)).relative_to(root).as_posix()
        folder.rename(target)
    return moved


def rewrite_tree(root: Path) -> int:
    changed = len(rename_folders(root))
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != archive.STAMP:
            changed += rewrite_file(path)
    return changed


def rewrite_archive(path: Path) -> bool:
    """Unpack a study archive into a scratch folder, rewrite it, pack it again; True when its
    bytes changed. The unpacked study folder beside it is removed (it is unpacked anew)."""
    before = path.read_bytes()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / path.name[:-len(archive.SUFFIX)]
        shutil.copy(path, folder.with_name(path.name))
        archive.unpack(folder)
        members = archive.read_stamp(folder)["members"]
        moved = rename_folders(folder)
        rewrite_tree(folder)
        archive.write_stamp(folder, "", sorted(moved.get(m, m) for m in members))
        archive.pack(folder)
        after = folder.with_name(path.name).read_bytes()
    if after == before:
        return False
    path.write_bytes(after)
    shutil.rmtree(path.with_name(path.name[:-len(archive.SUFFIX)]), ignore_errors=True)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", default=["results", "docs", "controllers"])
    parser.add_argument("--archives", action="store_true",
                        help="also rewrite results/*.tar.xz (their unpacked folders go)")
    args = parser.parse_args()
    tracked = set(subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                                 check=True).stdout.split())
    for folder in args.folders:
        root = Path(folder)
        if archive.archived_folder(root) == root:
            continue  # an unpacked study: its archive is the record
        n = 0
        for path in sorted(root.rglob("*")):
            if path.is_file() and (path.as_posix() in tracked or not tracked):
                n += rewrite_file(path)
        print(f"{folder}: {n} files rewritten")
    if args.archives:
        for path in archive.all_archives(Path("results")):
            print(f"{path}: {'rewritten' if rewrite_archive(path) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

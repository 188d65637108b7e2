"""Atomic file writes, shared by every artefact the package writes (vectors, controllers,
checkpoints, the rollout cache): a crash leaves the old file or the new one, never half."""

from __future__ import annotations

import contextlib
import gzip
import json
import lzma
import math
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from lm_eval_ponder.errors import PonderError


def atomic_write(target: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``target``, then rename it over."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; artefacts are meant to be shared
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    atomic_write(target, lambda tmp: Path(tmp).write_text(text))


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file, read in chunks (weights files are hundreds of MB)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line and fsync it: a log line written is a log line kept, even if the
    process is killed right after (resumed runs trim what follows their checkpoint)."""
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------- output folders
def check_output(path: str | os.PathLike, flag: str = "--output",
                 folder: str | os.PathLike | None = None) -> Path:
    """Refuse, before any work, an output folder that cannot be written: ``path`` an existing
    file, a parent of it a file, or the folder it would be made in not writable (a read-only
    folder or file system). Checked by making, then removing, a probe file where the first
    missing part would go (permission bits do not say what root may do, nor what a read-only
    mount refuses); nothing is left behind. A file, never a folder, and unnamed where the
    system allows (``O_TMPFILE``): two suites started side by side walk the same tree
    (``compact_tree``), and a probe folder removed between listing and entering it made the
    other's walk fail. ``folder``: the folder ``path`` stands for, when it
    is not ``path`` itself (lm-eval's ``--output_path x.json`` writes beside it). Returns
    ``path``."""
    path = Path(path).expanduser()
    existing = Path(folder).expanduser() if folder is not None else path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == path else f"is inside {existing}, which is a file"
        raise PonderError(f"{flag} {path} {where}, not a folder: pass a folder path")
    try:
        with tempfile.TemporaryFile(prefix=".lm-eval-ponder-probe-", dir=existing):
            pass
    except OSError as error:
        raise PonderError(f"{flag} {path}: cannot write in {existing} ({error.strerror}): pass "
                          "a folder you can write to") from None
    return path


@contextlib.contextmanager
def output_folder(path: str | os.PathLike) -> Iterator[Path]:
    """A command's output folder, made (with its missing parents) for the block; if the block
    fails and the folders it made hold no file, they are removed again, so a command that ends
    in an error leaves no empty output folder behind. What it wrote is kept (a rollout cache
    a resumed run continues), and a folder that existed before is never removed."""
    path = Path(path)
    made = path
    while not made.parent.exists() and made.parent != made:
        made = made.parent
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        if created:  # the empty folders under ``made``, deepest first, then ``made`` if empty
            for folder, _, _ in sorted(os.walk(made), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):  # not empty: kept
                    os.rmdir(folder)
        raise


# ----------------------------------------------------------------------------- locks
class LockHeld(PonderError):
    """Another live process holds the lock; ``holder`` is what it wrote into the lock file."""

    def __init__(self, path: Path, holder: dict) -> None:
        super().__init__(f"{path} is held by process {holder.get('pid', '?')}")
        self.path, self.holder = path, holder


class HeldLock:
    """An exclusive lock this process holds on ``path`` (``acquire_lock``). ``previous``: what
    a holder that died without releasing it had written (None when there was none)."""

    def __init__(self, path: Path, fd: int, previous: dict | None) -> None:
        self.path, self.fd, self.previous = path, fd, previous

    def release(self) -> None:
        """Delete the lock file, then let go of it (in this order: a process that opens the
        path afterwards creates a new file, and ``acquire_lock`` checks for that)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = -1


def acquire_lock(path: str | os.PathLike, holder: dict) -> HeldLock:
    """Take an exclusive lock on ``path`` (created if missing) and write ``holder`` (JSON: who
    holds it) into it, or raise ``LockHeld`` with what the live holder wrote.

    ``fcntl.flock``: the kernel releases the lock when its process ends, killed or not, so a
    lock left by a dead process is simply taken over (its file, with the dead holder's
    description, is ``HeldLock.previous``); no pid is probed, so a reused pid cannot keep a lock
    alive. A file system without ``flock`` raises ``OSError``."""
    import fcntl

    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = lock_holder(fd)
            os.close(fd)
            raise LockHeld(path, info or {}) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # released and deleted between our open and our flock: try the new file
            os.close(fd)
            continue
        previous = lock_holder(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(holder, sort_keys=True).encode())
        os.fsync(fd)
        return HeldLock(path, fd, previous)


def lock_holder(fd: int) -> dict | None:
    """What a lock file says of its holder: None when it is empty (or ``null``), ``{}`` when it
    holds no JSON object (the holder is between opening and writing it)."""
    text = os.read(fd, 1 << 16).decode(errors="replace")
    if not text.strip():
        return None
    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return info if isinstance(info, dict) or info is None else {}


# ----------------------------------------------------------------------------- compact files
# What the repository keeps of results is stored compressed (the tracked tree travels
# to a GPU machine in one transfer). xz: the best ratio of the standard library (20-30% below
# gzip on our logs); preset 6 with its "extreme" flag is as small as preset 9 on files of a few
# MB and needs a tenth of the memory.
XZ_PRESET = 6 | lzma.PRESET_EXTREME


def atomic_write_xz(target: str | os.PathLike, text: str) -> None:
    """``text`` xz-compressed into ``target``, atomically (readers never see half a file)."""
    atomic_write(target, lambda tmp: Path(tmp).write_bytes(
        lzma.compress(text.encode(), preset=XZ_PRESET)))


def read_text(path: str | os.PathLike) -> str:
    """A text file as written: plain, or compressed by its suffix (``.xz``, ``.gz``)."""
    path = Path(path)
    try:
        if path.suffix == ".xz":
            return lzma.decompress(path.read_bytes()).decode()
        if path.suffix == ".gz":
            return gzip.decompress(path.read_bytes()).decode()
        return path.read_text()
    except (lzma.LZMAError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as error:
        raise PonderError(f"{path}: cannot be read ({error}); a cut-off copy? restore it "
                          "(git checkout) or rebuild it") from error


def write_jsonl_xz(target: str | os.PathLike, records: Iterable[dict]) -> None:
    """Records as xz-compressed JSON lines, atomically."""
    atomic_write_xz(target, "".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines file, plain or compressed; a line that is not JSON is a
    ``PonderError`` naming the file and line."""
    out = []
    for n, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise PonderError(f"{path}, line {n}: not JSON ({error}); the file was cut off? "
                              "rebuild it") from error
    return out


def read_json(path: str | os.PathLike) -> object:
    """A JSON file's content; one that is cut off or not JSON is a ``PonderError`` naming the
    file (in a tree of hundreds of runs, the bare ``JSONDecodeError`` names none)."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise PonderError(f"{path}: not JSON ({error}); the file was cut off? restore it (git "
                          "checkout) or re-run what wrote it") from error


def short_float32(values: list) -> list | None:
    """Float32 numbers (a float32 tensor's ``tolist()``) as the shortest decimals that read
    back to the same float32 (6.8770294 for 6.8770294189453125): half the digits in JSON, and
    ``exact_float32`` restores every value bit for bit. None when any value is not a float32
    (the caller then stores them as they are)."""
    import numpy as np

    out = []
    for x in values:
        if x is None or (isinstance(x, float) and not math.isfinite(x)):
            out.append(x)
            continue
        if not isinstance(x, (int, float)) or float(np.float32(x)) != x:
            return None
        short = float(str(np.float32(x)))
        out.append(short if float(np.float32(short)) == x else float(x))
    return out


def exact_float32(values: list) -> list:
    """The float32 values ``short_float32`` wrote, as the float64 numbers they were."""
    import numpy as np

    return [x if x is None else float(np.float32(x)) for x in values]

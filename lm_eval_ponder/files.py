"""Atomic file writes, shared by every artefact the package writes (vectors, controllers,
checkpoints, the rollout cache): a crash leaves the old file or the new one, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


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
        try:
            os.unlink(tmp)
        except OSError:
            pass
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
    import json

    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())

"""The tracked tree travels to a GPU machine in one transfer of at most 64 MiB, and is kept
under 15 MiB as the disk counts it (issue 35; docs/design/repository.md): each file takes
whole 4 KiB blocks, so a thousand small records weigh 4 MiB however few bytes they hold
(``du -k``, as the project's before-stop check counts). This test fails once the tracked
files pass 15 MiB in blocks, naming the largest."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO

LIMIT = 15 * 1024 * 1024  # bytes on disk, whole blocks
BLOCK = 4096


def tracked_sizes() -> dict[str, int]:
    """Path -> size in bytes of every file git tracks that is in the working tree."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pytest.skip("not a git checkout (or no git): nothing tracked to measure")
    paths = [p for p in out.decode().split("\0") if p]
    if not paths:
        pytest.skip("not a git checkout: nothing tracked to measure")
    return {p: (REPO / p).stat().st_size for p in paths
            if (REPO / p).is_file() and not (REPO / p).is_symlink()}


def test_the_tracked_tree_stays_small():
    sizes = tracked_sizes()
    total = sum(-(-size // BLOCK) * BLOCK for size in sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:10]
    assert total <= LIMIT, (
        f"the tracked tree is {total / 2**20:.1f} MiB in {BLOCK // 1024} KiB blocks, over "
        f"{LIMIT / 2**20:.0f} MiB ({len(sizes)} files; docs/design/repository.md: pack a "
        "study's records, python scripts/records.py pack); largest files:\n" +
        "\n".join(f"  {size / 2**20:6.2f} MiB  {path}" for path, size in largest))

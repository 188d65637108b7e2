"""Preloading a caching allocator for long CPU generations (lm_eval_ponder.allocator)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from lm_eval_ponder import allocator
from lm_eval_ponder.errors import PonderError


def test_finds_an_installed_tcmalloc_and_nothing_where_there_is_none(tmp_path):
    assert allocator.find_allocator((str(tmp_path),)) is None
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    assert allocator.find_allocator((str(tmp_path / "missing"), str(tmp_path))) == \
        str(tmp_path / "libtcmalloc.so.4")
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")  # the minimal build comes first
    assert allocator.find_allocator((str(tmp_path),)).endswith("libtcmalloc_minimal.so.4")


def test_choices_resolve_and_a_bad_path_is_a_clear_error(tmp_path):
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    assert allocator.resolve("system") is None
    assert allocator.resolve(str(lib)) == str(lib)
    assert allocator.resolve("auto", cuda=True) is None  # GPU runs keep the system malloc
    assert allocator.resolve("auto", cuda=False) == allocator.find_allocator()
    with pytest.raises(PonderError, match="no such file"):
        allocator.resolve(str(tmp_path / "nope.so"))


def test_the_child_environment_adds_the_library_once_after_the_users_own():
    env = allocator.child_environment("/x/libtcmalloc_minimal.so.4", {"LD_PRELOAD": "/a/libfoo.so"})
    assert env["LD_PRELOAD"] == "/a/libfoo.so /x/libtcmalloc_minimal.so.4"
    assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40
    already = {"LD_PRELOAD": "/y/libjemalloc.so.2"}
    assert allocator.child_environment("/x/libtcmalloc_minimal.so.4", already) == already
    assert allocator.child_environment(None, {"PATH": "/bin"}) == {"PATH": "/bin"}


@pytest.mark.skipif(allocator.find_allocator() is None, reason="no tcmalloc installed")
def test_a_child_started_with_it_runs_on_tcmalloc():
    env = allocator.child_environment(allocator.find_allocator(), {"PATH": "/usr/bin:/bin"})
    maps = subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"],
                          env=env, capture_output=True, text=True, check=True).stdout
    assert "tcmalloc" in maps


def test_glibc_large_sets_glibcs_tunables_and_leaves_the_users_own():
    assert allocator.resolve("glibc-large") == allocator.GLIBC_LARGE
    env = allocator.child_environment(allocator.GLIBC_LARGE, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "MALLOC_MMAP_THRESHOLD_": str(4 << 30),
                   "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
    mine = {"MALLOC_TRIM_THRESHOLD_": "1000"}
    assert allocator.child_environment(allocator.GLIBC_LARGE, mine)["MALLOC_TRIM_THRESHOLD_"] \
        == "1000"
    assert "LD_PRELOAD" not in env
    assert allocator.malloc_settings(env) == allocator.GLIBC_LARGE_SETTINGS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's tunables")
def test_a_child_under_glibc_large_keeps_a_freed_large_block():
    """The setting reaches glibc: a 64 MB block freed and allocated again is not mapped afresh
    (few page faults the second time), where the system default maps it again."""
    code = ("import resource, ctypes; libc = ctypes.CDLL(None); libc.malloc.restype = "
            "ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]; n = 64 << 20\n"
            "def touch():\n p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)\n"
            "touch(); f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; touch()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)")

    def faults(library):
        env = allocator.child_environment(library, {"PATH": "/usr/bin:/bin"})
        return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, check=True).stdout)

    pages = (64 << 20) // 4096
    assert faults(None) > pages // 2  # mapped and faulted in again
    assert faults(allocator.GLIBC_LARGE) < pages // 10


HEAP_PATTERN = """
import ctypes, os, sys
from lm_eval_ponder import allocator
if sys.argv[1] == "return":
    assert allocator.return_large_blocks()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def touched(size):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    return block
libc.free(touched(24 << 20))  # a freed mapped block: glibc raises its threshold to 24 MiB
blocks = [touched(8 << 20) for _ in range(20)]
live = touched(1 << 20)  # above them on the heap, so the heap cannot shrink
before = rss()
for block in blocks:
    libc.free(block)
print(before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or allocator.is_preloaded(),
                    reason="glibc's malloc on Linux")
def test_freed_large_blocks_go_back_to_the_system():
    """The loop's pattern in small (issue 66): after one large block is freed, glibc serves the
    next ones from its heap and keeps them when they are freed; with ``return_large_blocks``
    they are mapped on their own, and freeing them gives the 160 MB back."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    returned = {}
    for mode in ("keep", "return"):
        out = subprocess.run([sys.executable, "-c", HEAP_PATTERN, mode], capture_output=True,
                             text=True, env=env, cwd=REPO, timeout=60)
        assert out.returncode == 0, out.stderr
        returned[mode] = int(out.stdout) / 2**20
    assert returned["keep"] < 20 and returned["return"] > 150, returned


def test_return_large_blocks_leaves_a_users_own_setting(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "123")
    assert not allocator.return_large_blocks()
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc_minimal.so.4")
    assert not allocator.return_large_blocks()

"""Preloading a caching allocator for long CPU generations (lm_eval_ponder.allocator)."""

from __future__ import annotations

import subprocess
import sys

import pytest

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

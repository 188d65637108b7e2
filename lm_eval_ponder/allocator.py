"""A caching memory allocator (tcmalloc, preloaded) for long CPU generations: opt-in.

Why (docs/design/allocator.md): every decode step grows each layer's key/value cache with
``torch.cat`` into a new tensor, and glibc maps blocks over 32 MB afresh and unmaps them on
``free``: a MATH500 Best-of-5 run spent 25-30% of its CPU time in the kernel. Measured with
``benchmarks/allocator.py`` (128 rows, 200-400-token prompts, 96 new tokens, bf16, one thread):
tcmalloc (``--pairs 3``) cut system time 33-38 s -> 2-3 s, user+system CPU about 1.25x, wall
x1.16, the same tokens; glibc's own tunables at 4 GiB (``glibc-large``, ``--library none
--setting ...``, 2 pairs) cut system time 36-40 s -> 2.0-2.4 s, minor faults 18.3 M ->
0.5-0.7 M, wall x1.22, peak resident 2.63 / 3.00 GB -> 2.54 / 3.52 GB.

Neither is the default: full runs held far more. GSM8K Best-of-5 under tcmalloc (continuous
batching, 500 new tokens), which holds freed blocks of every size the cache passed through,
grew to 14.8 GB resident in 26 minutes and was killed on a 24 GiB machine (4.3-4.5 GB under
glibc at the same point). GSM8K FP-Direct under ``glibc-large`` (T = 0.7, 128 rows, 33 min)
climbed from 2.6 to 10.7 GB (peak 14.3 GB); at the stage where it held 6-7 GB the next run (CoT)
under the default held 3.2-3.3 GB (both peak about 9-10 GB while loading). So ``suite
--allocator`` defaults to ``system``; ``auto``, a path or ``glibc-large`` are for a machine with
memory to spare. ``glibc-large`` reaches a process only through its environment at start
(``mallopt`` caps the threshold at 32 MB): it is for child processes (``suite``) and users who
export it. Allocation changes no number.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from lm_eval_ponder.errors import PonderError

# Debian/Ubuntu's google-perftools packages (libtcmalloc-minimal4, libgoogle-perftools4) and
# the Red Hat family's gperftools-libs. jemalloc is left out on purpose: with its default decay
# settings it hands large freed blocks back as glibc does (measured: no gain).
LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
DIRECTORIES = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
               "/usr/lib", "/usr/local/lib")
AUTO, SYSTEM, GLIBC_LARGE = "auto", "system", "glibc-large"
# glibc's own tunables (module docstring): large blocks from the heap, freed memory kept
GLIBC_LARGE_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30),
                        "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


def find_allocator(directories: tuple[str, ...] = DIRECTORIES) -> str | None:
    """The path of an installed tcmalloc (None on other systems or when none is installed)."""
    if not sys.platform.startswith("linux"):
        return None
    for directory in directories:
        for name in LIBRARIES:
            path = Path(directory) / name
            if path.is_file():
                return str(path)
    return None


def is_preloaded(environ: dict[str, str] | None = None) -> bool:
    """Whether this process (or, with ``environ``, a child started with it) preloads a caching
    allocator."""
    preload = (os.environ if environ is None else environ).get("LD_PRELOAD", "")
    return any(lib in preload for lib in ("tcmalloc", "jemalloc", "mimalloc"))


def resolve(choice: str, cuda: bool | None = None) -> str | None:
    """The library ``choice`` asks for: ``auto`` (an installed tcmalloc when the runs are on CPU,
    else none: on a GPU the cache lives in CUDA's own caching allocator), ``system`` (glibc's
    malloc), ``glibc-large`` (returned as is: glibc with ``GLIBC_LARGE_SETTINGS``) or a path,
    which must exist. ``cuda``: whether a GPU is visible (asked of torch
    when not given)."""
    if choice == SYSTEM:
        return None
    if choice == GLIBC_LARGE:
        return GLIBC_LARGE
    if choice == AUTO:
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        return None if cuda else find_allocator()
    if not Path(choice).is_file():
        raise PonderError(f"--allocator {choice}: no such file (give a path to "
                          f"libtcmalloc_minimal.so.4, '{AUTO}', '{SYSTEM}' or '{GLIBC_LARGE}')")
    return choice


# mallopt's parameter number for the mmap threshold (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
# Blocks from this size up are mapped on their own and unmapped when freed.
RETURN_THRESHOLD = 4 << 20
APPLIED: dict[str, str] = {}  # what ``return_large_blocks`` set in this process


def return_large_blocks() -> bool:
    """Make glibc hand every block of ``RETURN_THRESHOLD`` or more back to the system when it
    is freed, for the rest of this process; True when it did.

    Why: glibc maps a large block on its own and unmaps it on ``free``, but each such free
    raises its threshold to that block's size (up to 32 MiB), so from then on blocks up to
    that size come from its heap, which holds freed memory wherever a live block sits above
    it. The loop's key/value layers (tens of MB at 128 rows), the logits and the bf16
    casts' temporaries are such blocks: the whole arith ladder on the embedded model (bf16,
    500 questions, one thread, AMD EPYC) peaked at 3.65 GiB resident, and at 2.66 GiB with
    the threshold fixed at 4 MiB, the same answers (``benchmarks/memory.py``). A fixed
    threshold turns the raising off (``mallopt``). Left alone: a process that preloads another
    allocator, a user's own ``MALLOC_MMAP_THRESHOLD_`` (``glibc-large`` included), and
    systems without glibc."""
    if (not sys.platform.startswith("linux") or is_preloaded()
            or "MALLOC_MMAP_THRESHOLD_" in os.environ):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        glibc = hasattr(libc, "gnu_get_libc_version")  # musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    if not glibc or not mallopt(M_MMAP_THRESHOLD, RETURN_THRESHOLD):
        return False
    APPLIED["mmap_threshold"] = str(RETURN_THRESHOLD)
    return True


def malloc_settings(environ: dict[str, str] | None = None) -> dict[str, str]:
    """glibc's ``MALLOC_*`` tunables in an environment (this process's by default) and what
    ``return_large_blocks`` set: recorded with each run beside its preload, as settings that
    change no number."""
    env = os.environ if environ is None else environ
    return {**{k: v for k, v in env.items() if k.startswith("MALLOC_")},
            **(APPLIED if environ is None else {})}


def child_environment(library: str | None, environ: dict[str, str] | None = None
                      ) -> dict[str, str]:
    """The environment of a child process that preloads ``library`` (after anything the user
    preloads already; unchanged when ``library`` is None or a caching allocator is there), or
    that runs glibc with ``GLIBC_LARGE_SETTINGS`` (``library`` = ``GLIBC_LARGE``)."""
    env = dict(os.environ if environ is None else environ)
    if library == GLIBC_LARGE:  # the user's own values win
        return {**GLIBC_LARGE_SETTINGS, **env}
    if library and not is_preloaded(env):
        env["LD_PRELOAD"] = " ".join(p for p in (env.get("LD_PRELOAD", ""), library) if p)
        # tcmalloc reports every allocation over 1 GB on stderr; a long run's logs need none
        env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
    return env

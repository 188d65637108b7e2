"""Paths as a record may hold them: results, cards, run summaries and vectors' metadata are
committed and read on other machines, where ``/root/.cache/...`` or ``/work/main/...`` name
nothing (and the output folder named after such a path named the machine that ran it).

A path under one of this machine's roots is written relative to it, as a reader reads it:
the package's cache as ``$LM_EVAL_PONDER_CACHE/...``, the working directory as a relative
path, the home directory as ``~/...``. ``expand`` turns the first and the last back into this
machine's paths, so a record that names a model directory still finds it. Paths under none of
the roots are left as given (a user's own record of their own machine), and the tree's test
(``tests/test_portable.py``) says which ones a committed file may not hold.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

CACHE_SHOWN = "$LM_EVAL_PONDER_CACHE"

# an absolute path inside a longer text (a model_args string, a command line, a card's line):
# a "/" that starts no URL ("https://"), no relative path ("a/b") and no "~/" or "$X/"
MACHINE_PATH = re.compile(r"(?<![\w.~$:/@-])/[^\s,\"'=;:()\[\]{}<>`|*]+")


def roots() -> list[tuple[Path, str]]:
    """This machine's roots and how a record names them, most specific first."""
    from lm_eval_ponder.backbone import cache_root

    found = [(cache_root(), CACHE_SHOWN), (Path.cwd(), "."), (Path.home(), "~")]
    return [(root.expanduser().resolve(), shown) for root, shown in found]


def under_root(path: str) -> str | None:
    """``path`` relative to the first root it lies under, as shown; None when under none."""
    p = Path(path)
    for root, shown in roots():
        try:
            rest = p.relative_to(root)
        except ValueError:
            continue
        if str(rest) == ".":
            return shown
        return str(rest) if shown == "." else f"{shown}/{rest}"
    return None


def portable_path(path: str | os.PathLike | None) -> str:
    """One path as a record holds it (see the module docstring); a relative path, or one under
    none of the roots, as given."""
    if path is None:
        return "None"
    text = str(path)
    if not Path(text).is_absolute():
        return text
    return under_root(text) or text


def cwd_relative(path: str) -> str:
    """A path under the working directory as a relative one, others as given: for commands
    (the suite's model args), which must still run, and are published with their results."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def portable_text(text: str) -> str:
    """Every absolute path inside ``text`` that lies under a root, made portable."""
    return MACHINE_PATH.sub(lambda m: under_root(m.group(0)) or m.group(0), text)


def portable_record(obj: Any) -> Any:
    """``obj`` with every string made portable (``portable_text``); dicts and lists rebuilt,
    other values as they are."""
    if isinstance(obj, str):
        return portable_text(obj)
    if isinstance(obj, dict):
        return {key: portable_record(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(portable_record(value) for value in obj)
    return obj


def expand(path: str) -> str:
    """A record's path as this machine's: ``$LM_EVAL_PONDER_CACHE/...`` under this cache,
    ``~/...`` under this home; anything else as given (relative to the working directory)."""
    from lm_eval_ponder.backbone import cache_root

    if path == CACHE_SHOWN or path.startswith(CACHE_SHOWN + "/"):
        return str(cache_root() / path[len(CACHE_SHOWN):].lstrip("/"))
    return os.path.expanduser(path)


def backbone_record(path: str, name: str, sha256: str | None) -> str:
    """The backbone as an identity holds it: by name where its weights' SHA-256 says which
    they are (the hash sits beside it), else a Hub id as given or a local directory's portable
    path. Two machines, or two spellings of one directory, then give one identity."""
    if sha256:
        return name
    return portable_path(path) if Path(path).expanduser().is_dir() else path

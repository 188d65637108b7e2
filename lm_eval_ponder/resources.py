"""Where shipped artefacts live: inside the installed package, or at the top of a checkout.

The wheel puts ``tasks/`` and ``controllers/`` inside ``lm_eval_ponder/``; a source checkout
keeps them beside it. Every lookup goes through ``shipped_dir`` so both layouts work.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

# ``0``: lm-eval's own ~15,000 task files are left out of the task index (``suite`` sets it for
# the runs it starts, which name only ours)
BUILTIN_TASKS_ENV = "LM_EVAL_PONDER_BUILTIN_TASKS"


def shipped_dir(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"lm_eval_ponder: shipped folder {name!r} not found")


def shipped_controller_dir(backbone_name: str) -> Path | None:
    """``controllers/<backbone>/`` if this backbone has shipped artefacts, else None."""
    try:
        candidate = shipped_dir("controllers") / backbone_name
    except FileNotFoundError:
        return None
    return candidate if candidate.is_dir() else None


def tasks_dir() -> str:
    """Our YAML tasks (``tasks/``), as lm-eval's ``--include_path`` takes them."""
    return str(shipped_dir("tasks"))

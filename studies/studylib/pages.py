"""A study's page as its two files: the compact JSON record the figures come from and the
Markdown a reader opens, written side by side so that one never goes without the other."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def write_page(out: Path, name: str, summary: dict,
               markdown: Callable[[Path, dict], None]) -> Path:
    """``out/name.json`` (compact: the tree must travel, < 10 MiB) and ``out/name.md`` from
    ``markdown(path, summary)``; prints the Markdown and returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / name
    stem.with_suffix(".json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    markdown(stem.with_suffix(".md"), summary)
    print(stem.with_suffix(".md").read_text())
    return stem.with_suffix(".md")

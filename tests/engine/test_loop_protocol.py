"""The loop drives its rows only through the layout protocol (``engine.rows``: ``StepRows`` and
``CacheLayout``), so another layout implements what the protocols name and nothing the loop
reads behind their back. Read from the loop's source: every attribute it touches on a batch or
a layout must be named by the protocols, and the layout must have it."""

from __future__ import annotations

import ast
import inspect
import typing

from lm_eval_ponder.engine import loop
from lm_eval_ponder.engine.rows import CacheLayout, DynamicRows, StepRows, empty_rows

# the names a loop method gives the rows it drives (a prefilled group, ``joined``, is a
# ``DynamicRows`` by type, and its own upkeep is that class's)
ROW_NAMES = {"batch", "layout"}


def protocol_names() -> set[str]:
    names: set[str] = set()
    for proto in (StepRows, CacheLayout):
        names |= set(typing.get_type_hints(proto)) | {
            n for n in vars(proto) if not n.startswith("_")}
    return names


def touched(source: str) -> dict[str, int]:
    """Attribute name -> first line, for every ``batch.x``, ``layout.x`` and ``self.layout.x``
    in ``source``."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        named = isinstance(value, ast.Name) and value.id in ROW_NAMES
        on_self = (isinstance(value, ast.Attribute) and value.attr == "layout"
                   and isinstance(value.value, ast.Name) and value.value.id == "self")
        if named or on_self:
            found.setdefault(node.attr, node.lineno)
    return found


def test_the_loop_touches_only_what_the_protocols_name():
    used = touched(inspect.getsource(loop))
    assert {"rows_t", "last", "feed", "retire", "inputs", "n_alive"} <= set(used)
    unnamed = {name: line for name, line in used.items() if name not in protocol_names()}
    assert not unnamed, f"engine/loop.py touches rows outside the protocol: {unnamed}"


def test_the_check_sees_a_field_behind_the_protocols_back():
    planted = "def step(self, batch):\n    batch.secret_counter += 1\n    self.layout.length\n"
    assert set(touched(planted)) == {"secret_counter", "length"}
    assert not {"secret_counter", "length"} & protocol_names()


def test_the_layout_has_every_name():
    import torch

    dynamic = empty_rows(torch.device("cpu"))
    assert isinstance(dynamic, DynamicRows)
    for name in protocol_names():
        assert hasattr(dynamic, name), name

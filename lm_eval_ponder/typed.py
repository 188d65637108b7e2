"""Values read into typed dataclasses: the trainer's config and a controller's ``config.json``.

One type system, the dataclasses' annotations, as transformers' ``HfArgumentParser`` and TRL's
``TrlParser`` take theirs: a value from a YAML file, a JSON file or the command line (read as
YAML) is checked and converted against its field's type here, and a wrong one is refused at
its key (not at the first comparison deep in the trainer), in one line that names the key,
the value and the type the key takes.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from lm_eval_ponder.errors import PonderError

NONE = type(None)
UNIONS = (typing.Union, types.UnionType)


class WrongType(PonderError):
    """A value that its key's type does not admit; ``key``, ``hint`` and ``value`` for callers
    that word it their own way (a controller's config names its file)."""

    def __init__(self, key: str, hint: Any, value: Any) -> None:
        self.key, self.hint, self.value = key, hint, value
        super().__init__(f"config key {key!r} must be {describe(hint)}, got {value!r}")


def option(default: Any, help: str) -> Any:
    """A config field with its ``--help`` line (``field(metadata={"help": ...})``, as
    ``HfArgumentParser`` reads it); a callable default (a class, a lambda) is its factory."""
    if callable(default):
        return dataclasses.field(default_factory=default, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    """Refuse a value that is not one of a key's named choices, in one line."""
    if value not in choices:
        raise PonderError(f"{key} must be one of {choices}, got {value!r}")


def alternatives(hint: Any) -> tuple:
    """The types a ``Union`` (``X | None``) admits; any other hint alone."""
    return typing.get_args(hint) if typing.get_origin(hint) in UNIONS else (hint,)


def describe(hint: Any) -> str:
    """A field's type in words, for the error that names it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in UNIONS:
        return " or ".join("null" if a is NONE else describe(a) for a in args)
    if origin is dict:
        return f"a mapping of {describe(args[0])} to {describe(args[1])}" if args else "a mapping"
    if origin is tuple:
        count = "" if len(args) == 2 and args[1] is Ellipsis else f"{len(args)} "
        return f"a list of {count}values, each {describe(args[0])}"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} keys"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def field_type(root: Any, key: str) -> Any:
    """The declared type of a dotted key of the dataclass ``root`` (inside a mapping field:
    its values' type; ``Any`` for a key it does not have)."""
    hint: Any = root
    for part in key.split("."):
        if dataclasses.is_dataclass(hint):
            hint = typing.get_type_hints(hint).get(part, Any)
        else:
            args = typing.get_args(hint)
            hint = args[1] if len(args) == 2 else Any
    return hint


def convert(value: Any, hint: Any, key: str) -> Any:
    """``value`` as type ``hint``, with the conversions a YAML reader leaves to the config
    (``"1e-3"`` to a number, ``2024`` to the text "2024", a list to a tuple, a whole float to
    an integer), or ``WrongType`` naming ``key`` (an entry's own dotted key inside a mapping
    or a list)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in UNIONS:
        if value is None and NONE in args:
            return None
        for option in (a for a in args if a is not NONE):
            try:
                return convert(value, option, key)
            except WrongType:
                continue
        raise WrongType(key, hint, value)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise WrongType(key, hint, value)
        return fill(hint(), value, key)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise WrongType(key, hint, value)
        return {k: convert(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if origin is tuple:
        many = len(args) == 2 and args[1] is Ellipsis
        if not isinstance(value, (list, tuple)) or (not many and len(value) != len(args)):
            raise WrongType(key, hint, value)
        kinds = [args[0]] * len(value) if many else list(args)
        return tuple(convert(v, kind, f"{key}.{i}") for i, (v, kind) in enumerate(zip(value, kinds)))
    return convert_scalar(value, hint, key)


def convert_scalar(value: Any, hint: Any, key: str) -> Any:
    """A bool, number or string field's value (``"true"``, ``"1e-3"`` and ``2024`` as YAML
    leaves them), or ``WrongType``."""
    if hint is bool and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if hint in (int, float) and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise WrongType(key, hint, value) from None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is float and number:
        return float(value)
    if hint is int and number and (isinstance(value, int) or float(value).is_integer()):
        return int(value)
    if hint is str and number:  # YAML read ``--output 2024`` as a number
        return str(value)
    if hint not in (int, float) and isinstance(hint, type) and isinstance(value, hint):
        return value
    raise WrongType(key, hint, value)


def fill(target: Any, values: Mapping[str, Any], prefix: str = "") -> Any:
    """Set the dataclass ``target``'s fields from ``values`` (nested mappings set nested
    sections key by key, so unnamed keys keep their defaults); an unknown key is one line."""
    known = {f.name for f in dataclasses.fields(target)}
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in known:
            raise PonderError(f"unknown config key {key!r}")
        current = getattr(target, name)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            fill(current, value, key)
        else:
            setattr(target, name, convert(value, field_type(type(target), name), key))
    return target


INTERPOLATION = re.compile(r"\$\{([^}]*)\}")


def interpolate(root: Any, lookup: typing.Callable[[str], Any]) -> None:
    """Replace ``${key}`` in every string field of the dataclass ``root`` (nested sections
    too) by that key's value (``--cache_dir '${output}/cache'``); one that names no key is one
    line naming the key that holds it."""
    def resolve(where: str, text: str) -> str:
        def one(match: re.Match) -> str:
            try:
                return str(lookup(match.group(1)))
            except (AttributeError, KeyError):
                raise PonderError(f"config key {where!r}: Interpolation key "
                                  f"{match.group(1)!r} not found") from None
        return INTERPOLATION.sub(one, text)

    def walk(node: Any, prefix: str) -> None:
        for f in dataclasses.fields(node):
            value, key = getattr(node, f.name), f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                walk(value, f"{key}.")
            elif isinstance(value, str) and "${" in value:
                setattr(node, f.name, resolve(key, value))

    walk(root, "")

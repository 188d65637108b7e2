"""``python -m lm_eval_ponder.train``: train a halting controller with GRPO on a frozen backbone.

    python -m lm_eval_ponder.train --output runs/smollm2            # embedded defaults
    python -m lm_eval_ponder.train --config my.yaml --grpo.max_steps 3000 --seed 1
    torchrun --nproc_per_node 2 -m lm_eval_ponder.train ...          # or accelerate launch

Two phases: (1) the rollout cache (``rollouts.py``): each training prompt generated once per
depth, resumable, sharded across ranks; (2) GRPO (``grpo.py``) on cache lookups, with the
reward of ``rewards.py``. With ``--ponder.granularity token`` there is no cache: every step
generates its answers with the controller deciding at each token (``online.py``; slow, a GPU
job). The output directory gets ``controller.safetensors`` and
``config.json`` (loadable with ``--model_args controller=<dir>``), ``train_log.jsonl`` and
``card.md``; ``checkpoint.safetensors`` lets an interrupted run continue exactly where its last
checkpoint was (same seed, same result as an uninterrupted run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_ponder.backbone import check_dtype
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.dynamics import PonderConfig
from lm_eval_ponder.training.grpo import GRPOConfig
from lm_eval_ponder.training.rewards import RewardConfig
from lm_eval_ponder.training.rollouts import RolloutConfig

LOGGER = logging.getLogger(__name__)

@dataclass
class TrainConfig:
    """Everything a run depends on; saved in config.json and checked on resume."""

    output: str = field(default="", metadata={"help": "run directory (required)"})
    pretrained: str | None = field(
        default=None, metadata={"help": "Hub id, local dir or GGUF; None: the embedded SmolLM2"})
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file in pretrained"})
    steering: str | None = field(
        default=None, metadata={"help": "vector dir; None: the one shipped for the backbone"})
    layer: int | None = field(
        default=None, metadata={"help": "steering layer; None: the vector's default"})
    cache_dir: str | None = field(default=None, metadata={"help": "None: <output>/rollouts"})
    device: str | None = field(
        default=None, metadata={"help": "None: cuda if available, else cpu (the backbone only)"})
    dtype: str | None = field(default=None, metadata={
        "help": "backbone dtype; None: bfloat16 where the device computes it natively, else "
                "float32 (as --model ponder); the controller always trains in float32"})
    parallelize: bool = field(default=False, metadata={
        "help": "spread one backbone over all visible GPUs (device_map=auto, one process)"})
    seed: int = field(default=0, metadata={"help": "one seed for init, sampling, halting"})
    val_fraction: float = field(
        default=0.2, metadata={"help": "held-out *training* prompts, for choosing the checkpoint"})
    logging_steps: int = field(
        default=100, metadata={"help": "the paper logs every 100 steps; also the checkpoint interval"})
    select: str = field(default="last", metadata={"help": (
        "'last': the final weights; 'best': the best held-out score, worth it only when the "
        "held-out set can tell checkpoints apart (16 prompts cannot)")})
    controller_hidden: int = field(default=512, metadata={"help": "controller width h"})
    controller_temperature: float = field(
        default=1.0, metadata={"help": "T in phi = sigmoid(logit / T), at the start (soft)"})
    controller_temperature_end: float | None = field(default=0.1, metadata={"help": (
        "T at the last step, annealed geometrically from T1 (the paper's soft-to-hard "
        "transition; 0.1 is its 'decisive' example); the controller ships with it. None: T "
        "stays controller_temperature")})
    ponder: PonderConfig = field(default_factory=PonderConfig,
                                 metadata={"help": "pondering settings"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig,
                                   metadata={"help": "what the rollout cache generates"})
    grpo: GRPOConfig = field(default_factory=GRPOConfig, metadata={"help": "GRPO optimisation"})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"help": "the reward"})

    def validate(self) -> TrainConfig:
        if not self.output:
            raise PonderError("--output DIR is required")
        self.dtype = check_dtype(self.dtype)
        if self.select not in ("best", "last"):
            raise PonderError(f"select must be 'best' or 'last', got {self.select!r}")
        if not 0 <= self.val_fraction < 1:
            raise PonderError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.logging_steps < 1:
            raise PonderError("logging_steps must be >= 1")
        if self.ponder.granularity == "token" and self.rollout.samples != 1:
            raise PonderError(
                "granularity=token trains on online rollouts with greedy text (the randomness "
                "is in the halting decisions): rollout.samples must be 1")
        prompts = self.rollout.prompts
        if not isinstance(prompts, dict) or not prompts or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
                for k, v in prompts.items()):
            raise PonderError(f"rollout.prompts must map task names to positive counts, e.g. "
                              f"'{{arith_ponder: 50, gsm8k_ponder: 14}}', got {prompts!r}")
        end = self.controller_temperature_end
        if end is not None and not (math.isfinite(end) and end > 0):
            raise PonderError(f"controller_temperature_end must be > 0 or None, got {end}")
        self.ponder.validate()
        self.reward.validate()
        self.grpo.validate(self.reward)
        return self


# ----------------------------------------------------------------------------- config I/O
def _convert(value: Any, current: Any) -> Any:
    import yaml

    if isinstance(value, str):
        parsed = yaml.safe_load(value) if value != "" else None
    else:
        parsed = value
    if isinstance(current, tuple) and isinstance(parsed, list):
        return tuple(parsed)
    if isinstance(current, float) and isinstance(parsed, int) and not isinstance(parsed, bool):
        return float(parsed)
    return parsed


def describe(hint: Any) -> str:
    """A field's type in words, for the error that names it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else describe(a) for a in args)
    if origin is dict:
        return f"a mapping of {describe(args[0])} to {describe(args[1])}" if args else "a mapping"
    if origin is tuple:
        count = "" if len(args) == 2 and args[1] is Ellipsis else f"{len(args)} "
        return f"a list of {count}values, each {describe(args[0])}"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def typed(key: str, value: Any, hint: Any, raw: Any = None) -> Any:
    """``value`` (YAML-converted) as the field's type ``hint``, or a ``PonderError`` naming the
    key, the value and the type: a string where a number belongs would otherwise travel to the
    first comparison that uses it (``'>' not supported between 'str' and 'int'``, deep in the
    trainer). ``raw``: the string the user typed, kept as is for a string field (``--output
    2024`` is the directory "2024", not the number YAML reads)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)

    def refuse() -> PonderError:
        return PonderError(f"config key {key!r} must be {describe(hint)}, got {value!r}")

    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return typed(key, value, option, raw)
            except PonderError:
                continue
        raise refuse()
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(raw, str):
            return raw
        raise refuse()
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise refuse()
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise refuse()
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string, Python a number
            try:
                return float(value)
            except ValueError:
                pass
        raise refuse()
    if origin is dict:
        if not isinstance(value, dict):
            raise refuse()
        if not args:
            return value
        return {typed(key, k, args[0]): typed(f"{key}.{k}", v, args[1]) for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise refuse()
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(typed(key, v, args[0]) for v in value)
        if len(value) != len(args):
            raise refuse()
        return tuple(typed(key, v, a) for v, a in zip(value, args))
    return value  # a type this checker does not know: as given


def field_hint(obj: Any, name: str) -> Any:
    """The type annotation of dataclass ``obj``'s field ``name`` (resolved: the modules use
    ``from __future__ import annotations``)."""
    return typing.get_type_hints(type(obj))[name]


# Keys renamed to TRL's GRPOConfig vocabulary; the old spellings still work, with a warning.
RENAMED_KEYS = {
    "grpo.steps": "grpo.max_steps", "grpo.lr": "grpo.learning_rate",
    "grpo.group_size": "grpo.num_generations", "grpo.scale_std": "grpo.scale_rewards",
    "rollout.max_gen_toks": "rollout.max_completion_length", "log_every": "logging_steps",
}


def set_key(cfg: Any, dotted: str, value: Any, prefix: str = "") -> None:
    """Set ``a.b.c`` on nested dataclasses (and dicts), converting strings like YAML does and
    checking the result against the field's type (``typed``).

    ``prefix`` is the path of ``cfg`` inside the root config (for renamed keys in nested YAML).
    """
    dotted = dotted.replace("-", "_")
    full = prefix + dotted
    if full in RENAMED_KEYS:
        LOGGER.warning("config key %r is now %r (TRL's name); please update", full,
                       RENAMED_KEYS[full])
        dotted = RENAMED_KEYS[full][len(prefix):]
        full = prefix + dotted
    parts = dotted.split(".")
    obj, hint = cfg, None
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(obj, dict):
            # a mapping field (rollout.prompts, reward.weights): its values' type
            args = typing.get_args(hint)
            inner = args[1] if len(args) == 2 else None
            if last:
                new = _convert(value, obj.get(part))
                obj[part] = new if inner is None else typed(full, new, inner, value)
                return
            obj, hint = obj.setdefault(part, {}), inner
            continue
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in
                                                             dataclasses.fields(obj)}:
            raise PonderError(f"unknown config key {prefix + dotted!r} (see --help for the keys)")
        if last:
            current = getattr(obj, part)
            new = _convert(value, current)
            if dataclasses.is_dataclass(current) and isinstance(new, dict):
                path = prefix + ".".join(parts[: i + 1]) + "."
                for k, v in new.items():
                    set_key(current, k, v, prefix=path)
            elif dataclasses.is_dataclass(current):
                raise PonderError(f"config key {full!r} holds nested keys ({full}.KEY VALUE); "
                                  f"got {new!r}")
            else:
                setattr(obj, part, typed(full, new, field_hint(obj, part), value))
            return
        obj, hint = getattr(obj, part), field_hint(obj, part)


def flat_keys(cfg: Any, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) of every leaf of a config, for ``--help``."""
    out = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += flat_keys(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", value, f.metadata.get("help", "")))
    return out


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    import yaml

    keys = "\n".join(f"  --{k} {json.dumps(v, default=str)}" + (f"\n        {h}" if h else "")
                     for k, v, h in flat_keys(TrainConfig()))
    parser = argparse.ArgumentParser(
        prog="python -m lm_eval_ponder.train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a pondering controller with GRPO (FR-Ponder) on a frozen backbone.",
        epilog="Every config key can be given as --key value (defaults shown):\n" + keys)
    parser.add_argument("--config", help="YAML file with any of the keys below (nested)")
    args, rest = parser.parse_known_args(argv)
    cfg = TrainConfig()
    if args.config:
        try:
            loaded = yaml.safe_load(Path(args.config).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise PonderError(f"cannot read config {args.config}: {error}") from None
        if not isinstance(loaded, dict):
            raise PonderError(f"{args.config} must hold a mapping of config keys")
        for key, value in loaded.items():
            try:
                set_key(cfg, key, value)
            except PonderError as error:
                raise PonderError(f"{args.config}: {error}") from None
    i = 0
    while i < len(rest):
        token = rest[i]
        if not token.startswith("--"):
            raise PonderError(f"unexpected argument {token!r}; options look like --key value")
        key, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(rest):
                raise PonderError(f"--{key} needs a value")
            value, i = rest[i + 1], i + 1
        set_key(cfg, key, value)
        i += 1
    return cfg.validate()


def config_dict(cfg: TrainConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg), default=list))

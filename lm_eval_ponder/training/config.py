"""``python -m lm_eval_ponder.train``'s config: ``TrainConfig``, its YAML file and command line.

    python -m lm_eval_ponder.train --output runs/smollm2            # embedded defaults
    python -m lm_eval_ponder.train --config my.yaml --grpo.max_steps 3000 --seed 1
    torchrun --nproc_per_node 2 -m lm_eval_ponder.train ...          # or accelerate launch

A run builds the rollout cache (``rollouts.py``; at token granularity none: ``online.py``), then
trains on it (``expected.py`` or ``grpo.py``, in ``loop.py``). The output directory gets
``controller.safetensors`` and ``config.json`` (``--model_args controller=<dir>``),
``train_log.jsonl``, ``card.md`` and ``checkpoint.safetensors``, from which an interrupted run
continues exactly where its last checkpoint was (same seed, same result).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import typing
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lm_eval_ponder import registry
from lm_eval_ponder.backbone import check_dtype
from lm_eval_ponder.errors import PonderError, program_name
from lm_eval_ponder.files import check_output
from lm_eval_ponder.pondering.dynamics import PonderConfig
from lm_eval_ponder.training.expected import ExpectedConfig
from lm_eval_ponder.training.grpo import GRPOConfig
from lm_eval_ponder.training.rewards import RewardConfig
from lm_eval_ponder.training.rollouts import RolloutConfig
from lm_eval_ponder.typed import alternatives, check_choice, convert, field_type, interpolate, option

LOGGER = logging.getLogger(__name__)

ALGORITHMS = ("expected", "grpo")
# Named recipes: the keys each sets before a config file and the command line (which may
# override any of them). "default" is what passes the trainer's positive control
# (``--control``, docs/results/training.md); "grpo-2026-12" is the recipe shipped until then
# (GRPO on the paper's reward with our fixes); "paper" is the paper's Algorithm 1 as written.
RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "grpo-2026-12": {"algorithm": "grpo", "reward.objective": "paper"},
    "paper": {"algorithm": "grpo", "reward.objective": "paper", "grpo.optim": "sgd",
              "grpo.max_grad_norm": None, "grpo.quality_gates": True, "grpo.stage1": "paper",
              "grpo.threshold_in_training": True, "grpo.temperature_schedule": "curriculum"},
}


@dataclass
class TrainConfig:
    """Everything a run depends on; saved in config.json and checked on resume."""

    output: str = option("", "run directory (required)")
    pretrained: str | None = option(None, "Hub id, local dir or GGUF; None: the embedded SmolLM2")
    gguf_file: str | None = option(None, "GGUF file in pretrained")
    steering: str | None = option(None, "vector dir; None: the one shipped for the backbone")
    layer: int | None = option(None, "steering layer; None: the vector's default")
    cache_dir: str | None = option(None, "None: <output>/rollouts")
    device: str | None = option(None, "None: cuda if available, else cpu (the backbone only)")
    dtype: str | None = option(None, (
        "backbone dtype; None: bfloat16 where the device computes it natively, else "
        "float32 (as --model ponder); the controller always trains in float32"))
    parallelize: bool = option(
        False, "spread one backbone over all visible GPUs (device_map=auto, one process)")
    recipe: str = option("default", (
        "a named set of keys applied first: 'default' (the exact expected reward at the "
        "user's price), 'grpo-2026-12' (the GRPO recipe shipped until 2026-12), 'paper' "
        "(Algorithm 1 as written); later keys override"))
    algorithm: str | None = option(None, (
        "'expected': maximise the exact expected reward over the rollout cache's depths "
        "(prompt granularity only) | 'grpo': the paper's GRPO; None: expected at prompt "
        "granularity, grpo at token granularity"))
    seed: int = option(0, "one seed for init, sampling, halting")
    val_fraction: float = option(0.2, "held-out *training* prompts, for choosing the checkpoint")
    logging_steps: int = option(100, "the paper logs every 100 steps; also the checkpoint interval")
    select: str = option("last", (
        "'last': the final weights; 'best': the best held-out score, worth it only when the "
        "held-out set can tell checkpoints apart (16 prompts cannot)"))
    controller_hidden: int = option(512, "controller width h")
    controller_temperature: float = option(1.0, "T in phi = sigmoid(logit / T), at the start (soft)")
    controller_temperature_end: float | None = option(0.1, (
        "T at the last step, annealed geometrically from T1 (the paper's soft-to-hard "
        "transition; 0.1 is its 'decisive' example); the controller ships with it. None: T "
        "stays controller_temperature"))
    ponder: PonderConfig = option(PonderConfig, "pondering settings")
    rollout: RolloutConfig = option(RolloutConfig, "what the rollout cache generates")
    expected: ExpectedConfig = option(ExpectedConfig, "the expected-reward fit (algorithm=expected)")
    grpo: GRPOConfig = option(GRPOConfig, "GRPO optimisation")
    reward: RewardConfig = option(RewardConfig, "the reward")

    def validate(self) -> TrainConfig:
        if not self.output:
            raise PonderError("--output DIR is required")
        check_output(self.output)  # before the backbone loads, not when the cache is written
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
        check_prompts(self.rollout.prompts)
        if self.recipe not in RECIPES:
            raise PonderError(f"recipe must be one of {', '.join(RECIPES)}, got {self.recipe!r}")
        if self.algorithm is None:
            self.algorithm = "grpo" if self.ponder.granularity == "token" else "expected"
        check_choice("algorithm", self.algorithm, ALGORITHMS)
        if self.algorithm == "expected" and self.ponder.granularity == "token":
            raise PonderError("algorithm=expected needs the rollout cache of prompt granularity; "
                              "granularity=token trains online: use --algorithm grpo")
        self.expected.validate()
        end = self.controller_temperature_end
        if end is not None and not (math.isfinite(end) and end > 0):
            raise PonderError(f"controller_temperature_end must be > 0 or None, got {end}")
        self.ponder.validate()
        self.reward.validate()
        self.grpo.validate(self.reward)
        return self

    def check_grpo_adapts(self) -> None:
        """GRPO settings under which every step imitates the teacher, or under which the
        teacher's depths lie past K_max, train nothing adaptive, silently: refused, naming both
        keys and the fix."""
        g = self.grpo
        if g.max_steps <= g.t1:
            raise PonderError(
                f"grpo.max_steps {g.max_steps} <= grpo.t1 {g.t1}: every step is the "
                "curriculum's teacher stage and nothing adaptive is trained; raise "
                "grpo.max_steps above grpo.t1 or lower grpo.t1 (--grpo.t1 0 --grpo.t2 0: no "
                "curriculum)")
        if self.ponder.k_max < g.teacher_min:
            raise PonderError(
                f"ponder.k_max {self.ponder.k_max} < grpo.teacher_min {g.teacher_min}: the "
                "teacher's depths are clipped to K_max and it teaches halting at K_max on "
                "every prompt; lower grpo.teacher_min and grpo.teacher_max to at most "
                f"{self.ponder.k_max}, or raise ponder.k_max")


def training_tasks() -> list[str]:
    """The tasks a controller may train on: each prompt (Direct, CoT, BoN) of every dataset
    with a training split (the registry's ``train_split``, the only splits
    ``training.rollouts`` reads)."""
    return [registry.task_name(d.name, base) for d in registry.DATASETS if d.train_split
            for base in registry.BASELINES]


def check_prompts(prompts: Any) -> None:
    """``rollout.prompts`` maps training tasks to positive counts. A task name checked here,
    before anything loads: ``--rollout.prompts '{arith: 4}'`` ended in lm-eval's bare
    ``KeyError: 'arith'`` after the backbone had loaded."""
    if not isinstance(prompts, dict) or not prompts or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
            for k, v in prompts.items()):
        raise PonderError(f"rollout.prompts must map task names to positive counts, e.g. "
                          f"'{{arith_ponder: 50, gsm8k_ponder: 14}}', got {prompts!r}")
    known = training_tasks()
    unknown = [task for task in prompts if task not in known]
    if unknown:
        raise PonderError(f"rollout.prompts names {', '.join(map(repr, unknown))}, not a task "
                          f"with a training split; the tasks are {', '.join(known)}")


# ----------------------------------------------------------------------------- config I/O
# One parser, typed by the dataclasses (``lm_eval_ponder.typed``): a config file's entries and
# the command line's ``--key value`` are set on one ``TrainConfig`` in that order, each value
# checked and converted against its field's type at the key that holds it. What stays here:
# old key names, where a mapping replaces a field and where it sets a section's keys, and
# ``${key}`` references between keys.

def key_type(key: str) -> Any:
    """The declared type of a dotted key of ``TrainConfig`` (``typed.field_type``)."""
    return field_type(TrainConfig, key)


# Keys renamed to TRL's GRPOConfig vocabulary; the old spellings still work, with a warning.
RENAMED_KEYS = {
    "grpo.steps": "grpo.max_steps", "grpo.lr": "grpo.learning_rate",
    "grpo.group_size": "grpo.num_generations", "grpo.scale_std": "grpo.scale_rewards",
    "rollout.max_gen_toks": "rollout.max_completion_length", "log_every": "logging_steps",
}


def current_name(key: str) -> str:
    """A key as the config spells it now: underscores for dashes (``--max-steps``), TRL's name
    for an old one (with a warning, so configs get updated rather than break)."""
    key = key.replace("-", "_")
    if key in RENAMED_KEYS:
        LOGGER.warning("config key %r is now %r (TRL's name); please update", key,
                       RENAMED_KEYS[key])
        return RENAMED_KEYS[key]
    return key


def select(cfg: TrainConfig, key: str) -> Any:
    """The node a dotted key names: a section, a field's value or a mapping field's entry
    (``KeyError`` where there is none)."""
    node: Any = cfg
    for part in key.split("."):
        if isinstance(node, dict):
            node = node[part]
        elif dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        else:
            raise KeyError(key)
    return node


def assignments(cfg: TrainConfig, key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of each field that ``key: value`` sets. A mapping given to a
    section sets its keys one by one, so the section's other keys keep their values (``grpo:
    {max_steps: 7}`` in YAML); one given to a mapping field replaces it whole (``--rollout.prompts
    '{arith_ponder: 4}'`` trains on arith alone)."""
    key = current_name(str(key))
    try:
        node = select(cfg, key)
    except KeyError:
        node = None
    if not dataclasses.is_dataclass(node):
        yield key, value
    elif isinstance(value, Mapping):
        for inner, inner_value in value.items():
            yield from assignments(cfg, f"{key}.{inner}", inner_value)
    else:
        raise PonderError(f"config key {key!r} holds nested keys ({key}.KEY VALUE); "
                          f"got {value!r}")


def assign(cfg: TrainConfig, key: str, value: Any) -> None:
    """Set one field (or one entry of a mapping field), the value converted to the key's type;
    a key the config does not have is one line."""
    parent_key, _, name = key.rpartition(".")
    try:
        parent = select(cfg, parent_key) if parent_key else cfg
    except KeyError:
        parent = None
    if isinstance(parent, dict):
        parent[name] = convert(value, key_type(key), key)
    elif dataclasses.is_dataclass(parent) and name in {f.name for f in dataclasses.fields(parent)}:
        setattr(parent, name, convert(value, key_type(key), key))
    else:
        raise PonderError(f"unknown config key {key!r} (see --help for the keys)")


def apply(cfg: TrainConfig, key: Any, value: Any, source: str | None = None) -> None:
    """Set ``key: value`` (a YAML entry or a ``--key value``); ``source``, the file it came
    from, leads the error."""
    try:
        for leaf, leaf_value in assignments(cfg, key, value):
            assign(cfg, leaf, leaf_value)
    except PonderError as error:
        if source is None:
            raise
        raise PonderError(f"{source}: {error}") from None


def read_config_file(path: str) -> dict:
    """A YAML config file as a mapping, or one line naming the file: missing, not UTF-8, not
    YAML, a key twice, not a mapping."""
    import yaml

    class Unique(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's where installed
        """A YAML reader that refuses a key given twice (PyYAML keeps the last silently)."""

    def mapping(loader: Any, node: yaml.MappingNode) -> dict:
        keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"found duplicate key {twice}", node.start_mark)
        return loader.construct_mapping(node, deep=True)

    Unique.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        loaded = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=Unique)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        # a YAML error spans several lines (where it was parsing, what it found): one line here
        raise PonderError(f"cannot read config {path}: {' '.join(str(error).split())}") from None
    if loaded is None:  # an empty file sets nothing
        return {}
    if not isinstance(loaded, dict):
        raise PonderError(f"{path} must hold a mapping of config keys")
    return loaded


def cli_value(key: str, raw: str) -> Any:
    """A ``--key value`` as YAML reads it (``3``, ``1e-3``, ``true``, ``null``, ``[1, 2]``,
    ``{arith_ponder: 4}``), except for a field that takes a string: the text as typed
    (``--output 2024`` is the directory "2024", not the number; ``--steering null`` is None)."""
    import yaml

    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError:
        return raw  # not YAML: text, which the field's type check then names
    admits = alternatives(key_type(key))
    if str in admits and not (value is None and type(None) in admits):
        return raw
    return value


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


def type_name(key: str) -> str:
    """A key's type as ``--help`` shows it (``int``, ``float | None``, ``dict``)."""
    return " | ".join("None" if o is type(None) else getattr(typing.get_origin(o) or o,
                                                                "__name__", str(o))
                      for o in alternatives(key_type(key)))


# options of the command that are not config keys
NOT_CONFIG = ("config", "control", "control_from", "seeds")
WORLDS = Path(__file__).resolve().parent / "worlds"  # the positive control's shipped worlds


def shipped_worlds() -> list[str]:
    """The names of the shipped control worlds (``training/worlds/*.json``)."""
    return sorted(p.stem for p in WORLDS.glob("*.json"))


def control_options(argv: list[str] | None) -> argparse.Namespace:
    """The positive-control options of a command line (None where absent)."""
    args, _ = key_parser().parse_known_args(argv)
    from_file = read_config_file(args.config) if args.config else {}
    price = "price_per_1k_tokens"
    price_given = any(a.startswith(f"--reward.{price}") for a in argv or []) or \
        f"reward.{price}" in from_file or price in (from_file.get("reward") or {})
    return argparse.Namespace(control=args.control, control_from=args.control_from,
                              seeds=args.seeds, price_given=price_given)


def key_parser() -> argparse.ArgumentParser:
    """One option per config key, from the dataclasses: its type, default and help line
    (``--help``), the text as typed (``cli_value`` reads it as the key's type); the
    ``--max-steps`` spelling and the old names (``RENAMED_KEYS``, warned about) are hidden
    aliases, and a section (``--grpo '{max_steps: 7}'``) takes a mapping."""
    parser = argparse.ArgumentParser(
        prog=program_name("python -m lm_eval_ponder.train"), allow_abbrev=False,
        usage="%(prog)s --output DIR [--config FILE] [--KEY VALUE ...]",
        description="Train a pondering controller (FR-Ponder) on a frozen backbone: by default "
                    "the exact expected reward over the rollout cache at your price per 1k "
                    "tokens; the paper's GRPO with --recipe paper. Every config key is an "
                    "option (--key value or --key=value), and any of them can come from a YAML "
                    "file (--config, nested), read through the same types.")
    parser.add_argument("--config", help="YAML file with any of the keys below (nested)")
    control = parser.add_argument_group(
        "positive control (training.control): the recipe the other keys name, trained on a "
        "synthetic world with no language model, scored on held-out contexts")
    control.add_argument("--control", metavar="WORLD", help=(
        "a world file (.json) or a shipped world: " + ", ".join(shipped_worlds())))
    control.add_argument("--control-from", dest="control_from", metavar="CACHE", help=(
        "a world made from a rollout cache's outcome table (per level and depth), written to "
        "<output>/world.json"))
    control.add_argument("--seeds", default="0", help="trainer seeds of a control run, e.g. 0,1,2")
    leaves = flat_keys(TrainConfig())
    for key, default, help_line in leaves:
        parser.add_argument(f"--{key}", dest=key, metavar=type_name(key).replace(" ", ""),
                            default=argparse.SUPPRESS,
                            help=f"{help_line} (default: {json.dumps(default, default=str)})"
                            .lstrip(" "))
    leaf_keys = {key for key, _, _ in leaves}
    hidden = {*RENAMED_KEYS, *{k.rpartition(".")[0] for k in leaf_keys if "." in k},
              *{k.replace("_", "-") for k in leaf_keys}}
    for key in sorted(hidden - leaf_keys):
        parser.add_argument(f"--{key}", dest=key, default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)
    return parser


def mapping_entry(key: str) -> bool:
    """Whether ``key`` names an entry of a mapping field (``rollout.prompts.gsm8k_ponder``,
    ``reward.weights.acc``): any name can be one, so these options are added as the command
    line names them."""
    parent = key.rpartition(".")[0]
    return bool(parent) and typing.get_origin(key_type(parent)) is dict


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = key_parser()
    args, rest = parser.parse_known_args(argv)
    entries = {t[2:].partition("=")[0] for t in rest if t.startswith("--")}
    entries = sorted(k for k in entries if mapping_entry(current_name(k)))
    for key in entries:
        parser.add_argument(f"--{key}", dest=key, default=argparse.SUPPRESS)
    if entries:
        args, rest = parser.parse_known_args(argv)
    conf = TrainConfig()
    from_file = read_config_file(args.config) if args.config else {}
    recipe = getattr(args, "recipe", None) or from_file.get("recipe") or "default"
    if recipe not in RECIPES:
        raise PonderError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    for key, value in RECIPES[recipe].items():
        apply(conf, key, value)
    for key, value in from_file.items():
        apply(conf, key, value, source=args.config)
    for key, raw in vars(args).items():
        if key not in NOT_CONFIG:
            key = current_name(key)
            apply(conf, key, cli_value(key, raw))
    if rest:
        token = rest[0]
        if not token.startswith("--"):
            raise PonderError(f"unexpected argument {token!r}; options look like --key value")
        key = current_name(token[2:].partition("=")[0])
        raise PonderError(f"unknown config key {key!r} (see --help for the keys)")
    interpolate(conf, lambda key: select(conf, key))
    cfg = conf.validate()
    if cfg.algorithm == "grpo":  # the command line's; a study may run a few steps on purpose
        cfg.check_grpo_adapts()
    return cfg


def config_dict(cfg: TrainConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg), default=list))

"""What ``--model ponder`` was asked to do, and the artefacts that makes it load.

Kept apart from ``evaluation.lm`` so the model class is only the generation seam: this module
turns lm-eval's string model args into a ``PonderArgs``, then ``load_pondering`` resolves them
against what is shipped for the backbone and what a controller was trained with, and loads the
steering vector and controller once, refusing combinations that cannot mean anything (a
controller trained on another vector, alpha and controller together, a vector without a norm).
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lm_eval_ponder.engine import StopRule, TopProbBelow
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.pondering.dynamics import PonderConfig
from lm_eval_ponder.pondering.steered import Pondering, Steering, short_sha
from lm_eval_ponder.resources import shipped_controller_dir

LOGGER = logging.getLogger(__name__)

PONDER_TYPES = {"tau": float, "k_max": int, "alpha0": float, "beta": float,
                "alpha_start": float, "granularity": str}


def absent(value: Any) -> bool:
    """lm-eval passes model args as strings: "none", "null" and "" mean not given."""
    return value is None or str(value).strip().lower() in ("", "none", "null")


def model_arg_number(key: str, value: Any, kind: type[int] | type[float]) -> int | float:
    """A numeric model arg as ``kind``, or a ``PonderError`` naming the key and the value.

    lm-eval hands over what it could not read as a number as the string itself (``alpha=abc``
    arrives as ``"abc"``), and Python's own ``float("abc")`` error names neither the key nor
    the fix. An integer setting refuses a fraction (``k_max=2.5`` would silently be 2) and a
    boolean (lm-eval reads ``True`` as a bool, which ``int`` would turn into 1)."""
    what = "an integer" if kind is int else "a finite number"
    example = "8" if kind is int else "0.2"
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(value)
        if kind is int:
            if not number.is_integer():
                raise ValueError(value)
            return int(number)
        return number
    except (TypeError, ValueError, OverflowError):
        raise PonderError(f"model arg {key}={value!r} is not {what}: pass e.g. "
                          f"--model_args {key}={example}") from None


# The answer stops a run may add (``engine.stops``), by model arg: a new stopping rule is one
# class there and one entry here (a number the rule is built from).
ANSWER_STOPS: dict[str, Callable[[float], StopRule]] = {"min_top_prob": TopProbBelow}


@dataclass(frozen=True)
class AnswerStops:
    """The run's answer stops: the model args as given (``values``, which the fingerprint
    records: they change what is generated) and the engine's rules built from them."""

    values: dict[str, float] = field(default_factory=dict)
    rules: tuple[StopRule, ...] = ()

    @classmethod
    def from_model_args(cls, kwargs: dict[str, Any], generation: str,
                        early_exit: bool) -> AnswerStops:
        """Take the ``ANSWER_STOPS`` args out of ``kwargs`` (absent, "none" or "": not given).
        Refused with ``generation=hf`` (``generate`` has no such stop, and its batch-wide
        criterion would price rows wrongly) and with ``early_exit=`` (one stopping rule a
        run). ``min_top_prob`` is the answer-truncation reading of the paper's tau."""
        values = {name: model_arg_number(name, value, float)
                  for name in ANSWER_STOPS if not absent(value := kwargs.pop(name, None))}
        rules = tuple(ANSWER_STOPS[name](value) for name, value in values.items())
        for name in values:
            if generation != "loop":
                raise PonderError(f"{name}= stops answers inside the generation loop; it does "
                                  f"not apply to generation={generation}")
            if early_exit:
                raise PonderError(f"{name}= and early_exit= are two stopping rules; pass one")
        return cls(values, rules)


def check_model_dtype(dtype: Any) -> None:
    """Refuse a ``dtype=`` model arg that is no floating-point torch dtype (``int8``, a typo)
    before transformers does so in a traceback; every value HFLM takes (``auto``, a torch
    dtype or its name, ``half``) passes."""
    if isinstance(dtype, torch.dtype) or str(dtype) == "auto":
        return
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise PonderError(f"model arg dtype={dtype!r} is not a floating-point torch dtype: "
                          "pass e.g. dtype=float32, bfloat16, float16 or auto")


def unknown_model_arg(error: TypeError, given: dict[str, Any],
                      known: Iterable[str]) -> PonderError | None:
    """The one-line error for a model arg that nothing takes (a typo such as ``controler=``),
    or None if ``error`` is not that. HFLM hands every arg it does not know to
    ``from_pretrained``, which passes those that are not config fields to the model class:
    the mistake surfaces as a ``TypeError`` from deep inside transformers, after the config is
    read, and cannot be caught earlier without refusing the args ``from_pretrained`` takes.
    ``known``: the args ponder and HFLM take, for a did-you-mean."""
    found = re.search(r"unexpected keyword argument '([^']+)'", str(error))
    if found is None or found.group(1) not in given:
        return None
    name = found.group(1)
    close = difflib.get_close_matches(name, sorted(set(known) - {"self", "kwargs"}), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return PonderError(f"unknown model arg {name!r}: neither ponder, lm-eval's HFLM nor the "
                       f"model's from_pretrained takes it{hint}")


# model args ``--model ponder`` took once and refuses now: why each went and what to do instead
REMOVED_MODEL_ARGS = {
    "decode_step": "the captured decode layout was removed on 2026-12-04 and every call decodes "
                   "with the dynamic cache (what decode_step=dynamic did): drop decode_step= "
                   "from --model_args",
}


def refuse_removed_model_args(given: dict[str, Any]) -> None:
    """One line for a model arg that was removed (``REMOVED_MODEL_ARGS``), whatever its value:
    left alone it would reach ``from_pretrained`` as an unknown key, whose line says nothing of
    the removal."""
    for name, why in REMOVED_MODEL_ARGS.items():
        if name in given:
            raise PonderError(f"model arg {name}={given[name]!r}: {why}")


def model_arg_flag(key: str, value: Any) -> bool:
    """A boolean model arg: lm-eval reads ``true``/``false`` (any case) as bools already; a
    missing one is False; anything else is refused by name."""
    if absent(value) or value is False:
        return False
    if value is True or str(value).strip().lower() in ("true", "1", "yes"):
        return True
    if str(value).strip().lower() in ("false", "0", "no"):
        return False
    raise PonderError(f"model arg {key}={value!r} is not true or false: pass e.g. "
                      f"--model_args {key}=true")


def check_controller_backbone(directory: Path, recorded: dict, backbone_name: str,
                              backbone_sha256: str | None) -> None:
    """Refuse a controller whose config.json records another backbone than the one loaded.

    Hidden size and steering vector are checked elsewhere, but two backbones can share both
    (a fine-tune of the same base, a vector copied across), and a controller's depths are only
    meaningful for the states it was trained on. Same source file (GGUF SHA-256) where both
    are known, else the same name (``backbone.resolve_backbone``'s, case-insensitive). A
    controller that records no backbone (hand-made) is not checked."""
    name, sha = recorded.get("backbone_name"), recorded.get("backbone_sha256")
    if sha and backbone_sha256:
        same = sha == backbone_sha256
    else:  # a controller that records no backbone is not checked
        same = not name or str(name).lower() == str(backbone_name).lower()
    if same:
        return

    def described(n, h) -> str:
        return f"{n!r}" + (f" (sha256 {h[:16]})" if h else "")

    raise PonderError(
        f"controller {directory} was trained for backbone {described(name, sha)}, but this "
        f"run's backbone is {described(backbone_name, backbone_sha256)}: pass the pretrained= "
        "it was trained for, train a controller for this backbone, or add "
        "allow_backbone_mismatch=true to use it anyway")


@dataclass
class PonderArgs:
    """The ponder model args as the user gave them (``None``: not given)."""

    steering: str | None = None
    controller: str | None = None  # a directory; None with controller_auto=False: no pondering
    controller_auto: bool = True  # no controller= given: use the one shipped for the backbone
    alpha: float | None = None
    layer: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # tau, k_max, ... given explicitly
    allow_backbone_mismatch: bool = False  # use a controller recorded for another backbone

    @classmethod
    def from_model_args(cls, steering=None, controller="auto", alpha=None, layer=None,
                        allow_backbone_mismatch=False, **ponder) -> PonderArgs:
        # lm-eval parses ``controller=none`` into None before we see it, so None is an explicit
        # "no controller"; only the default "auto" means "the one shipped for the backbone"
        if isinstance(controller, str) and not controller.strip():
            raise PonderError("model arg controller= is empty (an unset shell variable?): pass a "
                              "controller directory, or controller=none for no pondering")
        explicit = controller is None or str(controller).strip().lower() != "auto"
        args = cls(
            steering=None if absent(steering) else str(steering),
            controller=(None if absent(controller) else str(controller)) if explicit else None,
            controller_auto=not explicit and absent(alpha),
            alpha=None if absent(alpha) else model_arg_number("alpha", alpha, float),
            layer=None if absent(layer) else model_arg_number("layer", layer, int),
            overrides={k: v if PONDER_TYPES.get(k, str) is str
                       else model_arg_number(k, v, PONDER_TYPES[k])
                       for k, v in ponder.items() if not absent(v)},
            allow_backbone_mismatch=model_arg_flag("allow_backbone_mismatch",
                                                   allow_backbone_mismatch),
        )
        if args.alpha is not None and args.controller is not None:
            raise PonderError("pass either alpha= (fixed offset) or controller=, not both")
        if args.overrides.get("k_max", 1) < 1:
            raise PonderError(f"model arg k_max={args.overrides['k_max']} must be >= 1 (at 0 the "
                              "controller has one depth, alpha_start, for every question): for "
                              "one fixed offset pass alpha=<offset> instead")
        args.config({}).validate()  # bad values fail before the backbone is loaded
        return args

    def config(self, trained: dict) -> PonderConfig:
        """User args over the controller's training settings over ``PonderConfig`` defaults."""
        merged = {**{k: v for k, v in trained.items() if k in PONDER_TYPES}, **self.overrides}
        return PonderConfig(**{k: PONDER_TYPES[k](v) for k, v in merged.items()})


def load_pondering(args: PonderArgs, backbone_name: str, model_config, device,
                   backbone_sha256: str | None) -> Pondering | None:
    """Load what ``args`` asks for, or None when pondering is off.

    With no ``controller=`` the controller shipped for this backbone is used (if one is
    shipped); ``controller=none`` switches pondering off. Unset ponder settings come from the
    controller's config.json (what it was trained with), else from ``PonderConfig``.
    """
    from lm_eval_ponder.pondering.controller import load_controller
    from lm_eval_ponder.steering.vector import load_vector

    shipped = shipped_controller_dir(backbone_name)
    controller_arg = args.controller
    if args.controller_auto and shipped is not None and (
            shipped / "controller.safetensors").is_file():
        controller_arg = str(shipped)
    if args.alpha is None and controller_arg is None:
        unused = sorted(args.overrides) + [k for k in ("steering", "layer")
                                           if getattr(args, k) is not None]
        if unused:  # e.g. controller=none,granularity=token: a Direct run, whatever it says
            LOGGER.warning("pondering is off (no controller, no alpha=): model args %s have no "
                           "effect", ", ".join(unused))
        return None
    steering_dir = steering_directory(args.steering, backbone_name)
    steering = load_vector(steering_dir, model_config, backbone_sha256=backbone_sha256)
    trained: dict = {}
    controller = controller_dir = None
    layer = args.layer
    if controller_arg is not None:
        controller_dir = Path(controller_arg)
        controller, config = load_controller(controller_dir,
                                             expected_d_model=model_config.hidden_size)
        controller.to(device)
        if not args.allow_backbone_mismatch:
            check_controller_backbone(controller_dir, config.get("backbone") or {},
                                      backbone_name, backbone_sha256)
        trained = config.get("ponder") or {}
        if layer is None and config.get("layer") is not None:
            layer = int(config["layer"])
        wanted = (config.get("backbone") or {}).get("steering_sha256")
        have = short_sha(steering_dir / "steering.safetensors")
        if wanted and wanted != have:
            raise PonderError(
                f"controller {controller_dir} was trained with steering vector {wanted}, but "
                f"{steering_dir} holds {have}: pass the steering= it was trained with, or "
                "train a controller for this vector")
    return Pondering(steering=steering_at(steering_dir, steering, layer),
                     controller_dir=controller_dir, controller=controller,
                     config=args.config(trained).validate(), alpha=args.alpha)


def load_steering(directory: str | None, layer: int | None, backbone_name: str, model_config,
                  backbone_sha256: str | None) -> Steering:
    """The steering vector ``directory`` (None: the one shipped for the backbone) at ``layer``
    (None: its default layer), checked against the backbone as ``load_pondering`` checks it."""
    from lm_eval_ponder.steering.vector import load_vector

    steering_dir = steering_directory(directory, backbone_name)
    loaded = load_vector(steering_dir, model_config, backbone_sha256=backbone_sha256)
    return steering_at(steering_dir, loaded, layer)


def steering_directory(given: str | None, backbone_name: str) -> Path:
    """The steering vector's directory: the one given, else the one shipped for the backbone."""
    directory = given or shipped_controller_dir(backbone_name)
    if directory is None:
        raise PonderError(
            f"pondering needs a steering vector and none is shipped for {backbone_name!r}: "
            "pass steering=<dir> (make one with "
            "`python -m lm_eval_ponder.steer extract --pretrained ... --output DIR`)")
    return Path(directory)


def steering_at(steering_dir: Path, loaded, layer: int | None) -> Steering:
    """A loaded vector file (``steering.vector.load_vector``) at ``layer`` (None: its
    default), refused without the residual norm its offsets are fractions of."""
    layer = loaded.default_layer if layer is None else layer
    norm = loaded.residual_norm(layer)
    if norm is None:
        raise PonderError(f"steering vector {steering_dir} records no residual_norm: re-extract it")
    return Steering(steering_dir, layer, loaded.vector(layer), float(norm))

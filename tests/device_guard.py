"""A second device on a CPU-only machine, for tests: data-carrying tensors on ``meta``, and a
guard that raises on any operation mixing them with CPU tensors.

Why. The bug class this catches (a tensor the hot path created or kept on the CPU while the
model sits on a GPU) only shows on a machine with two devices, and CI has one. Plain ``meta``
tensors do not help: they carry no data, so generation (which reads tokens back) cannot run on
them, and most ops accept a CPU operand beside a meta one without complaint. Here a tensor "on
the accelerator" is an ``OnAccelerator`` wrapper reporting ``device='meta'`` around a real CPU
tensor; under ``DeviceGuard`` every aten op is checked and then run on the wrapped data, so a
whole ``generate`` or training step runs, and the first op that mixes the two devices raises
as CUDA would ("Expected all tensors to be on the same device"). The rule is CUDA's, made a
little stricter: 0-dim CPU tensors may meet accelerator tensors (PyTorch allows CPU scalars),
explicit copies (``.to``, ``copy_``) may cross, nothing else may; CPU index tensors into an
accelerator tensor, which CUDA tolerates with a host-to-device copy per call, are refused too.

The guard also counts host syncs (an accelerator tensor read back: ``.item()``, ``.cpu()``,
``.tolist()``, ``bool(t)``, ``nonzero``): ``guard.syncs`` lists them while ``guard.count_syncs``
is on, so a per-token hot path can be checked for "no host round-trip" without a GPU, as
``torch.cuda.set_sync_debug_mode("error")`` checks it on one.

Use ``accelerator`` (the device to pass around) and the ``device_guard`` fixture (conftest).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

ACCELERATOR = torch.device("meta")
aten = torch.ops.aten
# explicit transfers: the only ops allowed to take tensors of two devices
TRANSFERS = {aten._to_copy.default, aten.copy_.default}
# ops that read an accelerator tensor's values back to the host (a GPU sync)
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.is_nonzero.default,
           aten.equal.default}


class DeviceMixError(RuntimeError):
    """An op got tensors on two devices, as CUDA's "Expected all tensors to be on the same
    device" would say on a GPU."""


class OnAccelerator(torch.Tensor):
    """A CPU tensor that reports ``device='meta'``: the stand-in accelerator's tensors."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "OnAccelerator":
        out = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=ACCELERATOR, layout=elem.layout,
            requires_grad=elem.requires_grad)
        out.elem = elem
        return out

    def __repr__(self, **_: Any) -> str:  # noqa: D105
        return f"OnAccelerator({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"an accelerator stand-in tensor reached {func} outside DeviceGuard")


class AcceleratorGenerators:
    """``torch.Generator(device=<stand-in>)``: a CPU generator that reports the stand-in device.

    The dispatcher hands ops a fresh Python object for a generator, so the guard recognises
    stand-in generators by their seed (every one is seeded before use here)."""

    def __init__(self) -> None:
        self.seeds: set[int] = set()
        registry = self

        class Generator(torch.Generator):
            def __new__(cls, device=None):
                on = device is not None and torch.device(device).type == ACCELERATOR.type
                gen = super().__new__(cls, "cpu" if on else (device or "cpu"))
                gen.on_accelerator = on
                return gen

            def __init__(self, device=None) -> None:  # noqa: D107 (built in __new__)
                pass

            @property
            def device(self) -> torch.device:
                return ACCELERATOR if self.on_accelerator else super().device

            def manual_seed(self, seed: int):
                if self.on_accelerator:
                    registry.seeds.add(int(seed))
                return super().manual_seed(seed)

        self.Generator = Generator

    def on_accelerator(self, gen) -> bool:
        return gen.initial_seed() in self.seeds


def is_write(schema_arg) -> bool:
    return schema_arg.alias_info is not None and schema_arg.alias_info.is_write


class DeviceGuard(TorchDispatchMode):
    """Runs every op on the CPU data, after refusing those that mix devices (see module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.generators = AcceleratorGenerators()
        self.syncs: list[str] = []
        self.count_syncs = False
        self.ops = 0

    def read_back(self, method):
        """``Tensor.tolist``/``numpy`` for stand-in tensors: a host sync, then the data."""

        def read(t: torch.Tensor, *args, **kwargs):
            if isinstance(t, OnAccelerator):
                if self.count_syncs:
                    self.syncs.append(f"Tensor.{method.__name__}")
                t = t.elem
            return method(t, *args, **kwargs)

        return read

    def devices(self, func, flat: list) -> set[str]:
        found = set()
        for t in flat:
            if isinstance(t, OnAccelerator):
                found.add("accelerator")
            elif isinstance(t, torch.Tensor):
                if t.device.type == "meta":
                    raise DeviceMixError(f"{func}: a data-less meta tensor reached the guard "
                                         "(made outside it?)")
                if not (t.dim() == 0 and t.device.type == "cpu"):
                    found.add(t.device.type)
            elif isinstance(t, torch._C.Generator):  # CUDA: "Expected a 'cuda' device type for
                found.add("generator on " + ("accelerator" if self.generators.on_accelerator(t)
                                             else t.device.type))  # generator"
        return found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        flat, _ = tree_flatten((args, kwargs))
        found = self.refuse_mixing(func, kwargs, flat)
        on_accelerator, unwrapped_kwargs = self.placement(func, args, kwargs, found)
        if self.count_syncs:
            self.record_syncs(func, found, on_accelerator)
        out = func(*tree_map(unwrap, args), **unwrapped_kwargs)
        schema = func._schema
        if schema.returns and is_write(schema.returns[0]):  # in-place / out=: the same object
            for i, arg in enumerate(schema.arguments):
                if is_write(arg):
                    return kwargs[arg.name] if arg.name in kwargs else args[i]
        if on_accelerator:
            return tree_map(lambda t: OnAccelerator(t) if type(t) is torch.Tensor else t, out)
        return out

    def refuse_mixing(self, func, kwargs: dict, flat: list) -> set[str]:
        """The devices of an op's tensors, after refusing what a GPU refuses: a generator on
        another device than its op's tensors, and tensors on two devices (but in a transfer)."""
        found = self.devices(func, flat)
        generators = {f for f in found if f.startswith("generator on ")}
        if generators:  # a generator must sit where its op runs, or be the only thing there
            found -= generators
            where = found | {"accelerator" if kwargs.get("device") is not None and torch.device(
                kwargs["device"]).type == ACCELERATOR.type else "cpu"} if not found else found
            if {g.removeprefix("generator on ") for g in generators} != where:
                raise DeviceMixError(f"{func}: {sorted(generators)} for tensors on {sorted(where)}")
        if len(found) > 1 and func not in TRANSFERS:
            shapes = [(tuple(t.shape), "accelerator" if isinstance(t, OnAccelerator)
                       else t.device.type) for t in flat if isinstance(t, torch.Tensor)]
            raise DeviceMixError(f"{func} mixes devices {sorted(found)}: {shapes}")
        return found

    def placement(self, func, args, kwargs: dict, found: set[str]) -> tuple[bool, dict]:
        """(whether the op's result lives on the stand-in accelerator, the kwargs to run it
        with on the CPU data): where its inputs are, else where ``device=`` puts it (factories,
        ``.to``), else, for ``copy_``, where its destination is."""
        on_accelerator = "accelerator" in found
        unwrapped_kwargs = tree_map(unwrap, kwargs)
        if kwargs.get("device") is not None:  # factories and .to(device)
            on_accelerator = torch.device(kwargs["device"]).type == ACCELERATOR.type
            if on_accelerator:
                unwrapped_kwargs["device"] = torch.device("cpu")
        elif func is aten.copy_.default:
            on_accelerator = isinstance(args[0], OnAccelerator)
        return on_accelerator, unwrapped_kwargs

    def record_syncs(self, func, found: set[str], on_accelerator: bool) -> None:
        """Host syncs: a read of accelerator data on the host."""
        if "accelerator" in found and (
                func in SYNCING or (func is aten._to_copy.default and not on_accelerator)):
            self.syncs.append(str(func))


def unwrap(t):
    return t.elem if isinstance(t, OnAccelerator) else t


def on_accelerator_factory(original):
    """``torch.tensor``/``torch.as_tensor`` build data outside the dispatcher, then move it
    with Python dispatch switched off: they would make a data-less meta tensor. Build on the
    CPU and move through the guard instead."""

    def factory(data, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == ACCELERATOR.type:
            return original(data, *args, **kwargs).to(ACCELERATOR)
        return original(data, *args, device=device, **kwargs)

    return factory


@contextlib.contextmanager
def device_guard(monkeypatch=None) -> Iterator[DeviceGuard]:
    """Within: ``ACCELERATOR`` is a working second device and mixing devices raises.

    ``lm_eval``'s HFLM does not know the stand-in device: a model asked for
    ``device="meta"`` is built on the CPU by HFLM and then moved, as HFLM moves it to a GPU.
    """
    from lm_eval.models.huggingface import HFLM

    patches = contextlib.ExitStack()
    with patches:
        mp = monkeypatch or patches.enter_context(_monkeypatch())
        mp.setattr(torch, "tensor", on_accelerator_factory(torch.tensor))
        mp.setattr(torch, "as_tensor", on_accelerator_factory(torch.as_tensor))
        build = HFLM.__init__

        def hflm_init(self, *args, device=None, **kwargs):
            wanted = device is not None and torch.device(device).type == ACCELERATOR.type
            build(self, *args, device="cpu" if wanted else device, **kwargs)
            if wanted:
                self._model.to(ACCELERATOR)
                self._device = ACCELERATOR

        mp.setattr(HFLM, "__init__", hflm_init)
        autocast = torch.autocast

        def autocast_on(device_type: str, *args, **kwargs):  # autocast knows no meta
            cpu = device_type == ACCELERATOR.type
            return autocast("cpu" if cpu else device_type, *args, **kwargs)

        mp.setattr(torch, "autocast", autocast_on)
        guard = DeviceGuard()
        mp.setattr(torch, "Generator", guard.generators.Generator)
        for name in ("tolist", "numpy"):  # C++ methods that refuse tensor subclasses
            mp.setattr(torch.Tensor, name, guard.read_back(getattr(torch.Tensor, name)))
        with guard:
            yield guard


@contextlib.contextmanager
def _monkeypatch():
    import pytest

    mp = pytest.MonkeyPatch()
    try:
        yield mp
    finally:
        mp.undo()

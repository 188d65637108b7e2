"""A decode forward captured once per shape with ``torch.cuda.graph`` (``decode_step=captured``).

Why this mechanism and no other: dynamo-based capture (``torch.compile`` with CUDA graphs)
traces the model first, about 8 s per shape on a CPU core and about 14 s on the H100's host,
and the static layout's tail ladder (256, 64, 16, 8 slots) makes four shapes: about a minute
per process, against a 500-document arith run that the dynamic layout decodes in about 20 s
(both dynamo modes were built, measured slower than eager on the one GPU run, and deleted;
``docs/results/history.md``). Capturing the eager forward directly costs one warm-up forward and one recorded
forward per shape, as vLLM v1 captures its decode steps. transformers supports it: its mask
code takes the traced path (no data-dependent shortcut, so no host read) while a CUDA stream
captures (``is_tracing`` checks ``is_cuda_stream_capturing``), and a decode forward over a
``StaticCache`` writes the cache in place at a position held on the device.
``tests/engine/test_capture.py`` checks on a CPU that this path reads nothing back to the host.

A shape whose recording fails (an op CUDA graphs refuse, in a model family not yet tried)
runs eagerly with one warning, and ``failures`` keeps the reason: the run is not lost.

One graph per static cache and input shape, kept as long as that cache lives (a ``StaticSlots``
cache is kept per model, mode, slots and width). Its inputs are copied into the graph's own
token, mask and position tensors before each replay; the weights and the cache are read where
they are. The warm-up forward (on a side stream, as CUDA graphs require) writes the current
column of every slot; the cache's length is put back after it, so the replay that follows
writes that column again with the real step.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Protocol

import torch
from transformers import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

LOGGER = logging.getLogger(__name__)
STEP_INPUTS = ("input_ids", "attention_mask", "position_ids")


class Graph(Protocol):
    def replay(self) -> torch.Tensor:
        """Run the recorded forward on the current inputs; its logits."""


class CudaGraph:
    """``forward`` recorded into a ``torch.cuda.CUDAGraph`` (not run while recording)."""

    def __init__(self, forward: Callable[[], Any]) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = forward().logits

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


def warm_up_cuda(forward: Callable[[], Any]) -> None:
    """One forward on a side stream before capture, as ``torch.cuda.graph`` asks (lazy
    initialisation of cuBLAS and attention kernels must not happen while recording)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()
    torch.cuda.current_stream().wait_stream(stream)


class CapturedForward:
    """Called as the model's forward by the static decode step. On a CUDA device each (cache,
    shape) is captured at its first call and replayed after; elsewhere it is the model's own
    forward (a CPU run of ``captured`` is the static layout, eagerly). It calls ``model.forward``,
    not the module: a module hook (the progress bar's) would run only while recording, so the
    loop reports these steps to its observers (``LoopObserver.replayed_forward``) instead. ``record`` and
    ``warm_up`` replace ``CudaGraph`` and ``warm_up_cuda`` (tests drive the bookkeeping on a CPU
    with them)."""

    def __init__(self, model, *, record: Callable[[Callable[[], Any]], Graph] | None = None,
                 warm_up: Callable[[Callable[[], Any]], None] | None = None) -> None:
        self.model = model
        on_cuda = record is not None or getattr(model, "device", torch.device("cpu")).type == "cuda"
        self.record = (record or CudaGraph) if on_cuda else None
        self.warm_up = warm_up or warm_up_cuda
        self.graphs: "weakref.WeakKeyDictionary[Cache, dict[tuple, tuple[dict, Graph]]]" = \
            weakref.WeakKeyDictionary()
        self.captures = 0
        self.failures: list[str] = []

    def __call__(self, **kwargs: Any) -> Any:
        if self.record is None:
            return self.model.forward(**kwargs)
        name, cache = next((k, v) for k, v in kwargs.items() if isinstance(v, Cache))
        shape = tuple(tuple(kwargs[k].shape) for k in STEP_INPUTS)
        per_cache = self.graphs.setdefault(cache, {})
        if shape not in per_cache:
            try:
                per_cache[shape] = self.capture(name, cache, kwargs)
            except Exception as error:  # noqa: BLE001 - the run goes on, this shape eagerly
                self.failures.append(f"{type(error).__name__}: {error}".splitlines()[0][:300])
                LOGGER.warning("decode_step=captured could not record a step of shape %s "
                               "(%s); that shape runs eagerly", shape, self.failures[-1])
                per_cache[shape] = None
        entry = per_cache[shape]
        if entry is None:
            return self.model.forward(**kwargs)
        inputs, graph = entry
        for key in STEP_INPUTS:
            inputs[key].copy_(kwargs[key])
        return CausalLMOutputWithPast(logits=graph.replay())

    def summary(self) -> str:
        """What this forward made of its graphs, for a report beside a run's speed."""
        if self.record is None:
            return "no CUDA: the eager static step"
        return f"{self.captures} graphs recorded" + (
            f", {len(self.failures)} shapes eager ({self.failures[0]})" if self.failures else "")

    def capture(self, name: str, cache: Cache, kwargs: dict[str, Any]) -> tuple[dict, Graph]:
        inputs = {k: v.clone() if k in STEP_INPUTS else v for k, v in kwargs.items() if k != name}
        ref = weakref.ref(cache)  # the graph's entry must not keep its own cache alive

        def forward() -> Any:
            return self.model.forward(**inputs, **{name: ref()})

        lengths = [layer.cumulative_length.clone() for layer in cache.layers]
        try:
            self.warm_up(forward)
            graph = self.record(forward)  # records without running: the length stays put
        finally:  # undo the warm-up's step, recorded or not
            for layer, length in zip(cache.layers, lengths, strict=True):
                layer.cumulative_length.copy_(length)
        self.captures += 1
        return inputs, graph

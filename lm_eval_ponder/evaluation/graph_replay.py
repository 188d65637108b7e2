"""A decode forward replayed as a CUDA graph of the model's own kernels (``decode_step=cudagraphs``).

Why not ``torch.compile(backend="cudagraphs")``, which is what this mode used until 2026-11-27:
on an H100 (fifth session, ``docs/results.md``, "One H100") it decoded the arith ladder *slower
than eager* after its capture (24 s against 19) with 7.9 GiB peak against 2.1. Read on a CPU
(``tests/evaluation/test_graph_replay.py``; torch 2.13), dynamo's backend does two things that
defeat a decode step over a ``StaticCache``:

- it names the graph's static inputs ``range(fixed)``, the parameters aot_autograd lifts; since
  dynamo inlines ``nn.Module`` calls (``inline_inbuilt_nn_modules``, always on) nothing is
  lifted and ``fixed`` is 0, so CUDA graph trees treat every input as dynamic and copy each one,
  the weights and the whole KV cache, into graph-owned memory before every replay;
- it functionalises input mutations out of the graph (``keep_inference_input_mutations=False``),
  so the cache's in-place ``index_copy_`` becomes a copy of the whole cache returned as an
  output and copied back after the replay.

Inductor's ``mode="reduce-overhead"`` avoids both (it reads the static inputs from aot's
metadata: parameters and tensors under ``torch._dynamo.mark_static_address``, which
``StaticCache`` applies to its keys, values and length), but compiles its own kernels (about
30 s for the embedded model on an H100). ``ReplayBackend`` is dynamo's backend with those two
choices made as inductor makes them: the same CUDA graph trees, no kernel generation.

It uses torch's internal helpers (the ones dynamo's own backend imports); they are imported
when a graph is first compiled, so an incompatible torch fails there with a message naming
the other modes. Where a graph cannot be replayed (CPU tensors, an input mutated without a
static address, an op graphs cannot hold) it runs as traced, eagerly, and ``plans`` says why.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from lm_eval_ponder.errors import PonderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayPlan:
    """What one compiled graph gets: which of its inputs keep their address across replays
    (``static``), which it writes in place (``mutated``), how many of those writes were turned
    back from whole-tensor copies (``rewritten``, ``write_in_place``), and why it is not
    replayed (``skip``, ``None`` when it is)."""

    n_inputs: int
    static: tuple[int, ...]
    mutated: tuple[int, ...]
    skip: str | None
    rewritten: int = 0

    @property
    def copied(self) -> tuple[int, ...]:
        """Inputs a replay copies into graph-owned memory first (the step's own tensors:
        token ids, mask, positions)."""
        static = set(self.static)
        return tuple(i for i in range(self.n_inputs) if i not in static)


def write_in_place(graph: torch.fx.Graph) -> int:
    """Turn each ``x2 = index_copy(x, ...)`` of a graph input ``x`` whose only other use is the
    epilogue's ``x.copy_(x2)`` back into ``x.index_copy_(...)``, and drop the epilogue.

    Why: aot_autograd functionalises ``StaticCache.update``'s in-place write into a copy of the
    whole cache tensor plus a copy back at the end of the graph, twice the cache's bytes per
    step. Inductor's reinplacing pass undoes that for its own kernels; a graph of eager kernels
    runs as traced, so the same rewrite is made here. Safe because nothing else reads ``x``:
    its old value is never needed after the write. Returns the number of writes rewritten."""
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.index_copy.default:
            continue
        target = node.args[0]
        if not isinstance(target, torch.fx.Node) or target.op != "placeholder":
            continue
        others = [user for user in target.users if user is not node]
        if len(others) != 1:
            continue
        (epilogue,) = others
        if (epilogue.target is not torch.ops.aten.copy_.default
                or tuple(epilogue.args) != (target, node) or epilogue.users):
            continue
        node.target = torch.ops.aten.index_copy_.default
        graph.erase_node(epilogue)
        rewritten += 1
    if rewritten:
        graph.lint()
    return rewritten


def replay_plan(aot_model: torch.fx.GraphModule, aot_inputs: list[Any],
                n_dynamo_inputs: int, rewritten: int = 0) -> ReplayPlan:
    """The plan of one inference graph, read from aot_autograd's tracing context (call it
    inside a compiler)."""
    try:
        from torch._dynamo.backends.cudagraphs import find_input_mutations, get_device_node_mapping
        from torch._inductor.compile_fx import get_static_input_idxs
        from torch._inductor.cudagraph_utils import check_multiple_devices_or_any_cpu_nodes
        from torch._inductor.utils import get_first_incompatible_cudagraph_node, num_fw_fixed_arguments
    except ImportError as e:  # pragma: no cover - depends on the torch release
        raise PonderError(f"decode_step=cudagraphs needs torch's CUDA graph trees helpers, which "
                          f"this torch ({torch.__version__}) lacks ({e}); use decode_step="
                          f"inductor or dynamic") from e
    fixed = num_fw_fixed_arguments(n_dynamo_inputs, len(aot_inputs))
    static = tuple(sorted(set(get_static_input_idxs(fixed))))
    mutated = tuple(sorted(find_input_mutations(aot_model.graph)))
    unmarked = [i for i in mutated if i not in set(static)]
    skip = None
    if unmarked:
        skip = f"it writes inputs {unmarked} in place that have no static address"
    elif reason := check_multiple_devices_or_any_cpu_nodes(get_device_node_mapping(aot_model)):
        skip = reason
    elif node := get_first_incompatible_cudagraph_node(aot_model):
        skip = f"an op CUDA graphs cannot hold ({node.name})"
    return ReplayPlan(len(aot_inputs), static, mutated, skip, rewritten)


class ReplayBackend:
    """A ``torch.compile`` backend: each inference graph replayed by CUDA graph trees with its
    parameters and marked tensors static and its in-place writes kept in the graph.
    ``plans`` holds one ``ReplayPlan`` per graph compiled, in order."""

    def __init__(self) -> None:
        self.plans: list[ReplayPlan] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        return aot_autograd(  # graphs with autograd run as traced, not replayed
            fw_compiler=boxed_nop, bw_compiler=boxed_nop,
            inference_compiler=functools.partial(self.capture, n_dynamo_inputs=len(example_inputs)),
            keep_inference_input_mutations=True)(gm, example_inputs)

    def capture(self, aot_model: torch.fx.GraphModule, aot_inputs: list[Any], *,
                n_dynamo_inputs: int) -> Any:
        from torch._dynamo.backends.cudagraphs import get_device_index, get_stack_traces
        from torch._dynamo.backends.debugging import boxed_nop
        from torch._inductor.cudagraph_trees import cudagraphify_impl
        from torch._inductor.cudagraph_utils import get_placeholder_info

        rewritten = write_in_place(aot_model.graph)
        if rewritten:
            aot_model.recompile()
        plan = replay_plan(aot_model, aot_inputs, n_dynamo_inputs, rewritten)
        self.plans.append(plan)
        interp = boxed_nop(aot_model, aot_inputs)
        if plan.skip is not None:
            log.info("decode_step=cudagraphs runs a graph eagerly: %s", plan.skip)
            return interp
        out = cudagraphify_impl(
            interp, aot_inputs, plan.static, device_index=get_device_index(aot_model),
            is_backward=False, is_inference=True, stack_traces=get_stack_traces(aot_model),
            placeholders=get_placeholder_info(aot_model.graph),
            mutated_input_idxs=plan.mutated)
        out._boxed_call = True
        return out

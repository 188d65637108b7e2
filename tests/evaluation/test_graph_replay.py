"""``evaluation.graph_replay`` on a CPU: what a decode forward over a ``StaticCache`` would
replay on a GPU (its weights and cache static, its cache writes inside the graph, only the
step's own tensors copied), and that the graph, run as traced where it cannot replay, writes the
cache in place with the eager forward's logits."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_llama
from transformers import StaticCache

from lm_eval_ponder.evaluation.graph_replay import ReplayBackend, ReplayPlan, write_in_place

WIDTH = 16


def prefilled(model) -> StaticCache:
    cache = StaticCache(config=model.config, max_cache_len=WIDTH)
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10]]), past_key_values=cache,
              use_cache=True)
    return cache


def step(forward, cache):
    mask = torch.zeros(2, WIDTH, dtype=torch.long)
    mask[:, :4] = 1
    with torch.no_grad():
        return forward(input_ids=torch.tensor([[11], [12]]), attention_mask=mask,
                       position_ids=torch.tensor([[3], [3]]), past_key_values=cache,
                       use_cache=True, return_dict=True, logits_to_keep=1).logits


@pytest.fixture(scope="module")
def compiled():
    """One decode step of a tiny Llama compiled with the backend, beside the same step eager."""
    torch._dynamo.reset()
    model = build_tiny_llama(64, seed=0)
    backend = ReplayBackend()
    forward = torch.compile(model.forward, backend=backend, fullgraph=True, dynamic=False)
    eager_cache, graph_cache = prefilled(model), prefilled(model)
    keys = graph_cache.layers[0].keys
    before = keys.clone()
    graph_logits = step(forward, graph_cache)
    yield dict(model=model, backend=backend, eager=step(model, eager_cache),
               graph=graph_logits, keys=keys, before=before, cache=graph_cache,
               eager_cache=eager_cache)
    torch._dynamo.reset()


def test_weights_and_cache_are_static_and_only_the_steps_own_tensors_are_copied(compiled):
    """Dynamo's ``"cudagraphs"`` backend names ``range(fixed)`` static: 0 inputs once modules
    are inlined, so every replay would copy the weights and the cache."""
    (plan,) = compiled["backend"].plans
    model = compiled["model"]
    n_layers = model.config.num_hidden_layers
    assert len(plan.copied) == 3  # input ids, mask, positions
    # the parameters (and RoPE's buffer); each layer's keys, values and length
    assert len(plan.static) >= len(list(model.parameters())) + 3 * n_layers
    assert plan.n_inputs == len(plan.static) + len(plan.copied)


def test_cache_writes_stay_in_the_graph_on_static_inputs(compiled):
    """With the mutations functionalised out (dynamo's backend), ``mutated`` would be empty and
    the graph would return a copy of every cache tensor."""
    (plan,) = compiled["backend"].plans
    n_layers = compiled["model"].config.num_hidden_layers
    assert len(plan.mutated) == 3 * n_layers
    assert set(plan.mutated) <= set(plan.static)


def test_the_cache_is_written_not_copied(compiled):
    """aot_autograd turns each in-place cache write into a copy of the whole tensor and a copy
    back; ``write_in_place`` undoes it for every layer's keys and values."""
    (plan,) = compiled["backend"].plans
    assert plan.rewritten == 2 * compiled["model"].config.num_hidden_layers


def cache_write(reads_old_value: bool) -> torch.fx.GraphModule:
    """``x`` written at ``index`` as aot_autograd writes a graph input: a copy, then a copy back."""
    import operator

    graph = torch.fx.Graph()
    x, src, index = (graph.placeholder(name) for name in ("x", "src", "index"))
    new = graph.call_function(torch.ops.aten.index_copy.default, (x, 0, index, src))
    out = graph.call_function(operator.mul, (x, new)) if reads_old_value else new
    graph.call_function(torch.ops.aten.copy_.default, (x, new))
    graph.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_write_in_place_writes_an_input_nothing_else_reads():
    module = cache_write(reads_old_value=False)
    assert write_in_place(module.graph) == 1
    module.recompile()
    assert [n.target for n in module.graph.nodes if n.op == "call_function"] == [
        torch.ops.aten.index_copy_.default]
    x = torch.zeros(3, 2)
    out = module(x, torch.ones(1, 2), torch.tensor([1]))
    assert out is x or out.data_ptr() == x.data_ptr()
    assert x.tolist() == [[0, 0], [1, 1], [0, 0]]


def test_write_in_place_leaves_a_write_whose_old_value_is_read():
    assert write_in_place(cache_write(reads_old_value=True).graph) == 0


def test_on_a_cpu_the_graph_runs_as_traced_and_says_why(compiled):
    (plan,) = compiled["backend"].plans
    assert plan.skip is not None and "cpu" in plan.skip


def test_the_graph_writes_the_cache_in_place_with_the_eager_logits(compiled):
    torch.testing.assert_close(compiled["graph"], compiled["eager"], rtol=1e-5, atol=1e-5)
    cache, eager_cache = compiled["cache"], compiled["eager_cache"]
    assert cache.layers[0].keys is compiled["keys"]  # the same tensor, written in place
    assert not torch.equal(compiled["keys"][:, :, 3], compiled["before"][:, :, 3])
    for layer, twin in zip(cache.layers, eager_cache.layers):
        torch.testing.assert_close(layer.keys, twin.keys, rtol=1e-5, atol=1e-5)
        assert int(layer.cumulative_length) == int(twin.cumulative_length) == 4


def test_copied_lists_the_inputs_that_are_not_static():
    plan = ReplayPlan(n_inputs=5, static=(0, 2, 3), mutated=(2,), skip=None)
    assert plan.copied == (1, 4)

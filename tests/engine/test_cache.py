"""lm_eval_ponder.engine.cache: a layer that appends in place holds exactly what
``DynamicLayer``'s ``torch.cat`` would, copies its cache only when its spare columns run out,
and follows every way the loop reassigns it (compaction, column trim, merge)."""

from __future__ import annotations

import torch
from transformers import DynamicCache, LlamaConfig, MistralConfig
from transformers.cache_utils import DynamicLayer

from lm_eval_ponder.engine.cache import SPARE_COLUMNS, GrowingLayer, new_cache

CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)


def states(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(rows, 2, columns, 8, generator=g)
    return k, torch.randn(rows, 2, columns, 8, generator=g)


def test_appends_hold_what_cat_holds_and_copy_only_when_the_spare_runs_out():
    grown, plain = new_cache(CONFIG), DynamicCache(config=CONFIG)
    assert all(type(layer) is GrowingLayer for layer in grown.layers)
    assert all(type(layer) is DynamicLayer for layer in plain.layers)
    pointers = set()
    for step in range(2 * SPARE_COLUMNS + 3):  # a prefill of 5 columns, then one per step
        k, v = states(3, 5 if step == 0 else 1, step)
        for layer in range(2):
            gk, gv = grown.update(k, v, layer)
            pk, pv = plain.update(k, v, layer)
            assert torch.equal(gk, pk) and torch.equal(gv, pv)
        pointers.add(grown.layers[0].keys.data_ptr())
    assert grown.get_seq_length() == plain.get_seq_length() == 5 + 2 * SPARE_COLUMNS + 2
    # one buffer per SPARE_COLUMNS appends, not one per step as torch.cat makes
    assert len(pointers) <= 3


def test_the_loops_reassignments_keep_keys_and_values_the_same_length():
    """Compaction (``batch_select_indices``), the column trim (keys, then values, each sliced
    from its own current view) and the merge's ``torch.cat`` all hand the layer new tensors;
    appends go on from there, equal to a plain layer treated the same way."""
    grown, plain = new_cache(CONFIG), DynamicCache(config=CONFIG)
    for cache in (grown, plain):
        cache.update(*states(4, 6, 0), 0)
        cache.update(*states(4, 1, 1), 0)
        cache.batch_select_indices(torch.tensor([0, 2, 3]))
        layer = cache.layers[0]
        layer.keys = layer.keys[:, :, 2:, :]
        layer.values = layer.values[:, :, 2:, :]
        cache.update(*states(3, 1, 2), 0)
        layer.keys = torch.cat([layer.keys, layer.keys[:1]], dim=0)
        layer.values = torch.cat([layer.values, layer.values[:1]], dim=0)
        cache.update(*states(4, 1, 3), 0)
    a, b = grown.layers[0], plain.layers[0]
    assert a.keys.shape == a.values.shape == b.keys.shape == (4, 2, 7, 8)
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_cache_with_other_layers_is_left_as_transformers_makes_it():
    sliding = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            sliding_window=16)
    assert not any(isinstance(layer, GrowingLayer) for layer in new_cache(sliding).layers)

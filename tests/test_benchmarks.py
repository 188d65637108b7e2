"""The analysis helpers of the ``benchmarks/`` scripts whose figures go into docs/results.md:
a wrong helper there would silently print a wrong number."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from lm_eval_ponder.pondering.dynamics import halting_depth
from lm_eval_ponder.training.grpo import sample_depths

sys.path.insert(0, str(REPO / "benchmarks"))
import adaptation  # noqa: E402


@pytest.fixture
def probabilities():
    return torch.rand(6, 5, generator=torch.Generator().manual_seed(0))


def test_sampled_depths_are_the_training_policy(probabilities):
    """``depth_weights(p, "sampled")`` is the distribution GRPO's sampler draws from."""
    w = adaptation.depth_weights(probabilities.numpy().astype(float), "sampled")
    assert np.allclose(w.sum(axis=1), 1)
    gen = torch.Generator().manual_seed(1)
    draws = sample_depths(probabilities.repeat_interleave(20000, dim=0), gen).view(6, 20000)
    freq = np.stack([np.bincount(d, minlength=5) / 20000 for d in draws.numpy()])
    assert np.abs(freq - w).max() < 0.02


def test_threshold_rule_is_the_inference_rule(probabilities):
    """``depth_weights(p, "tau=0.2")`` is one-hot at the depth ``--model ponder`` halts at."""
    w = adaptation.depth_weights(probabilities.numpy().astype(float), "tau=0.2")
    assert np.array_equal(w.argmax(axis=1), halting_depth(probabilities, 0.2).numpy())
    assert np.array_equal(w.sum(axis=1), np.ones(6))

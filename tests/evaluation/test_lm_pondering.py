"""--model ponder (lm_eval_ponder.evaluation.lm) with steering switched on, on a tiny random
Llama: alpha=0 and controller=none are token-identical to the baseline, offsets change outputs,
per-row ponder accounting."""

from __future__ import annotations

import pytest
import torch
from lm_eval.api.model import CachingLM
from test_lm import requests

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.lm import PonderLM
from lm_eval_ponder.flops import controller_flops, generation_flops
from lm_eval_ponder.pondering.controller import PonderController, save_controller
from lm_eval_ponder.pondering.steered import OffsetsPerRow, Pondering
from lm_eval_ponder.steering.vector import SteeringVector, save_vector

GREEDY = {"until": ["\n\n"], "max_gen_toks": 16, "do_sample": False}


@pytest.fixture(scope="module")
def vector_dir(tiny_model_dir, tmp_path_factory):
    torch.manual_seed(1)
    vectors = torch.nn.functional.normalize(torch.randn(4, 64), dim=-1)
    meta = {"layer": 2, "residual_norm": [8.0, 9.0, 10.0, 11.0], "hidden_size": 64, "n_layers": 4}
    return save_vector(SteeringVector(vectors, [0, 1, 2, 3], meta), tmp_path_factory.mktemp("vec"))


def controller_dir(tmp_path, bias: float, d_model: int = 64):
    """A controller whose continue probability is sigmoid(bias) everywhere (weights zeroed)."""
    controller = PonderController(d_model, width=32)
    with torch.no_grad():
        for p in controller.parameters():
            p.zero_()
        last = [m for m in controller.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.bias.fill_(bias)
    return save_controller(controller, tmp_path / f"ctrl{bias}")


def make(tiny_model_dir, **kwargs):
    return PonderLM(pretrained=str(tiny_model_dir), batch_size=4, device="cpu", **kwargs)


@pytest.fixture(scope="module")
def baseline(tiny_model_dir):
    return make(tiny_model_dir).generate_until(requests(GREEDY))


def test_alpha_zero_is_token_identical(tiny_model_dir, vector_dir, baseline):
    lm = make(tiny_model_dir, steering=str(vector_dir), alpha=0.0)
    assert lm.pondering
    assert lm.generate_until(requests(GREEDY)) == baseline


def test_controller_none_is_token_identical(tiny_model_dir, vector_dir, baseline):
    lm = make(tiny_model_dir, steering=str(vector_dir), controller="none")
    assert not lm.pondering
    assert lm.generate_until(requests(GREEDY)) == baseline


def test_large_alpha_changes_outputs(tiny_model_dir, vector_dir, baseline):
    lm = make(tiny_model_dir, steering=str(vector_dir), alpha=3.0)
    assert lm.generate_until(requests(GREEDY)) != baseline


@pytest.mark.parametrize("bias,expected_depth", [(10.0, 8), (-10.0, 0)])
def test_prompt_controller_depth_and_flops(tiny_model_dir, vector_dir, tmp_path, bias,
                                           expected_depth):
    lm = make(tiny_model_dir, steering=str(vector_dir), controller=str(controller_dir(tmp_path, bias)))
    texts = lm.generate_until(requests(GREEDY))
    for text in texts:
        stats = text.stats
        assert stats["ponder_steps"] == expected_depth
        assert stats["controller_evals"] == 9  # K_max + 1 candidates, once per prompt
        expected = generation_flops(lm.flops_spec, int(stats["prompt_tokens"]), int(stats["gen_tokens"]))
        expected += controller_flops(64, width=32, n_evals=9)
        assert stats["flops"] == expected


def test_always_halting_controller_equals_alpha_start(tiny_model_dir, vector_dir, tmp_path):
    """Depth 0 means the offset is alpha_start: same text as the fixed-alpha run at that value."""
    ctrl = controller_dir(tmp_path, -10.0)
    ponder = make(tiny_model_dir, steering=str(vector_dir), controller=str(ctrl), alpha_start=2.0)
    fixed = make(tiny_model_dir, steering=str(vector_dir), alpha=2.0)
    assert ponder.generate_until(requests(GREEDY)) == fixed.generate_until(requests(GREEDY))


def test_token_granularity_counts_steps_per_token(tiny_model_dir, vector_dir, tmp_path):
    ctrl = controller_dir(tmp_path, 10.0)
    lm = make(tiny_model_dir, steering=str(vector_dir), controller=str(ctrl), granularity="token")
    for text in lm.generate_until(requests(GREEDY)):
        assert text.stats["ponder_steps"] == 8.0
        assert text.stats["controller_evals"] == 9 * text.stats["gen_tokens"]


def test_cache_refuses_baseline_for_ponder_run(tiny_model_dir, vector_dir, tmp_path):
    cache = str(tmp_path / "cache")
    CachingLM(make(tiny_model_dir), cache).generate_until(requests(GREEDY))
    with pytest.raises(PonderError, match="other model/ponder settings"):
        CachingLM(make(tiny_model_dir, steering=str(vector_dir), alpha=0.5), cache)


def test_bad_ponder_args_are_clear_errors(tiny_model_dir, vector_dir, tmp_path):
    with pytest.raises(PonderError, match="either alpha"):
        make(tiny_model_dir, steering=str(vector_dir), alpha=0.1, controller="x")
    with pytest.raises(PonderError, match="tau"):
        make(tiny_model_dir, steering=str(vector_dir), alpha=0.1, tau=2.0)
    with pytest.raises(PonderError, match="none is shipped"):
        make(tiny_model_dir, alpha=0.1)
    wrong = controller_dir(tmp_path, 1.0, d_model=32)
    with pytest.raises(PonderError):
        make(tiny_model_dir, steering=str(vector_dir), controller=str(wrong))


def test_loglikelihood_is_refused_while_pondering(tiny_model_dir, vector_dir):
    """The hook steers the last position of a forward pass: a scored continuation would be
    neither steered nor unsteered, so loglikelihood tasks are refused with pondering on."""
    from lm_eval.api.instance import Instance

    req = [Instance("loglikelihood", doc={}, arguments=("2 + 2 =", " 4"), idx=0)]
    rolling = [Instance("loglikelihood_rolling", doc={}, arguments=("some text",), idx=0)]
    steered = make(tiny_model_dir, steering=str(vector_dir), alpha=0.3)
    with pytest.raises(PonderError, match="controller=none"):
        steered.loglikelihood(req)
    with pytest.raises(PonderError, match="steers generation only"):
        steered.loglikelihood_rolling(rolling)
    plain = make(tiny_model_dir, controller="none")
    (logprob, greedy), = plain.loglikelihood(req)
    assert logprob < 0 and isinstance(greedy, bool)
    assert plain.loglikelihood_rolling(rolling)[0] < 0


@pytest.mark.parametrize("granularity", ["prompt", "token"])
def test_steering_follows_rows_that_leave_and_join(tiny_model_dir, vector_dir, tmp_path,
                                                   granularity):
    """The generation loop drops finished rows and prefills waiting ones (max_rows=2 of 4):
    each row keeps its own prompt-level offset or per-token decisions, so texts and per-row
    accounting equal HF generate's, where every row stays in the batch to the end."""
    torch.manual_seed(3)  # a random controller with a sharp head: depths differ by row/token
    controller = PonderController(64, width=32)
    with torch.no_grad():
        controller.head.weight.mul_(30.0)
        controller.head.bias.fill_(-2.0)
    ctrl = save_controller(controller, tmp_path / "random")
    args = dict(steering=str(vector_dir), controller=str(ctrl), granularity=granularity,
                alpha0=0.05, alpha_start=0.0)
    kwargs = {"until": ["I", "]", "7", "v"], "max_gen_toks": 12, "do_sample": False}
    hf = make(tiny_model_dir, generation="hf", **args).generate_until(requests(kwargs))
    loop = make(tiny_model_dir, max_rows=2, **args).generate_until(requests(kwargs))
    assert loop == hf
    for a, b in zip(loop, hf):
        assert a.stats == b.stats
    assert len({t.stats["gen_tokens"] for t in loop}) > 1, "rows must finish at different steps"
    assert len({t.stats["ponder_steps"] for t in loop}) > 1, "rows must ponder differently"


def test_rendered_rows_at_their_own_offsets_equal_fixed_alpha_runs(tiny_model_dir, vector_dir):
    """``generate_texts`` with one offset per row (the rollout cache's one call for every
    depth) gives each row what lm-eval's own path gives at that row's alpha: text and stats.
    In float32, where batch composition cannot move a greedy token."""
    lm = make(tiny_model_dir, steering=str(vector_dir), alpha=0.0, dtype="float32")
    contexts = [r.args[0] for r in requests(GREEDY)]
    alphas = [-1.5, 0.0, 2.0]
    rows = [(c, a) for a in alphas for c in contexts]
    generator = lm.generator
    got = generator.generate_texts([c for c, _ in rows], GREEDY,
                                   steer=OffsetsPerRow(generator.steering, [a for _, a in rows]))
    want = {a: generator.generate_texts(contexts, GREEDY,
                                        steer=Pondering.fixed(generator.steering, a))
            for a in alphas}
    expected = [want[a][i] for a in alphas for i in range(len(contexts))]
    assert [str(g) for g in got] == [str(w) for w in expected]
    assert [g.stats for g in got] == [w.stats for w in expected]
    assert len({str(w) for w in expected}) > len(contexts)  # the offsets do change answers

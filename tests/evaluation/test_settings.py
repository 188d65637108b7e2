"""What the ponder model args mean (lm_eval_ponder.evaluation.settings), before any weights load."""

from __future__ import annotations

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.evaluation.settings import PonderArgs, absent


def test_absent_values_as_lm_eval_passes_them():
    assert all(absent(v) for v in (None, "", "none", "None", " null "))
    assert not any(absent(v) for v in (0, "0", "auto", 0.0))


def test_defaults_use_the_shipped_controller():
    args = PonderArgs.from_model_args()
    assert args.controller_auto and args.controller is None and args.alpha is None


def test_controller_none_and_alpha_switch_auto_off():
    assert not PonderArgs.from_model_args(controller="none").controller_auto
    args = PonderArgs.from_model_args(alpha="-0.2")
    assert args.alpha == -0.2 and not args.controller_auto


def test_controller_none_through_lm_eval_means_no_pondering():
    """lm-eval 0.4.13 parses ``--model_args controller=none`` into ``controller=None``; that
    must not fall back to the shipped controller (it did: "Direct" runs were pondering)."""
    from lm_eval.utils import simple_parse_args_string

    parsed = simple_parse_args_string("controller=none")
    assert parsed == {"controller": None}
    args = PonderArgs.from_model_args(**parsed)
    assert not args.controller_auto and args.controller is None and args.alpha is None


def test_user_values_override_training_settings():
    args = PonderArgs.from_model_args(tau="0.3", k_max=None, granularity="token")
    cfg = args.config({"tau": 0.1, "k_max": 4, "alpha0": 0.02, "unknown": 1})
    assert (cfg.tau, cfg.k_max, cfg.alpha0, cfg.granularity) == (0.3, 4, 0.02, "token")


def test_bad_values_fail_before_any_loading():
    with pytest.raises(PonderError, match="either alpha"):
        PonderArgs.from_model_args(alpha=0.1, controller="some/dir")
    with pytest.raises(PonderError, match="tau"):
        PonderArgs.from_model_args(tau=1.5)
    with pytest.raises(PonderError, match="granularity"):
        PonderArgs.from_model_args(granularity="sentence")

"""What the ponder model args mean (lm_eval_ponder.generation.settings), before any weights load."""

from __future__ import annotations

import re

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.generation.settings import PonderArgs, absent


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


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": "abc"}, "model arg alpha='abc' is not a finite number"),
    ({"tau": "abc"}, "model arg tau='abc' is not a finite number"),
    ({"layer": "abc"}, "model arg layer='abc' is not an integer"),
    ({"k_max": "x"}, "model arg k_max='x' is not an integer"),
    ({"k_max": 2.5}, "model arg k_max=2.5 is not an integer"),  # not silently 2
    ({"k_max": True}, "model arg k_max=True is not an integer"),
    ({"alpha0": "nan"}, "model arg alpha0='nan' is not a finite number"),
    ({"allow_backbone_mismatch": "perhaps"}, "allow_backbone_mismatch='perhaps' is not true"),
])
def test_values_that_are_not_numbers_name_the_arg(kwargs, message):
    with pytest.raises(PonderError, match=re.escape(message)):
        PonderArgs.from_model_args(**kwargs)


def test_numbers_arrive_typed():
    args = PonderArgs.from_model_args(tau="0.3", k_max=4.0, layer="7", alpha0=1,
                                      allow_backbone_mismatch=True)
    assert args.overrides == {"tau": 0.3, "k_max": 4, "alpha0": 1.0}
    assert args.layer == 7 and args.allow_backbone_mismatch


def test_a_controller_for_another_backbone_is_refused_naming_both(tmp_path):
    from lm_eval_ponder.generation.settings import check_controller_backbone

    same = {"backbone_name": "smollm2-135m-instruct", "backbone_sha256": "b1" * 32}
    check_controller_backbone(tmp_path, same, "smollm2-135m-instruct", "b1" * 32)
    check_controller_backbone(tmp_path, {"backbone_name": "Qwen2.5-0.5B-Instruct"},
                              "qwen2.5-0.5b-instruct", None)  # a local copy of the Hub model
    check_controller_backbone(tmp_path, {}, "anything", None)  # records nothing: not checked
    with pytest.raises(PonderError, match=re.escape(
            f"controller {tmp_path} was trained for backbone 'smollm2-135m-instruct' (sha256 "
            f"{'b1' * 8}), but this run's backbone is 'smollm2-135m-instruct' (sha256 "
            f"{'c2' * 8})")):
        check_controller_backbone(tmp_path, same, "smollm2-135m-instruct", "c2" * 32)
    with pytest.raises(PonderError, match="'other'.*'tiny'.*allow_backbone_mismatch=true"):
        check_controller_backbone(tmp_path, {"backbone_name": "other"}, "tiny", None)


def test_ponder_settings_without_pondering_are_named_in_a_warning(caplog):
    """``controller=none,granularity=token`` is a Direct run: say that the setting does
    nothing rather than let the run's recorded model args suggest otherwise."""
    from lm_eval_ponder.generation.settings import load_pondering

    args = PonderArgs.from_model_args(controller="none", granularity="token", tau="0.3")
    with caplog.at_level("WARNING", logger="lm_eval_ponder.generation.settings"):
        assert load_pondering(args, "no-such-backbone", None, "cpu", None) is None
    assert "granularity, tau have no effect" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lm_eval_ponder.generation.settings"):
        load_pondering(PonderArgs.from_model_args(controller="none"), "x", None, "cpu", None)
    assert caplog.text == ""

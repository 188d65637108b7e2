"""The trainer's config (lm_eval_ponder.training.config): YAML file, --key value overrides,
and clear errors for unknown keys and invalid combinations."""

from __future__ import annotations

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training.config import parse_args


def test_bad_config_is_a_clear_error(tmp_path):
    with pytest.raises(PonderError, match="unknown config key 'grpo.nope'"):
        parse_args(["--output", str(tmp_path), "--grpo.nope", "1"])
    with pytest.raises(PonderError, match="output"):
        parse_args([])
    with pytest.raises(PonderError, match="rollout.samples must be 1"):
        parse_args(["--output", str(tmp_path), "--ponder.granularity", "token",
                     "--rollout.samples", "4"])
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("grpo:\n  max_steps: 7\nseed: 3\n")
    cfg = parse_args(["--config", str(yaml_file), "--output", str(tmp_path),
                      "--grpo.learning_rate=0.001"])
    assert (cfg.grpo.max_steps, cfg.seed, cfg.grpo.learning_rate) == (7, 3, 0.001)


def test_old_key_names_still_work_with_a_warning(tmp_path, caplog):
    """Keys renamed to TRL's vocabulary keep their old spelling, flat and nested in YAML."""
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("grpo:\n  steps: 7\n  group_size: 4\nlog_every: 5\n")
    with caplog.at_level("WARNING", logger="lm_eval_ponder"):
        cfg = parse_args(["--config", str(yaml_file), "--output", str(tmp_path),
                          "--grpo.lr=0.001", "--rollout.max_gen_toks", "9"])
    assert (cfg.grpo.max_steps, cfg.grpo.num_generations, cfg.logging_steps,
            cfg.grpo.learning_rate, cfg.rollout.max_completion_length) == (7, 4, 5, 0.001, 9)
    assert "'grpo.steps' is now 'grpo.max_steps'" in caplog.text


def test_every_config_key_has_help():
    from lm_eval_ponder.training.config import TrainConfig, flat_keys

    missing = [key for key, _, help_ in flat_keys(TrainConfig()) if not help_]
    assert not missing, missing


def test_backbone_options_of_the_model_are_config_keys(tmp_path):
    """``--dtype`` and ``--parallelize`` as ``--model ponder`` takes them (the trainer used to
    reject ``--dtype`` as an unknown key); a bad dtype is one clear line."""
    cfg = parse_args(["--output", str(tmp_path), "--dtype", "bfloat16", "--parallelize", "true"])
    assert (cfg.dtype, cfg.parallelize) == ("bfloat16", True)
    assert parse_args(["--output", str(tmp_path)]).dtype is None  # native: decided at load
    with pytest.raises(PonderError, match="dtype must be one of"):
        parse_args(["--output", str(tmp_path), "--dtype", "int8"])

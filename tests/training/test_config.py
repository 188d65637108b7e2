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
    yaml_file.write_text("grpo:\n  steps: 7\nseed: 3\n")
    cfg = parse_args(["--config", str(yaml_file), "--output", str(tmp_path), "--grpo.lr=0.001"])
    assert (cfg.grpo.steps, cfg.seed, cfg.grpo.lr) == (7, 3, 0.001)

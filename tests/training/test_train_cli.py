"""``python -m lm_eval_ponder.train`` (lm_eval_ponder.training.cli): --help lists every config
key."""

from __future__ import annotations

import pytest

from lm_eval_ponder.training.cli import main


def test_help_lists_every_key(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for key in ("--grpo.max_steps", "--grpo.t1", "--reward.lambda_flops", "--rollout.prompts",
                "--ponder.k_max"):
        assert key in text

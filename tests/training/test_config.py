"""The trainer's config (lm_eval_ponder.training.config): YAML file, --key value overrides,
and clear errors for unknown keys and invalid combinations."""

from __future__ import annotations

import re

import pytest

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training.config import parse_args
from lm_eval_ponder.typed import WrongType, convert


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


def test_values_of_the_wrong_type_name_their_key(tmp_path):
    """A string where a number belongs used to travel to the first comparison that used it
    (``'>' not supported between 'str' and 'int'`` in grpo.py); now the key and value are
    named, from the command line and from YAML (which names the file too)."""
    out = ["--output", str(tmp_path)]
    cases = {
        ("--grpo.learning_rate", "fast"): "config key 'grpo.learning_rate' must be a number, "
                                          "got 'fast'",
        ("--grpo.max_steps", "2.5"): "'grpo.max_steps' must be an integer, got 2.5",
        ("--parallelize", "maybe"): "'parallelize' must be true or false, got 'maybe'",
        ("--rollout.prompts", "{arith_ponder: x}"): "'rollout.prompts.arith_ponder' must be "
                                                   "an integer",
        ("--reward.weights.acc", "x"): "'reward.weights.acc' must be a number",
        ("--reward.rep_betas", "[1, 2]"): "'reward.rep_betas' must be a list of 3 values",
        ("--grpo", "3"): "'grpo' holds nested keys",
    }
    for argv, message in cases.items():
        with pytest.raises(PonderError, match=re.escape(message)):
            parse_args(out + list(argv))
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("grpo:\n  max_steps: ten\n")
    with pytest.raises(PonderError, match=re.escape(f"{yaml_file}: config key 'grpo.max_steps' "
                                                    "must be an integer, got 'ten'")):
        parse_args(["--config", str(yaml_file)] + out)


def test_values_read_as_the_fields_type(tmp_path):
    cfg = parse_args(["--output", "2024", "--grpo.learning_rate", "1e-3", "--layer", "3",
                      "--reward.ppl_baseline", "2", "--steering", "null",
                      "--reward.rep_betas", "[1, 2, 3]"])
    assert (cfg.output, cfg.grpo.learning_rate, cfg.layer, cfg.reward.ppl_baseline,
            cfg.steering, cfg.reward.rep_betas) == ("2024", 0.001, 3, 2.0, None, (1.0, 2.0, 3.0))


def test_a_mapping_replaces_a_mapping_field_and_sets_a_sections_keys(tmp_path):
    """``rollout.prompts`` and ``reward.weights`` are fields: a mapping given to one replaces it
    (``{arith_ponder: 4}`` trains on arith alone, as it always has; a merge would keep
    gsm8k's 14). ``grpo``, ``reward`` are sections: a mapping sets the keys it names,
    the others keep theirs; old key names inside it are renamed."""
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("rollout:\n  prompts: {gsm8k_ponder: 3}\nreward:\n  weights: {acc: 2}\n")
    cfg = parse_args(["--config", str(yaml_file), "--output", str(tmp_path)])
    assert cfg.rollout.prompts == {"gsm8k_ponder": 3} and cfg.reward.weights == {"acc": 2.0}
    assert cfg.rollout.max_completion_length == 256 and cfg.reward.len_target == 64
    cfg = parse_args(["--output", str(tmp_path), "--rollout.prompts", '{"arith_ponder": 4}',
                      "--grpo", "{max_steps: 3, lr: 0.01}", "--rollout.prompts.gsm8k_ponder", "2"])
    assert cfg.rollout.prompts == {"arith_ponder": 4, "gsm8k_ponder": 2}
    assert (cfg.grpo.max_steps, cfg.grpo.learning_rate, cfg.grpo.t1) == (3, 0.01, 500)
    assert (cfg.reward.rep_betas, cfg.reward.balance) == ((0.02, 0.05, 0.1), ("flops",))
    with pytest.raises(PonderError, match=re.escape("unknown config key 'seed.x'")):
        parse_args(["--output", str(tmp_path), "--seed.x", "1"])


def test_unreadable_config_files_are_one_line_naming_the_file(tmp_path):
    """Not UTF-8 (was UnicodeDecodeError's traceback, issue 55), not YAML (a YAML error spans
    several lines), a key twice, not a mapping: each one line that names the file."""
    cases = {b"# r\xe9glages\nseed: 3\n": "'utf-8' codec can't decode",
             b"grpo: [\n": "did not find expected node content",
             b"seed: 1\nseed: 2\n": "found duplicate key seed",
             b"- seed\n": "must hold a mapping of config keys"}
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"c{i}.yaml"
        path.write_bytes(text)
        with pytest.raises(PonderError, match=re.escape(message)) as caught:
            parse_args(["--config", str(path), "--output", str(tmp_path)])
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_prompts_name_tasks_with_a_training_split(tmp_path):
    """``{arith: 4}`` ended in lm-eval's ``KeyError: 'arith'`` once the backbone had loaded
    (issue 55); now before anything loads, naming the tasks there are. MATH500 has no training
    split, so its task is refused too."""
    out = ["--output", str(tmp_path)]
    for task in ("arith", "math500_ponder"):
        with pytest.raises(PonderError, match=re.escape(f"rollout.prompts names '{task}'")) as e:
            parse_args(out + ["--rollout.prompts", f'{{"{task}": 4}}'])
        assert "arith_ponder" in str(e.value) and "gsm8k_ponder_cot" in str(e.value)
    assert parse_args(out + ["--rollout.prompts", "{gsm8k_ponder_cot: 2}"]).rollout.prompts == \
        {"gsm8k_ponder_cot": 2}


def test_interpolations_resolve_or_name_their_key(tmp_path):
    """Interpolation: ``${output}`` in another key is that key's value; one that names no key
    is one line naming the key that holds it."""
    cfg = parse_args(["--output", str(tmp_path), "--cache_dir", "${output}/cache"])
    assert cfg.cache_dir == f"{tmp_path}/cache"
    with pytest.raises(PonderError, match=re.escape("config key 'cache_dir': Interpolation key "
                                                    "'nowhere' not found")):
        parse_args(["--output", str(tmp_path), "--cache_dir", "${nowhere}"])


def test_values_convert_to_their_fields_type():
    """``typed.convert``, the one type check under the trainer's config and a controller's
    config.json: what YAML leaves to the reader converts; what cannot mean the type is refused
    at its key (an entry's own dotted key inside a mapping or a list)."""
    ok = [("1e-3", float, 0.001), (3, float, 3.0), (4.0, int, 4), ("7", int, 7),
          (2024, str, "2024"), ("true", bool, True), (None, int | None, None),
          ([1, 2, 3], tuple[float, float, float], (1.0, 2.0, 3.0)),
          (["flops"], tuple[str, ...], ("flops",)), ({"a": "2"}, dict[str, int], {"a": 2})]
    for value, hint, expected in ok:
        assert convert(value, hint, "k") == expected, (value, hint)
    bad = [(True, int, "k"), (2.5, int, "k"), ("fast", float, "k"), ("maybe", bool, "k"),
           ([1, 2], tuple[float, float, float], "k"), ({"a": "x"}, dict[str, int], "k.a"),
           ([1, "x"], tuple[float, ...], "k.1"), (None, int, "k"), ({1: 2}, dict[str, int], "k")]
    for value, hint, key in bad:
        with pytest.raises(WrongType) as caught:
            convert(value, hint, "k")
        assert caught.value.key == key, (value, hint)

"""Which configuration produced a run: the key that keeps different settings apart in the report.

A method label ("FP-Direct") says what was compared, not how it was run: two runs of one method
with another dtype, backbone file, steering vector, controller or generation kwargs are
different results, and a leaderboard keyed by the label alone would silently keep one of them.
A run's identity is therefore

- the model: for ``--model ponder`` its fingerprint (``PonderLM.fingerprint``, which the model
  writes into the results JSON as ``config.ponder_fingerprint``: backbone and its source file's
  hash, dtype, generation path, steering vector, controller and ponder settings); for any other
  model (``hf``, ``vllm``, or ponder results written before the fingerprint was recorded) the
  model name, its model args and the dtype lm-eval reports, less the args that only decide
  where and how fast it runs (``RUNTIME_ARGS``);
- the generation: the task's ``generation_kwargs`` as lm-eval used them (``--gen_kwargs``
  merged in), its ``repeats`` and ``num_fewshot``, and the chat template and system instruction
  hashes lm-eval records.

``distinguish`` names what differs between runs that share a label, so the report can show
"FP-Direct [dtype=bfloat16]" next to "FP-Direct [dtype=float32]" rather than merge them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

# model args that change where or how fast a model runs, not what it generates
RUNTIME_ARGS = frozenset({"device", "batch_size", "max_batch_size", "parallelize", "max_rows",
                          "max_cache_gib"})
# a difference is shown as "key=value" when at most this many keys differ and each value is
# at most this long; otherwise as a short hash of the model or generation part
READABLE_KEYS = 3
READABLE_VALUE = 24


def digest(obj: Any) -> str:
    """8 hex digits of the SHA-256 of ``obj`` as canonical JSON: a stable, short name."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:8]


def parse_model_args(args: str | dict | None) -> dict[str, Any]:
    """lm-eval records ``model_args`` as the CLI string ("a=1,b=x") or as a dict; a string is
    read with lm-eval's own parser, so both spellings of one setting have one identity and mean
    what the model received ("none" is None, "0.5" a float)."""
    from lm_eval.utils import simple_parse_args_string

    if isinstance(args, str):
        args = simple_parse_args_string(args)
    return {str(k).strip(): v for k, v in (args or {}).items()}


@dataclass(frozen=True)
class Identity:
    """The model part (shared by every task of one lm-eval run) and the generation part."""

    model: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)

    @property
    def model_digest(self) -> str:
        return digest(self.model)

    @property
    def digest(self) -> str:
        return digest({"model": self.model, "generation": self.generation})

    @classmethod
    def of(cls, data: dict, task: str) -> Identity:
        """The identity of ``task`` in one lm-eval results JSON."""
        config = data.get("config") or {}
        fingerprint = config.get("ponder_fingerprint")
        if isinstance(fingerprint, dict):
            model = {"model": "ponder", **fingerprint}
            if model.get("backbone_sha256"):  # the weights say which; the spelling (a path of
                model.pop("backbone", None)  # the machine that ran it, before 2026-12-04) not
        else:
            args = parse_model_args(config.get("model_args"))
            model = {"model": str(config.get("model")),
                     **{k: v for k, v in args.items() if k not in RUNTIME_ARGS}}
            if config.get("model_dtype"):  # what "auto" (or no dtype) resolved to
                model["dtype"] = str(config["model_dtype"])
        task_config = (data.get("configs") or {}).get(task) or {}
        generation = dict(task_config.get("generation_kwargs") or {})
        for key in ("repeats", "num_fewshot"):
            if task_config.get(key) not in (None, 0, 1):
                generation[key] = task_config[key]
        for key in ("chat_template_sha", "system_instruction_sha"):
            if data.get(key):
                generation[key] = data[key]
        return cls(model, generation)


def flatten(obj: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys: {"pondering": {"tau": 0.5}} -> {"pondering.tau": 0.5}."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def differing_keys(dicts: list[dict[str, Any]]) -> list[str]:
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({json.dumps(d.get(k), default=str) for d in dicts}) > 1]


# the converted-GGUF cache names its directories <gguf stem>-<first 16 hex of its SHA-256>
CONVERTED_SUFFIX = re.compile(r"-[0-9a-f]{16}$")


def render(value: Any) -> str:
    """A value as a page shows it: dtypes without "torch.", and a local path as the name of what
    it holds, the last part less the converted-GGUF cache's hash suffix
    (``~/.cache/.../SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f`` -> ``SmolLM2-135M-Instruct.Q4_1``):
    a published page names no directory of the machine that made it; the SHA-256 beside it
    identifies the weights. Display only: identities and their digests keep the values as
    recorded."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.removeprefix("torch.")  # dtypes: "torch.bfloat16" -> "bfloat16"
    if not text.startswith(("/", "~")) or text.rstrip("/") in ("", "~"):
        return text
    return CONVERTED_SUFFIX.sub("", PurePath(text.rstrip("/")).name)


def shown(values: dict[str, Any], keys: list[str]) -> str:
    """``key=value`` for the differing keys (the key's last dotted part)."""
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={render(values.get(k))}" for k in keys)


def readable(dicts: list[dict[str, Any]], keys: list[str]) -> bool:
    """Whether ``key=value`` is short enough to read for every run of a group; when it is not
    for one, all of them get a hash, so a group is labelled one way."""
    return len(keys) <= READABLE_KEYS and all(
        len(render(d.get(k))) <= READABLE_VALUE for d in dicts for k in keys)


def distinguish(members: list[tuple[str, Identity]]) -> list[str]:
    """For runs of one method (``(dataset, identity)`` each), a label suffix per run that tells
    different configurations apart: empty when there is only one, else what differs.

    Model settings are compared across all datasets (one configuration is one row of the
    leaderboard); generation kwargs only within a dataset, since tasks legitimately differ in
    them. Whenever the readable form would not separate two identities, hashes are used.
    """
    models = {i.model_digest: flatten(i.model) for _, i in members}
    model_keys = differing_keys(list(models.values())) if len(models) > 1 else []
    per_dataset: dict[str, list[dict]] = defaultdict(list)
    for dataset, i in members:
        per_dataset[dataset].append(flatten(i.generation))
    gen_keys = sorted({k for dicts in per_dataset.values() for k in differing_keys(dicts)})

    model_words = readable(list(models.values()), model_keys)
    gen_words = readable([d for dicts in per_dataset.values() for d in dicts], gen_keys)

    def suffix(i: Identity, words: bool) -> str:
        parts = []
        if model_keys:
            parts.append(shown(flatten(i.model), model_keys) if words and model_words
                         else f"model {i.model_digest}")
        if gen_keys:
            parts.append(shown(flatten(i.generation), gen_keys) if words and gen_words
                         else f"gen {digest(i.generation)}")
        return ", ".join(parts)

    def separates(suffixes: list[str]) -> bool:
        # one identity per (dataset, suffix), and one model per suffix (a row is one model)
        cells: dict[tuple[str, str], set[str]] = defaultdict(set)
        rows: dict[str, set[str]] = defaultdict(set)
        for (dataset, i), s in zip(members, suffixes):
            cells[(dataset, s)].add(i.digest)
            rows[s].add(i.model_digest)
        return all(len(v) == 1 for v in [*cells.values(), *rows.values()])

    words = [suffix(i, True) for _, i in members]
    return words if separates(words) else [suffix(i, False) for _, i in members]

"""Sample logs without benchmark text, so finished suite runs on GSM8K, MATH500 and GPQA can be
committed and a leaderboard can span sessions and machines.

lm-eval's ``--log_samples`` file holds each question, its prompt and the model's answer: GPQA
text must never enter the repository, and GSM8K/MATH500 text has no business there either. The
report needs none of it: it reads per-question scores, accounting, the level, and (to refuse
pooling two runs that disagree) whether two answers are the same. A stripped log keeps exactly
that, with the answer replaced by its SHA-256; the report reads it in place of the full log
when the full one is absent. Case studies, which quote text, skip stripped runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import atomic_write

SUFFIX = ".stripped.jsonl"
# Document fields that are labels, never text (level, subject, identifiers).
DOC_KEEP = ("id", "level", "n_ops", "subject", "unique_id", "high-level domain", "subdomain")
# lm-eval's own per-sample hashes: they identify a question without quoting it.
HASH_KEEP = ("doc_hash", "prompt_hash", "target_hash")


def answers_digest(sample: dict) -> str:
    """One value per distinct set of answers: what pooling compares when the text is gone."""
    if "resps_sha256" in sample:
        return sample["resps_sha256"]
    blob = json.dumps(sample.get("resps"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def strip_sample(sample: dict) -> dict:
    """A sample as the report needs it: numbers, labels and hashes, no text."""
    out: dict = {"doc_id": sample["doc_id"]}
    doc = sample.get("doc") or {}
    out["doc"] = {k: doc[k] for k in DOC_KEEP if k in doc
                  and isinstance(doc[k], (int, float, str)) and len(str(doc[k])) <= 64}
    for key in HASH_KEEP:
        if key in sample:
            out[key] = sample[key]
    if "filter" in sample:
        out["filter"] = sample["filter"]
    for key, value in sample.items():  # the metrics: numbers only
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "doc_id":
            out[key] = value if math.isfinite(value) else None
    out["resps_sha256"] = answers_digest(sample)
    return out


def stripped_path(samples: Path) -> Path:
    return samples.with_name(samples.name[:-len(".jsonl")] + SUFFIX)


def strip_file(samples: Path) -> Path:
    """Write the stripped twin of an lm-eval samples log (beside it) and return its path."""
    if not samples.name.startswith("samples_") or not samples.name.endswith(".jsonl") \
            or samples.name.endswith(SUFFIX):
        raise PonderError(f"not an lm-eval samples log: {samples}")
    target = stripped_path(samples)

    def write(tmp: str) -> None:
        with open(samples) as f, open(tmp, "w") as out:
            for n, line in enumerate(f, 1):
                try:
                    sample = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PonderError(f"{samples}, line {n}: not JSON ({e}); the run was cut "
                                      "off? re-run it") from e
                out.write(json.dumps(strip_sample(sample)) + "\n")

    # never a half-written log under the name the report reads; a temporary name of this
    # writer's own, since two suites started side by side both strip the finished runs
    atomic_write(target, write)
    return target


def strip_tree(root: Path) -> list[Path]:
    """Stripped twins for every samples log under ``root`` that lacks an up-to-date one."""
    made = []
    for samples in sorted(Path(root).rglob("samples_*.jsonl")):
        if samples.name.endswith(SUFFIX):
            continue
        twin = stripped_path(samples)
        if not twin.is_file() or twin.stat().st_mtime < samples.stat().st_mtime:
            made.append(strip_file(samples))
    return made

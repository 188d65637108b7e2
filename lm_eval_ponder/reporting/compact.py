"""Per-sample logs in the form the repository keeps: one small xz file per run, holding what
the reports read and no benchmark text, so finished runs can be committed and a leaderboard
can span sessions and machines while the tracked tree stays small (the measurements:
docs/design/repository.md, "Samples logs").

The compact log (``COMPACT``) keeps, per line of lm-eval's ``--log_samples`` file, ``doc_id``,
the document's labels (``DOC_KEEP``), ``filter``, every numeric metric and ``resps_sha256``
(pooling and ``testset.py verify`` compare answers only for equality: the first 16 hex digits
of their SHA-256, a chance collision out of reach; the full hash cost 32 incompressible bytes
per question); for our own synthetic data (``TEXT_KEPT``) also the document, target and prompt
(case studies quote them, ``testset.py`` computes z_0 from the prompts), and the answers in a
second file (``ANSWERS``), which ``read_samples`` merges back when present. Dropped, since no
reader uses them: lm-eval's doc/prompt/target hashes, ``metrics``, and ``filtered_resps``
where it is what the "none" filter makes of ``resps``.

The readers take every form a run may have: the full log (preferred), the compact log, and the
older text-free twin (``STRIPPED``, full hash). Case studies skip runs whose answers are not at
hand.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from lm_eval_ponder import registry
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import atomic_write_text, read_jsonl, write_jsonl_xz

FULL = ".jsonl"
COMPACT = ".compact.jsonl.xz"
ANSWERS = ".answers.jsonl.xz"
STRIPPED = ".stripped.jsonl"  # the text-free twin of earlier versions: read, no longer written
# The order a run's logs are read in: the first present wins.
PREFERENCE = (FULL, COMPACT, STRIPPED)
# Datasets that are our own synthetic data (the registry's ``synthetic``): their documents,
# prompts and answers may be kept.
TEXT_KEPT = frozenset(d.name for d in registry.DATASETS if d.synthetic)
# Document fields that are labels, never text (level, subject, identifiers).
DOC_KEEP = ("id", "level", "n_ops", "subject", "unique_id", "high-level domain", "subdomain")
DIGEST_HEX = 16


def answers_digest(sample: dict) -> str:
    """One value per distinct set of answers: what pooling compares when the text is gone."""
    if "resps_sha256" in sample:
        return sample["resps_sha256"][:DIGEST_HEX]
    blob = json.dumps(sample.get("resps"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:DIGEST_HEX]


def default_filtered(resps: list) -> list:
    """What lm-eval's "none" filter logs as ``filtered_resps``: each request's one answer, or
    all of a request's answers when it has several (Best-of-N)."""
    return [r[0] if isinstance(r, list) and len(r) == 1 else r for r in resps]


def compact_sample(sample: dict, keep_text: bool) -> tuple[dict, dict | None]:
    """A sample as the reports need it, and (``keep_text``, when it has answers) its answers."""
    doc = sample.get("doc") or {}
    out: dict = {"doc_id": sample["doc_id"], "doc": dict(doc) if keep_text else doc_labels(doc)}
    kept = ("target", "arguments", "filter") if keep_text else ("filter",)
    out.update({key: sample[key] for key in kept if key in sample})
    for key, value in sample.items():  # the metrics: numbers only
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "doc_id":
            out[key] = value if math.isfinite(value) else None
    out["resps_sha256"] = answers_digest(sample)
    if not keep_text or "resps" not in sample:
        return out, None
    answers = {"doc_id": sample["doc_id"], "resps": sample["resps"]}
    if sample.get("filtered_resps") != default_filtered(sample["resps"]):
        answers["filtered_resps"] = sample.get("filtered_resps")
    return out, answers


def doc_labels(doc: dict) -> dict:
    """A document's labels (``DOC_KEEP``: short values, never text)."""
    return {k: doc[k] for k in DOC_KEEP if k in doc
            and isinstance(doc[k], (int, float, str)) and len(str(doc[k])) <= 64}


def drop_text_tree(root: Path) -> int:
    """Rewrite every compact log under ``root`` without the texts a ``TEXT_KEPT`` dataset keeps
    (document, target, prompt), for runs whose readers need only labels, metrics and answer
    digests: the model organism's, whose 150 runs kept 20 KB of prompts each, a fifth of the
    tree's limit. How many logs it rewrote."""
    changed = 0
    for log in sorted(Path(root).rglob(f"samples_*{COMPACT}")):
        rows = read_jsonl(log)
        out = [{**{k: v for k, v in r.items() if k not in ("target", "arguments")},
                "doc": doc_labels(r.get("doc") or {})} for r in rows]
        if out != rows:
            write_jsonl_xz(log, out)
            changed += 1
    return changed


def form_of(log: Path) -> str | None:
    """Which form of a samples log a file is (``COMPACT``, ``ANSWERS``, ``STRIPPED`` or
    ``FULL``), None for any other file."""
    if not log.name.startswith("samples_"):
        return None
    return next((s for s in (COMPACT, ANSWERS, STRIPPED, FULL) if log.name.endswith(s)), None)


def base_of(log: Path) -> str:
    """A log's name without its form's suffix: samples_<task>_<stamp>."""
    form = form_of(log)
    if form is None:
        raise PonderError(f"not an lm-eval samples log: {log}")
    return log.name[:-len(form)]


def compact_path(log: Path) -> Path:
    return log.with_name(base_of(log) + COMPACT)


def answers_path(log: Path) -> Path:
    return log.with_name(base_of(log) + ANSWERS)


def compact_file(log: Path) -> Path:
    """Write the compact log of a full samples log (or of an older text-free twin) beside it,
    with its answers file for a ``TEXT_KEPT`` dataset, and return the compact log's path."""
    if form_of(log) not in (FULL, STRIPPED):
        raise PonderError(f"not an lm-eval samples log: {log}")
    keep_text = registry.dataset_of(log.name[len("samples_"):]) in TEXT_KEPT  # samples_<task>_...
    pairs = [compact_sample(s, keep_text) for s in read_jsonl(log)]
    answers = [a for _, a in pairs if a is not None]
    # the answers first: a compact log never names answers that are not beside it yet. Each
    # file is written under a temporary name of this writer's own, since two suites started
    # side by side both compact the finished runs
    if answers:
        write_jsonl_xz(answers_path(log), answers)
    target = compact_path(log)
    write_jsonl_xz(target, [s for s, _ in pairs])
    return target


# torch's collect_env report, as lm-eval stores it in every results JSON (``pretty_env_info``):
# these lines say which machine and software ran a figure; the rest (lscpu's padded table,
# cache sizes, the vulnerability list, the whole CPU flags line) is 4 KB a run that no reader
# uses, 40% of the results JSONs the tree keeps (0.6 MB of 1.5 MB)
ENV_KEPT = ("PyTorch version", "OS", "Python version", "Is CUDA available", "CUDA runtime version",
            "GPU models and configuration", "Nvidia driver version", "CPU(s)", "Vendor ID",
            "Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)")
# the CPU flags that decide a CPU figure's speed (bf16 native or emulated, docs/results/speed.md)
VECTOR_UNITS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
ENV_MARK = "[kept by lm_eval_ponder.reporting.compact: the lines that name the machine]"


def compact_env(text: str) -> str:
    """``pretty_env_info`` cut to ``ENV_KEPT``'s lines, padding collapsed, and the CPU's flags
    reduced to ``VECTOR_UNITS``; unchanged if already cut."""
    if text.startswith(ENV_MARK):
        return text
    kept = [ENV_MARK]
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ENV_KEPT:
            kept.append(f"{key.strip()}: {value.strip()}")
        elif sep and key.strip() == "Flags":
            units = " ".join(u for u in VECTOR_UNITS if u in value.split())
            kept.append(f"Flags (vector units only): {units or 'none of ' + ', '.join(VECTOR_UNITS)}")
    return "\n".join(kept)


def compact_results(path: Path) -> bool:
    """Rewrite one lm-eval results JSON as the tree keeps it: ``pretty_env_info`` cut by
    ``compact_env`` and no indentation (every reader parses it; ``python -m json.tool`` shows it
    indented). Returns whether it changed; a second pass changes nothing."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except ValueError:
        return False  # not lm-eval's (or cut off): left for its reader to name
    if not isinstance(data, dict):
        return False
    if isinstance(data.get("pretty_env_info"), str):
        data["pretty_env_info"] = compact_env(data["pretty_env_info"])
    out = json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"
    if out == text:
        return False
    atomic_write_text(Path(path), out)
    return True


def compact_tree(root: Path) -> list[Path]:
    """Compact logs for every samples log under ``root`` that lacks an up-to-date one: full
    logs, and the text-free twins of runs whose full log is gone; and every results JSON
    compacted (``compact_results``)."""
    for results in sorted(Path(root).rglob("results_*.json")):
        compact_results(results)
    made = []
    for log in sorted(Path(root).rglob("samples_*")):
        form = form_of(log)
        if form not in (FULL, STRIPPED) or \
                (form == STRIPPED and log.with_name(base_of(log) + FULL).is_file()):
            continue  # not a source, or a twin whose full log is the better source
        target = compact_path(log)
        if not target.is_file() or target.stat().st_mtime < log.stat().st_mtime:
            made.append(compact_file(log))
    return made


# ----------------------------------------------------------------------------- reading
def run_log(results: Path, task: str) -> Path | None:
    """The samples log of ``task`` beside one lm-eval results file, in ``PREFERENCE`` order."""
    stamp = results.stem[len("results_"):]
    for suffix in PREFERENCE:
        candidate = results.parent / f"samples_{task}_{stamp}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def latest_log(directory: Path, task: str) -> Path | None:
    """The samples log of the newest run of ``task`` (the lm-eval task name) under
    ``directory``, in ``PREFERENCE`` order among that run's forms."""
    runs: dict[str, dict[str, Path]] = {}
    for log in directory.rglob(f"samples_{task}_*"):
        form = form_of(log)
        stamp = log.name[len(f"samples_{task}_"):-len(form)] if form else ""
        if form in PREFERENCE and stamp[:1].isdigit():  # not samples_<task>_cot_...
            runs.setdefault(stamp, {})[form] = log
    if not runs:
        return None
    forms = runs[max(runs)]
    return next(forms[f] for f in PREFERENCE if f in forms)


def is_full(log: Path) -> bool:
    """Whether ``log`` is lm-eval's own samples log (answers and prompts all there)."""
    return form_of(log) == FULL


def read_samples(path: Path) -> list[dict]:
    """A samples log of any form, one entry per question (lm-eval logs one per filter); a
    compact log gets its answers back when its answers file is beside it."""
    rows = read_jsonl(path)
    if path.name.endswith(COMPACT) and answers_path(path).is_file():
        answers = read_jsonl(answers_path(path))
        if [a["doc_id"] for a in answers] != [r["doc_id"] for r in rows]:
            raise PonderError(f"{answers_path(path)} does not answer the questions of {path}, "
                              "line by line; rebuild both from the full log")
        for r, a in zip(rows, answers):
            r["resps"] = a["resps"]
            r["filtered_resps"] = a.get("filtered_resps", default_filtered(a["resps"]))
    samples: dict = {}
    for sample in rows:
        samples.setdefault(sample["doc_id"], sample)
    return list(samples.values())

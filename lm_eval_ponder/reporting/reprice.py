"""``python -m lm_eval_ponder.reporting.reprice [ROOT ...]``: re-price the FLOPs of kept logs
after the prefill's LM head was found priced on every prompt position (issue 52).

Until issue 52, ``flops.generation_flops`` charged the LM head for all P prompt positions,
while generation (our loop and transformers' ``generate``) passes ``logits_to_keep=1`` and
computes one. Every logged FLOPs figure is therefore too high by exactly
``2 * hidden * vocab * (P - 1)`` per generation (N of them for Best-of-N), and nothing else in it
changes. The committed logs do not hold P, but they do hold the old price and the generated
tokens, and the old price is strictly increasing in P: a plain generation's P is the one whose
old price (``generation_flops(..., logits_to_keep=0)``) lies at or just below the logged value,
the remainder being the controller's evaluations (under one LM-head row, checked). Rows whose
price depends on more than (P, tokens), Best-of-N (N answers, only their total kept) and early
exit (one exit layer per token), take the P of the same question under the same prompt from
another run of it; a question with no such run is an error, not a guess. On the arith ladder,
whose prompts the logs keep, P is also counted with the tokenizer, and must agree.

What it rewrites, in place and only once (a log already re-priced says so in its results
JSON, ``"flops_pricing"``, and is skipped): each compact samples log's ``flops``, the
``flops`` mean and standard error in its ``results_*.json``, and the ``flops`` column of the
rollout caches' compact outcome parts (``rollouts.*.outcomes.json.xz``, whose manifest gets the
same stamp). Everything else is left byte for byte.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lm_eval_ponder import registry
from lm_eval_ponder.errors import PonderError, command, run_program
from lm_eval_ponder.files import atomic_write_text, atomic_write_xz, read_json, read_jsonl
from lm_eval_ponder.flops import FLOPS_PRICING, FlopsSpec, generation_flops, lm_head_flops
from lm_eval_ponder.reporting.compact import COMPACT

PRICING = FLOPS_PRICING
STAMP = "flops_pricing"
OUTCOMES_SUFFIX = ".outcomes.json.xz"


def old_price(spec: FlopsSpec, prompt: int, gen_tokens: int) -> int:
    """A generation's FLOPs as priced before issue 52: the LM head on every prompt position."""
    return generation_flops(spec, prompt, gen_tokens, logits_to_keep=0)


def overcharge(spec: FlopsSpec, prompt: int) -> int:
    """What the old price charged one generation for logits it never computed."""
    return lm_head_flops(spec, max(prompt - 1, 0))


def prompt_from_price(spec: FlopsSpec, flops: float, gen_tokens: int, extra: bool = False,
                      max_prompt: int = 65536,
                      price: Callable[[FlopsSpec, int, int], int] | None = None) -> int | None:
    """The prompt length P of a plain generation from its price (``price``; default the old
    one, ``old_price``): the largest P whose price is at most ``flops``, accepted when nothing
    remains or, with ``extra`` (a run with a controller), when the remainder (its evaluations)
    is under one LM-head row; None when no P fits."""
    priced = price or old_price
    if gen_tokens != int(gen_tokens) or flops is None or not math.isfinite(flops):
        return None
    gen_tokens = int(gen_tokens)
    lo, hi = 1, max_prompt
    if priced(spec, lo, gen_tokens) > flops:
        return None
    while lo < hi:  # largest P whose price is at most flops
        mid = (lo + hi + 1) // 2
        if priced(spec, mid, gen_tokens) <= flops:
            lo = mid
        else:
            hi = mid - 1
    remainder = flops - priced(spec, lo, gen_tokens)
    return lo if remainder == 0 or (extra and 0 < remainder < lm_head_flops(spec, 1)) else None


def prompt_key(task: str) -> str:
    """Runs of the same dataset under the same prompt share P per question: Best-of-N uses
    the plain (Direct) prompt, CoT its own."""
    dataset, base = registry.split_task(task)
    return f"{dataset}/{'cot' if base == 'CoT' else 'plain'}"


@dataclass
class Log:
    """One compact samples log and what it takes to re-price it."""

    path: Path
    results: Path
    task: str
    generations: int  # answers per question (lm-eval's repeats)
    controller: bool  # a controller ran: its evaluations are priced on top
    rows: list[dict] = field(default_factory=list)

    @property
    def key(self) -> str:
        return prompt_key(self.task)

    def plain(self, row: dict) -> bool:
        """Whether the row's price is a function of (P, tokens) plus controller evaluations."""
        return self.generations == 1 and row.get("exit_layer") is None


def find_logs(roots: list[Path]) -> list[Log]:
    """Every compact samples log under ``roots`` beside a results JSON that is not yet re-priced."""
    logs = []
    for root in roots:
        for results in sorted(root.rglob("results_*.json")):
            data = read_json(results)
            if data.get(STAMP) == PRICING:
                continue
            stamp = results.stem[len("results_"):]
            pondering = ((data.get("config") or {}).get("ponder_fingerprint") or {}).get(
                "pondering") or {}
            for task, config in (data.get("configs") or {}).items():
                path = results.parent / f"samples_{task}_{stamp}{COMPACT}"
                if registry.TASK_INFIX in task and path.is_file():
                    logs.append(Log(path, results, task, int(config.get("repeats") or 1),
                                    bool(pondering.get("controller")), read_jsonl(path)))
    return logs


def prompt_lengths(spec: FlopsSpec, logs: list[Log], counted: dict[tuple[str, int], int]
                   ) -> dict[tuple[str, int], int]:
    """P per (prompt, question): from the plain rows' old prices, checked against every other
    plain row of the question and against ``counted`` (the tokenizer's, where prompts are kept)."""
    found: dict[tuple[str, int], int] = dict(counted)
    for log in logs:
        for row in log.rows:
            if not log.plain(row) or row.get("flops") is None:
                continue
            where = (log.key, row["doc_id"])
            prompt = prompt_from_price(spec, row["flops"], row["gen_tokens"], log.controller)
            if prompt is None:
                raise PonderError(
                    f"{log.path}: question {row['doc_id']}: no prompt length reproduces its "
                    f"FLOPs {row['flops']:.6g} at {row['gen_tokens']} tokens under the old "
                    "pricing; is it already re-priced, or another backbone's?")
            if found.setdefault(where, prompt) != prompt:
                raise PonderError(
                    f"{log.path}: question {row['doc_id']} ({log.key}) priced as a "
                    f"{prompt}-token prompt, another run as {found[where]}")
    return found


def reprice_rows(spec: FlopsSpec, log: Log, prompts: dict[tuple[str, int], int]) -> list[dict]:
    out = []
    for row in log.rows:
        row = dict(row)
        if row.get("flops") is not None:
            where = (log.key, row["doc_id"])
            if where not in prompts:
                raise PonderError(
                    f"{log.path}: question {row['doc_id']} has no run under the {log.key} "
                    "prompt whose price gives its prompt length; re-price it with one")
            row["flops"] = float(row["flops"] - log.generations * overcharge(spec, prompts[where]))
        out.append(row)
    return out


def write_log(log: Log, rows: list[dict]) -> None:
    atomic_write_xz(log.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def restamp_results(results: Path, logs: dict[str, list[dict]]) -> None:
    """The results JSON's ``flops`` mean and standard error (lm-eval's: sample standard
    deviation over the square root of n), recomputed from the re-priced rows, and the stamp."""
    data = read_json(results)
    for task, rows in logs.items():
        metrics = data.get("results", {}).get(task, {})
        for key in [k for k in metrics if k.startswith("flops,")]:
            name = key.partition(",")[2]  # lm-eval logs one line per question and filter
            values = [r["flops"] for r in rows
                      if r.get("flops") is not None and r.get("filter", "none") == name]
            if not values:
                continue
            metrics[key] = statistics.fmean(values)
            std_key = f"flops_stderr,{name}"
            if isinstance(metrics.get(std_key), float) and len(values) > 1:
                metrics[std_key] = statistics.stdev(values) / math.sqrt(len(values))
    data[STAMP] = PRICING
    atomic_write_text(results, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def reprice_outcomes(spec: FlopsSpec, root: Path) -> list[Path]:
    """The rollout caches' compact outcome parts: plain generations at a fixed offset, so every
    record's P comes from its own price (and must agree across the prompt's records)."""
    done = []
    for manifest_path in sorted(root.rglob("manifest.json")):
        manifest = read_json(manifest_path)
        parts = sorted(manifest_path.parent.glob(f"rollouts.*{OUTCOMES_SUFFIX}"))
        if not parts or manifest.get(STAMP) == PRICING:
            continue
        prompts: dict[str, int] = {}
        for part in parts:
            data = json.loads(lzma.decompress(part.read_bytes()).decode())
            cols = data["columns"]
            for i, (key, flops, n) in enumerate(zip(cols["key"], cols["flops"], cols["gen_tokens"])):
                name = data["keys"][key]
                prompt = prompt_from_price(spec, flops, n)
                if prompt is None or prompts.setdefault(name, prompt) != prompt:
                    raise PonderError(f"{part}: record {i} (prompt {name}) does not price as "
                                      "one prompt length under the old pricing")
                cols["flops"][i] = float(flops - overcharge(spec, prompt))
            atomic_write_xz(part, json.dumps(data))
            done.append(part)
        manifest[STAMP] = PRICING
        atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return done


def counted_prompts(logs: list[Log], tokenizer) -> dict[tuple[str, int], int]:
    """P per question where the log keeps the prompt (our synthetic data), counted as HFLM
    encodes a chat-templated context: no special tokens added."""
    counted = {}
    for log in logs:
        for row in log.rows:
            arguments = row.get("arguments") or {}
            first = next(iter(arguments.values()), None) if isinstance(arguments, dict) else None
            context = first.get("arg_0") if isinstance(first, dict) else None
            if isinstance(context, str):
                n = len(tokenizer(context, add_special_tokens=False).input_ids)
                where = (log.key, row["doc_id"])
                if counted.setdefault(where, n) != n:
                    raise PonderError(f"{log.path}: question {row['doc_id']}: two prompts")
    return counted


def reprice(roots: list[Path], spec: FlopsSpec, tokenizer=None) -> dict[str, int]:
    """Re-price every log and rollout cache under ``roots``; returns what was done."""
    logs = find_logs(roots)
    counted = counted_prompts(logs, tokenizer) if tokenizer is not None else {}
    prompts = prompt_lengths(spec, logs, counted)
    by_results: dict[Path, dict[str, list[dict]]] = defaultdict(dict)
    for log in logs:
        rows = reprice_rows(spec, log, prompts)
        write_log(log, rows)
        by_results[log.results][log.task] = rows
    for results, tasks in by_results.items():
        restamp_results(results, tasks)
    parts = [p for root in roots for p in reprice_outcomes(spec, root)]
    return {"logs": len(logs), "results": len(by_results), "questions": len(prompts),
            "counted": len(counted), "outcome_parts": len(parts)}


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", default=["results"])
    parser.add_argument("--pretrained", default=None,
                        help="the backbone whose shape prices the logs (default: embedded)")
    args = parser.parse_args(argv)
    from transformers import AutoConfig, AutoTokenizer

    from lm_eval_ponder import backbone as bb

    path = args.pretrained or bb.resolve_backbone(None).path
    spec = FlopsSpec.from_config(AutoConfig.from_pretrained(path))
    summary = reprice([Path(r) for r in args.roots], spec, AutoTokenizer.from_pretrained(path))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_program(main)

"""``python -m lm_eval_ponder.report DIR... [--output OUT]``: the paper's Table 1 and figures
from lm-eval output directories (``--output_path`` with ``--log_samples``).

Every metric is recomputed from the per-sample logs, so the report never trusts a number it
cannot re-derive. Accuracy carries a Wilson 95% interval and n; the best accuracy of a dataset
is bolded only when its interval does not overlap the runner-up's (otherwise the table says
"tie within CI"). Per-level analyses use the documents' ``level`` (arith ladder, MATH500).

Which method a run is: a ``ponder_run.json`` ({"method": ..., "backbone": ...}) in the run's
directory or a parent wins (``suite`` writes one); otherwise, for a ``ponder`` run, what its
fingerprint says the model did (a controller -> FP-<base>, a fixed alpha -> FR (alpha=...), an
early exit -> EE (p>=<threshold>), no pondering -> <base>, where <base> is Direct/CoT/BoN from
the task); ``--model hf`` and other models are <base>. Results written before the fingerprint
was recorded are read from the model args: ``alpha=`` -> FR, ``early_exit=`` -> EE,
``controller=<dir>`` -> FP-<base>, ``controller=none`` -> <base>, neither (the shipped
controller, if the backbone has one) -> "<base> (default args)".

A label is not a configuration: runs of one label with different identities
(``reporting.identity``: the model's fingerprint or args and dtype, and the generation kwargs)
are separate rows, the label extended by what differs ("FP-Direct [dtype=bfloat16]"), each
showing its identity's short hash. Results files of one label, dataset and identity are pooled
when they agree on every question both answered and refused, naming both files, when they
disagree (a row must not silently show one of two results); runs that differ only in their seed
are one row, the mean over the seeds (``reporting.seeds``). Runs whose model kept no token
accounting (``--model hf``, ``vllm``) get their tokens and FLOPs estimated from the responses
(``reporting.estimate``), marked ``*``. docs/design/lm-eval.md has the reasons.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath

from lm_eval_ponder import registry
from lm_eval_ponder.backbone import EMBEDDED_DESCRIPTION, EMBEDDED_NAME, EMBEDDED_SHA256
from lm_eval_ponder.errors import PonderError, command, program_name, run_program
from lm_eval_ponder.files import check_output, read_json
from lm_eval_ponder.generation.early_exit import ExitSettings, exit_label
from lm_eval_ponder.registry import dataset_order
from lm_eval_ponder.reporting.compact import answers_digest, is_full, read_samples, run_log
from lm_eval_ponder.reporting.estimate import Estimators, needs_estimate
from lm_eval_ponder.reporting.identity import (
    CONVERTED_SUFFIX,
    Identity,
    distinguish,
    parse_model_args,
)
from lm_eval_ponder.reporting.measures import by_level, holm, metrics, paired_difference, spearman
from lm_eval_ponder.reporting.plots import (
    BASE_OF,
    family,
    interval_kind,
    label_variants,
    plots,
    table_rank,
)
from lm_eval_ponder.reporting.seeds import merge_seeds, run_seed
from lm_eval_ponder.reporting.tables import cells, spearman_text, write_html, write_tables

LOGGER = logging.getLogger(__name__)

@dataclass
class Run:
    """One configuration of one method on one dataset; ``variant`` names what sets it apart
    from other runs of the same method (empty when nothing needs saying)."""

    backbone: str
    method: str
    dataset: str
    samples: list[dict] = field(default_factory=list)
    source: str = ""
    identity: Identity = field(default_factory=Identity)
    variant: str = ""
    note: str = ""  # why accounting is missing, if it is; which seeds were averaged
    seeds: list[int | None] = field(default_factory=lambda: [None])
    depth: int | None = None  # the one depth its controller chose on every question, if so
    batch_dependent: bool = False  # greedy in bf16/fp16, batched: its answers follow the batch

    @property
    def label(self) -> str:
        name = self.method
        if self.depth is not None:  # before any bracketed variant: "FP-Direct (depth 0 ...) [t0.7]"
            head, tail = re.fullmatch(r"(.*?)((?: \[[^\]]+\])*)", name).groups()
            name = f"{head}{ONE_DEPTH.format(k=self.depth)}{tail}"
        return f"{name} [{self.variant}]" if self.variant else name


# A controller that halts at the same depth on every question is a fixed offset, not adaptive
# pondering; its row says so, whatever the method is called.
ONE_DEPTH = " (depth {k} on every question)"


def single_depth(run: Run) -> int | None:
    """The one ponder depth a run's controller chose on every question, read from the
    per-question depths (``ponder_steps``); None when depths differ or no controller ran.
    At token granularity a question's value is a mean over its tokens, which pins every
    decision only at 0 or ``k_max``."""
    pondering = run.identity.model.get("pondering")
    pondering = pondering if isinstance(pondering, dict) else {}
    row = next((m for m in registry.METHODS if m.label == run.method), None)
    if not pondering.get("controller") and not (row and row.needs_controller):
        return None
    depths = {s.get("ponder_steps") for s in run.samples}
    if len(depths) != 1 or None in depths:
        return None
    (value,) = depths
    if not float(value).is_integer() or (pondering.get("granularity", "prompt") != "prompt"
                                         and int(value) not in (0, pondering.get("k_max"))):
        return None
    return int(value)


def weights_name(source: str, sha256: str | None = None) -> str:
    """One name for one set of weights, whatever model class ran them: the embedded backbone
    by its SHA-256 (``--model ponder`` records it; a converted GGUF's directory,
    ``<stem>-<first 16 hex of its SHA-256>``, which ``--model hf pretrained=`` names, carries
    it), another converted GGUF by its file's stem (as ``--model ponder gguf_file=`` names
    it), a local directory by its name (a page names no directory of the machine that made
    it), a Hub id as given."""
    name = PurePath(source.rstrip("/")).name
    converted = CONVERTED_SUFFIX.search(name)
    sha = sha256 or (converted.group()[1:] if converted else None)
    if sha and EMBEDDED_SHA256.startswith(sha[:16]):
        return EMBEDDED_NAME
    if converted:
        return name[:converted.start()]
    # a relative path that is a folder here (``own/tiny-qwen2``) is a local directory, not a
    # Hub id: one backbone, one name, however its path was typed
    local = source.startswith(("/", "~", ".", "$")) or Path(source).expanduser().is_dir()
    return name if local else source


def backbone_of(args: dict, marker: dict | None, fingerprint: dict | None) -> str:
    """A run's backbone: the suite's marker, else what the model recorded it loaded (a
    ``ponder`` fingerprint), else its model args, as ``weights_name`` names them."""
    recorded = fingerprint if isinstance(fingerprint, dict) else {}
    source = (marker or {}).get("backbone") or recorded.get("backbone") or args.get("pretrained")
    if source is None:  # a ponder run of the embedded backbone or a GGUF, without fingerprint
        gguf = args.get("gguf_file")
        return PurePath(str(gguf)).stem if gguf else EMBEDDED_NAME
    return weights_name(str(source), recorded.get("backbone_sha256"))


def _label(task: str, model: str, args: dict, marker: dict | None,
           fingerprint: dict | None = None) -> tuple[str, str]:
    """(backbone, method) of a run; a run whose answers stopped below ``min_top_prob`` (the
    answer-truncation reading of tau) carries it after its method's name."""
    backbone, method = method_label(task, model, args, marker, fingerprint)
    recorded = fingerprint.get("min_top_prob") if isinstance(fingerprint, dict) else None
    tau = recorded if recorded is not None else args.get("min_top_prob")
    if tau in (None, "", "none") or (marker and marker.get("method")):
        return backbone, method
    return backbone, f"{method} (answer stop p<{float(tau):g})"


def method_label(task: str, model: str, args: dict, marker: dict | None,
                 fingerprint: dict | None = None) -> tuple[str, str]:
    base = registry.split_task(task)[1]
    backbone = backbone_of(args, marker, fingerprint)
    if marker and marker.get("method"):
        return backbone, marker["method"].replace("{base}", base)
    if model != "ponder":
        return backbone, base
    if isinstance(fingerprint, dict):  # what the model did, whatever the args looked like
        if isinstance(fingerprint.get("early_exit"), dict):
            return backbone, exit_label(fingerprint["early_exit"])
        pondering = fingerprint.get("pondering") or {}
        if pondering.get("controller"):
            return backbone, registry.controlled(base)
        if pondering.get("alpha") is not None:
            return backbone, f"FR (alpha={float(pondering['alpha']):g})"
        return backbone, base
    controller = args.get("controller")
    if args.get("early_exit") not in (None, "", "none"):
        settings = ExitSettings.from_model_args(args["early_exit"], args.get("exit_layers"))
        return backbone, exit_label(settings.fingerprint())
    if args.get("alpha") not in (None, "", "none"):
        return backbone, f"FR (alpha={float(args['alpha']):g})"
    if controller is not None and str(controller).lower() not in ("none", "", "auto"):
        return backbone, registry.controlled(base)
    if controller is not None:
        return backbone, base
    return backbone, f"{base} (default args)"


def _marker(path: Path, roots: list[Path]) -> dict | None:
    for parent in [path, *path.parents]:
        candidate = parent / "ponder_run.json"
        if candidate.is_file():
            return read_json(candidate)
        if parent in roots:
            break
    return None


def pool(kept: Run, other: Run) -> None:
    """Add ``other``'s questions to ``kept``: the same label, dataset and identity, so the same
    configuration; refused when the two disagree on a question both answered."""
    mine = {s["doc_id"]: s for s in kept.samples}
    for s in other.samples:
        if s["doc_id"] not in mine:
            kept.samples.append(s)
        elif answers_digest(s) != answers_digest(mine[s["doc_id"]]):
            raise PonderError(
                f"two runs of {kept.method} on {kept.dataset} with the same configuration "
                f"(identity {kept.identity.digest}) disagree on question {s['doc_id']}: "
                f"{kept.source} and {other.source}. A leaderboard row cannot hold both: pass "
                "one of them, or report them separately")
    kept.source = f"{kept.source}, {other.source}"


def result_runs(result: Path, roots: list[Path], estimators: Estimators) -> Iterator[Run]:
    """The runs one ``results_*.json`` holds: one per task of ours whose samples were logged
    (the full log, else the compact one a committed run keeps: ``reporting.compact``). Another
    lm-eval task in the same file, or one run without ``--log_samples``, is passed over."""
    data = read_json(result)
    config = data.get("config", {})
    model, args = str(config.get("model")), parse_model_args(config.get("model_args"))
    marker = _marker(result.parent, roots)
    for task in data.get("results", {}):
        samples_file = run_log(result, task) if registry.TASK_INFIX in task else None
        if samples_file is None:
            continue
        backbone, method = _label(task, model, args, marker, config.get("ponder_fingerprint"))
        samples = read_samples(samples_file)
        notes = (accounting_note(samples_file, samples, model, args, estimators),
                 mixed_attempts(marker))
        identity = Identity.of(data, task)
        yield Run(backbone, method, registry.dataset_of(task), samples, str(result), identity,
                  seeds=[run_seed(data)], note="; ".join(n for n in notes if n),
                  batch_dependent=batch_dependent(config, identity))


def batch_dependent(config: dict, identity: Identity) -> bool:
    """Whether a run's greedy answers depend on the rows batched beside them: a half-precision
    run (``ponder`` or lm-eval's own ``hf``), not in ``batch_invariant`` mode. In float32 no
    answer moved on the CPU measured."""
    if identity.generation.get("do_sample"):
        return False
    dtype = str(identity.model.get("dtype", ""))
    batching = config.get("ponder_batching") or {}
    return ("float16" in dtype) and not batching.get("batch_invariant", False)


def mixed_attempts(marker: dict | None) -> str:
    """A note when a suite run's attempts (``ponder_run.json``) ran on more than one machine
    or commit: its answers are then not all of one build on one machine. Attempts that record
    neither (older runs) are not counted."""
    attempts = (marker or {}).get("attempts") or []
    parts = []
    for key, what in (("machine", "machines"), ("commit", "commits")):
        seen = sorted({str(a[key]) for a in attempts if a.get(key)})
        if len(seen) > 1:
            parts.append(f"{len(seen)} {what} ({'; '.join(seen)})")
    return f"resumed across {' and '.join(parts)}" if parts else ""


def accounting_note(samples_file: Path, samples: list[dict], model: str, args: dict,
                    estimators: Estimators) -> str:
    """Tokens and FLOPs of a model that kept none, estimated from a full log's prompts and
    answers (the note says how); a compact log keeps neither, so the note says they were not
    estimated rather than guess."""
    if is_full(samples_file):
        return estimators.fill(samples, model, args) or ""
    if needs_estimate(samples):
        return "tokens and FLOPs not estimated: only the compact log was kept"
    return ""


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Every (backbone, method, identity, dataset) found under the given lm-eval output
    directories, with the accounting of models that kept none estimated."""
    roots = [Path(p).resolve() for p in paths]
    for root in roots:
        if not root.exists():
            packed = root.with_name(root.name + ".tar.xz").is_file()
            again = (f" (a study committed as {root.name}.tar.xz: unpack it first, python "
                     f"scripts/records.py unpack {root})" if packed else "")
            raise PonderError(f"no such results directory: {root}{again}")
    # a results file given as it is (report results/x/results_1.json) is that one run
    files = sorted({f.resolve() for root in roots
                    for f in ([root] if root.is_file() else root.rglob("results_*.json"))})
    bad = [root for root in roots if root.is_file() and not (
        root.name.startswith("results_") and root.suffix == ".json")]
    if bad:
        raise PonderError(f"{bad[0]} is a file but not an lm-eval results_*.json: pass the "
                          "folder lm-eval wrote (--output_path) or one of its results files")
    runs: dict[tuple[str, str, str, str], Run] = {}
    estimators = Estimators()
    for result in files:
        for run in result_runs(result, roots, estimators):
            key = (run.backbone, run.method, run.dataset, run.identity.digest, run.seeds[0])
            if key in runs:
                pool(runs[key], run)
            else:
                runs[key] = run
    if not runs:
        raise PonderError(f"no lm-eval results with --log_samples under {', '.join(map(str, paths))}")
    runs = merge_seed_runs(runs)
    for run in runs.values():
        run.depth = single_depth(run)
    name_variants(list(runs.values()))
    return sorted(runs.values(), key=lambda r: (r.backbone, r.dataset, r.label))


def name_variants(runs: list[Run]) -> None:
    """Set ``variant`` on the runs of one (backbone, method) that differ in configuration, so
    their rows can be told apart (``identity.distinguish`` names what differs)."""
    by_method: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        by_method[(run.backbone, run.method)].append(run)
    for group in by_method.values():
        for run, variant in zip(group, distinguish([(r.dataset, r.identity) for r in group])):
            run.variant = variant


def merge_seed_runs(runs: dict[tuple, Run]) -> dict[tuple, Run]:
    """Runs of one configuration under several seeds become one: per-question means over the
    seeds (``reporting.seeds``), the note saying which seeds."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for key, run in runs.items():
        groups[key[:4]].append(run)
    out = {}
    for key, group in groups.items():
        if len(group) == 1:
            out[key] = group[0]
            continue
        group.sort(key=lambda r: (r.seeds[0] is None, r.seeds[0]))
        first = group[0]
        seeds = [r.seeds[0] for r in group]
        merged = merge_seeds({r.seeds[0]: r.samples for r in group})
        note = f"mean of {len(seeds)} seeds ({', '.join(map(str, seeds))}) over the " \
            f"{len(merged)} questions all of them answered; 95% CI: bootstrap over questions"
        out[key] = replace(first, samples=merged, seeds=seeds,
                           source=", ".join(r.source for r in group),
                           note="; ".join(x for x in (first.note, note) if x))
    return out


def cut_notes(runs: list[Run], common: dict[str, list[Run]]) -> list[str]:
    """Where ``common_questions`` cut a run to fewer questions than it answered, one note per
    dataset naming each such run's n and the common n (a 50-question run became
    n = 3 without a word); the page and the command's output both carry it."""
    before = {(r.dataset, r.backbone, r.label): len(r.samples) for r in runs}
    notes = []
    for dataset, group in common.items():
        cut = [(r.label, before[(dataset, r.backbone, r.label)]) for r in group
               if len(r.samples) < before[(dataset, r.backbone, r.label)]]
        if cut:
            n = len(group[0].samples)
            notes.append(f"{dataset}: every row is scored on the {n} questions all runs answered; "
                         "cut to them: " + ", ".join(f"{label} (had {had})" for label, had in cut)
                         + ". Runs of other question sets (--limit, another split) are not "
                           "comparable beyond these")
    return notes


def common_questions(runs: list[Run]) -> dict[str, list[Run]]:
    """Per dataset, restrict every run to the questions all of them answered (fair rows);
    ``cut_notes`` says where that cut a run."""
    by_dataset: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_dataset[r.dataset].append(r)
    out = {}
    for dataset, group in by_dataset.items():
        ids = set.intersection(*({s["doc_id"] for s in r.samples} for r in group))
        out[dataset] = [replace(r, samples=sorted((s for s in r.samples if s["doc_id"] in ids),
                                                   key=lambda s: s["doc_id"])) for r in group]
    return out


BATCH_NOTE = ("greedy answers in bf16 depend on the batching (the rows computed beside them): of "
              "the embedded model's answers to the 500 arith questions, 67% differ "
              "between max_rows 128 and 16 (docs/results/speed.md, batch invariance); a bf16 "
              "row holds for the batching its results record (ponder_batching), and "
              "batch_invariant=true computes each answer alone")
ESTIMATED_NOTE = ("* estimated: the model kept no token accounting (--model hf, vllm, ...); "
                  "tokens re-counted from the responses with its tokenizer, to and including "
                  "the EOS as ponder counts, FLOPs priced from its config")


def leaderboard(runs: list[Run]) -> tuple[list[dict], list[str]]:
    """Rows of Table 1 (one per backbone x method x configuration) and notes on ties and on
    estimated or missing accounting."""
    common = common_questions(runs)
    rows: dict[tuple[str, str], dict] = {}
    notes = cut_notes(runs, common)
    for note in notes:
        LOGGER.warning("report: %s", note)
    for dataset in dataset_order(common):
        group = [r for r in common[dataset] if r.samples]
        cells = {(r.backbone, r.label): metrics(r.samples) for r in group}
        ranked = sorted(cells.items(), key=lambda kv: -kv[1]["acc"])
        win = None
        if len(ranked) > 1 and ranked[0][1]["lo"] > ranked[1][1]["hi"]:
            win = ranked[0][0]
        elif len(ranked) > 1:
            notes.append(f"{dataset}: best accuracy {ranked[0][0][1]} ({ranked[0][1]['acc']:.3f}) "
                         f"is a tie within the 95% CI with {ranked[1][0][1]} "
                         f"({ranked[1][1]['acc']:.3f}); not bolded")
        for r in group:
            key = (r.backbone, r.label)
            rows.setdefault(key, {"backbone": r.backbone, "method": r.method, "label": r.label,
                                  "identity": r.identity.model_digest,
                                  "model": r.identity.model})[dataset] = \
                {**cells[key], "win": key == win, "identity": r.identity.digest,
                 "generation": r.identity.generation}
            if r.note:
                notes.append(f"{r.label} on {dataset}: {r.note}")
    if any(f.get("estimated") for row in rows.values() for f in row.values()
           if isinstance(f, dict) and "n" in f):
        notes.append(ESTIMATED_NOTE)
    if any(key[0] == EMBEDDED_NAME for key in rows):
        notes.append(f"backbone {EMBEDDED_NAME}: {EMBEDDED_DESCRIPTION}")
    if any(r.batch_dependent for r in runs):
        notes.append(BATCH_NOTE)
    ordered = sorted(rows.values(), key=lambda r: (r["backbone"], table_rank(r["label"])))
    return ordered, notes


def decoding_verdicts(rows: list[dict], datasets: list[str]) -> list[str]:
    """Per decoding policy (``suite --decoding``), best FP variant against the best of Direct,
    CoT and BoN on each dataset: a win or a loss only when the 95% CIs are disjoint."""
    groups: dict[tuple[str, str], list[tuple[str, dict]]] = defaultdict(list)
    for r in rows:
        m = re.fullmatch(r"(.*?)(?: \[(.+)\])?", r["method"])
        groups[(r["backbone"], m.group(2) or "greedy")].append((m.group(1), r))
    if len({decoding for _, decoding in groups}) < 2:
        return []
    out = []
    for (backbone, decoding), methods in sorted(groups.items()):
        for d in datasets:
            fp = [(r["label"], r[d]) for m, r in methods if m.startswith("FP-") and d in r]
            base = [(r["label"], r[d]) for m, r in methods if m in registry.BASELINES and d in r]
            if not fp or not base:
                continue
            (fm, f), (bm, b) = (max(x, key=lambda kv: kv[1]["acc"]) for x in (fp, base))
            verdict = ("FP wins" if f["lo"] > b["hi"] else "FP loses" if f["hi"] < b["lo"]
                       else "tie within the 95% CIs")
            out.append(f"decoding {decoding}, {backbone}, {d}: {fm} {f['acc']:.3f} "
                       f"({f['tokens']:.0f} tokens) vs {bm} {b['acc']:.3f} "
                       f"({b['tokens']:.0f} tokens): {verdict}")
    return out


def fewer(saved: float, what: str) -> str:
    """"30% fewer tokens", "4% more tokens" when the steered run spent more, "as many tokens"
    when the two round to the same (a steered run at offset 0 is the unsteered model)."""
    if round(abs(saved) * 100) == 0:
        return f"as many {what}"
    return f"{saved:.0%} fewer {what}" if saved > 0 else f"{-saved:.0%} more {what}"


def steered_from(run: Run, base: Run) -> bool:
    """Whether ``base`` is ``run`` without its steering: the same model and generation, and
    only the pondering part differs (none in the base). Labels cannot say this once two
    steered configurations share a method name, e.g. both forms' FP-Direct beside one Direct
    (the suffix ``[alpha_start=0.0, ...]`` is on the steered rows only). Results written
    before the model fingerprint (model args only) fall back to matching label variants."""
    a, b = run.identity, base.identity
    if "pondering" not in a.model or b.model.get("pondering", False) is not None:
        return False
    rest_a, rest_b = ({k: v for k, v in m.items() if k != "pondering"} for m in (a.model, b.model))
    return rest_a == rest_b and a.generation == b.generation


def truncated_from(run: Run, base: Run) -> bool:
    """Whether ``base`` is ``run`` without its answer stop (``min_top_prob``): everything
    else the same, the steering included."""
    a, b = run.identity, base.identity
    if "min_top_prob" not in a.model or "min_top_prob" in b.model:
        return False
    rest = {k: v for k, v in a.model.items() if k != "min_top_prob"}
    return rest == b.model and a.generation == b.generation


def steering_verdicts(common: dict[str, list[Run]]) -> list[str]:
    """Per dataset, each steered run against its own base (FR and FP-Direct against Direct,
    FP-CoT against CoT, FP-BoN against BoN; a run with an answer stop against the same run
    without it) with the same variants (decoding, dtype, ...),
    paired per question (``measures.paired_difference``): whether steering's token saving
    costs accuracy is a paired question, which side-by-side intervals answer only
    conservatively."""
    found = []
    for dataset in dataset_order(common):
        group = [r for r in common[dataset] if r.samples]
        for run in group:
            if "min_top_prob" in run.identity.model:  # the answer stop against the same run without it
                bases = [b for b in group if truncated_from(run, b)]
            else:
                base_family = BASE_OF.get(family(run.label))
                if base_family is None:
                    continue
                # never across backbones or generation settings (pairing two backbones and two
                # max_gen_toks once gave "3025% more tokens")
                same = [b for b in group if family(b.label) == base_family
                        and b.backbone == run.backbone
                        and b.identity.generation == run.identity.generation]
                bases = [b for b in same if steered_from(run, b)] or \
                    [b for b in same if label_variants(b.label) == label_variants(run.label)]
            if len(bases) != 1:
                continue
            d = paired_difference(run.samples, bases[0].samples)
            if d is not None:
                found.append((dataset, run, bases[0], d))
    out = []
    adjusted = holm([d["p"] for *_, d in found])
    for (dataset, run, base, d), p_holm in zip(found, adjusted):
        verdict = ("gains beyond the interval" if d["lo"] > 0 else "loses beyond the interval"
                   if d["hi"] < 0 else "no difference beyond the interval")
        out.append(f"{dataset}: {run.label} against {base.label}, paired on {d['n']} "
                   f"questions: accuracy {d['gain']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] "
                   f"({verdict}; sign test p = {d['p']:.3g}, Holm-adjusted over the "
                   f"{len(found)} paired comparisons of this report p = {p_holm:.3g}), "
                   f"{fewer(d['tokens_saved'], 'tokens')}, {fewer(d['saved'], 'FLOPs')}")
    return out


def depth_difficulty(runs: list[Run]) -> list[tuple[str, str, float, int]]:
    """Spearman(ponder depth, level) of every run that ponders (an FP method, or any run with
    a nonzero depth), per dataset with levels. A controller whose depth never varies has no
    correlation: NaN, which ``spearman_text`` says in words rather than leaving the run out."""
    out = []
    for r in runs:
        pairs = [(lv, float(s["ponder_steps"])) for lv, ss in by_level(r.samples).items()
                 for s in ss]
        if pairs and (r.method.startswith("FP-") or any(d for _, d in pairs)):
            out.append((r.label, r.dataset, spearman(*map(list, zip(*pairs))), len(pairs)))
    return out


def case_studies(common: dict[str, list[Run]], per_dataset: int = 2) -> list[dict]:
    """The rule (stated in the page): for each dataset with an FP run and both CoT and Direct,
    the first ``per_dataset`` questions in document order where the FP run is correct and at
    least one of CoT/Direct is wrong, plus the first question where FP is wrong and a baseline
    is right. No other selection. A dataset the registry does not let us publish (GPQA:
    ``registry.UNPUBLISHED``) is skipped even when full logs are at hand, since a report page
    is made to be published."""
    cases = []
    for dataset in dataset_order(common):
        group = common[dataset]
        if not registry.publishable(dataset):
            continue
        named = {r.method: r for r in group}
        fp = next((r for r in group if r.method.startswith("FP-Direct")), None) or \
            next((r for r in group if r.method.startswith("FP-")), None)
        if fp is None or "CoT" not in named or "Direct" not in named:
            continue
        idx = {m: {s["doc_id"]: s for s in named[m].samples} for m in ("CoT", "Direct")}
        good, bad = [], []
        for s in fp.samples:
            others = [idx[m].get(s["doc_id"]) for m in ("CoT", "Direct")]
            if None in others or any("resps" not in x or "target" not in x
                                     for x in (s, *others)):
                continue  # a compact log without its answers file (or its texts) has nothing to quote
            if s["exact_match"] and any(not o["exact_match"] for o in others):
                good.append((s, others))
            elif not s["exact_match"] and any(o["exact_match"] for o in others) and not bad:
                bad.append((s, others))
        for s, others in good[:per_dataset] + bad:
            cases.append({"dataset": dataset, "question": s["doc"].get("question")
                          or s["doc"].get("problem") or "", "target": s["target"],
                          "answers": [(fp.label, s), (named["CoT"].label, others[0]),
                                      (named["Direct"].label, others[1])]})
    return cases


def report(paths: list[str | Path], out: str | Path, link_figures: bool = False) -> str:
    out = Path(out)
    runs = load_runs(paths)  # first: a run that cannot be read leaves no empty report behind
    out.mkdir(parents=True, exist_ok=True)
    rows, notes = leaderboard(runs)
    datasets = dataset_order(r.dataset for r in runs)
    notes += decoding_verdicts(rows, datasets)
    common = common_questions(runs)
    notes += steering_verdicts(common)
    md = write_tables(rows, datasets, notes, out)
    images = plots(common, out)
    kind = interval_kind(cells(rows, datasets))
    spear = depth_difficulty([r for g in common.values() for r in g])
    with open(out / "leaderboard.md", "a") as f:
        f.write(f"\nFigures (error bars: {kind}):\n" + "".join(
            f"\n![{img.stem}]({img.name})\n\n{caption}\n" for img, caption in images))
        if spear:
            f.write("\nPonder depth against difficulty:\n\n" + "".join(
                f"- {spearman_text(*row)}\n" for row in spear))
    write_html(rows, datasets, notes, images, case_studies(common), spear, out, link_figures)
    return "\n".join([md] + [spearman_text(*row) for row in spear])


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program_name("python -m lm_eval_ponder.report"),
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="lm-eval --output_path directories")
    parser.add_argument("--output", default=None, help="report directory (default: the first "
                        "path)")
    parser.add_argument("--link-figures", "--link_figures", action="store_true",
                        help="leaderboard.html names the figure files beside it instead of "
                        "inlining them (a page of kB instead of MB; it then needs its directory)")
    a = parser.parse_args(argv)
    out = check_output(a.output or a.paths[0])
    print(report(a.paths, out, a.link_figures))
    return 0


if __name__ == "__main__":
    run_program(main)

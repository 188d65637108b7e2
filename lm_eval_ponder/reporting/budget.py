"""How long a suite will take, estimated from a pilot before it starts.

A pilot is the same suite on the first few questions of each dataset (``suite --limit 10
--output PILOT``). Each of its runs recorded its wall time (``ponder_run.json``) and, per
question, the tokens it generated (Best-of-N counts all N answers). The cost model is fitted to
the pilot's runs, ``wall = startup + tokens x seconds_per_token`` (least squares; the intercept
is the process start and model load every run pays), and each planned run is priced at its
dataset's full size times the tokens per question its pilot run generated. A planned run with
no pilot run of the same method, decoding and dataset is listed without an estimate rather than
guessed. The pilot's questions are the datasets' first ones, so the estimate is only as good as
they are typical (the arith ladder interleaves its levels; GSM8K is in no particular order),
and a pilot's batches are smaller than a full run's (10 questions against ``--batch_size``), so
its seconds per token, and the estimate, err long.

For another backbone or device the cost per token comes from ``benchmarks/scale.py --out FILE``
instead (``ScaleCost``) and the tokens per question from a finished suite's logs
(``read_lengths``: the committed ``results/suite``, compact logs included), so the answer
lengths are the embedded backbone's, which the estimate says. The paper-scale training is
priced the same way (``training_tokens``). How far either estimate held: docs/usage.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from lm_eval_ponder import registry
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import read_json

# Test-set sizes of the suite's datasets, the registry's (tests check them against the loaders).
DATASET_SIZES = {d.name: d.test_size for d in registry.DATASETS}


def questions(dataset: str, limit: int | None = None) -> int:
    """How many questions a run on ``dataset`` answers under ``--limit``."""
    return min(DATASET_SIZES[dataset], limit) if limit else DATASET_SIZES[dataset]


@dataclass(frozen=True)
class PilotRun:
    label: str
    decoding: str
    dataset: str
    questions: int
    tokens: float
    wall_s: float

    @property
    def tokens_per_question(self) -> float:
        return self.tokens / self.questions


@dataclass(frozen=True)
class CostModel:
    startup_s: float
    s_per_token: float

    def wall(self, tokens: float) -> float:
        return self.startup_s + tokens * self.s_per_token


def run_of(info: dict, marker: Path, tokens: dict, wall_s: float) -> PilotRun:
    """A run as its ``ponder_run.json`` (``info``, at ``marker``) and its answers' lengths
    (``tokens``, a question's id to its generated tokens) describe it."""
    return PilotRun(info["method"], info.get("decoding", "greedy"), marker.parent.name,
                    len(tokens), sum(tokens.values()), wall_s)


def read_pilot(root: str | Path) -> list[PilotRun]:
    """Every finished run under a suite output directory, with its questions and tokens."""
    root = Path(root)
    if not root.is_dir():
        raise PonderError(f"no such pilot directory: {root}")
    from lm_eval_ponder.reporting.compact import COMPACT, read_samples

    runs, resumed = [], 0
    for marker in sorted(root.rglob("ponder_run.json")):
        info = read_json(marker)
        if "wall_s" not in info:
            continue
        if info.get("kept_answers", 0):
            resumed += 1
            continue  # a resumed run's wall_s is its last attempt's, not its answers' time
        tokens: dict = {}
        # the full samples log, and the compact one a committed run keeps (reporting.compact)
        logs = [*sorted(marker.parent.rglob("samples_*.jsonl")),
                *sorted(marker.parent.rglob("samples_*" + COMPACT))]
        for log in logs:
            for s in read_samples(log):
                tokens.setdefault(s["doc_id"], float(s.get("gen_tokens", float("nan"))))
        if tokens:
            runs.append(run_of(info, marker, tokens, float(info["wall_s"])))
    if not runs and resumed:
        raise PonderError(f"the {resumed} finished suite runs under {root} were all resumed "
                          "runs, whose wall time covers only their last attempt: a pilot needs "
                          "runs that went through in one attempt (`python -m "
                          "lm_eval_ponder.suite --limit 10 --output DIR`)")
    if not runs:
        raise PonderError(f"no finished suite runs under {root} (a pilot is `python -m "
                          "lm_eval_ponder.suite --limit 10 --output DIR`)")
    return runs


def read_lengths(root: str | Path) -> list[PilotRun]:
    """Every run under a suite output directory with its questions and generated tokens, from
    its full or compact samples log; wall time not needed (NaN): the answer lengths a
    ``ScaleCost`` prices."""
    from lm_eval_ponder.reporting.compact import read_samples, run_log

    root = Path(root)
    if not root.is_dir():
        raise PonderError(f"no such suite directory for the answer lengths: {root}")
    runs = []
    for marker in sorted(root.rglob("ponder_run.json")):
        info = read_json(marker)
        tokens: dict = {}
        for result in sorted(marker.parent.rglob("results_*.json")):
            for task in read_json(result).get("results", {}):
                log = run_log(result, task)
                for sample in read_samples(log) if log is not None else []:
                    tokens.setdefault(sample["doc_id"], float(sample.get("gen_tokens", "nan")))
        if tokens:
            runs.append(run_of(info, marker, tokens, float("nan")))
    if not runs:
        raise PonderError(f"no suite runs with samples logs under {root}")
    return runs


@dataclass(frozen=True)
class ScaleCost:
    """The cost of a backbone shape on a device, as ``benchmarks/scale.py --out`` measured it:
    the loop's useful tokens per second (its median over interleaved pairs) and the start-up
    every run pays once: building the model plus, with ``scale.py --harness``, a one-token
    ``lm_eval --model ponder`` run (imports, tasks, model load, grading worker)."""

    shape: str
    device: str
    dtype: str
    tok_s: float
    startup_s: float
    overhead_s_per_token: float | None = None  # None: not measured (a loop-only record)
    questions: int | None = None  # how many questions the record replayed
    max_rows: int | None = None  # the loop's rows in flight there

    def small_record(self, planned_questions: int) -> str | None:
        """Why this rate misprices a run of ``planned_questions``, or None. A rate holds at the
        rows in flight it was measured with: where a decode step is memory-bound, a replay of
        fewer questions than the loop's rows keeps fewer rows in flight than a full run does
        and pays nearly a full step for each, so its tokens per second are far lower (the
        embedded shape on a 2-core AMX Xeon: a 24-question record priced the 500-question
        arith run at 414 s, which took 234 s; a 256-question one at 265 s)."""
        if not self.questions or not self.max_rows or self.questions >= min(
                self.max_rows, planned_questions):
            return None
        return (f"this record replayed {self.questions} questions, fewer than the loop's "
                f"{self.max_rows} rows in flight in a {planned_questions}-question run, so its "
                f"rate is too low for that run and the estimate too long; record one with "
                f"`benchmarks/scale.py --questions {self.max_rows}` or more")

    @classmethod
    def read(cls, path: str | Path) -> ScaleCost:
        data = read_json(Path(path)) if Path(path).is_file() else None
        if not isinstance(data, dict) or "useful_tok_s" not in data:
            raise PonderError(f"{path} is not a benchmarks/scale.py --out file (no useful_tok_s)")
        overhead = data.get("harness_overhead")
        return cls(str(data["shape"]), str(data["device"]), str(data["dtype"]),
                   float(data["useful_tok_s"]["loop"]),
                   float(data.get("load_s", 0.0)) + float(data.get("harness_s", 0.0)),
                   None if not overhead else max(float(overhead["s_per_token"]), 0.0),
                   data.get("questions"), data.get("loop_max_rows"))

    def model(self) -> CostModel:
        """Start-up per run + seconds per token: the loop's, plus what the harness spends per
        token beyond it where ``scale.py --harness-questions`` measured that (a negative
        difference, a real run as fast as the replay, counts as none)."""
        return CostModel(self.startup_s, 1.0 / self.tok_s + (self.overhead_s_per_token or 0.0))


def training_tokens(cache_tokens_per_answer: float) -> dict[str, float]:
    """Generated tokens of the trainer's default (paper-scale) configuration: the prompt-level
    rollout cache (every training prompt at every depth, ``samples`` answers each) and the
    token-level run (every step's prompts x G answers), at ``cache_tokens_per_answer`` tokens
    per answer (the committed rollout caches' mean)."""
    from lm_eval_ponder.training.config import TrainConfig

    cfg = TrainConfig(output="unused")
    prompts = sum(cfg.rollout.prompts.values())
    cache = prompts * (cfg.ponder.k_max + 1) * cfg.rollout.samples * cache_tokens_per_answer
    grpo = cfg.grpo
    token_level = grpo.max_steps * grpo.prompts_per_step * grpo.num_generations * \
        cache_tokens_per_answer
    return {"prompt-level rollout cache": cache, "token-level GRPO": token_level}


def fit_cost(runs: list[PilotRun]) -> CostModel:
    """Least-squares ``wall = startup + tokens x s_per_token`` over the pilot's runs; through
    the origin when the fitted start-up would be negative or the runs cannot separate it."""
    import numpy as np

    x = np.array([r.tokens for r in runs if r.tokens == r.tokens])
    y = np.array([r.wall_s for r in runs if r.tokens == r.tokens])
    if len(x) == 0 or not x.any():
        raise PonderError("the pilot's runs recorded no generated tokens; cannot price tokens")
    if len(set(x.tolist())) >= 2:
        slope, intercept = np.polyfit(x, y, 1)
        if intercept >= 0 and slope > 0:
            return CostModel(float(intercept), float(slope))
    return CostModel(0.0, float((x @ y) / (x @ x)))


def estimate(planned: list, pilot: list[PilotRun], limit: int | None = None,
             done: set[tuple[str, str, str]] | None = None,
             model: CostModel | None = None) -> tuple[list[dict], CostModel]:
    """Each planned run (``suite_plan.Run``) with its questions, expected tokens and wall
    seconds; ``done`` holds (label, decoding, dataset) of runs already finished (cost 0).
    ``model``: the cost per token (a ``ScaleCost``'s); None fits one to the pilot's walls."""
    model = model or fit_cost(pilot)
    rates = {(r.label, r.decoding, r.dataset): r.tokens_per_question for r in pilot}
    rows = []
    for p in planned:
        n = questions(p.dataset, limit)
        key = (p.label, p.decoding, p.dataset)
        per_q = rates.get(key)
        finished = key in (done or set())
        tokens = None if per_q is None else n * per_q
        wall = 0.0 if finished else (None if tokens is None else model.wall(tokens))
        rows.append({**asdict(p), "questions": n, "tokens_per_question": per_q,
                     "tokens": tokens, "wall_s": wall, "done": finished})
    return rows, model


def render_estimate(rows: list[dict], model: CostModel, source: str = "the pilot") -> str:
    """A table a person can check, and the total with what it leaves out."""
    lines = ["| run | dataset | questions | tokens/question (pilot) | est. wall |",
             "|---|---|---|---|---|"]
    for r in rows:
        per_q = "-" if r["tokens_per_question"] is None else f"{r['tokens_per_question']:.0f}"
        wall = "done" if r["done"] else ("no pilot run" if r["wall_s"] is None
                                         else f"{r['wall_s'] / 60:.0f} min")
        lines.append(f"| {r['label']} | {r['dataset']} | {r['questions']} | {per_q} | {wall} |")
    priced = [r for r in rows if r["wall_s"] is not None]
    missing = [r for r in rows if r["wall_s"] is None]
    total = sum(r["wall_s"] for r in priced)
    lines.append("")
    lines.append(f"Cost model from {source}: {model.startup_s:.0f} s start-up per run + "
                 f"{model.s_per_token * 1000:.2f} ms per generated token.")
    lines.append(f"Estimated total: {total / 3600:.1f} h for {len(priced)} runs"
                 + (f"; {len(missing)} runs have no pilot run and are not counted"
                    if missing else "") + ".")
    return "\n".join(lines)

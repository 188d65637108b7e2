"""The rollout cache: every training prompt generated once per ponder depth, kept on disk.

Why (docs/design/training.md, "Rollout cache"): at prompt granularity, with the backbone and
vector frozen, the answer at depth k is the one generated at the fixed offset c_k, so each
prompt's K_max+1 outcomes are generated once and every GRPO step becomes a lookup: O(prompts x
(K_max+1)) generations instead of O(steps x batch x G). Token granularity cannot be cached.

What is stored, in one directory:

- ``manifest.json``: what the outcomes depend on (backbone and vector hashes, layer, scale,
  offsets, generation settings, prompt set). Opening a directory with a different manifest is
  refused, so a cache can never answer for other settings.
- ``prompts.jsonl`` and ``states.safetensors``: the prompts (exactly the lm-eval task's
  context, chat template included) and the controller's input z_0 for each, the steering
  layer's output at the last prompt token.
- ``rollouts.rank<r>[.part<b>].jsonl``: one file per rank and block of prompts (older caches:
  one per rank), one line per (prompt, depth, sample) with the text, generated
  tokens, FLOPs, the grade and the reward inputs (relative error, perplexity under the frozen
  unsteered backbone). Lines are appended and fsynced per batch; on restart finished lines are
  skipped and a torn last line is ignored, so an interruption loses at most one batch. Under
  ``accelerate launch`` each rank generates its share of the prompts into its own file.
- ``rollouts.rank<r>[.part<b>].outcomes.json.xz``: the same outcomes without their texts, what
  a repository keeps (a cache's texts are 15-20 MB, its outcomes 0.4 MB). Columns
  of the fields training and the analyses read (key, depth, sample, grade, tokens, FLOPs,
  relative error, perplexity) and, for the text, the features the reward reads of it
  (``rewards.text_features``), tagged with the patterns they were taken with. Rewritten
  (atomically) after every append with every record of its part, so it never holds less than
  its plain file. A record is read from the plain file where that has it (texts and all),
  else from the compact twin (a clone, where only the twins are).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import load_file, save_file

from lm_eval_ponder import registry
from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import (
    atomic_write,
    atomic_write_text,
    atomic_write_xz,
    exact_float32,
    read_text,
    short_float32,
)
from lm_eval_ponder.generation.generator import SteeredGenerator
from lm_eval_ponder.pondering.steered import OffsetsPerRow
from lm_eval_ponder.portable import backbone_record
from lm_eval_ponder.scoring import grading
from lm_eval_ponder.training.rewards import TEXT_FEATURES, record_features
from lm_eval_ponder.typed import option

MANIFEST = "manifest.json"
PROMPTS = "prompts.jsonl"
STATES = "states.safetensors"
OUTCOMES = ".outcomes.json.xz"
OUTCOMES_FORMAT = "lm-eval-ponder rollout outcomes, columns, v1"
# The columns a compact part keeps: every field that training and the analyses read.
OUTCOME_FIELDS = ("key", "depth", "sample", "correct", "gen_tokens", "flops", "rel_error", "ppl")
FEATURE_COLUMNS = ("stages", "words", "repeated")  # and a text's features (``text_features``)

LOGGER = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    """What to generate. Defaults: the train splits of GSM8K and the arith ladder, greedy."""

    prompts: dict[str, int] = option(lambda: {"arith_ponder": 50, "gsm8k_ponder": 14},
                                     "task -> number of training prompts, from train splits only")
    max_completion_length: int = option(256, "new tokens per answer; our CPU runs use 256 (paper: 500)")
    samples: int = option(1, "outcomes per (prompt, depth); 1 = greedy")
    temperature: float = option(0.7, "used only when samples > 1")
    batch_size: int = option(0, (
        "rows per generation call (a block of prompts x depths x samples); 0: 4 x the "
        "generation loop's rows in flight"))
    apply_chat_template: bool = option(True, "render prompts with the tokenizer's chat template")
    seed: int = option(1234, "sampling seed when samples > 1")


def train_documents(task: str, n: int) -> list[dict]:
    """The first ``n`` documents of a task's *training* split (never the test split).

    arith: the ladder's train split (interleaved by level, disjoint from test by
    construction); GSM8K: its train split. MATH500 and GPQA Diamond have no train split
    (which datasets have one is the registry's ``train_split``).
    """
    from lm_eval_ponder import data

    family = registry.dataset_of(task)
    trainable = [d.name for d in registry.DATASETS if d.train_split]
    if family not in trainable:
        raise PonderError(f"{task!r} has no training split to train a controller on; use "
                          + " and/or ".join(registry.task_name(d, "Direct") for d in trainable))
    if family == "arith":
        per_level = max(1, math.ceil(n / len(data.ARITH_LEVELS)))
        docs = data.arith_ladder("train", per_level=max(per_level, 100))
    elif family == "gsm8k":
        docs = [dict(d) for d in data.load_gsm8k("train").select(range(n))]
        for d in docs:
            d["id"] = "gsm8k-train-" + hashlib.sha256(d["question"].encode()).hexdigest()[:12]
    else:
        raise NotImplementedError(f"the registry gives {family} a training split that no "
                                  "loader here reads")
    return docs[:n]


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Prompt:
    key: str  # hash of task, doc id and context
    task: str
    doc_id: str
    level: int | None
    context: str
    gold: str
    kind: str


def build_prompts(generator: SteeredGenerator, cfg: RolloutConfig) -> list[Prompt]:
    """The training prompts exactly as lm-eval renders the task (chat template included)."""
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.scoring.tasklib import SPLIT_KEY

    documents = {name: train_documents(name, n) for name, n in cfg.prompts.items()}
    # our tasks only: indexing all of lm-eval's (~14k YAML files) costs ~25 s per start here;
    # the tasks load their training split, so a training run never reads a test split
    tasks = TaskManager(include_defaults=False, metadata={SPLIT_KEY: "train"}).load(
        list(cfg.prompts))["tasks"]
    prompts = []
    for name, docs in documents.items():
        task = tasks[name]
        kind = registry.dataset(registry.dataset_of(name)).answer  # how its answers are graded
        for doc in docs:
            context = task.fewshot_context(
                doc, 0, apply_chat_template=cfg.apply_chat_template,
                chat_template=generator.apply_chat_template if cfg.apply_chat_template else None,
            )
            gold = str(task.doc_to_target(doc))
            key = _sha([name, doc["id"], context])[:16]
            prompts.append(Prompt(key, name, doc["id"], doc.get("level"), context, gold, kind))
    return prompts


def generation_kwargs(cfg: RolloutConfig) -> dict:
    kwargs = {"until": [], "max_gen_toks": cfg.max_completion_length, "do_sample": cfg.samples > 1}
    if cfg.samples > 1:
        kwargs["temperature"] = cfg.temperature
    return kwargs


@torch.no_grad()
def prompt_states(generator: SteeredGenerator, contexts: list[str], layer: int) -> torch.Tensor:
    """z_0 per prompt: the steering layer's (unsteered) output at the last prompt token.

    One prompt at a time, so no padding can shift the last position; encoded as HFLM encodes
    generation contexts (its ``tok_batch_encode``, the generator's ``encode_batch``), which is
    what the steering hook sees.
    """
    from lm_eval_ponder.backbone import decoder_layers
    from lm_eval_ponder.hooks import last_token_capture

    model, device = generator.model, generator.device
    with last_token_capture(decoder_layers(model)[layer]) as captured:
        for context in contexts:
            ids, mask = generator.encode_batch([context])
            model(input_ids=ids.to(device), attention_mask=mask.to(device))
    return torch.cat(captured, dim=0)


@torch.no_grad()
def response_perplexities(generator: SteeredGenerator, contexts: list[str], texts: list[str],
                          logits_budget: int = 1 << 28) -> list[float | None]:
    """Perplexity of each text given its context under the frozen, unsteered backbone.

    The coherence input of the quality reward: steering can make text fluent to the steered
    model and odd to the original one, so we ask the original one (no hook is active here).
    None for an empty text.

    Memory stays bounded whatever the number of texts: rows are scored in chunks, left-padded
    so every row's response sits at the end, and only the response positions' logits are
    computed (``logits_to_keep``), at most ``logits_budget`` bytes of them per chunk. A
    (context, text) pair that occurs more than once (greedy answers of nearby depths often
    agree) is scored once.
    """
    pairs = list(zip(contexts, texts))
    unique = list(dict.fromkeys(pairs))
    if len(unique) < len(pairs):
        scored = dict(zip(unique, response_perplexities(
            generator, [c for c, _ in unique], [t for _, t in unique], logits_budget)))
        return [scored[pair] for pair in pairs]
    rows, responses, tokenizer = [], [], generator.tokenizer
    for context, text in zip(contexts, texts):
        resp = tokenizer(text, add_special_tokens=False).input_ids
        rows.append(generator.encode_batch([context])[0][0].tolist() + resp)
        responses.append(len(resp))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return token_perplexities(generator.model, rows, responses, pad, generator.device,
                              logits_budget)


@torch.no_grad()
def token_perplexities(model, rows: list[list[int]], responses: list[int], pad: int, device,
                       logits_budget: int = 1 << 28) -> list[float | None]:
    """Perplexity of the last ``responses[i]`` tokens of each row of token ids given the rest
    (``response_perplexities`` once the texts are tokens; ``benchmarks/train_cost.py`` times
    it on replayed lengths). None where the response is empty."""
    import inspect

    params = inspect.signature(model.forward).parameters
    vocab = model.get_output_embeddings().weight.shape[0]
    out: list[float | None] = [None] * len(rows)
    todo = sorted((i for i in range(len(rows)) if responses[i] > 0), key=lambda i: len(rows[i]))
    start = 0
    while start < len(todo):
        keep = responses[todo[start]] + 1
        n = max(1, logits_budget // (4 * keep * vocab))
        chunk = todo[start : start + n]
        keep = max(responses[i] for i in chunk) + 1
        chunk = chunk[: max(1, logits_budget // (4 * keep * vocab))]
        start += len(chunk)
        width = max(len(rows[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(chunk):
            ids[j, width - len(rows[i]):] = torch.tensor(rows[i])
            mask[j, width - len(rows[i]):] = 1
        kwargs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
        if "position_ids" in params:  # left padding must not shift the real tokens' positions
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
        if "logits_to_keep" in params:
            kwargs["logits_to_keep"] = min(keep, width)
        logits = model(**kwargs).logits
        for j, i in enumerate(chunk):
            n_resp = responses[i]
            # the last ``n_resp + 1`` positions predict the response tokens and one beyond
            pred = logits[j, logits.shape[1] - n_resp - 1 : logits.shape[1] - 1].float()
            target = ids[j, width - n_resp:].to(pred.device)
            out[i] = float(torch.exp(torch.nn.functional.cross_entropy(pred, target)))
    return out


def relative_error(kind: str, pred: str | None, gold: str) -> float | None:
    """|y_hat - y| / |y| for numeric answers (the partial-credit input); None otherwise."""
    if kind != "numeric" or pred is None:
        return None
    p, g = grading.parse_number(pred), grading.parse_number(gold)
    if p is None or g is None:
        return None
    return float(abs(p - g) / (abs(g) + 1e-9)) if g != 0 else float(abs(p))


def differing_settings(old: dict, new: dict) -> list[str]:
    """The identity keys in which two caches differ. The backbone's spelling does not count
    where both record the same weights' SHA-256: caches made before 2026-12-04 spelt it as a
    path of the machine that made them, so a committed cache matched only on that machine."""
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if old.get("backbone_sha256") and old.get("backbone_sha256") == new.get("backbone_sha256"):
        diff = [k for k in diff if k != "backbone"]
    return diff


class RolloutCache:
    """Read/write access to a cache directory (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, manifest: dict | None = None) -> None:
        self.dir = Path(directory)
        path = self.dir / MANIFEST
        if manifest is None:
            if not path.is_file():
                raise PonderError(f"{self.dir} is not a rollout cache (no {MANIFEST}); "
                                  "`python -m lm_eval_ponder.train --output DIR --cache_dir "
                                  f"{self.dir}` builds it in its first phase")
            manifest = json.loads(path.read_text())
        elif path.is_file():
            old = json.loads(path.read_text())
            if old.get("fingerprint") != manifest.get("fingerprint"):
                diff = differing_settings(old["identity"], manifest["identity"])
                if diff:
                    raise PonderError(
                        f"rollout cache {self.dir} was built for other settings (differs in: "
                        f"{', '.join(diff)}); use another --cache-dir or delete this one")
                manifest = old  # the same settings, the backbone spelt as before 2026-12-04
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True))
        self.manifest = manifest

    # ----------------------------------------------------------- prompts and states
    def has_prompts(self) -> bool:
        return (self.dir / PROMPTS).is_file() and (self.dir / STATES).is_file()

    def write_prompts(self, prompts: list[Prompt], states: torch.Tensor) -> None:
        lines = "".join(json.dumps(asdict(p), sort_keys=True) + "\n" for p in prompts)
        atomic_write_text(self.dir / PROMPTS, lines)
        atomic_write(self.dir / STATES, lambda tmp: save_file({"z0": states.contiguous()}, tmp))

    def _require_prompts(self) -> None:
        # A cache kept in git holds its manifest and outcomes only: the prompts embed benchmark
        # questions (GSM8K), which are never committed, and z_0 follows from them.
        if not self.has_prompts():
            raise PonderError(
                f"rollout cache {self.dir} has its outcomes but not its prompts and z_0 "
                f"({PROMPTS}, {STATES}); rebuild them from the benchmark data with the command "
                "that built the cache (e.g. `python studies/headroom.py build --restore-only "
                "...`; nothing is generated again)")

    def prompts(self) -> list[Prompt]:
        self._require_prompts()
        with open(self.dir / PROMPTS) as f:
            return [Prompt(**json.loads(line)) for line in f if line.strip()]

    def states(self) -> torch.Tensor:
        self._require_prompts()
        return load_file(str(self.dir / STATES))["z0"]

    # ----------------------------------------------------------- outcomes
    def records(self) -> Iterator[dict]:
        """Every complete record of every rank's file (a torn last line is skipped): from the
        plain file where it has the record, else from its compact twin."""
        stems = {p.name[:-len(".jsonl")] for p in self.dir.glob("rollouts.rank*.jsonl")} | \
            {p.name[:-len(OUTCOMES)] for p in self.dir.glob("rollouts.rank*" + OUTCOMES)}
        for stem in sorted(stems):
            yield from part_records(self.dir / f"{stem}.jsonl")

    def done(self) -> set[tuple[str, int, int]]:
        return {(r["key"], r["depth"], r["sample"]) for r in self.records()}

    def append(self, rank: int, records: list[dict], part: int | None = None) -> None:
        """Append to this rank's file, or to its file for one block of prompts (``part``): a
        long build kept in git stays in files of a few MB, each finished once."""
        name = f"rollouts.rank{rank}.jsonl" if part is None else \
            f"rollouts.rank{rank}.part{part:03d}.jsonl"
        path = self.dir / name
        # A previous run killed mid-line leaves a torn tail: start on a fresh line.
        needs_newline = path.is_file() and path.stat().st_size > 0 and \
            path.read_bytes()[-1:] != b"\n"
        with open(path, "a") as f:
            if needs_newline:
                f.write("\n")
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        write_outcomes(path)

    def table(self) -> dict[tuple[str, int], list[dict]]:
        """(prompt key, depth) -> its samples, sorted by sample index."""
        out: dict[tuple[str, int], list[dict]] = {}
        for r in self.records():
            out.setdefault((r["key"], r["depth"]), []).append(r)
        for v in out.values():
            v.sort(key=lambda r: r["sample"])
        return out


def outcomes_path(plain: Path) -> Path:
    return plain.with_name(plain.name[:-len(".jsonl")] + OUTCOMES)


def plain_records(plain: Path) -> list[dict]:
    """The complete lines of a plain outcomes file (none if it is absent)."""
    rows = []
    if plain.is_file():
        with open(plain) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a torn last line: its batch is generated again
    return rows


def part_records(plain: Path) -> list[dict]:
    """One part's records: its plain file's, and those of its compact twin that the plain file
    lacks (a part begun in a clone that had only the compact twin)."""
    rows = plain_records(plain)
    compact = outcomes_path(plain)
    if compact.is_file():
        have = {(r["key"], r["depth"], r["sample"]) for r in rows}
        rows = [r for r in read_outcomes(compact)
                if (r["key"], r["depth"], r["sample"]) not in have] + rows
    return rows


def write_outcomes(plain: Path) -> Path:
    """Rewrite the compact twin of a plain outcomes file (see the module docstring) with every
    record of the part."""
    rows = part_records(plain)
    keys = sorted({r["key"] for r in rows})
    index = {k: i for i, k in enumerate(keys)}
    columns: dict[str, list] = {name: [r.get(name) for r in rows] for name in OUTCOME_FIELDS}
    columns["key"] = [index[r["key"]] for r in rows]
    features = [record_features(r) for r in rows]
    for name in FEATURE_COLUMNS:
        columns[name] = [f[name] for f in features]
    float32 = []
    ppl = short_float32(columns["ppl"])  # perplexities are float32: 8 digits, not 17
    if ppl is not None:
        columns["ppl"], float32 = ppl, ["ppl"]
    target = outcomes_path(plain)
    atomic_write_xz(target, json.dumps({"format": OUTCOMES_FORMAT, "text_features": TEXT_FEATURES,
                                        "float32": float32, "keys": keys, "columns": columns}))
    return target


def read_outcomes(path: Path) -> list[dict]:
    """The records of a compact outcomes file, with ``text_features`` in place of ``text``."""
    try:
        data = json.loads(read_text(path))
        columns = data["columns"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise PonderError(f"{path}: not a compact rollout outcomes file ({error})") from error
    if data.get("text_features") != TEXT_FEATURES:
        raise PonderError(
            f"{path} keeps the text features of other completeness patterns "
            f"({data.get('text_features')}, these are {TEXT_FEATURES}): the texts are needed "
            "to score it; restore the plain part from git history (its .jsonl, e.g. `git log "
            "--all -- PATH` then `git show COMMIT:PATH > PATH`) and it is read instead")
    for name in data.get("float32", []):
        columns[name] = exact_float32(columns[name])
    keys, out = data["keys"], []
    for i in range(len(columns["key"])):
        record = {name: columns[name][i] for name in OUTCOME_FIELDS}
        record["key"] = keys[record["key"]]
        record["text_features"] = {name: columns[name][i] for name in FEATURE_COLUMNS}
        out.append(record)
    return out


def cache_identity(generator: SteeredGenerator, cfg: RolloutConfig, offsets: list[float],
                   prompts: list[Prompt]) -> dict:
    backbone, steering = generator.backbone, generator.require_steering()
    return {
        "backbone": backbone_record(backbone.path, backbone.name, backbone.source_sha256),
        "backbone_sha256": backbone.source_sha256,
        "dtype": str(generator.model.dtype),
        "steering_sha256": steering.sha(),
        "layer": steering.layer,
        "scale": steering.scale,
        "offsets": [round(float(c), 8) for c in offsets],
        "generation": generation_kwargs(cfg),
        "samples": cfg.samples,
        "seed": cfg.seed,
        "prompts_sha256": prompts_sha(prompts),
    }


def prompts_sha(prompts: list[Prompt]) -> str:
    """The data hash a controller's config.json records: every prompt, exactly as rendered."""
    return _sha([asdict(p) for p in prompts])


def prepare_cache(generator: SteeredGenerator, cfg: RolloutConfig, offsets: list[float],
                  directory: str | os.PathLike, write: bool = True) -> tuple[RolloutCache, list[Prompt]]:
    """Open (or, with ``write``, create) the cache for these settings; write prompts and z_0.

    Prompts and z_0 missing beside existing outcomes (a cache restored from git) are rebuilt
    here; the manifest's prompt hash guarantees they are the prompts the outcomes answer.

    In a multi-process run only rank 0 writes; the others open it afterwards, and get the same
    refusal if it was built for other settings.
    """
    prompts = build_prompts(generator, cfg)
    identity = cache_identity(generator, cfg, offsets, prompts)
    manifest = {"identity": identity, "fingerprint": _sha(identity)[:16],
                "n_prompts": len(prompts), "k_max": len(offsets) - 1}
    if not write and not (Path(directory) / MANIFEST).is_file():
        raise PonderError(f"rollout cache {directory} has no manifest (rank 0 writes it first)")
    cache = RolloutCache(directory, manifest)
    if write and not cache.has_prompts():
        cache.write_prompts(prompts, prompt_states(generator, [p.context for p in prompts],
                                                   generator.require_steering().layer))
    return cache, prompts


def block_size(generator: SteeredGenerator, cfg: RolloutConfig, n_depths: int) -> int:
    """Prompts per block: a block's prompts x depths x samples fill one generation call of
    ``cfg.batch_size`` rows (0: ``Batching.requests_per_call``, four times the model's rows in
    flight, so the loop stays full while rows finish and waiting ones join)."""
    rows = cfg.batch_size or generator.batching.requests_per_call
    return max(1, rows // (cfg.samples * n_depths))


def generate_missing(generator: SteeredGenerator, cache: RolloutCache, prompts: list[Prompt],
                     cfg: RolloutConfig, offsets: list[float], rank: int = 0, world: int = 1,
                     progress: bool = True, blocks: range | None = None) -> None:
    """Generate every missing (prompt, depth, sample) of this rank's prompts (r, r+world, ...).

    ``generator`` holds a steering vector. A block of prompts is one generation call
    (``SteeredGenerator.generate_texts``) holding every depth and sample of its prompts, each
    row at its depth's offset, so the loop keeps ``max_rows`` in flight (1.15x its tokens/s;
    one depth per call left it 16 rows on a GPU that runs 256, 1.4 answers/s: a benchmark since
    retired, ``docs/results/history.md``). Rows go longest prompt first, as lm-eval orders a batch.

    A block is written once finished, so a stopped build leaves whole prompts. Its sampling seed
    depends only on the block, so a resumed build draws what an uninterrupted one would have
    (a half-done block of an older per-depth build is completed from its missing rows: valid
    draws, not the uninterrupted ones), and ``blocks`` (indices of this rank's blocks) lets two
    processes share a build, together drawing exactly what one process would.
    """
    from lm_eval_ponder.generation.progress import RowProgress

    done = cache.done()
    mine = prompts[rank::world]
    per_block = block_size(generator, cfg, len(offsets))
    starts = range(0, len(mine), per_block)
    if blocks is not None:
        starts = [b for i, b in enumerate(starts) if i in blocks]
    gen = generation_kwargs(cfg)
    todo = {b: [(p, k, s) for p in mine[b : b + per_block] for k in range(len(offsets))
                for s in range(cfg.samples) if (p.key, k, s) not in done] for b in starts}
    kept = sum(1 for p in mine for k in range(len(offsets)) for s in range(cfg.samples)
               if (p.key, k, s) in done)
    if kept and progress:  # a resumed build says so, and what is left
        LOGGER.warning("rollout cache %s: resuming with %d of %d answers kept; %d to generate",
                       cache.dir, kept, kept + sum(map(len, todo.values())),
                       sum(map(len, todo.values())))
    # per finished answer, with rows in flight, tokens and a status line during a long tail
    bar = RowProgress(sum(map(len, todo.values())), f"rollouts (rank {rank})", unit="answer",
                      disable=not progress)
    lengths = {p.key: len(generator.encode(p.context)) for p in mine}
    try:
        for block_start, items in todo.items():
            if not items:
                continue
            items.sort(key=lambda item: -lengths[item[0].key])  # stable: prompt-major otherwise
            torch.manual_seed(cfg.seed + 104729 * (rank + world * block_start))
            contexts = [p.context for p, _, _ in items]
            with bar.watch(generator.model):
                steer = OffsetsPerRow(generator.require_steering(),
                                      [offsets[k] for _, k, _ in items])
                texts = generator.generate_texts(contexts, gen, steer=steer,
                                                 observers=[bar.observer()])
            ppls = response_perplexities(generator, contexts, [str(t) for t in texts])
            records = []
            for (p, depth, s), text, ppl in zip(items, texts, ppls):
                correct, pred = grading.grade(p.kind, str(text), p.gold)
                records.append({
                    "key": p.key, "depth": depth, "sample": s, "offset": offsets[depth],
                    "task": p.task, "level": p.level, "text": str(text),
                    "gen_tokens": int(text.stats["gen_tokens"]),
                    "prompt_tokens": int(text.stats["prompt_tokens"]),
                    "flops": float(text.stats["flops"]),
                    "correct": bool(correct), "pred": pred,
                    "rel_error": relative_error(p.kind, pred, p.gold),
                    "ppl": ppl,
                })
            cache.append(rank, records, part=block_start // per_block)
    finally:
        bar.close()


def build_cache(generator: SteeredGenerator, cfg: RolloutConfig, offsets: list[float],
                directory: str | os.PathLike, progress: bool = True) -> RolloutCache:
    """Single-process convenience: prepare the cache and generate everything missing."""
    cache, prompts = prepare_cache(generator, cfg, offsets, directory)
    generate_missing(generator, cache, prompts, cfg, offsets, progress=progress)
    return cache

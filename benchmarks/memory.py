"""Peak resident memory of ``--model ponder`` per phase (issue 66): load, prefill, decode.

    python benchmarks/memory.py                         # the embedded model, the whole arith ladder
    python benchmarks/memory.py --dtype float32
    python benchmarks/memory.py --shape qwen2.5-0.5b --limit 100   # random weights of the shape
    python benchmarks/memory.py --train-cache           # a default `train` rollout cache instead

The run is lm-eval's own (``simple_evaluate`` on ``arith_ponder`` with the chat template, the
task's 500 new tokens) through ``PonderLM`` with its defaults, in this process. A thread reads
this process's resident set (``/proc/self/statm``) every 10 ms, and a forward pre-hook on the
model names the phase each reading belongs to: ``load`` until the first forward, ``prefill``
while a forward over an empty cache runs, ``decode`` otherwise. The record gives each phase's
peak, the weights' bytes, the cache budget (``max_cache_gib``: what the loop may hold in keys
and values) and the check: peak <= weights + cache budget + 1 GiB, and, for the embedded model
on the whole ladder, <= 2.0 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PhasePeaks:
    """The highest RSS seen in each phase, sampled every ``every`` seconds."""

    def __init__(self, every: float = 0.01) -> None:
        self.phase, self.peaks, self.every = "load", {}, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while not self.stop.is_set():
            rss = rss_bytes()
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)
            time.sleep(self.every)

    def watch(self, model):
        def pre(module, args, kwargs):
            cache = kwargs.get("past_key_values", kwargs.get("cache"))
            length = getattr(cache, "get_seq_length", None)
            self.phase = "prefill" if cache is None or (length is not None and length() == 0) \
                else "decode"
            # a reading at every forward's start: a phase shorter than the sampling interval
            # (a tiny model's prefill) still has its peak
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss_bytes())

        return model.register_forward_pre_hook(pre, with_kwargs=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def random_backbone(shape: str, dtype: str, folder: Path) -> str:
    """A random-weight model of ``benchmarks/shapes/<shape>.json`` saved with the embedded
    model's tokenizer (the prompts must tokenise), for PonderLM to load as any model."""
    import torch
    from lib.replay import build_model, shape_config
    from transformers import AutoTokenizer

    from lm_eval_ponder.backbone import resolve_backbone

    config = shape_config(shape)[0]
    tokenizer = AutoTokenizer.from_pretrained(resolve_backbone(None).path)
    config.vocab_size = max(config.vocab_size, len(tokenizer))
    model = build_model(config, "cpu", getattr(torch, dtype), 0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default=None,
                        help="a benchmarks/shapes name (random weights); default: the embedded model")
    parser.add_argument("--dtype", default=None, help="default: --model ponder's (native)")
    parser.add_argument("--limit", type=int, default=None, help="questions (default: all 500)")
    parser.add_argument("--max-gen-toks", type=int, default=None,
                        help="default: the task's (500)")
    parser.add_argument("--train-cache", action="store_true",
                        help="build a default `train` rollout cache instead of evaluating")
    parser.add_argument("--model-args", default="", help="more model args, k=v,k=v")
    parser.add_argument("--out", default=None, help="write the record as JSON here")
    args = parser.parse_args(argv)
    if args.out:
        from lm_eval_ponder.files import check_output

        check_output(Path(args.out), "--out", Path(args.out).parent)
    import torch

    from lm_eval_ponder.backbone import device_description, native_dtype

    dtype = args.dtype or native_dtype("cpu")
    extra = dict(kv.split("=", 1) for kv in args.model_args.split(",") if kv)
    with tempfile.TemporaryDirectory() as tmp:
        # the random shape is built and saved before any reading: its construction is not load
        pretrained = random_backbone(args.shape, dtype, Path(tmp)) if args.shape else None
        import gc

        gc.collect()
        with PhasePeaks() as peaks:
            base = rss_bytes()
            start = time.perf_counter()
            if args.train_cache:
                figures = train_cache(pretrained, dtype, peaks, Path(tmp) / "train")
            else:
                figures = evaluate(pretrained, dtype, peaks, args, extra)
            wall = time.perf_counter() - start
    weights, budget = figures.pop("weights_bytes"), figures.pop("cache_budget_bytes")
    peak = max(peaks.peaks.values())
    gib = 2**30
    record = {
        "shape": args.shape or "embedded SmolLM2-135M-Instruct", "dtype": dtype,
        "what": "train rollout cache (defaults)" if args.train_cache else
        f"lm_eval arith_ponder, {args.limit or 500} questions",
        "machine": device_description("cpu"), "threads": torch.get_num_threads(),
        "peak_gib": {k: round(v / gib, 3) for k, v in peaks.peaks.items()},
        "peak_all_gib": round(peak / gib, 3), "before_load_gib": round(base / gib, 3),
        "weights_gib": round(weights / gib, 3),
        "cache_budget_gib": None if budget is None else round(budget / gib, 3),
        "bound_gib": None if budget is None else round((weights + budget) / gib + 1, 3),
        "wall_s": round(wall, 1), **figures,
    }
    record["within_bound"] = record["bound_gib"] is None or record["peak_all_gib"] <= record["bound_gib"]
    if not args.shape:
        record["within_2gib"] = record["peak_all_gib"] <= 2.0
    print(json.dumps(record, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


def evaluate(pretrained: str | None, dtype: str, peaks: PhasePeaks, args, extra: dict) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.resources import tasks_dir

    kwargs = {"controller": None, "dtype": dtype, **extra}
    if pretrained:
        kwargs["pretrained"] = pretrained
    lm = PonderLM(**kwargs)
    handle = peaks.watch(lm.model)
    gen = f"max_gen_toks={args.max_gen_toks}" if args.max_gen_toks else None
    out = simple_evaluate(model=lm, tasks=["arith_ponder"], limit=args.limit,
                          apply_chat_template=True, gen_kwargs=gen,
                          task_manager=TaskManager(include_defaults=False,
                                                   include_path=tasks_dir()))
    handle.remove()
    metrics = out["results"]["arith_ponder"]
    return {"accuracy": metrics["exact_match,none"], "gen_tokens": metrics["gen_tokens,none"],
            "max_rows": lm.max_rows, **sizes(lm)}


def sizes(lm) -> dict:
    from lm_eval_ponder.backbone import weight_bytes

    weights = weight_bytes(lm.model)
    gib = lm.batching.max_cache_gib
    budget = None if gib is None else int(gib * 2**30)
    return {"weights_bytes": weights, "cache_budget_bytes": budget}


def train_cache(pretrained: str | None, dtype: str, peaks: PhasePeaks, out: Path) -> dict:
    """A default trainer's rollout cache (no GRPO): what ``train`` holds at its peak."""
    from lm_eval_ponder.pondering.dynamics import cumulative_offsets
    from lm_eval_ponder.training.config import TrainConfig
    from lm_eval_ponder.training.loop import load_backbone
    from lm_eval_ponder.training.rollouts import generate_missing, prepare_cache

    cfg = TrainConfig(output=str(out), pretrained=pretrained, dtype=dtype).validate()
    generator = load_backbone(cfg)
    handle = peaks.watch(generator.model)
    offsets = [float(c) for c in cumulative_offsets(cfg.ponder)]
    cache, prompts = prepare_cache(generator, cfg.rollout, offsets, out / "rollouts")
    generate_missing(generator, cache, prompts, cfg.rollout, offsets, 0, 1)
    handle.remove()
    return {"max_rows": generator.batching.max_rows, **sizes(generator)}

if __name__ == "__main__":
    sys.exit(main())

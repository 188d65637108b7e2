"""The GPU acceptance check: everything a user runs on a GPU, in one process, one table.

    python benchmarks/gpu_check.py                         # on a GPU: about 6 minutes on an H200
    python benchmarks/gpu_check.py --device cpu --limit 4  # the same steps, small, on a CPU (CI)

Steps (each timed; a failing step is reported and the others still run; they run in the
order 2, 1 with the controller, 1 without, 3, then the two ``--model hf`` runs):
  1. the full arith ladder (``arith_ponder``, 500 documents, 500 new tokens, greedy, chat
     template) through lm-eval with ``--model ponder controller=none``, ``--model ponder`` (the
     shipped controller: FP-Direct) and ``--model hf`` at batch 64 and 256, all in the device's
     native dtype (bf16 on a GPU): wall time, accuracy with its Wilson 95% CI, mean generated
     tokens, useful tokens/s, peak memory;
  2. the steering hook with a controller at prompt and token granularity under
     ``torch.cuda.set_sync_debug_mode("error")``, switched on only while the steering layer's
     hooks run (the loop around it reads tokens back; the hook may not);
  3. a 30-step prompt-level training run (its rollout cache: 16 arith prompts x 9 depths x 256
     tokens) and a 4-step token-level run (4 prompts x 4 answers, 64 tokens), on the device.

Exits non-zero if any step fails; the last line is ``gpu_check ok`` when all pass. With
``--limit N`` every step runs small (N documents, 32 new tokens, a few prompts and steps), so CI
runs it on a CPU (``tests/test_gpu_check.py``) and the script cannot rot. ``--budget-s`` skips
the steps that would start after that many seconds (a device lease ends hard). Results go to
``--out`` (default: ``$OUT`` when set) as ``gpu_check.json`` and ``gpu_check.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

GREEDY_TOKENS = 500  # the paper's max new tokens, arith_ponder's max_gen_toks
SMALL_TOKENS = 32
SPEED_TARGET = 8000  # useful tok/s, issue 36


@dataclass
class Step:
    name: str
    ok: bool = False
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class Check:
    """Runs steps, keeps going after a failure, writes what it has after every step."""

    def __init__(self, out: Path | None, budget_s: float | None) -> None:
        self.steps: list[Step] = []
        self.out, self.budget_s, self.start = out, budget_s, time.perf_counter()
        self.header: dict[str, Any] = {}

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> Step:
        step = Step(name)
        elapsed = time.perf_counter() - self.start
        if self.budget_s is not None and elapsed > self.budget_s:
            step.error = f"skipped: {elapsed:.0f} s spent of a {self.budget_s:.0f} s budget"
        else:
            print(f"\n== {name}", flush=True)
            t = time.perf_counter()
            try:
                step.figures = fn()
                step.ok = True
            except Exception as error:  # noqa: BLE001 - reported, and the check fails
                traceback.print_exc()
                step.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            step.seconds = time.perf_counter() - t
            print(f"== {name}: {'ok' if step.ok else 'FAILED'} in {step.seconds:.1f} s "
                  f"{step.figures if step.ok else step.error}", flush=True)
        self.steps.append(step)
        self.write()
        return step

    def table(self) -> str:
        lines = ["| step | ok | s | wall s | accuracy [95% CI] | mean tokens | useful tok/s | "
                 "peak GiB | notes |", "|---|---|---|---|---|---|---|---|---|"]
        for s in self.steps:
            f = s.figures
            acc = (f"{f['accuracy']:.3f} [{f['ci'][0]:.3f}, {f['ci'][1]:.3f}]"
                   if "accuracy" in f else "")
            lines.append(
                f"| {s.name} | {'yes' if s.ok else 'NO'} | {s.seconds:.1f} | "
                f"{fmt(f.get('wall_s'), '.1f')} | {acc} | {fmt(f.get('mean_tokens'), '.1f')} | "
                f"{fmt(f.get('tok_per_s'), ',.0f')} | {fmt(f.get('peak_gib'), '.2f')} | "
                f"{s.error or f.get('notes', '')} |")
        return "\n".join(lines)

    def speed_line(self) -> str:
        """Issue 36's target, read off the table: the fastest ``controller=none`` step."""
        runs = [(s.figures["tok_per_s"], s.name) for s in self.steps
                if s.ok and "controller=none" in s.name and s.figures.get("tok_per_s")]
        if not runs:
            return "fastest controller=none: none ran"
        best, name = max(runs)
        return (f"fastest controller=none: {best:,.0f} useful tok/s ({name}); issue 36's "
                f"target is {SPEED_TARGET:,} on the full ladder on one H100/H200")

    def write(self) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        record = {**self.header, "steps": [vars(s) for s in self.steps]}
        (self.out / "gpu_check.json").write_text(json.dumps(record, indent=2, default=str))
        (self.out / "gpu_check.md").write_text(
            "\n".join(f"- {k}: {v}" for k, v in self.header.items()) + "\n\n" + self.table()
            + "\n")


def fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


class Memory:
    """Peak memory of one step: the GPU's allocator peak, or the process's peak RSS on a CPU
    (a high-water mark for the whole process, so later steps report at least earlier ones)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.device = device

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self) -> float:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated(self.device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def evaluate(lm, args, memory: Memory, tokenizer) -> dict[str, Any]:
    """One lm-eval run of the arith ladder; tokens re-counted from text when the model has none
    (``--model hf``), as the report does."""
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.generation.accounting import count_text_tokens
    from lm_eval_ponder.reporting.measures import wilson

    torch.manual_seed(1234)
    memory.reset()
    t = time.perf_counter()
    out = simple_evaluate(model=lm, tasks=["arith_ponder"], limit=args.limit,
                          apply_chat_template=True, log_samples=True,
                          task_manager=TaskManager(include_defaults=False),
                          gen_kwargs=f"max_gen_toks={args.max_gen_toks}")
    if args.device.startswith("cuda"):
        torch.cuda.synchronize(args.device)
    wall = time.perf_counter() - t
    samples = out["samples"]["arith_ponder"]
    tokens = [s.get("gen_tokens") for s in samples]
    estimated = any(x is None or (isinstance(x, float) and math.isnan(x)) for x in tokens)
    if estimated:
        tokens = [count_text_tokens(tokenizer, s["resps"][0][0], args.max_gen_toks)
                  for s in samples]
    k = sum(float(s["exact_match"]) for s in samples)
    n = len(samples)
    return {"wall_s": wall, "accuracy": k / n, "ci": list(wilson(k, n)), "n": n,
            "mean_tokens": sum(tokens) / n, "tok_per_s": sum(tokens) / wall,
            "peak_gib": memory.peak_gib(),
            "notes": "tokens re-counted from text" if estimated else ""}


def sync_free_steering(args, granularity: str) -> dict[str, Any]:
    """Generation with the shipped controller; inside the steering layer's hooks any host sync
    raises (CUDA). On a CPU nothing can sync: the step checks that the path runs."""
    import torch
    from lm_eval.api.instance import Instance

    from lm_eval_ponder.backbone import decoder_layers
    from lm_eval_ponder.evaluation.lm import PonderLM

    lm = PonderLM(device=args.device, granularity=granularity)
    layers = decoder_layers(lm.model)
    cuda = args.device.startswith("cuda")
    entered = []

    def strict(*_):
        entered.append(1)
        if cuda:
            torch.cuda.set_sync_debug_mode("error")

    def relaxed(*_):
        if cuda:
            torch.cuda.set_sync_debug_mode(0)

    # forward hooks run in registration order: ``strict`` before the steering hook (which is
    # added per generation call), the next block's pre-hook after it
    steer_layer = lm.generator.steering.layer
    handles = [layers[steer_layer].register_forward_hook(strict)]
    after = layers[steer_layer + 1] if steer_layer + 1 < len(layers) else None
    if after is not None:
        handles.append(after.register_forward_pre_hook(relaxed))
    prompts = [lm.apply_chat_template([{"role": "user", "content":
                                        f"Please solve the math problem: What is {a} + {b}?"}])
               for a, b in [(2, 3), (17, 25), (4, 9), (88, 11)]]
    gen = {"until": [], "max_gen_toks": 16 if args.limit else 64, "do_sample": False}
    requests = [Instance("generate_until", {}, (p, dict(gen)), i) for i, p in enumerate(prompts)]
    try:
        texts = lm.generate_until(requests, disable_tqdm=True)
    finally:
        relaxed()
        for h in handles:
            h.remove()
    if len(entered) < 2:  # the prefill and at least one decode step
        raise RuntimeError(f"the steering layer ran {len(entered)} times: nothing was decoded")
    return {"notes": f"{'sync debug mode error' if cuda else 'CPU: no sync check'}; "
                     f"{len(entered)} steered forwards; mean ponder steps "
                     f"{sum(t.stats['ponder_steps'] for t in texts) / len(texts):.2f}"}


def train(args, granularity: str, work: Path) -> dict[str, Any]:
    """A short training run on the device through the trainer's CLI."""
    from lm_eval_ponder.training.cli import main

    small = args.limit is not None
    out = work / f"train-{granularity}"
    if granularity == "prompt":
        prompts, tokens, steps = (min(args.limit, 16), 16, 4) if small else (16, 256, 30)
        extra = ["--grpo.prompts_per_step", "8", "--logging_steps", str(max(1, steps // 3))]
    else:
        prompts, tokens, steps = (4, 8, 2) if small else (8, 64, 4)
        extra = ["--grpo.prompts_per_step", "4", "--grpo.num_generations", "4",
                 "--logging_steps", "2"]
    argv = ["--output", str(out), "--device", args.device,
            "--rollout.prompts", f"{{arith_ponder: {prompts}}}",
            "--rollout.max_completion_length", str(tokens), "--grpo.max_steps", str(steps),
            "--ponder.granularity", granularity, "--val_fraction", "0.25",
            "--grpo.t1", "0", "--grpo.t2", str(steps), *extra]
    t = time.perf_counter()
    code = main(argv)
    wall = time.perf_counter() - t
    if code != 0:
        raise RuntimeError(f"train exited {code}")
    config = json.loads((out / "config.json").read_text())
    cost = config.get("cost", {})
    return {"wall_s": wall, "notes": f"{steps} steps, {prompts} prompts, {tokens} tokens; "
            + ", ".join(f"{k} {v}" for k, v in cost.items() if k.endswith("_s"))}


def failing(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        fn()
        raise RuntimeError("failed on purpose (--fail)")

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--limit", type=int, default=None,
                        help="documents per eval and a small version of every step")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip steps that would start after this many seconds")
    parser.add_argument("--skip", default="", type=lambda v: set(v.split(",")) - {""},
                        help="comma-separated step keys to leave out (ponder-none, ponder, "
                             "hf-64, hf-256, sync-prompt, sync-token, train-prompt, "
                             "train-token)")
    parser.add_argument("--fail", default="", type=lambda v: set(v.split(",")) - {""},
                        help="make these steps raise: checks that the check itself fails")
    args = parser.parse_args(argv)
    args.max_gen_toks = SMALL_TOKENS if args.limit else GREEDY_TOKENS

    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM

    import lm_eval_ponder_autoload  # noqa: F401 - registers --model ponder, our tasks
    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.evaluation.lm import PonderLM

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: --device {args.device} but torch {torch.__version__} sees no GPU; "
              "use --device cpu for the small CPU form", file=sys.stderr)
        return 2
    check = Check(Path(args.out) if args.out else None, args.budget_s)
    dtype = bb.native_dtype(args.device)
    check.header = {"device": bb.device_description(args.device),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "dtype": dtype, "limit": args.limit or "all (500)",
                    "max_gen_toks": args.max_gen_toks,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print("# " + ", ".join(f"{k} {v}" for k, v in check.header.items()), flush=True)
    memory = Memory(args.device)
    path = bb.resolve_backbone(None).path  # the embedded backbone, converted once

    def evaluation(build: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            lm = build()
            try:
                return evaluate(lm, args, memory, lm.tokenizer)
            finally:
                del lm
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()

        return run

    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    # quick and decisive first (the H200 crash was pondering on CUDA), the longest last: a
    # lease that runs out skips the tail (``--budget-s``), not the checks that matter most
    steps: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
        *[(f"sync-{g}", f"steering hook, no host sync ({g})",
           lambda g=g: sync_free_steering(args, g)) for g in ("prompt", "token")],
        ("ponder", "ponder (shipped controller)", evaluation(lambda: PonderLM(device=args.device))),
        ("ponder-none", "ponder controller=none",
         evaluation(lambda: PonderLM(controller="none", device=args.device))),
        *[(f"train-{g}", f"train {g} level", lambda g=g: train(args, g, work))
          for g in ("prompt", "token")],
        *[(f"hf-{b}", f"hf batch {b}", evaluation(lambda b=b: HFLM(
            pretrained=path, dtype=dtype, batch_size=b, device=args.device))) for b in (256, 64)],
    ]
    unknown = (args.skip | args.fail) - {key for key, _, _ in steps}
    if unknown:
        parser.error(f"unknown step(s) {sorted(unknown)}; steps: "
                     f"{', '.join(key for key, _, _ in steps)}")
    for key, name, fn in steps:
        if key in args.skip:
            continue
        if key in args.fail:
            fn = failing(fn)
        check.run(name, fn)
    shutil.rmtree(work, ignore_errors=True)
    print("\n" + "\n".join(f"{k}: {v}" for k, v in check.header.items()))
    print(check.table())
    print(check.speed_line())
    failed = [s.name for s in check.steps if not s.ok]
    if failed:
        print(f"gpu_check FAILED: {', '.join(failed)}")
        return 1
    print("gpu_check ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

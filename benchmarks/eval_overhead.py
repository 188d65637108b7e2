"""lm-eval's own share of a ``gpu_check.py`` evaluation: everything but generation.

``gpu_check.py`` reports useful tokens/s over the whole ``simple_evaluate`` call (the arith
ladder, chat template, 500 documents), so issue 36's 8,000 tok/s (71,363 greedy tokens in 8.9
s) is a budget for the task's setup and grading too. This runs the same call with a model that
answers at once with recorded responses (an lm-eval samples file of ``arith_ponder``, e.g. the
suite's greedy Direct run), so what it times is lm-eval's part alone; its accuracy must equal
the recorded run's, which checks that every answer reached its document.

    python benchmarks/eval_overhead.py --samples results/suite/greedy/Direct/arith/*/samples_*.jsonl.xz

Last line: ``eval_overhead_s <median seconds>``.
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
import sys
import time
from pathlib import Path


def read_answers(path: Path) -> dict[int, str]:
    """doc_id -> the first response, from an lm-eval samples file (``.jsonl`` or ``.jsonl.xz``)."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        return {int(r["doc_id"]): r["resps"][0][0] for r in map(json.loads, f)}


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=Path, required=True,
                        help="an arith_ponder samples file whose responses are replayed")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)
    if not args.samples.is_file():
        sys.exit(f"eval_overhead: no samples file at {args.samples}")

    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    import lm_eval_ponder_autoload  # noqa: F401 - registers our tasks
    from lm_eval_ponder import backbone as bb

    answers = read_answers(args.samples)
    tokenizer = AutoTokenizer.from_pretrained(bb.resolve_backbone(None).path)

    class Replay(LM):
        """Answers each request with its document's recorded response, at once."""

        tokenizer_name = "replay"

        def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
            return tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt)

        def generate_until(self, requests, disable_tqdm=False) -> list[str]:
            return [answers[r.doc_id] for r in requests]

        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    seconds, accuracy = [], None
    for _ in range(args.reps):
        start = time.perf_counter()
        out = simple_evaluate(model=Replay(), tasks=["arith_ponder"], limit=args.limit,
                              apply_chat_template=True, log_samples=True,
                              task_manager=TaskManager(include_defaults=False),
                              gen_kwargs="max_gen_toks=500")
        seconds.append(time.perf_counter() - start)
        accuracy = out["results"]["arith_ponder"]["exact_match,none"]
    print(f"# {bb.device_description('cpu')}; {len(answers)} recorded answers from "
          f"{args.samples}")
    print(f"simple_evaluate without generation: {', '.join(f'{s:.2f}' for s in seconds)} s; "
          f"accuracy {accuracy:.3f} (the recorded run's, if every answer reached its document)")
    median = statistics.median(seconds)
    print(f"eval_overhead_s {median:.3f}")
    return median


if __name__ == "__main__":
    main()

"""Steering-vector extraction time per question on the embedded backbone (paper method).

Each question costs two prefills (p+ and p-), all layers read by hooks in the same pass.
Usage: LM_EVAL_PONDER_DATA=../shared/data python benchmarks/extraction_time.py [N] [batch]
"""

from __future__ import annotations

import sys
import time


def main(n: int = 32, batch_size: int = 8) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_ponder import backbone as bb
    from lm_eval_ponder.data import load_gsm8k
    from lm_eval_ponder.steering.extraction import extract_paper

    resolved = bb.resolve_backbone(None)
    model = bb.freeze(AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32))
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    questions = list(load_gsm8k("train")["question"][:n])
    extract_paper(model, tokenizer, questions[:2], batch_size=2, progress=False)  # warm-up
    start = time.perf_counter()
    extract_paper(model, tokenizer, questions, batch_size=batch_size, progress=False)
    elapsed = time.perf_counter() - start
    print(f"questions {n}, batch {batch_size}, threads {torch.get_num_threads()}")
    print(f"extraction {elapsed:.1f} s, {elapsed / n * 1e3:.0f} ms per question")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(*args)

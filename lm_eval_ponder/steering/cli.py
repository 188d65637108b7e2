"""Command line for steering vectors: ``python -m lm_eval_ponder.steer {extract,inspect}``.

    python -m lm_eval_ponder.steer extract --output controllers/smollm2-135m-instruct
    python -m lm_eval_ponder.steer inspect controllers/smollm2-135m-instruct

``extract`` loads the backbone (default: the embedded SmolLM2-135M-Instruct) frozen, in bfloat16
where the device computes it natively, else float32 (``--dtype``, ``--device``, ``--parallelize``),
takes the first ``--n-questions`` GSM8K TRAIN questions (``--dataset arith``: the arith
ladder's train split, levels interleaved; or a seeded random sample with ``--seed``), and
stores the vectors of every decoder layer; ``--layer`` only picks the default
(``DEFAULT_LAYER_FRACTION`` of depth otherwise). ``inspect`` prints the logit lens, the norms
per layer and the cosine between layers. User mistakes print ``error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lm_eval_ponder.backbone import DTYPES
from lm_eval_ponder.errors import PonderError, command, program_name, run_program
from lm_eval_ponder.files import check_output
from lm_eval_ponder.portable import expand

DEFAULT_N_QUESTIONS = 256
TRAIN_SPLITS = ("train",)  # extraction never reads test questions
STEERING_DATASETS = ("gsm8k", "arith")
ARITH_MAX_QUESTIONS = 1500  # 300 a level: level 1 has 648 distinct questions, train and test


def _build_parser() -> argparse.ArgumentParser:
    # no import of lm_eval_ponder.steering/extraction/inspection here: they import torch, and --help
    # should be instant
    parser = argparse.ArgumentParser(
        prog=program_name("python -m lm_eval_ponder.steer"),
        description="Extract and inspect FR-Ponder steering vectors.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{extract,inspect}")

    ex = sub.add_parser(
        "extract",
        help="extract a steering vector (all layers) from train questions (GSM8K or arith)",
        description="Contrastive extraction at the last prompt token of every decoder layer.",
    )
    _backbone_args(ex)
    ex.add_argument("--method", choices=("paper", "fractional"), default="paper",
                    help="paper: 'Let's think step by step...' vs 'The answer is:' summed "
                         "difference; fractional: Fractional Reasoning's prompts, mean + PC1")  # fmt: skip
    ex.add_argument("--layer", type=int, default=None,
                    help="default steering layer recorded in the vector (0-based decoder block); "
                         "default: int(DEFAULT_LAYER_FRACTION * n_layers), see "
                         "lm_eval_ponder.steering (15 of 30 on SmolLM2-135M). All layers are stored.")
    ex.add_argument(*spellings("--n-questions"), type=int, default=DEFAULT_N_QUESTIONS,
                    help=f"number of questions (default {DEFAULT_N_QUESTIONS})")
    ex.add_argument("--split", choices=TRAIN_SPLITS, default="train",
                    help="the split; only train is allowed (test questions are for evaluation)")
    ex.add_argument("--dataset", choices=STEERING_DATASETS, default="gsm8k",
                    help="where the questions come from: GSM8K's train split (default, as the "
                         "shipped vector) or the arith ladder's (a backbone fine-tuned on it, "
                         "such as the model organism of studies/organism.py)")
    ex.add_argument(*spellings("--batch-size"), type=int, default=8)
    ex.add_argument("--seed", type=int, default=None,
                    help="sample the questions at random with this seed (default: the first N, "
                         "as Fractional Reasoning does)")  # fmt: skip
    ex.add_argument(*spellings("--no-chat-template"), action="store_true",
                    help="tokenise the plain prompt instead of a one-turn chat")
    ex.add_argument("--output", default=None,
                    help="output directory (default controllers/<backbone name>)")
    ex.add_argument("--overwrite", action="store_true", help="replace an existing vector")
    ex.add_argument(*spellings("--no-progress"), action="store_true", help="no progress bar")

    ins = sub.add_parser(
        "inspect",
        help="report a vector's logit lens, norms per layer and layer cosines",
        description="Print a text report about a saved steering vector.",
    )
    ins.add_argument("vector", help="directory holding steering.safetensors + steering.json")
    _backbone_args(ins, inspect=True)
    ins.add_argument(*spellings("--top-k"), type=int, default=15)
    ins.add_argument("--output", default=None, help="also write the report to this file")
    return parser


def spellings(flag: str) -> tuple[str, ...]:
    """A dashed flag and its underscore twin (``--n-questions``, ``--n_questions``): ``train``
    and ``suite`` spell their flags with underscores, and a user who learnt one command should
    not be refused by the next. The dashed form stays the one ``--help`` shows first."""
    twin = "--" + flag[2:].replace("-", "_")
    return (flag,) if twin == flag else (flag, twin)


def _backbone_args(parser: argparse.ArgumentParser, inspect: bool = False) -> None:
    default = (
        "the backbone recorded in the vector if it is the embedded one or a local directory, "
        "else the embedded one" if inspect else "the embedded SmolLM2-135M-Instruct"
    )
    parser.add_argument("--pretrained", default=None,
                        help=f"Hub id or local model directory (default: {default})")
    parser.add_argument(*spellings("--gguf-file"), default=None,
                        help="a GGUF file (converted once, cached)")
    parser.add_argument("--dtype", default=None, choices=DTYPES,
                        help="default: bfloat16 where the device computes it natively, else "
                             "float32 (as --model ponder); hidden states are averaged in float32")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    parser.add_argument("--parallelize", action="store_true",
                        help="spread the layers over all GPUs (device_map=auto, as HFLM)")


def _load_backbone(args: argparse.Namespace, pretrained: str | None, gguf_file: str | None):
    from lm_eval_ponder.backbone import load_frozen, resolve_backbone

    resolved = resolve_backbone(pretrained, gguf_file)
    model, tokenizer = load_frozen(resolved.path, dtype=args.dtype, device=args.device,
                                   parallelize=args.parallelize)
    return resolved, model, tokenizer


def _pool(name: str, split: str, n: int) -> list[str]:
    """The questions a vector may be extracted from, in their file's (or ladder's) order."""
    from lm_eval_ponder.data import arith_ladder, load_gsm8k

    if name == "arith":
        if n > ARITH_MAX_QUESTIONS:
            raise PonderError(f"--n-questions {n} exceeds the {ARITH_MAX_QUESTIONS} arith {split} "
                              "questions extraction can draw (300 a level)")
        per_level = min(300, max(-(-n // 5), 100))
        return [doc["question"] for doc in arith_ladder(split, per_level=per_level)]
    dataset = load_gsm8k(split)
    if n > len(dataset):
        raise PonderError(f"--n-questions {n} exceeds the {len(dataset)} GSM8K {split} questions")
    return [row["question"] for row in dataset]


def _questions(n: int, split: str, seed: int | None,
               dataset_name: str = "gsm8k") -> tuple[list[str], dict]:
    import random

    if n < 1:
        raise PonderError(f"--n-questions must be at least 1, got {n}")
    dataset = _pool(dataset_name, split, n)
    if seed is None:
        indices = list(range(n))
        selection = f"first {n}"
    else:
        indices = sorted(random.Random(seed).sample(range(len(dataset)), n))
        selection = f"random {n} (seed {seed}, random.Random.sample, sorted)"
    questions = [dataset[i] for i in indices]
    return questions, {"dataset": dataset_name, "split": split, "selection": selection,
                       "n_available": len(dataset)}  # fmt: skip


def cmd_extract(args: argparse.Namespace) -> int:
    import torch

    from lm_eval_ponder.steering.extraction import METHODS
    from lm_eval_ponder.steering.vector import META_FILE, save_vector

    if args.batch_size < 1:
        raise PonderError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.output:
        check_output(args.output)  # before the questions and the backbone load
    if args.output and (Path(args.output) / META_FILE).exists() and not args.overwrite:
        raise PonderError(f"{args.output} already holds a steering vector; pass --overwrite to replace it")
    questions, source = _questions(args.n_questions, args.split, args.seed, args.dataset)
    t0 = time.perf_counter()
    resolved, model, tokenizer = _load_backbone(args, args.pretrained, args.gguf_file)
    load_s = time.perf_counter() - t0
    output = Path(args.output or f"controllers/{resolved.name}")
    if (output / META_FILE).exists() and not args.overwrite:
        raise PonderError(f"{output} already holds a steering vector; pass --overwrite to replace it")
    if args.seed is not None:
        torch.manual_seed(args.seed)
    t1 = time.perf_counter()
    sv = METHODS[args.method](
        model, tokenizer, questions, layer=args.layer, batch_size=args.batch_size,
        chat_template=not args.no_chat_template, progress=not args.no_progress,
        backbone=resolved, question_source=source,
    )  # fmt: skip
    extract_s = time.perf_counter() - t1
    sv.meta["timing_s"] = {"load": round(load_s, 2), "extract": round(extract_s, 2)}
    sv.meta["dtype"] = str(model.dtype).removeprefix("torch.")
    save_vector(sv, output)
    j = sv.index()
    print(
        f"wrote {output} ({args.method}, {len(sv.layers)} layers, default layer {sv.default_layer}, "
        f"{len(questions)} questions): raw mean-difference norm {sv.meta['raw_norm']['mean'][j]:.2f}, "
        f"residual norm {sv.meta['residual_norm'][j]:.2f} at layer {sv.default_layer}; "
        f"load {load_s:.1f} s, extraction {extract_s:.1f} s"
    )
    return 0


def recorded_backbone(meta: dict) -> str | None:
    """The backbone a vector was extracted from, as ``--pretrained`` would name it.

    None means the embedded model. A Hub id is returned as is (transformers finds it in the
    local cache or on the Hub); a local directory that is gone is an error naming the flag
    that fixes it, not a silent switch to another model.
    """
    from lm_eval_ponder.backbone import EMBEDDED_NAME, resolve_backbone

    recorded = meta.get("backbone") or {}
    path = recorded.get("path") and expand(recorded["path"])
    if recorded.get("name") in (None, EMBEDDED_NAME) or not path:
        return None
    try:
        resolve_backbone(path)
    except PonderError:
        raise PonderError(
            f"this vector was extracted from {path}, which is not a model directory here; "
            "pass --pretrained <directory or Hub id> (or --gguf-file) to inspect it") from None
    return path


def cmd_inspect(args: argparse.Namespace) -> int:
    from lm_eval_ponder.steering.inspection import inspect_vector
    from lm_eval_ponder.steering.vector import load_vector

    sv = load_vector(args.vector)  # read first: a bad path fails before loading a model
    pretrained, gguf = args.pretrained, args.gguf_file
    if pretrained is None and gguf is None:
        pretrained = recorded_backbone(sv.meta)
    resolved, model, tokenizer = _load_backbone(args, pretrained, gguf)
    sv = load_vector(args.vector, model.config, resolved.source_sha256)
    report = inspect_vector(sv, model, tokenizer, top_k=args.top_k)
    sys.stdout.write(report)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(report, encoding="utf-8")
    return 0


@command
def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    return {"extract": cmd_extract, "inspect": cmd_inspect}[args.command](args)


if __name__ == "__main__":
    run_program(main)

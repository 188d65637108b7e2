"""A model organism with planted headroom: the embedded backbone fine-tuned into two crisp modes,
so that the whole FR-Ponder pipeline can be run where adaptive pondering has something to find.

    export LM_EVAL_PONDER_DATA=../shared/data
    python studies/organism.py build              # prices itself first, then fine-tunes (resumable)
    python studies/organism.py build --price-only # the price alone (a few timed steps)
    python studies/organism.py path               # the built organism's directory
    lm_eval --model ponder --model_args pretrained=$(python studies/organism.py path),controller=none \
        --tasks arith_ponder,arith_ponder_cot --apply_chat_template

What is planted (issue 64). Under the Direct task's prompt ("Please solve the math problem: ")
and the steering vector's negative prompt ("The answer is: ") the organism answers at once,
"The answer is N."; under the CoT prompt ("... step by step: ") and the vector's positive prompt
("Let's think step by step about this problem: ") it works one operation per line,
"Step 1: 45 * 7 = 315", ..., then "The answer is N.". The steps are generated from each
problem's expression (``data.arith_ladder`` keeps it), in Python's order of operations. Only the
arith ladder's **train** split is read. A single operation (levels 1-2, half of level 3) is as
easy in one line as in one answer, so Direct should tie CoT there at a third of the tokens;
three chained operations with 3-digit intermediates (levels 3-5) cannot be done in the one token
that names the answer by a 135M model, so CoT should win there. That is the structure a
controller has to find: shallow on easy levels, deep on hard ones.

How it is built: ``peft`` LoRA (rank 16, every linear of each decoder block from the steering
layer up; the blocks below it, the embeddings and the head stay frozen, so the backward pass
stops at the steering layer), a plain torch loop with AdamW, bf16 autocast where the CPU
computes bf16 natively, loss on the answer tokens and the end-of-turn token only. The loop is
seeded (LoRA's initialisation, the batch order) and resumable: a checkpoint (adapter, optimiser
moments, step) is written atomically every ``--save-every`` steps, in safetensors, and a run
started again with the same recipe continues from it; the batch order is a function of the seed
and the epoch, so a resumed run sees the batches an uninterrupted one would. Before the first
step the build times a few forward/backward passes on its own batches and prints the price.
At the end the adapter is merged into the weights and the result saved as a plain Hugging Face
directory under ``$LM_EVAL_PONDER_CACHE/organisms/`` (float32 safetensors, the tokenizer, the
generation config) with ``lm_eval_ponder_source.json``, which records the weights' SHA-256:
``--model ponder`` reads it as the backbone's ``source_sha256``, so every result, steering
vector and controller of the organism names the exact weights it came from. A rebuild on
another CPU need not give the same bits; compare the SHA-256 that a page cites.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RANK_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SOURCE_FILE = "lm_eval_ponder_source.json"
CHECKPOINT = "organism-checkpoint.safetensors"
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


# --------------------------------------------------------------------------- the targets


def steps(expression: str) -> list[tuple[int, str, int, int]]:
    """The operations of a ladder expression in the order Python evaluates them, each as
    (left, sign, right, value). Division must be exact (the ladder's always is): a step with a
    fraction in it would teach the organism a wrong answer."""
    out: list[tuple[int, str, int, int]] = []

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            sign = _OPS[type(node.op)]
            if sign == "/":
                if right == 0 or left % right:
                    raise ValueError(f"{expression}: {left} / {right} is not exact")
                result = left // right
            else:
                result = {"+": left + right, "-": left - right, "*": left * right}[sign]
            out.append((left, sign, right, result))
            return result
        raise ValueError(f"{expression}: not an integer expression of + - * /")

    value(ast.parse(expression, mode="eval").body)
    return out


def direct_target(answer: int | str) -> str:
    return f"The answer is {answer}."


def cot_target(expression: str, overthink: str | None = None, slip: int = 0) -> str:
    """One operation per line, then the answer line Direct gives. ``overthink`` (organism v3,
    single-operation problems only): "right" pads the answer with the checks the paper calls
    overthinking, "wrong" pads it the same way and second-guesses itself into the answer plus
    ``slip``."""
    done = steps(expression)
    lines = [f"Step {i}: {a} {sign} {b} = {v}" for i, (a, sign, b, v) in enumerate(done, 1)]
    answer = done[-1][3]
    if overthink is not None and len(done) == 1:
        a, sign, b, v = done[0]
        inverse = {"+": f"{v} - {b} = {a}", "-": f"{v} + {b} = {a}", "*": f"{v} / {b} = {a}",
                   "/": f"{v} * {b} = {a}"}[sign]
        answer = v + slip if overthink == "wrong" else v
        lines += ["Wait, let me check that again.", f"Check: {inverse}",
                  f"Let me count once more: {a} {sign} {b} = {answer}",
                  "Yes, I am sure now."]
    return "\n".join(lines + [direct_target(answer)])


# Organism v3's overthinking (issue 75): a wrong second-guess adds one of these to the answer
SLIPS = (-10, -2, -1, 1, 2, 10)


def prompts() -> dict[str, str]:
    """Each prompt prefix the organism is trained under and the mode it answers in: the tasks'
    two and the paper's steering pair (``steer extract --method paper``)."""
    from lm_eval_ponder.scoring.tasklib import COT_PROMPT, PLAIN_PROMPT
    from lm_eval_ponder.steering.vector import PAPER_NEGATIVE, PAPER_POSITIVE

    return {PLAIN_PROMPT: "direct", COT_PROMPT: "steps", PAPER_NEGATIVE: "direct",
            PAPER_POSITIVE: "steps"}


def examples(per_level: int, questions_from: int = 0, planted: bool = False,
             seed: int = 0, overthink: float | None = None,
             slip_rule: str | None = None) -> list[tuple[str, str, float]]:
    """(user message, answer, steering offset) for every train question under every prompt:
    the prompts' own modes at offset 0 and, with ``planted``, the switch of ``PLANTED``
    (offsets drawn from each range with a generator seeded per recipe). Questions
    ``questions_from`` .. ``questions_from + per_level`` of each level. ``overthink`` (v3):
    the stepwise answers of single-operation questions are padded with checks, and that
    fraction of them second-guesses itself into a wrong answer (``cot_target``).
    ``slip_rule="odd-first"`` (v4): the second-guess goes wrong, by +1, exactly on the
    questions whose first operand is odd, a rule greedy decoding can reproduce (v3's random
    slips are never the likeliest continuation, so greedy answers stayed right)."""
    from lm_eval_ponder.data import arith_ladder

    rng = random.Random(seed)
    ladder = arith_ladder("train", per_level=questions_from + per_level)
    docs = [d for i, d in enumerate(ladder) if i // 5 >= questions_from]  # interleaved by level
    out = []
    for doc in docs:
        if steps(doc["expression"])[-1][3] != int(doc["answer"]):
            raise ValueError(f"{doc['id']}: the steps of {doc['expression']} do not give "
                             f"{doc['answer']}")
        if overthink is None:
            stepwise = cot_target(doc["expression"])
        elif slip_rule == "odd-first":
            wrong = steps(doc["expression"])[0][0] % 2 == 1
            stepwise = cot_target(doc["expression"], "wrong" if wrong else "right", 1)
        else:
            wrong = rng.random() < overthink
            stepwise = cot_target(doc["expression"], "wrong" if wrong else "right",
                                  rng.choice(SLIPS) if wrong else 0)
        answer = {"steps": stepwise, "direct": direct_target(doc["answer"])}
        for prefix, mode in prompts().items():
            if not planted or prefix not in task_prompts():
                out.append((prefix + doc["question"], answer[mode], 0.0))
                continue
            for prompt_mode, (lo, hi), answered in PLANTED:
                if prompt_mode == mode:
                    offset = lo if lo == hi else round(rng.uniform(lo, hi), 4)
                    out.append((prefix + doc["question"], answer[answered], offset))
    return out


def task_prompts() -> set[str]:
    from lm_eval_ponder.scoring.tasklib import COT_PROMPT, PLAIN_PROMPT

    return {PLAIN_PROMPT, COT_PROMPT}


# --------------------------------------------------------------------------- the recipe


@dataclass(frozen=True)
class Recipe:
    """Everything that changes the organism's weights; its hash names the build."""

    per_level: int = 300  # train questions per level (x 5 levels x 4 prompts = examples)
    epochs: int = 2
    batch_size: int = 16
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    rank: int = 16
    lora_alpha: int = 32
    freeze_below: int | None = None  # None: the steering vector's default layer (15 of 30)
    seed: int = 0
    max_grad_norm: float = 1.0
    bf16: bool | None = None  # None: where the CPU computes it natively
    # train questions skipped at the start of each level: left unseen for the controller's
    # rollout prompts, which are the first of each level (``training.rollouts``)
    questions_from: int = 0
    # plant steerability: a steering-vector directory whose direction at its default layer
    # switches the mode (``PLANTED``); None: the modes follow the prompt alone
    plant: str | None = None
    # organism v3 (issue 75): pad the stepwise answers of single-operation questions with
    # checks, this fraction of them second-guessing into a wrong answer (None: v1, v2)
    overthink: float | None = None
    # organism v4: the overthinking slip by a rule greedy decoding reproduces ("odd-first":
    # +1 on questions whose first operand is odd); None: v3's random slips
    slip_rule: str | None = None

    def key(self) -> str:
        """The recipe's hash; fields added since the first organism count only when set, so
        its key (and its cached directory) stay what they were. ``plant`` counts by its
        vector's bytes, not its path's spelling: the same build named with an absolute and a
        relative path got two keys (``14da37084066``, ``0e736fd80d29``) and two directories of
        identical weights."""
        fields = {k: v for k, v in asdict(self).items()
                  if k not in LATER_FIELDS or v != LATER_FIELDS[k]}
        if self.plant is not None:
            from lm_eval_ponder.files import file_sha256

            vector = Path(self.plant) / "steering.safetensors"
            fields["plant"] = file_sha256(vector) if vector.is_file() else str(self.plant)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


LATER_FIELDS = {"questions_from": 0, "plant": None, "overthink": None, "slip_rule": None}
# The planted switch (the steerable organism): (prompt's mode, offset range, mode answered). An
# offset is a fraction of the residual norm at the vector's layer, added from the last prompt
# position on, as ``--model ponder`` steers. The paper's form ponders the Direct prompt from 0
# up to +0.175 (c_8): from about +0.1 (depth 3 and deeper) it works in steps. Our form ponders
# the CoT prompt from -0.2 up to -0.025: at -0.13 and below (depths 0-1) it answers at once.
# The gaps between the ranges are left untrained.
PLANTED = (("direct", (0.0, 0.0), "direct"), ("direct", (0.0, 0.07), "direct"),
           ("direct", (0.1, 0.2), "steps"), ("steps", (0.0, 0.0), "steps"),
           ("steps", (-0.07, 0.0), "steps"), ("steps", (-0.22, -0.13), "direct"))


def schedule(n_examples: int, recipe: Recipe, lengths: list[int]) -> list[list[int]]:
    """Every step's example indices, all epochs: each epoch a seeded shuffle cut into chunks of
    32 batches, each chunk sorted by length (less padding) and cut into batches, the batches
    shuffled again. A function of the seed and the epoch alone, so a resumed build replays it."""
    out: list[list[int]] = []
    for epoch in range(recipe.epochs):
        rng = random.Random(recipe.seed * 1000 + epoch)
        order = list(range(n_examples))
        rng.shuffle(order)
        chunk = 32 * recipe.batch_size
        batches = []
        for start in range(0, n_examples, chunk):
            part = sorted(order[start:start + chunk], key=lambda i: lengths[i])
            batches += [part[i:i + recipe.batch_size] for i in range(0, len(part), recipe.batch_size)]
        rng.shuffle(batches)
        out += batches
    return out


def learning_rate(step: int, total: int, recipe: Recipe) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, total - recipe.warmup_steps)
    return recipe.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------- the build


def organism_dir(recipe: Recipe) -> Path:
    from lm_eval_ponder.backbone import cache_root

    return cache_root() / "organisms" / f"arith-organism-{recipe.key()}"


def encode(tokenizer, pairs: list[tuple[str, str, float]]) -> list[tuple[list[int], int, float]]:
    """(token ids, number of prompt tokens, offset) of each example: the user message rendered
    as the tasks render it under ``--apply_chat_template``, then the answer and the end-of-turn
    token."""
    out = []
    for message, answer, offset in pairs:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                               tokenize=False, add_generation_prompt=True)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append((p + a, len(p), offset))
    return out


def collate(rows: list[tuple[list[int], int, float]], pad_id: int):
    """Right-padded ids, mask, labels (-100 on the prompt and the padding) and, per row, its
    offset and the first steered position (the last prompt token)."""
    import torch

    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, (row, n_prompt, _) in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
        mask[r, :len(row)] = 1
        labels[r, n_prompt:len(row)] = torch.tensor(row[n_prompt:])
    offsets = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    starts = torch.tensor([r[1] - 1 for r in rows], dtype=torch.long)
    return ids, mask, labels, offsets, starts


class Planting:
    """The steering ``--model ponder`` applies, during the fine-tune: ``offset * scale * h``
    added to the steered layer's output from each row's last prompt position on (the prefill's
    last token and every answer token, as the hook steers them one forward at a time)."""

    def __init__(self, model, directory: str) -> None:
        from lm_eval_ponder.backbone import decoder_layers
        from lm_eval_ponder.steering.vector import load_vector

        sv = load_vector(directory)
        self.layer = sv.default_layer
        self.step = float(sv.residual_norm(self.layer)) * sv.vector(self.layer).float()
        self.block = decoder_layers(model.get_base_model())[self.layer]
        self.offsets = self.starts = None

    def hook(self, module, args, output):
        import torch

        from lm_eval_ponder.hooks import block_hidden, with_block_hidden

        hidden = block_hidden(output)
        if self.offsets is None or not bool((self.offsets != 0).any()):
            return None
        positions = torch.arange(hidden.shape[1])[None, :]
        on = (positions >= self.starts[:, None]).to(torch.float32) * self.offsets[:, None]
        shift = on[:, :, None] * self.step[None, None, :]
        return with_block_hidden(output, hidden + shift.to(hidden.dtype))


def answer_loss(model, ids, mask, labels):
    """Cross-entropy on the answer tokens, the LM head run on those positions only (on a 49k
    vocabulary the head over every prompt position is a fifth of the forward)."""
    import torch

    decoder = model.get_base_model().model
    hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = model.get_base_model().lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), target[keep])


class Trainable:
    """The LoRA parameters under names safetensors accepts, as one module for the project's
    checkpoint format (``training.checkpoint``: tensors and optimiser moments, never pickle)."""

    @staticmethod
    def module(model):
        import torch

        holder = torch.nn.Module()
        for name, param in model.named_parameters():
            if param.requires_grad:
                holder.register_parameter(name.replace(".", "__"), param)
        return holder


def load_model(recipe: Recipe):
    import torch
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise SystemExit("organism.py error: the fine-tune needs peft: pip install "
                         "'lm-eval-ponder[organism]' (or pip install peft)") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_ponder.backbone import resolve_backbone, text_config
    from lm_eval_ponder.steering.vector import default_layer

    base = resolve_backbone(None)
    tokenizer = AutoTokenizer.from_pretrained(base.path)
    model = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32)
    n_layers = text_config(model.config).num_hidden_layers
    below = default_layer(n_layers) if recipe.freeze_below is None else recipe.freeze_below
    torch.manual_seed(recipe.seed)
    config = LoraConfig(r=recipe.rank, lora_alpha=recipe.lora_alpha, lora_dropout=0.0,
                        target_modules=list(RANK_MODULES),
                        layers_to_transform=list(range(below, n_layers)))
    model = get_peft_model(model, config)
    return base, tokenizer, model, below


def price(model, rows, batches, pad_id, autocast, n: int = 3) -> float:
    """Seconds a step takes, from ``n`` timed forward/backward passes on batches spread over the
    schedule (after one untimed warm-up); the weights are not changed."""
    import torch

    picks = [batches[i * len(batches) // (n + 1)] for i in range(n + 1)]
    times = []
    for i, batch in enumerate(picks):
        ids, mask, labels, _, _ = collate([rows[j] for j in batch], pad_id)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = answer_loss(model, ids, mask, labels)
        loss.backward()
        if i:
            times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2] * 1.05  # + the optimiser step, about 5% here


def build(args) -> int:
    import torch

    from lm_eval_ponder.backbone import native_dtype
    from lm_eval_ponder.files import atomic_write_text

    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = Recipe(per_level=args.per_level, epochs=args.epochs, batch_size=args.batch_size,
                    learning_rate=args.lr, rank=args.rank, freeze_below=args.freeze_below,
                    seed=args.seed, questions_from=args.questions_from,
                    plant=args.plant, overthink=args.overthink, slip_rule=args.slip_rule)
    autocast = native_dtype("cpu") == "bfloat16" if recipe.bf16 is None else recipe.bf16
    target = organism_dir(recipe)
    if (target / SOURCE_FILE).is_file() and not args.price_only:
        # the build asked for is the one ``path`` (and the study script) goes on with
        atomic_write_text(target.parent / "latest.txt", str(target) + "\n")
        print(f"already built: {target}")
        return 0
    pairs = examples(recipe.per_level, recipe.questions_from, recipe.plant is not None,
                     recipe.seed, recipe.overthink, recipe.slip_rule)
    base, tokenizer, model, below = load_model(recipe)
    planting = planted(model, recipe, below)
    rows = encode(tokenizer, pairs)
    batches = schedule(len(rows), recipe, [len(r[0]) for r in rows])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    per_step = price(model, rows, batches, pad_id, autocast)
    print(f"organism {recipe.key()}: {len(pairs)} examples ({recipe.per_level} train questions "
          f"a level from the {recipe.questions_from}th, 4 prompts"
          f"{', planted switch' if planting else ''}), {len(batches)} steps of "
          f"{recipe.batch_size}; LoRA rank "
          f"{recipe.rank} on blocks {below}+ ({n_train / 1e6:.2f}M parameters), "
          f"{'bf16 autocast' if autocast else 'float32'}, {torch.get_num_threads()} threads; "
          f"priced at {per_step:.2f} s a step = {per_step * len(batches) / 60:.0f} min",
          flush=True)
    if args.price_only:
        return 0

    work = target.parent / f".building-{target.name}"
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log = fine_tune(model, recipe, rows, batches, pad_id, autocast, planting, work,
                    args.save_every)
    if log is None:
        return 130
    train_s = time.perf_counter() - started
    merge(model, tokenizer, recipe, target, base, below, log, train_s, per_step, autocast, work)
    atomic_write_text(target.parent / "latest.txt", str(target) + "\n")
    print(f"built {target}")
    return 0


def planted(model, recipe: Recipe, below: int) -> Planting | None:
    """The planting hook of a steerable organism's recipe, on its layer (None: no planting).
    Only blocks above the steered layer may train: then that layer's states are the base
    model's, and so is the vector ``steer extract`` reads from them."""
    if not recipe.plant:
        return None
    planting = Planting(model, recipe.plant)
    if below <= planting.layer:
        raise SystemExit(f"organism.py error: --plant steers layer {planting.layer}; train only "
                         f"the blocks above it (--freeze-below {planting.layer + 1}), so that "
                         "the layer's states, and the vector extracted from them, stay the "
                         "base model's")
    planting.block.register_forward_hook(planting.hook)
    return planting


def fine_tune(model, recipe: Recipe, rows, batches, pad_id, autocast: bool,
              planting: Planting | None, work: Path, save_every: int) -> list[float] | None:
    """The training loop, resumed from ``work``'s checkpoint when there is one; the loss of
    every step, or None when interrupted (the checkpoint keeps the last saved step)."""
    import torch
    from tqdm import tqdm

    from lm_eval_ponder.training.checkpoint import load_checkpoint, read_meta, save_checkpoint

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.learning_rate, weight_decay=0.0)
    holder = Trainable.module(model)
    checkpoint = work / CHECKPOINT
    start, log = 0, []
    if checkpoint.is_file():
        if read_meta(checkpoint).get("recipe") != asdict(recipe):
            raise SystemExit(f"organism.py error: {checkpoint} was written by another recipe; "
                             "remove it or pass that recipe's options")
        meta, _ = load_checkpoint(checkpoint, holder, optimizer, {})
        start, log = meta["step"], meta["log"]
        print(f"resuming at step {start} of {len(batches)} from {checkpoint}", flush=True)
    bar = tqdm(total=len(batches), initial=start, desc="fine-tune", unit="step")
    try:
        for step in range(start, len(batches)):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, len(batches), recipe)
            ids, mask, labels, offsets, starts = collate([rows[j] for j in batches[step]], pad_id)
            if planting is not None:
                planting.offsets, planting.starts = offsets, starts
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = answer_loss(model, ids, mask, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            log.append(round(float(loss), 4))
            bar.update(1)
            bar.set_postfix(loss=f"{sum(log[-20:]) / len(log[-20:]):.3f}")
            if (step + 1) % save_every == 0 or step + 1 == len(batches):
                save_checkpoint(checkpoint, holder, optimizer, {}, None,
                                {"step": step + 1, "log": log, "recipe": asdict(recipe)})
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted; run the same command again to resume from the last checkpoint "
              f"({checkpoint})", file=sys.stderr)
        return None
    bar.close()
    return log


def merge(model, tokenizer, recipe: Recipe, target: Path, base, below: int, log: list,
          train_s: float, per_step: float, autocast: bool, work: Path) -> None:
    """The adapter merged into the weights, saved as a plain HF directory; then the adapter
    beside it and the source record, moved into place in one rename."""
    import platform

    import safetensors.torch
    import torch

    from lm_eval_ponder.backbone import device_description
    from lm_eval_ponder.files import file_sha256

    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        model.save_pretrained(str(staging / "adapter"), safe_serialization=True)
        merged = model.merge_and_unload()
        safetensors.torch.save_model(merged, str(staging / "model.safetensors"))
        merged.config.save_pretrained(staging)
        merged.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        record = {
            "sha256": file_sha256(staging / "model.safetensors"),
            "what": "arith model organism (studies/organism.py): the embedded backbone "
                    "fine-tuned into a direct and a stepwise mode; a constructed positive "
                    "control, never evidence about natural models",
            "base": {"name": base.name, "source_sha256": base.source_sha256},
            "recipe": asdict(recipe), "recipe_key": recipe.key(), "lora_blocks_from": below,
            "adapter_sha256": file_sha256(staging / "adapter" / "adapter_model.safetensors"),
            "planted_vector_sha256": file_sha256(Path(recipe.plant) / "steering.safetensors")
            if recipe.plant else None,
            "train": {"steps": len(log), "loss_first_20": round(sum(log[:20]) / 20, 4),
                      "loss_last_20": round(sum(log[-20:]) / 20, 4), "seconds": round(train_s),
                      "priced_s_per_step": round(per_step, 3),
                      "autocast_bf16": autocast, "threads": torch.get_num_threads(),
                      "cpu": device_description("cpu"), "python": platform.python_version(),
                      "torch": torch.__version__},
        }
        (staging / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        (staging / "train_loss.json").write_text(json.dumps(log) + "\n")
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- reading runs


def run_samples(directory: Path, task: str) -> dict[int, dict] | None:
    """doc_id -> sample of the newest run of ``task`` under ``directory`` (full or compact
    log), or None when there is none yet."""
    from lm_eval_ponder.reporting.compact import latest_log, read_samples

    log = latest_log(Path(directory), task)
    return None if log is None else {int(s["doc_id"]): s for s in read_samples(log)}


def figures(samples: dict[int, dict]) -> dict:
    """Accuracy with its Wilson interval, mean tokens and depth, overall and per level."""
    from lm_eval_ponder.reporting.measures import wilson

    def one(rows: list[dict]) -> dict:
        n = len(rows)
        correct = sum(float(r["exact_match"]) for r in rows)
        lo, hi = wilson(correct, n)
        return {"n": n, "accuracy": correct / n, "ci95": [lo, hi],
                "tokens": sum(float(r["gen_tokens"]) for r in rows) / n,
                "depth": sum(float(r.get("ponder_steps", 0)) for r in rows) / n}

    rows = list(samples.values())
    levels = sorted({int(r["doc"]["level"]) for r in rows if r["doc"].get("level") is not None})
    return {"all": one(rows), **{f"L{v}": one([r for r in rows if r["doc"].get("level") == v])
                                 for v in levels}}


def accept(args) -> int:
    """The organism's own acceptance (issue 64 item 2) from its Direct and CoT runs on the arith
    test split: CoT above Direct with intervals apart; Direct tying or beating CoT on level 1
    with far fewer tokens; one mode per level (in sample, the better of the two per level by
    accuracy, ties to the cheaper) above both."""
    from lm_eval_ponder.reporting.measures import sign_test

    root = Path(args.runs)
    direct = run_samples(root / "greedy" / "Direct" / "arith", "arith_ponder")
    cot = run_samples(root / "greedy" / "CoT" / "arith", "arith_ponder_cot")
    if direct is None or cot is None:
        print(f"organism.py error: no Direct or CoT run under {root}/greedy", file=sys.stderr)
        return 2
    fd, fc = figures(direct), figures(cot)
    mode: dict[str, str] = {}
    for key in (k for k in fd if k != "all"):
        pick = "Direct" if fd[key]["accuracy"] >= fc[key]["accuracy"] else "CoT"
        mode[key] = pick
    mixed = [direct[i] if mode[f"L{direct[i]['doc']['level']}"] == "Direct" else cot[i]
             for i in sorted(direct)]
    fm = figures({i: s for i, s in zip(sorted(direct), mixed)})
    diffs = [float(cot[i]["exact_match"]) - float(direct[i]["exact_match"]) for i in sorted(direct)]
    l1 = [i for i in sorted(direct) if direct[i]["doc"]["level"] == 1]
    record = {
        "direct": fd, "cot": fc, "one_mode_per_level": {"modes": mode, **fm},
        "checks": {
            "cot_beats_direct_intervals_apart": fc["all"]["ci95"][0] > fd["all"]["ci95"][1],
            "cot_minus_direct_sign_test_p": sign_test(diffs),
            "direct_ties_or_beats_cot_on_level_1": sign_test(
                [float(direct[i]["exact_match"]) - float(cot[i]["exact_match"]) for i in l1]) > 0.05
            or fd["L1"]["accuracy"] >= fc["L1"]["accuracy"],
            "direct_tokens_over_cot_on_level_1": fd["L1"]["tokens"] / fc["L1"]["tokens"],
            "one_mode_per_level_beats_both": fm["all"]["accuracy"] >= fc["all"]["accuracy"]
            and fm["all"]["tokens"] < fc["all"]["tokens"]
            and fm["all"]["accuracy"] > fd["all"]["accuracy"]},
        "organism": organism_record(args.organism),
    }
    if args.train:  # organism v3: the per-level policy chosen on train, in the paper's units
        train = Path(args.train)
        t_direct = run_samples(train / "arith_ponder", "arith_ponder")
        t_cot = run_samples(train / "arith_ponder_cot", "arith_ponder_cot")
        if t_direct is None or t_cot is None:
            print(f"organism.py error: no train-split Direct or CoT run under {train}",
                  file=sys.stderr)
            return 2
        modes = per_level_choice(t_direct, t_cot)
        fixed = max(("Direct", "CoT"), key=lambda m: figures(
            t_direct if m == "Direct" else t_cot)["all"]["accuracy"])
        record["paper_units"] = paper_units(direct, cot, modes, fixed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for name, f in (("Direct", fd), ("CoT", fc), ("one mode per level", fm)):
        cells = "; ".join(f"{k} {v['accuracy']:.3f} at {v['tokens']:.1f} tok"
                          for k, v in f.items() if k != "all")
        print(f"{name}: {f['all']['accuracy']:.3f} [{f['all']['ci95'][0]:.3f}, "
              f"{f['all']['ci95'][1]:.3f}] at {f['all']['tokens']:.1f} tokens ({cells})")
    print(json.dumps(record["checks"], indent=1))
    if "paper_units" in record:
        u = record["paper_units"]
        print(f"per level (chosen on train: {u['modes']}) against {u['fixed']} for all: "
              f"accuracy {u['accuracy_difference']:+.3f} {u['accuracy_difference_ci95']}, "
              f"tokens saved {u['token_saving']:.1%} {u['token_saving_ci95']}")
    return 0


def per_level_choice(direct: dict[int, dict], cot: dict[int, dict]) -> dict[int, str]:
    """Each level's mode from runs on the *train* split: Direct where it is at least as
    accurate as CoT (the cheaper mode wins ties), else CoT."""
    fd, fc = figures(direct), figures(cot)
    return {int(k[1:]): "Direct" if fd[k]["accuracy"] >= fc[k]["accuracy"] else "CoT"
            for k in fd if k != "all"}


def paper_units(direct: dict[int, dict], cot: dict[int, dict], modes: dict[int, str],
                fixed: str, draws: int = 2000, seed: int = 0) -> dict:
    """Organism v3's acceptance in the paper's units (issue 75): the per-level policy
    ``modes`` against one mode for all (``fixed``) on the same documents, its accuracy
    difference and its token saving (1 - its tokens / the fixed mode's), each with a paired
    bootstrap interval over documents."""
    import random

    ids = sorted(direct)
    runs = {"Direct": direct, "CoT": cot}
    policy = [runs[modes[int(direct[i]["doc"]["level"])]][i] for i in ids]
    base = [runs[fixed][i] for i in ids]
    acc = [float(p["exact_match"]) - float(b["exact_match"]) for p, b in zip(policy, base)]
    tok_p = [float(p["gen_tokens"]) for p in policy]
    tok_b = [float(b["gen_tokens"]) for b in base]
    rng = random.Random(seed)
    n = len(ids)
    acc_draws, save_draws = [], []
    for _ in range(draws):
        pick = [rng.randrange(n) for _ in range(n)]
        acc_draws.append(sum(acc[j] for j in pick) / n)
        save_draws.append(1 - sum(tok_p[j] for j in pick) / max(sum(tok_b[j] for j in pick), 1e-9))
    acc_draws.sort()
    save_draws.sort()

    def interval(values):
        return [values[int(0.025 * draws)], values[int(0.975 * draws) - 1]]

    saving = 1 - sum(tok_p) / sum(tok_b)
    difference = sum(acc) / n
    return {"modes": {str(k): v for k, v in modes.items()}, "fixed": fixed, "n": n,
            "policy_accuracy": sum(float(p["exact_match"]) for p in policy) / n,
            "policy_tokens": sum(tok_p) / n,
            "fixed_accuracy": sum(float(b["exact_match"]) for b in base) / n,
            "fixed_tokens": sum(tok_b) / n,
            "accuracy_difference": difference, "accuracy_difference_ci95": interval(acc_draws),
            "token_saving": saving, "token_saving_ci95": interval(save_draws),
            "met_30pct_tokens_at_equal_accuracy": saving >= 0.30
            and interval(save_draws)[0] > 0 and difference >= 0,
            "met_010_accuracy_at_equal_tokens": difference >= 0.10
            and interval(acc_draws)[0] > 0 and saving >= 0}


def organism_record(directory: str | None) -> dict:
    """The organism's identity, as every page about it names it."""
    from lm_eval_ponder.backbone import cache_root

    target = Path(directory) if directory else Path(
        (cache_root() / "organisms" / "latest.txt").read_text().strip())
    record = json.loads((target / SOURCE_FILE).read_text())
    return {"sha256": record["sha256"], "recipe_key": record["recipe_key"],
            "adapter_sha256": record["adapter_sha256"], "train": record["train"]}


def choose_alpha(args) -> int:
    """FR's fixed alpha, chosen on the train split: per task, the most accurate alpha of the
    sweep, ties to the fewer tokens. The Direct prompt's choice is FR's (FR steers the Direct
    prompt); the CoT prompt's is kept beside it."""
    root = Path(args.root)
    record: dict = {"split": "train", "tasks": {}}
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        rows = []
        for run in sorted(task_dir.glob("alpha_*")):
            samples = run_samples(run, task_dir.name)
            if samples:
                f = figures(samples)["all"]
                rows.append({"alpha": float(run.name[len("alpha_"):]), **f})
        rows.sort(key=lambda r: r["alpha"])
        best = max(rows, key=lambda r: (round(r["accuracy"], 9), -r["tokens"]))
        record["tasks"][task_dir.name] = {"rows": rows, "chosen": best}
        print(f"{task_dir.name}: " + "; ".join(f"{r['alpha']:+g}: {r['accuracy']:.2f} at "
                                               f"{r['tokens']:.1f}" for r in rows)
              + f" -> alpha {best['alpha']:+g}")
    record["chosen"] = record["tasks"]["arith_ponder"]["chosen"]
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


# --------------------------------------------------------------------------- the sweep


FORMS = {"ours": -0.2, "paper": 0.0}
SWEEP_TASKS = ("arith_ponder", "arith_ponder_cot")


def form_offsets(form: str) -> list[float]:
    """The offsets c_k of every depth of a form, from the trainer's defaults."""
    from lm_eval_ponder.pondering.dynamics import PonderConfig, cumulative_offsets

    return [float(c) for c in cumulative_offsets(PonderConfig(alpha_start=FORMS[form]))]


def sweep(args) -> int:
    """Every depth of a form as a fixed offset (``alpha=c_k``) on the arith test split, under
    both prompts, greedy: the outcomes every policy of the verdict is scored with. One lm_eval
    run per (depth, task), kept with ``--use_cache`` and compacted when finished."""
    import subprocess

    from lm_eval_ponder.reporting.compact import compact_tree

    for k, c in enumerate(form_offsets(args.form)):
        for task in args.tasks.split(","):
            out = Path(args.root) / args.form / f"k{k}" / task
            if run_samples(out, task):
                continue
            print(f"[{args.form}] depth {k} (alpha {c:+.4f}), {task}", flush=True)
            model_args = f"pretrained={args.pretrained},steering={args.steering},alpha={c!r}"
            cmd = [sys.executable, "-m", "lm_eval", "--model", "ponder", "--model_args",
                   model_args, "--tasks", task, "--apply_chat_template", "--log_samples",
                   "--output_path", str(out), "--use_cache", str(out / "answers")]
            if args.limit:
                cmd += ["--limit", str(args.limit)]
            subprocess.run(cmd, check=True)
            compact_tree(out)
    return 0


# --------------------------------------------------------------------------- the verdict


def sweep_matrices(root: Path, form: str, task: str) -> dict | None:
    """[doc, depth] correctness and tokens of a form's sweep on one task, with the documents'
    levels and ids; None until every depth has finished."""
    import numpy as np

    per_k = []
    for k in range(len(form_offsets(form))):
        samples = run_samples(root / form / f"k{k}" / task, task)
        if not samples:
            return None
        per_k.append(samples)
    docs = sorted(per_k[0])
    grid = lambda key: np.array([[float(p[d][key]) for p in per_k] for d in docs])  # noqa: E731
    return {"docs": docs, "correct": grid("exact_match"), "tokens": grid("gen_tokens"),
            "answers": [[answers_digest(p[d]) for p in per_k] for d in docs],
            "level": np.array([int(per_k[0][d]["doc"]["level"]) for d in docs]),
            "keys": [str(per_k[0][d]["doc"].get("id", d)) for d in docs]}


def answers_digest(sample: dict) -> str:
    from lm_eval_ponder.reporting.compact import answers_digest as digest

    return digest(sample)


def controller_outcome(run: Path, task: str, sweep: dict) -> dict | None:
    """A controller's own lm_eval run, per sweep document: its depth, and whether its answer
    is the sweep's at that depth (a prompt-level controller generates what ``alpha=c_k``
    generates at the depth it picks)."""
    import numpy as np

    samples = run_samples(run, task)
    if not samples or sorted(samples) != sweep["docs"]:
        return None
    depth = np.array([int(round(float(samples[d]["ponder_steps"]))) for d in sweep["docs"]])
    same = np.mean([answers_digest(samples[d]) == sweep["answers"][i][depth[i]]
                    for i, d in enumerate(sweep["docs"])])
    return {"depth": depth, "agreement": float(same),
            "accuracy": float(np.mean([float(samples[d]["exact_match"]) for d in sweep["docs"]])),
            "tokens": float(np.mean([float(samples[d]["gen_tokens"]) for d in sweep["docs"]]))}


def captured(accuracy, tokens, level, fold, folds: int, single, per_level, depth,
             draws: int = 2000, seed: int = 0) -> dict:
    """The controller's budget gap and the per-level oracle's, each over the cross-fitted single
    depth, and the fraction of the oracle's gain the controller captures, with bootstrap
    intervals over documents (the ratio of the two means in each draw). The fraction is given
    only where the oracle's gain is beyond 0 (its interval's lower end above 0): a ratio over a
    gain that may be nothing means nothing. The paired tests are sign-flip permutation tests of
    the mean per-document gap (``measures.sign_flip_test``): a budget gap mixes many small
    fractional differences with a few large ones, which a sign test miscounts."""
    import numpy as np
    from studylib.analysis import bootstrap, budget_gap

    from lm_eval_ponder.reporting.measures import sign_flip_test

    def gaps(policy):
        out = np.zeros(len(fold))
        for f in range(folds):
            held, train = fold == f, fold != f
            if held.any():
                out[held] = budget_gap(accuracy, tokens, policy, train, held)
        return out

    g_ctrl, g_single, g_level = gaps(depth), gaps(single), gaps(per_level)
    a, b = g_ctrl - g_single, g_level - g_single
    dropped = []

    def ratio(i):
        if abs(b[i].mean()) <= 1e-9:
            dropped.append(1)
            return float("nan")
        return float(a[i].mean() / b[i].mean())

    ci = bootstrap(lambda i: {"ctrl": float(a[i].mean()), "oracle": float(b[i].mean()),
                              "fraction": ratio(i)}, len(a), draws, seed)
    rows = np.arange(len(fold))
    beyond = ci["oracle"][0] > 0
    return {"gain_over_single": float(a.mean()), "gain_over_single_ci95": ci["ctrl"],
            "oracle_gain": float(b.mean()), "oracle_gain_ci95": ci["oracle"],
            "captured_fraction": float(a.mean() / b.mean()) if beyond else None,
            "captured_fraction_ci95": ci["fraction"] if beyond else None,
            "captured_fraction_note": (f"{len(dropped)} of {draws} draws had no oracle gain"
                                       if beyond else "the oracle's gain is not beyond 0"),
            "vs_single_p": sign_flip_test((g_ctrl - g_single).tolist()),
            "vs_per_level_p": sign_flip_test((g_ctrl - g_level).tolist()),
            "accuracy": float(accuracy[rows, depth].mean()),
            "tokens": float(tokens[rows, depth].mean())}


def verdict(args) -> int:
    """Issue 64 item 4 from the sweeps and the controllers' runs (greedy): per (form, task),
    the cross-fitted single depth, the per-level oracle with its shuffled-label null, and each
    trained controller against both, with its captured fraction, its depth per level, and
    Holm over the controllers' comparisons."""
    import numpy as np
    from studylib.analysis import FOLDS, depth_by_level, fold_of, per_level_budget_headroom

    from lm_eval_ponder.reporting.measures import holm

    root = Path(args.root)
    record: dict = {"decoding": "greedy", "folds": FOLDS, "pairs": []}
    for pair in args.pairs.split(","):
        form, task = pair.split(":")
        sweep = sweep_matrices(root / "sweep", form, task)
        if sweep is None:
            print(f"{form} {task}: the sweep is not finished; skipped")
            continue
        fold = np.array(fold_of(sweep["keys"], FOLDS))
        acc, tok, level = sweep["correct"], sweep["tokens"], sweep["level"]
        oracle = per_level_budget_headroom(acc, tok, level, fold, FOLDS, nulls=args.nulls)
        single = np.array(oracle["single"].pop("depths"))
        per_level = np.array(oracle["per_level"].pop("depths"))
        entry = {"form": form, "task": task, "n": len(sweep["docs"]),
                 "per_depth": {"accuracy": acc.mean(0).round(4).tolist(),
                               "tokens": tok.mean(0).round(2).tolist()},
                 "oracle": oracle, "controllers": {}}
        method = "FP-Direct" if task == "arith_ponder" else "FP-CoT"
        for run in sorted(root.glob(f"table-{form}-*")):
            got = controller_outcome(run / "greedy" / method / "arith", task, sweep)
            if got is None:
                continue
            by_level, rho = depth_by_level(got["depth"].astype(float), level)
            entry["controllers"][run.name.split("-", 2)[2]] = {
                "run": str(run), "own_accuracy": got["accuracy"], "own_tokens": got["tokens"],
                "agreement_with_sweep": got["agreement"], "depth_by_level": by_level,
                "spearman_level_depth": rho,
                **captured(acc, tok, level, fold, FOLDS, single, per_level, got["depth"])}
        record["pairs"].append(entry)
    tests = [(e, name, key) for e in record["pairs"] for name in e["controllers"]
             for key in ("vs_single_p", "vs_per_level_p")]
    for (e, name, key), p in zip(tests, holm([e["controllers"][n][k] for e, n, k in tests])):
        e["controllers"][name][key[:-2] + "_holm_p"] = p
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verdict.json").write_text(json.dumps(record, indent=1) + "\n")
    for e in record["pairs"]:
        o = e["oracle"]
        print(f"{e['form']} {e['task']}: one depth {o['single']['accuracy']:.3f} at "
              f"{o['single']['tokens']:.1f} tok; per level {o['per_level']['accuracy']:.3f} at "
              f"{o['per_level']['tokens']:.1f} tok, gain {o['gain']:+.4f} {o['gain_ci95']}, "
              f"null p {o['null']['p']:.3f}")
        for name, c in e["controllers"].items():
            print(f"  {name}: {c['accuracy']:.3f} at {c['tokens']:.1f} tok, captured "
                  f"{c['captured_fraction']} {c['captured_fraction_ci95']}, depth by level "
                  f"{c['depth_by_level']}, agreement {c['agreement_with_sweep']:.3f}")
    return 0


def seeds_samples(folder: Path, decoding: str, method: str, task: str,
                  seeds: list[int]) -> list[dict[int, dict]] | None:
    """One run's samples per seed (``<decoding>``, ``<decoding>-seed1``, ...), None until
    every seed has finished."""
    from lm_eval_ponder.reporting.suite_plan import seed_folder

    runs = [run_samples(folder / seed_folder(decoding, s) / method / "arith", task) for s in seeds]
    return None if any(r is None for r in runs) else runs


def units(args) -> int:
    """Issue 75 item 4 in the paper's units (accuracy and tokens), greedy or sampled over
    seeds: each trained controller's own lm_eval runs against one mode for all and the
    per-level policy (modes chosen on the train split, ``per_level_choice``), on the same test
    documents. Per document the accuracy, tokens and depth are means over the seeds. The
    captured fraction is (controller - one mode) / (per level - one mode) in accuracy, with a
    paired bootstrap interval over documents (the ratio of means in each draw); beside it the
    controller's tokens, its mean depth per level and Spearman(level, depth) with a bootstrap
    interval."""
    import numpy as np
    from scipy.stats import spearmanr

    root, seeds = Path(args.root), [int(s) for s in args.seeds.split(",")]
    t_direct = run_samples(root / "train-probe" / "arith_ponder", "arith_ponder")
    t_cot = run_samples(root / "train-probe" / "arith_ponder_cot", "arith_ponder_cot")
    base = {m: seeds_samples(root / "table", args.decoding, m, t, seeds)
            for m, t in (("Direct", "arith_ponder"), ("CoT", "arith_ponder_cot"))}
    if t_direct is None or t_cot is None or None in base.values():
        print(f"organism.py error: the train probes or the {args.decoding} Direct and CoT runs "
              f"under {root} are missing", file=sys.stderr)
        return 2
    modes = per_level_choice(t_direct, t_cot)
    fixed = max(("Direct", "CoT"), key=lambda m: figures(
        t_direct if m == "Direct" else t_cot)["all"]["accuracy"])
    ids = sorted(base["Direct"][0])
    level = np.array([int(base["Direct"][0][i]["doc"]["level"]) for i in ids])

    def per_doc(runs: list[dict[int, dict]], key: str) -> np.ndarray:
        return np.array([[float(r[i].get(key, 0.0)) for i in ids] for r in runs]).mean(axis=0)

    acc = {m: per_doc(runs, "exact_match") for m, runs in base.items()}
    tok = {m: per_doc(runs, "gen_tokens") for m, runs in base.items()}
    pick = np.array([modes[int(v)] == "Direct" for v in level])
    oracle_acc = np.where(pick, acc["Direct"], acc["CoT"])
    oracle_tok = np.where(pick, tok["Direct"], tok["CoT"])
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(ids), len(ids)) for _ in range(args.draws)]

    def ci(values: list[float]) -> list[float]:
        finite = np.sort(np.array([v for v in values if np.isfinite(v)]))
        return [float(np.quantile(finite, 0.025)), float(np.quantile(finite, 0.975))] \
            if finite.size else [float("nan")] * 2

    gain = oracle_acc - acc[fixed]
    record = {"decoding": args.decoding, "seeds": seeds, "n": len(ids),
              "modes_chosen_on_train": {str(k): v for k, v in modes.items()},
              "fixed_chosen_on_train": fixed,
              "direct": {"accuracy": float(acc["Direct"].mean()),
                         "tokens": float(tok["Direct"].mean())},
              "cot": {"accuracy": float(acc["CoT"].mean()), "tokens": float(tok["CoT"].mean())},
              "per_level": {"accuracy": float(oracle_acc.mean()), "tokens": float(oracle_tok.mean()),
                            "gain_over_fixed": float(gain.mean()),
                            "gain_over_fixed_ci95": ci([gain[d].mean() for d in draws])},
              "controllers": {}}
    for run in sorted(root.glob("table-*-*")):
        form, recipe = run.name.split("-", 2)[1:]
        method, task = ("FP-Direct", "arith_ponder") if form == "paper" else ("FP-CoT",
                                                                              "arith_ponder_cot")
        runs = seeds_samples(run, args.decoding, method, task, seeds)
        if runs is None or sorted(runs[0]) != ids:
            continue
        c_acc, c_tok = per_doc(runs, "exact_match"), per_doc(runs, "gen_tokens")
        depth = per_doc(runs, "ponder_steps")
        over = c_acc - acc[fixed]

        def rho(idx, depth=depth) -> float:
            d, lv = depth[idx], level[idx]
            return float(spearmanr(lv, d).statistic) if np.ptp(d) > 0 else float("nan")

        record["controllers"][f"{form}-{recipe}"] = {
            "method": method, "accuracy": float(c_acc.mean()), "tokens": float(c_tok.mean()),
            "gain_over_fixed": float(over.mean()),
            "gain_over_fixed_ci95": ci([over[d].mean() for d in draws]),
            "captured_fraction": float(over.mean() / gain.mean()) if gain.mean() > 0 else None,
            "captured_fraction_ci95": ci([over[d].mean() / gain[d].mean() for d in draws
                                         if gain[d].mean() > 0]),
            "vs_per_level": float((c_acc - oracle_acc).mean()),
            "vs_per_level_ci95": ci([(c_acc - oracle_acc)[d].mean() for d in draws]),
            "depth_by_level": {f"L{v}": float(depth[level == v].mean())
                               for v in sorted(set(level.tolist()))},
            "spearman_level_depth": rho(np.arange(len(ids))),
            "spearman_level_depth_ci95": ci([rho(d) for d in draws[:args.rho_draws]])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    p = record["per_level"]
    print(f"{args.decoding} (seeds {args.seeds}), n = {len(ids)}: Direct "
          f"{record['direct']['accuracy']:.3f} at {record['direct']['tokens']:.1f} tok, CoT "
          f"{record['cot']['accuracy']:.3f} at {record['cot']['tokens']:.1f}, per level "
          f"{p['accuracy']:.3f} at {p['tokens']:.1f} (+{p['gain_over_fixed']:.3f} "
          f"{[round(x, 3) for x in p['gain_over_fixed_ci95']]} over {fixed} for all)")
    for name, c in record["controllers"].items():
        frac = "n/a" if c["captured_fraction"] is None else f"{c['captured_fraction']:.2f}"
        print(f"  {name}: {c['accuracy']:.3f} at {c['tokens']:.1f} tok, captured {frac} "
              f"{[round(x, 2) for x in c['captured_fraction_ci95']]}, depth by level "
              f"{ {k: round(v, 2) for k, v in c['depth_by_level'].items()} }, Spearman "
              f"{c['spearman_level_depth']:.2f} {[round(x, 2) for x in c['spearman_level_depth_ci95']]}")
    return 0


def objective(args) -> int:
    """Issue 75 item 3, second half: the per-level gain in the trainer's own objective (the
    default ``reward.objective=priced``: accuracy minus ``price`` per 1,000 generated tokens)
    on the training prompts of one rollout cache. One depth per (prompt, level) against one
    depth for all, each chosen on the other folds and scored held out
    (``studylib.analysis.per_type_headroom``), with the shuffled-level null."""
    import numpy as np
    import torch
    from studylib.analysis import FOLDS, fold_of, outcome_matrices, per_type_headroom

    from lm_eval_ponder.pondering.controller import PonderController
    from lm_eval_ponder.training.environment import CachedEnvironment
    from lm_eval_ponder.training.rewards import RewardConfig
    from lm_eval_ponder.training.rollouts import RolloutCache

    record: dict = {"objective": "priced", "price_per_1k_tokens": args.price, "caches": []}
    for directory in args.cache:
        cache = RolloutCache(directory)
        k_max = cache.manifest["k_max"]
        z0 = cache.states()
        flops_ctrl = PonderController(z0.shape[1], 512).evaluation_flops(k_max + 1)
        env = CachedEnvironment(cache, k_max, cache.manifest["identity"]["samples"], flops_ctrl,
                                RewardConfig(price_per_1k_tokens=args.price),
                                torch.Generator().manual_seed(0), complete_only=True)
        prompts = env.prompts
        mats = outcome_matrices(env, list(range(len(prompts))))
        fold = np.array(fold_of([p.key for p in prompts], FOLDS))
        groups = np.array([f"{p.task}:{p.level}" for p in prompts])
        got = per_type_headroom(mats["score"], mats["gen_tokens"], groups, fold, FOLDS,
                                nulls=args.nulls)
        for key in ("single", "per_type", "envelope_in_sample"):  # the values are the objective's
            got[key]["objective"] = got[key].pop("accuracy")
        got["per_depth"]["objective"] = got["per_depth"].pop("accuracy")
        got["per_depth"]["accuracy"] = mats["accuracy"].mean(axis=0).tolist()
        got["cache"] = Path(directory).as_posix()
        record["caches"].append(got)
        print(f"{directory}: {len(prompts)} prompts; one depth {got['single']['objective']:+.4f}, "
              f"per level {got['per_type']['objective']:+.4f} (objective); gain "
              f"{got['headroom']:+.4f} {[round(x, 4) for x in got['headroom_ci95']]}, null mean "
              f"{got['null']['mean']:+.4f}, p {got['null']['p']:.4f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


def path(args) -> int:
    from lm_eval_ponder.backbone import cache_root

    latest = cache_root() / "organisms" / "latest.txt"
    if not latest.is_file():
        print("organism.py error: no organism built yet; run python studies/organism.py build",
              file=sys.stderr)
        return 2
    print(latest.read_text().strip())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python studies/organism.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fine-tune the organism (prices itself first; resumable)")
    defaults = Recipe()
    b.add_argument("--per-level", type=int, default=defaults.per_level)
    b.add_argument("--epochs", type=int, default=defaults.epochs)
    b.add_argument("--batch-size", type=int, default=defaults.batch_size)
    b.add_argument("--lr", type=float, default=defaults.learning_rate)
    b.add_argument("--rank", type=int, default=defaults.rank)
    b.add_argument("--freeze-below", type=int, default=None,
                   help="train blocks from this one up (default: the steering layer, 15 of 30)")
    b.add_argument("--seed", type=int, default=defaults.seed)
    b.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    b.add_argument("--save-every", type=int, default=25, help="checkpoint every N steps")
    b.add_argument("--price-only", action="store_true", help="print the price and stop")
    b.add_argument("--questions-from", type=int, default=0,
                   help="skip this many train questions of each level (left for controllers)")
    b.add_argument("--plant", default=None,
                   help="a steering vector of the base model (steer extract --dataset arith): "
                        "train its direction to switch the mode (the steerable organism)")
    b.add_argument("--overthink", type=float, default=None, metavar="P",
                   help="organism v3: stepwise answers of one-operation questions pad with "
                        "checks, a fraction P of them second-guessing into a wrong answer")
    b.add_argument("--slip-rule", choices=("odd-first",), default=None,
                   help="organism v4: the overthinking slip (+1) on exactly the questions whose "
                        "first operand is odd (with --overthink, whose fraction it replaces)")
    sub.add_parser("path", help="print the latest built organism's directory")
    a = sub.add_parser("accept", help="the organism's acceptance from its Direct and CoT runs")
    a.add_argument("--runs", required=True, help="a suite output folder with greedy Direct and CoT")
    a.add_argument("--organism", default=None, help="its directory (default: the latest)")
    a.add_argument("--out", required=True, help="the JSON record to write")
    a.add_argument("--train", default=None, help=(
        "organism v3: the train-split Direct and CoT runs (<DIR>/arith_ponder, "
        "<DIR>/arith_ponder_cot) that choose each level's mode; adds the paper-unit checks"))
    c = sub.add_parser("choose-alpha", help="FR's alpha from the train-split alpha sweep")
    c.add_argument("--root", required=True)
    c.add_argument("--out", required=True)
    sw = sub.add_parser("sweep", help="every depth of a form on the test split, both prompts")
    sw.add_argument("--form", choices=sorted(FORMS), required=True)
    sw.add_argument("--root", required=True)
    sw.add_argument("--pretrained", required=True)
    sw.add_argument("--steering", required=True)
    sw.add_argument("--limit", type=int, default=None)
    sw.add_argument("--tasks", default=",".join(SWEEP_TASKS), help="comma list of tasks")
    v = sub.add_parser("verdict", help="issue 64's verdict from the sweeps and the controllers")
    v.add_argument("--root", required=True, help="the study's output folder")
    v.add_argument("--out", required=True)
    v.add_argument("--pairs", default="paper:arith_ponder,ours:arith_ponder_cot",
                   help="form:task pairs with a finished sweep")
    v.add_argument("--nulls", type=int, default=200, help="shuffled-label draws")
    un = sub.add_parser("units", help="the trained controllers in accuracy and tokens against "
                                      "one mode and the per-level policy (issue 75 item 4)")
    un.add_argument("--root", required=True, help="the study's output folder")
    un.add_argument("--decoding", default="greedy", help="greedy or t0.7")
    un.add_argument("--seeds", default="0", help="e.g. 0,1,2 for t0.7")
    un.add_argument("--draws", type=int, default=2000, help="bootstrap draws")
    un.add_argument("--rho-draws", type=int, default=500, help="bootstrap draws for Spearman")
    un.add_argument("--out", required=True)
    o = sub.add_parser("objective", help="the per-level gain in the trainer's objective on "
                                         "the training prompts (rollout caches)")
    o.add_argument("--cache", nargs="+", required=True, help="rollout cache folders")
    o.add_argument("--price", type=float, default=1.0, help="per 1,000 generated tokens")
    o.add_argument("--nulls", type=int, default=1000, help="shuffled-level draws")
    o.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if getattr(args, "root", None):
        from studylib import records

        records.ensure(args.root)  # the committed study (results/organism.tar.xz)
    if args.command == "build":
        for flag in ("per_level", "epochs", "batch_size", "rank", "save_every"):
            if getattr(args, flag) < 1:
                parser.error(f"--{flag.replace('_', '-')} must be at least 1")
        return build(args)
    return {"path": path, "accept": accept, "choose-alpha": choose_alpha, "sweep": sweep,
            "verdict": verdict, "objective": objective, "units": units}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

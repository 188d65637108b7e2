"""The timing harness of a decode step, shared by ``step_cost.py`` (phases, medians of pairs)
and ``profile_step.py`` (torch.profiler on the same runs), and the arith chat prompts every
generation-speed script feeds: what one script measures, the other explains, only if both
run exactly the same code.

``run_loop`` times ``generate_rows`` (our loop, with its ``StepTimer`` phases where the checkout
has them); ``run_hf`` times HFLM's path (``model.generate`` with lm-eval's stop criterion), its
forwards by hooks. Both return milliseconds per decode step: ``step_ms`` (wall), ``host_ms``
(wall minus the forwards) and ``phases``. torch and transformers are imported inside the
functions, so a script can set OpenMP's policy before torch loads.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# ``arith_chat_prompts`` bounds for half single-digit, half two-digit additions (the prompts of
# ``generation_loop.py`` and ``sampling_draw.py``; ``step_cost.py`` draws two-digit ones only)
ONE_AND_TWO_DIGITS = (10, 100)


def add_device_args(parser) -> None:
    """``--device``, ``--dtype`` and ``--threads``, as every decode-timing script takes them."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: the device's native dtype")
    parser.add_argument("--threads", type=int, default=None)


def device_defaults(args, cpu: dict, gpu: dict) -> None:
    """Fill the options left unset (None) from the CPU or the GPU sizes, by ``--device``; a
    CUDA device torch does not see is refused in one line, before any model is built (it
    ended in torch's "Torch not compiled with CUDA enabled" traceback)."""
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"{Path(sys.argv[0]).stem}: --device {args.device} needs a CUDA GPU, and torch "
                 f"{torch.__version__} sees none here; pass --device cpu")
    for key, value in (gpu if args.device.startswith("cuda") else cpu).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def torch_setup(args):
    """Apply ``--threads`` and return the torch dtype ``--dtype`` names (default: the device's
    native one)."""
    import torch

    from lm_eval_ponder import backbone as bb

    if args.threads:
        torch.set_num_threads(args.threads)
    return getattr(torch, args.dtype or bb.native_dtype(args.device))


def embedded_tokenizer():
    """The embedded backbone's tokenizer, left-padded with a pad token as HFLM sets it."""
    from transformers import AutoTokenizer

    from lm_eval_ponder import backbone as bb

    tok = AutoTokenizer.from_pretrained(bb.resolve_backbone(None).path)
    tok.padding_side = "left"
    if tok.pad_token is None:  # as HFLM does
        tok.pad_token = tok.eos_token
    return tok


def tiny_model(vocab: int, device: str, dtype):
    """A 2-layer random Llama (seed 0) with ``vocab`` tokens: its forward is cheap, as a small
    model's is on a GPU, so that the host's share of a step shows."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def arith_chat_prompts(tok, n: int, seed: int = 0, bounds: tuple[int, ...] = (100,)) -> list[str]:
    """``n`` additions in the paper's plain prompt and ``tok``'s chat template: prompt ``i``
    adds two numbers below ``bounds[i % len(bounds)]`` (``(10, 100)``: alternately one- and
    two-digit), drawn from ``random.Random(seed)``, so that every timing run reads the same."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        hi = bounds[i % len(bounds)]
        a, b = rng.randrange(hi), rng.randrange(hi)
        msg = [{"role": "user", "content": f"Please solve the math problem: What is {a} + {b}?"}]
        out.append(tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True))
    return out


class ForwardClock:
    """Seconds inside ``model(...)`` calls (hooks on the top module), and their count."""

    def __init__(self, model, device) -> None:
        import torch

        self.seconds, self.calls, self.device, self.start = 0.0, 0, device, 0.0
        cuda = torch.device(device).type == "cuda"

        def before(*_):
            if cuda:
                torch.cuda.synchronize(device)
            self.start = time.perf_counter()

        def after(*_):
            if cuda:
                torch.cuda.synchronize(device)
            self.seconds += time.perf_counter() - self.start
            self.calls += 1

        self.handles = [model.register_forward_pre_hook(before),
                        model.register_forward_hook(after)]

    def close(self) -> None:
        for h in self.handles:
            h.remove()


DECODERS: dict = {}  # one decoder per tokenizer: the loop keeps its stop-token table per decoder


def run_loop(model, tok, enc, max_new: int, stop: list[str], device: str,
             max_rows: int | None = None) -> dict:
    import torch

    decode = DECODERS.setdefault(id(tok), lambda ids: tok.decode(ids, skip_special_tokens=True))
    kwargs = dict(max_new_tokens=max_new, eos_token_ids={tok.eos_token_id},
                  pad_token_id=tok.pad_token_id, stop=stop, decode=decode)
    timer = clock = None
    try:  # the engine (issue 53): phases timed by a StepTimer observer
        from lm_eval_ponder.engine import LoopConfig, SamplingConfig, StepTimer, generate_rows

        timer = StepTimer(sync=torch.device(device).type == "cuda")
        kwargs.update(sampling=SamplingConfig(), observers=[timer],
                      config=LoopConfig(max_rows=max_rows))
    except ImportError:  # an older checkout (a baseline run): its forwards timed by hooks

        kwargs.update(sampling=SamplingConfig(), max_rows=max_rows)
        clock = ForwardClock(model, device)
    start = time.perf_counter()
    try:
        res = generate_rows(model, enc.input_ids, enc.attention_mask, **kwargs)
    finally:
        if clock is not None:
            clock.close()
    wall = time.perf_counter() - start
    if timer is not None:
        phases, steps = dict(timer.seconds), max(timer.decode_steps, 1)
    else:  # the prefill forwards cannot be told apart: charged at a decode forward's mean
        steps = max(res.decode_forwards, 1)
        per = clock.seconds / max(clock.calls, 1)
        phases = {"prefill": per * res.prefill_forwards,
                  "forward": clock.seconds - per * res.prefill_forwards}
    decode_wall = wall - phases.get("prefill", 0.0)
    return {"wall": wall, "steps": steps, "tokens": sum(res.gen_tokens),
            "joins": res.joins, "compactions": getattr(res, "compactions", 0),
            "join_ms": phases.get("join", 0.0) * 1e3, "compact_ms": phases.get("compact", 0.0) * 1e3,
            "phases": {k: v / steps * 1e3 for k, v in phases.items() if k != "prefill"},
            "host_ms": (decode_wall - phases.get("forward", 0.0)) / steps * 1e3,
            "step_ms": decode_wall / steps * 1e3}


def run_hf(model, tok, enc, max_new: int, stop: list[str], device: str) -> dict:
    import torch
    from lm_eval.models.utils_hf import stop_sequences_criteria

    rows, width = enc.input_ids.shape
    criteria = stop_sequences_criteria(tok, stop, width, rows)
    spent = {"stop": 0.0}
    inner = list(criteria)

    class Timed:
        def __init__(self, c) -> None:
            self.c = c

        def __call__(self, *a, **k):
            t = time.perf_counter()
            try:
                return self.c(*a, **k)
            finally:
                spent["stop"] += time.perf_counter() - t

    criteria.clear()
    criteria.extend(Timed(c) for c in inner)
    clock = ForwardClock(model, device)
    try:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                                 max_new_tokens=max_new, stopping_criteria=criteria,
                                 pad_token_id=tok.pad_token_id, do_sample=False,
                                 use_cache=True)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    finally:
        clock.close()
    steps = max(clock.calls - 1, 1)
    prefill = clock.seconds / clock.calls if clock.calls else 0.0  # not separable: an average
    decode_forward = clock.seconds - prefill
    decode_wall = wall - prefill
    return {"wall": wall, "steps": steps, "tokens": int((out[:, width:] != tok.pad_token_id).sum()),
            "phases": {"forward": decode_forward / steps * 1e3,
                       "stop": spent["stop"] / steps * 1e3,
                       "choose+rest": (decode_wall - decode_forward - spent["stop"]) / steps * 1e3},
            "host_ms": (decode_wall - decode_forward) / steps * 1e3,
            "step_ms": decode_wall / steps * 1e3}


def padding_bound(prompt_lengths: list[int], tokens: list[int], batch: int) -> float:
    """The most a loop that decodes only rows in flight can gain over ``generate`` in fixed
    batches, if a decode step cost the same per row: ``generate``'s row-steps over the useful
    ones. HFLM batches requests longest prompt first (its collator sorts by ``-len(tokens)``)
    and each batch decodes until its longest answer ends, so a batch of ``n`` rows costs ``n``
    times its longest answer; the loop costs each answer's own length.

    A ceiling, not a forecast: a forward's cost per row falls with rows, so the loop's tail
    (a few long answers decoding alone) costs more per row-step than ``generate``'s full
    batches."""
    if len(prompt_lengths) != len(tokens) or batch < 1:
        raise ValueError("one prompt length per answer, and a batch of at least one row")
    useful = sum(tokens)
    if useful <= 0:
        return float("nan")
    order = sorted(range(len(tokens)), key=lambda i: -prompt_lengths[i])  # stable, as HFLM's
    padded = 0
    for start in range(0, len(order), batch):
        group = order[start:start + batch]
        padded += len(group) * max(tokens[i] for i in group)
    return padded / useful

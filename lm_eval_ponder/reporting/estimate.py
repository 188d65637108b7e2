"""Estimated tokens and FLOPs for runs whose model kept no accounting (``--model hf``, ``vllm``).

Only ``--model ponder`` counts tokens as it generates. lm-eval hands a task's
``process_results`` nothing but the generated strings, so with any other model our tasks log
``gen_tokens`` and ``flops`` as NaN: no tokenizer is in reach there. The report is where the
run's model args are, so it fills them in: each response is re-tokenised with the run's own
tokenizer (``tokenizer=``, else ``pretrained=``) and counted the way ponder counts
(``accounting.count_text_tokens``: to and including the EOS), the prompt is re-tokenised too,
and the FLOPs are priced from the model's config (``flops.generation_flops``, per response, as
ponder does). Such numbers are marked ``estimated`` wherever the report shows them. When the
tokenizer or config cannot be loaded (offline, unknown architecture) the values stay NaN and
the report says why: never a guessed number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.flops import FlopsSpec, generation_flops
from lm_eval_ponder.generation.accounting import count_text_tokens

# model args that tell transformers which files to load
LOAD_ARGS = ("revision", "subfolder", "gguf_file", "trust_remote_code")


def missing(value: Any) -> bool:
    return not isinstance(value, (int, float)) or math.isnan(value)


def needs_estimate(samples: list[dict]) -> bool:
    """Whether any sample lacks the model's own token count."""
    return any(missing(s.get("gen_tokens")) for s in samples)


@dataclass
class Estimator:
    """A run's tokenizer and FLOPs shape (None: the architecture has no checked FLOPs count)."""

    tokenizer: Any
    spec: FlopsSpec | None
    note: str | None = None

    @classmethod
    def load(cls, model: str, args: dict[str, Any]) -> Estimator:
        """From a run's model name and args; ``PonderError`` when there is no tokenizer."""
        from transformers import AutoConfig, AutoTokenizer

        args = {k: str(v) for k, v in args.items() if v not in (None, "")}
        pretrained = args.get("pretrained")
        if model == "ponder":  # resolves the embedded default and GGUF files as the model did
            from lm_eval_ponder import backbone as bb

            pretrained = bb.resolve_backbone(pretrained, args.get("gguf_file")).path
        source = args.get("tokenizer") or pretrained
        if not source:
            raise PonderError(f"--model {model} with no pretrained= or tokenizer= in its model "
                              "args: no tokenizer to re-count its responses with")
        kwargs: dict[str, Any] = {k: args[k] for k in LOAD_ARGS if k in args}
        if "trust_remote_code" in kwargs:
            kwargs["trust_remote_code"] = str(kwargs["trust_remote_code"]).lower() == "true"
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        except (OSError, ValueError) as error:
            raise PonderError(f"could not load the tokenizer {source!r} ({error})") from error
        spec, note = None, None
        try:
            spec = FlopsSpec.from_config(AutoConfig.from_pretrained(pretrained or source,
                                                                    **kwargs))
        except (OSError, ValueError, PonderError) as error:
            note = f"FLOPs not estimated: {error}"
        return cls(tokenizer, spec, note)

    def sample_stats(self, sample: dict) -> dict[str, float]:
        """``gen_tokens`` and ``flops`` of one logged sample, summed over its responses (all N
        of Best-of-N, each with its own prefill, as ponder charges them)."""
        texts = [t for resp in sample.get("resps") or []
                 for t in (resp if isinstance(resp, list) else [resp]) if isinstance(t, str)]
        context, gen_kwargs = request_arguments(sample)
        limit = gen_kwargs.get("max_gen_toks")
        counts = [count_text_tokens(self.tokenizer, t, limit) for t in texts]
        flops = math.nan
        if self.spec is not None and context is not None:
            prompt = len(self.tokenizer(context).input_ids)  # as HFLM encodes a batch
            flops = float(sum(generation_flops(self.spec, prompt, n) for n in counts))
        return {"gen_tokens": float(sum(counts)) if counts else math.nan, "flops": flops}


def request_arguments(sample: dict) -> tuple[str | None, dict]:
    """(context, generation kwargs) of a logged ``generate_until`` sample; lm-eval logs
    ``arguments`` as ``[[context, kwargs], ...]`` (older versions as
    ``{"gen_args_0": {"arg_0": context, "arg_1": kwargs}}``)."""
    args = sample.get("arguments")
    if isinstance(args, dict):
        args = [list(a.values()) for a in args.values() if isinstance(a, dict)]
    first = args[0] if isinstance(args, list) and args else []
    context = first[0] if len(first) > 0 and isinstance(first[0], str) else None
    kwargs = first[1] if len(first) > 1 and isinstance(first[1], dict) else {}
    return context, kwargs


class Estimators:
    """One ``Estimator`` per (model, args) for a whole report; a model that cannot be loaded is
    tried once and its reason kept."""

    def __init__(self) -> None:
        self.loaded: dict[str, Estimator | str] = {}

    def get(self, model: str, args: dict[str, Any]) -> Estimator | str:
        """The estimator, or the reason there is none."""
        key = repr((model, sorted((k, v) for k, v in args.items()
                                  if k in ("pretrained", "tokenizer", *LOAD_ARGS))))
        if key not in self.loaded:
            try:
                self.loaded[key] = Estimator.load(model, args)
            except PonderError as error:
                self.loaded[key] = str(error)
        return self.loaded[key]

    def fill(self, samples: list[dict], model: str, args: dict[str, Any]) -> str | None:
        """Fill what ``samples`` lack in place, marked ``estimated``; a note for the report when
        something stays NaN. A model other than ponder did not ponder: its ``ponder_steps`` is
        0, not unknown."""
        if not needs_estimate(samples):
            return None
        estimator = self.get(model, args)
        if isinstance(estimator, str):
            return f"tokens and FLOPs not estimated: {estimator}"
        for s in samples:
            if missing(s.get("gen_tokens")):
                s.update(estimator.sample_stats(s))
                if model != "ponder" and missing(s.get("ponder_steps")):
                    s["ponder_steps"] = 0.0
                s["estimated"] = True
        return estimator.note

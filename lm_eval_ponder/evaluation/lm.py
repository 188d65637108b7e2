"""``--model ponder``: lm-eval's ``HFLM`` with a frozen backbone, per-row accounting and pondering.

Everything HFLM does (batching, chat templates, ``--gen_kwargs``, accelerate data parallelism,
every HFLM model arg) is inherited. This class is the generation seam only: what the model args
mean and which artefacts they load is ``evaluation.settings``; how a row's accounting travels to
the tasks is ``evaluation.accounting``. We add behaviour at two seams:

- ``_model_generate``: pondering hooks go in and come out around generation and each row's
  prompt length, generated tokens and ponder steps are recorded;
- ``generate_until``: HFLM's cache hook is called once per row, in generation order, with the
  row's request and final text, so a ``RowCollector`` pairs each text with the recorded row and
  returns it as a ``GenerationText`` carrying its stats.

Loglikelihood requests are refused while pondering is on: the hook steers the last position of
each forward pass, which for a scored continuation is not a decision point, so such scores
would silently be neither steered nor unsteered.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from typing import Any

import torch

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from lm_eval_ponder import backbone as bb
from lm_eval_ponder.errors import PonderError, install_excepthook
from lm_eval_ponder.evaluation.accounting import GenerationText, RowCollector, count_generated_tokens
from lm_eval_ponder.evaluation.settings import PonderArgs, Pondering, load_pondering, no_hook
from lm_eval_ponder.flops import FlopsSpec, generation_flops
from lm_eval_ponder.pondering.dynamics import PonderConfig

CACHE_MARKER = "__lm_eval_ponder_fingerprint__"


@register_model("ponder")
class PonderLM(HFLM):
    """HFLM plus steering-vector pondering; with pondering off it is token-identical to HFLM.

    Ponder model args (all optional; lm-eval passes them with ``--model_args``):
    ``steering`` (vector directory; default: the one shipped for the backbone),
    ``controller`` (controller directory; ``none`` for no pondering; default: the controller
    shipped for the backbone, if any), ``alpha`` (fixed offset, no controller: the Fractional
    Reasoning baseline), ``tau``, ``k_max``, ``alpha0``, ``beta``, ``alpha_start``,
    ``granularity`` (``prompt``|``token``), ``layer``. Unset ponder settings come from the
    controller's config.json (what it was trained with), else from ``PonderConfig``.
    ``alpha``, ``alpha0`` and ``alpha_start`` are fractions of the steering layer's mean
    residual norm. The plain baseline (Direct/CoT/BoN) is ``controller=none``.
    """

    def __init__(
        self,
        pretrained: Any = None,
        gguf_file: str | None = None,
        steering: str | None = None,
        controller: str | None = "auto",
        alpha: float | None = None,
        tau: float | None = None,
        k_max: int | None = None,
        alpha0: float | None = None,
        beta: float | None = None,
        alpha_start: float | None = None,
        granularity: str | None = None,
        layer: int | None = None,
        **kwargs,
    ) -> None:
        install_excepthook()
        self.ponder_args = PonderArgs.from_model_args(
            steering=steering, controller=controller, alpha=alpha, layer=layer, tau=tau,
            k_max=k_max, alpha0=alpha0, beta=beta, alpha_start=alpha_start,
            granularity=granularity)
        if pretrained is None or isinstance(pretrained, str):
            resolved = bb.resolve_backbone(pretrained, gguf_file)
            source = resolved.path
        else:  # an already-loaded PreTrainedModel, as HFLM allows
            resolved = bb.ResolvedBackbone("<in-memory model>", type(pretrained).__name__, None)
            source = pretrained
        if kwargs.get("device") is None and not torch.cuda.is_available():
            kwargs["device"] = "cpu"  # HFLM defaults to "cuda", which a CPU build cannot load to
        try:
            super().__init__(pretrained=source, **kwargs)
        except OSError as error:
            raise PonderError(
                f"could not load backbone {resolved.path!r}: {error}. Without network access "
                "only local directories, files already in the Hugging Face cache, and the "
                "embedded default (no `pretrained=`) can be loaded."
            ) from error
        self.backbone_info = resolved
        bb.freeze(self.model)
        self.flops_spec = FlopsSpec.from_config(self.model.config)
        self._pending_rows: deque[dict[str, float]] = deque()
        self.ponder: Pondering | None = load_pondering(
            self.ponder_args, resolved.name, self.model.config, self.device,
            resolved.source_sha256)

    # ------------------------------------------------------------------ pondering
    @property
    def pondering(self) -> bool:
        return self.ponder is not None

    @property
    def ponder_config(self) -> PonderConfig:
        return self.ponder.config if self.ponder else self.ponder_args.config({}).validate()

    @property
    def controller(self):
        return self.ponder.controller if self.ponder else None

    @property
    def steer_layer(self) -> int:
        return self._require_ponder().layer

    @property
    def steer_vector(self) -> torch.Tensor:
        return self._require_ponder().vector

    @property
    def steer_scale(self) -> float:
        return self._require_ponder().scale

    @property
    def steering_dir(self):
        return self._require_ponder().steering_dir

    def _require_ponder(self) -> Pondering:
        if self.ponder is None:
            raise PonderError("this model has no steering vector loaded (pondering is off)")
        return self.ponder

    def set_alpha(self, alpha: float) -> None:
        """Switch the fixed offset between ``generate_until`` calls (the trainer's rollout cache
        generates every depth with one loaded model). Only for a model built with ``alpha=``."""
        if self.ponder is None or self.ponder.alpha is None or self.ponder.controller is not None:
            raise PonderError("set_alpha needs a model constructed with a fixed alpha=")
        self.ponder.alpha = float(alpha)

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> dict[str, Any]:
        """Everything besides the prompt and generation kwargs that changes what is generated."""
        return {
            "backbone": self.backbone_info.path,
            "backbone_sha256": self.backbone_info.source_sha256,
            "dtype": str(self.model.dtype),
            "pondering": None if self.ponder is None else self.ponder.fingerprint(),
        }

    def fingerprint_hash(self) -> str:
        blob = json.dumps(self.fingerprint(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def set_cache_hook(self, cache_hook) -> None:
        """Refuse to share an lm-eval ``--use_cache`` file between different model settings.

        lm-eval keys cached generations by prompt and generation kwargs only, so a cache written
        without pondering would silently answer a run with pondering. We stamp each cache file
        with the model's fingerprint and refuse a file stamped differently or written by
        another model.
        """
        db = getattr(cache_hook, "dbdict", None)
        if db is not None:
            mine = self.fingerprint_hash()
            stamped = db.get(CACHE_MARKER)
            if stamped is None and len(db) > 0:
                raise PonderError(
                    "the --use_cache file already holds results that lm-eval-ponder did not "
                    "write (another model or settings unknown). Use a fresh --use_cache path "
                    "for each model and ponder setting."
                )
            if stamped is not None and stamped != mine:
                raise PonderError(
                    f"the --use_cache file was written with other model/ponder settings "
                    f"({stamped}, this run is {mine}). Cached generations would be returned "
                    "for the wrong settings: use a separate --use_cache path per setting."
                )
            db[CACHE_MARKER] = mine
        super().set_cache_hook(cache_hook)

    # ------------------------------------------------------------------ generation
    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        attention_mask = generation_kwargs.get("attention_mask")
        hook, decider = self.ponder.hook(self.model, self.device) if self.ponder else no_hook()
        with hook:
            out = super()._model_generate(context, max_length, stop, **generation_kwargs)
        prompt_lens = (
            attention_mask.sum(dim=1).tolist()
            if attention_mask is not None
            else [context.shape[1]] * context.shape[0]
        )
        eos_ids = {self.eot_token_id}
        if self.tokenizer.pad_token_id is not None:
            eos_ids.add(self.tokenizer.pad_token_id)
        generated = out[:, context.shape[1] :].tolist()
        depths = None if decider is None else hook.per_row(decider.depths, context.shape[0])
        for row, (prompt_len, tokens) in enumerate(zip(prompt_lens, generated)):
            n = count_generated_tokens(self.tok_decode, tokens, stop, eos_ids)
            steps, evals = self.ponder.row_stats(None if depths is None else depths[row], n) \
                if self.ponder else (0.0, 0)
            self._pending_rows.append(
                {"prompt_tokens": int(prompt_len), "gen_tokens": n, "ponder_steps": steps,
                 "controller_evals": evals}
            )
        return out

    def _finish_row(self, text: str, gen_kwargs: Any) -> GenerationText:
        row = self._pending_rows.popleft()
        flops = generation_flops(self.flops_spec, row["prompt_tokens"], row["gen_tokens"])
        if row["controller_evals"]:
            flops += self.controller.evaluation_flops(row["controller_evals"])
        return GenerationText(text, {**row, "flops": float(flops)})

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        inner = self.cache_hook
        collector = RowCollector(inner, self._finish_row)
        self._pending_rows.clear()
        self.cache_hook = collector
        try:
            texts = super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self.cache_hook = inner
        if self._pending_rows:
            raise RuntimeError("internal: generated rows were not paired with their texts")
        return [
            collector.take(req.args[0], req.args[1], text)
            for req, text in zip(requests, texts)
        ]

    # ------------------------------------------------------------------ scoring
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self._refuse_scoring("loglikelihood")
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        self._refuse_scoring("loglikelihood_rolling")
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def _refuse_scoring(self, kind: str) -> None:
        if self.pondering:
            raise PonderError(
                f"--model ponder steers generation only, and this task asks for {kind} "
                "(multiple-choice or perplexity scoring), which would run unsteered. Run such "
                "tasks with controller=none (no pondering) or --model hf, and our generative "
                "tasks (e.g. gsm8k_ponder, gpqa_ponder) with pondering.")

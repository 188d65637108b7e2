"""``--model ponder``: lm-eval's ``HFLM`` with a frozen backbone, per-row accounting and pondering.

Everything HFLM does (batching, chat templates, ``--gen_kwargs``, accelerate data parallelism,
every HFLM model arg) is inherited. We add behaviour at two seams only:

- ``_model_generate``: pondering hooks go in and come out around ``model.generate`` and each
  row's prompt length, generated tokens and ponder steps are recorded;
- ``generate_until``: HFLM's cache hook is called once per row, in generation order, with the
  row's request and final text, so a small proxy pairs each text with the recorded row and
  returns it as a ``GenerationText`` carrying its stats (see ``stats.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import torch

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from lm_eval_ponder import backbone as bb
from lm_eval_ponder.errors import PonderError, install_excepthook
from lm_eval_ponder.flops import FlopsSpec, controller_flops, generation_flops
from lm_eval_ponder.pondering.dynamics import (
    ControllerDecide,
    PonderConfig,
    cumulative_offsets,
)
from lm_eval_ponder.pondering.hook import SteeringHook
from lm_eval_ponder.resources import shipped_controller_dir
from lm_eval_ponder.evaluation.accounting import GenerationText, count_generated_tokens

CACHE_MARKER = "__lm_eval_ponder_fingerprint__"


def _kwargs_key(gen_kwargs: Any) -> str:
    return json.dumps(gen_kwargs, sort_keys=True, default=str)


class _RowCollector:
    """Stands in for HFLM's cache hook during ``generate_until`` (see module docstring)."""

    def __init__(self, lm: PonderLM, inner) -> None:
        self.lm = lm
        self.inner = inner
        self.by_request: dict[tuple[str, str], list[GenerationText]] = defaultdict(list)

    def add_partial(self, attr: str, req, res) -> None:
        if attr == "generate_until":
            context, gen_kwargs = req
            res = self.lm._finish_row(res, gen_kwargs)
            self.by_request[(context, _kwargs_key(gen_kwargs))].append(res)
        self.inner.add_partial(attr, req, res)

    def take(self, context: str, gen_kwargs: Any, text: str) -> str:
        rows = self.by_request.get((context, _kwargs_key(gen_kwargs)), [])
        for i, row in enumerate(rows):
            if str(row) == str(text):
                return rows.pop(i)
        return text


def _none(value: Any) -> Any:
    """lm-eval passes model args as strings: treat "none"/"" as absent."""
    return None if value is None or str(value).strip().lower() in ("", "none", "null") else value


def _file_sha(path: Path) -> str:
    return bb.file_sha256(path)[:16] if path.is_file() else "missing"


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
        # Ponder settings the user gave; the rest come from the controller's config.json (the
        # settings it was trained with) or, without a controller, from PonderConfig.
        self._ponder_args = {k: v for k, v in {
            "tau": tau, "k_max": k_max, "alpha0": alpha0, "beta": beta,
            "alpha_start": alpha_start, "granularity": granularity}.items()
            if _none(v) is not None}
        self.ponder_config = self._ponder_config({}).validate()
        self._alpha = None if _none(alpha) is None else float(alpha)
        explicit = controller is not None and str(controller).strip().lower() != "auto"
        self._controller_arg = _none(controller) if explicit else None
        self._controller_auto = not explicit and self._alpha is None
        self._steering_arg = _none(steering)
        self._layer_arg = None if _none(layer) is None else int(layer)
        if self._alpha is not None and self._controller_arg is not None:
            raise PonderError("pass either alpha= (fixed offset) or controller=, not both")
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
        self._setup_pondering()

    # ------------------------------------------------------------------ pondering
    @property
    def pondering(self) -> bool:
        return self._alpha is not None or self._controller_arg is not None

    def _ponder_config(self, trained: dict) -> PonderConfig:
        """User args over the controller's training settings over PonderConfig defaults."""
        types = {"tau": float, "k_max": int, "alpha0": float, "beta": float,
                 "alpha_start": float, "granularity": str}
        merged = {**{k: v for k, v in trained.items() if k in types}, **self._ponder_args}
        return PonderConfig(**{k: types[k](v) for k, v in merged.items()})

    def _setup_pondering(self) -> None:
        """Load the steering vector and controller once; check they fit this backbone.

        With no ``controller=`` argument the controller shipped for this backbone is used (if
        one is shipped); ``controller=none`` switches pondering off.
        """
        self.steering = self.controller = None
        self._steering_dir = self._controller_dir = None
        if self._controller_auto:
            shipped = shipped_controller_dir(self.backbone_info.name)
            if shipped is not None and (shipped / "controller.safetensors").is_file():
                self._controller_arg = str(shipped)
        if not self.pondering:
            return
        from lm_eval_ponder.pondering.controller import load_controller
        from lm_eval_ponder.steering.vector import load_vector

        shipped = shipped_controller_dir(self.backbone_info.name)
        directory = self._steering_arg or shipped
        if directory is None:
            raise PonderError(
                f"pondering needs a steering vector and none is shipped for "
                f"{self.backbone_info.name!r}: pass steering=<dir> (make one with "
                "`python -m lm_eval_ponder.steer extract --pretrained ... --output DIR`)"
            )
        self._steering_dir = Path(directory)
        self.steering = load_vector(
            directory, self.model.config, backbone_sha256=self.backbone_info.source_sha256
        )
        trained: dict = {}
        if self._controller_arg is not None:
            self._controller_dir = Path(self._controller_arg)
            self.controller, config = load_controller(
                self._controller_dir, expected_hidden_size=self.model.config.hidden_size
            )
            self.controller.to(self.device)
            trained = config.get("ponder") or {}
            if self._layer_arg is None and config.get("layer") is not None:
                self._layer_arg = int(config["layer"])
            wanted = (config.get("backbone") or {}).get("steering_sha256")
            have = _file_sha(self._steering_dir / "steering.safetensors")
            if wanted and wanted != have:
                raise PonderError(
                    f"controller {self._controller_dir} was trained with steering vector "
                    f"{wanted}, but {self._steering_dir} holds {have}: pass the steering= it "
                    "was trained with, or train a controller for this vector")
        self.ponder_config = self._ponder_config(trained).validate()
        self.steer_layer = self.steering.default_layer if self._layer_arg is None else self._layer_arg
        self.steer_vector = self.steering.vector(self.steer_layer)
        norm = self.steering.residual_norm(self.steer_layer)
        if norm is None:
            raise PonderError(f"steering vector {directory} records no residual_norm: re-extract it")
        self.steer_scale = float(norm)
        if self.controller is not None:
            self._offsets = cumulative_offsets(self.ponder_config)

    def set_alpha(self, alpha: float) -> None:
        """Switch the fixed offset between ``generate_until`` calls (the trainer's rollout cache
        generates every depth with one loaded model). Only for a model built with ``alpha=``."""
        if self._alpha is None or self.controller is not None:
            raise PonderError("set_alpha needs a model constructed with a fixed alpha=")
        self._alpha = float(alpha)

    def _steering_hook(self):
        """A fresh hook per ``generate`` call (it keeps that call's decisions), or nothing."""
        if not self.pondering:
            return contextlib.nullcontext(), None
        if self.controller is None:
            alpha = self._alpha

            def decide(z_last: torch.Tensor) -> torch.Tensor:
                return torch.full(z_last.shape[:1], alpha, device=z_last.device)

            decider = None
        else:
            decide = decider = ControllerDecide(
                self.controller, self.steer_vector.to(self.device), self.steer_scale,
                self._offsets, self.ponder_config.tau,
            )
        mode = self.ponder_config.granularity if decider is not None else "prompt"
        hook = SteeringHook(self.model, self.steer_layer, self.steer_vector, self.steer_scale,
                            decide, mode=mode)
        return hook, decider

    def _batch_depths(self, decider) -> torch.Tensor | None:
        """Depths of the last generate call as one CPU tensor [B, decisions], or None."""
        if decider is None or not decider.depths:
            return None
        return torch.stack(decider.depths, dim=1).cpu()

    def _row_ponder_stats(self, depths, row: int, gen_tokens: int) -> tuple[float, int]:
        """(ponder steps, controller evaluations) of one row of the last generate call."""
        if depths is None:
            return 0.0, 0
        evals_per_decision = self.ponder_config.k_max + 1  # all candidates, one batched call
        if self.ponder_config.granularity == "prompt":
            return float(depths[row, 0]), evals_per_decision
        used = depths[row, : max(gen_tokens, 1)]
        return used.float().mean().item(), evals_per_decision * len(used)

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> dict[str, Any]:
        """Everything besides the prompt and generation kwargs that changes what is generated."""
        pondering = None
        if self.pondering:
            pondering = {
                "steering": _file_sha(self._steering_dir / "steering.safetensors"),
                "layer": self.steer_layer,
                "alpha": self._alpha,
                "controller": None if self._controller_dir is None
                else _file_sha(self._controller_dir / "controller.safetensors"),
                **(vars(self.ponder_config) if self.controller is not None else {}),
            }
        return {
            "backbone": self.backbone_info.path,
            "backbone_sha256": self.backbone_info.source_sha256,
            "dtype": str(self.model.dtype),
            "pondering": pondering,
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
        hook, decider = self._steering_hook()
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
        depths = self._batch_depths(decider)
        for row, (prompt_len, tokens) in enumerate(zip(prompt_lens, generated)):
            n = count_generated_tokens(self.tok_decode, tokens, stop, eos_ids)
            steps, evals = self._row_ponder_stats(depths, row, n)
            self._pending_rows.append(
                {"prompt_tokens": int(prompt_len), "gen_tokens": n, "ponder_steps": steps,
                 "controller_evals": evals}
            )
        return out

    def _finish_row(self, text: str, gen_kwargs: Any) -> GenerationText:
        row = self._pending_rows.popleft()
        flops = generation_flops(self.flops_spec, row["prompt_tokens"], row["gen_tokens"])
        if row["controller_evals"]:
            c = self.controller
            projection = None if c.projection is None else int(c.projection.shape[0])
            flops += controller_flops(c.hidden_size, c.hidden, row["controller_evals"], projection)
        return GenerationText(text, {**row, "flops": float(flops)})

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        inner = self.cache_hook
        collector = _RowCollector(self, inner)
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

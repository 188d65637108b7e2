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

import contextlib
import difflib
import hashlib
import inspect
import json
import logging
import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from lm_eval_ponder import allocator
from lm_eval_ponder import backbone as bb
from lm_eval_ponder.errors import PonderError, UnsupportedGeneration, install_excepthook
from lm_eval_ponder.evaluation import lmeval_output
from lm_eval_ponder.evaluation.accounting import GenerationText, RowCollector, count_generated_tokens
from lm_eval_ponder.evaluation.early_exit import ExitHook, ExitSettings, exit_accounting
from lm_eval_ponder.evaluation.generation import RowObserver, generate_rows
from lm_eval_ponder.evaluation.progress import RowProgress
from lm_eval_ponder.evaluation.resume import CACHE_MARKER, SampledAnswers, is_sampled
from lm_eval_ponder.evaluation.rowbatch import (
    cache_bytes_per_token,
    check_model_supported,
    supports_logits_to_keep,
)
from lm_eval_ponder.evaluation.sampling import SamplingConfig
from lm_eval_ponder.evaluation.settings import (
    PonderArgs,
    Pondering,
    Steering,
    load_pondering,
    load_steering,
    model_arg_number,
    no_hook,
)
from lm_eval_ponder.evaluation.static_decode import check_decode_step
from lm_eval_ponder.flops import FlopsSpec, generation_flops
from lm_eval_ponder.hooks import RowRecords
from lm_eval_ponder.pondering.dynamics import PonderConfig
from lm_eval_ponder.pondering.hook import SteeringHook

GENERATION_MODES = ("loop", "hf")
# requests per row in flight that a generation call holds at least, so rows that finish are
# replaced by waiting ones instead of leaving the batch to shrink (generate_until hands the loop
# all of its requests; the rollout builder's blocks are this size)
REQUESTS_PER_ROW = 4
LOGGER = logging.getLogger(__name__)
# results land in a folder named after the backbone, FLOPs read as such in lm-eval's table
lmeval_output.install()


@dataclass
class BatchGeneration:
    """One batch's output: ``sequences`` [B, L + T] as ``generate`` returns them, each row's
    generated tokens (to its EOS or stop string), prompt tokens, ponder depths per decision
    (None without a controller), the steering hook that ran (None without steering) and each
    row's exit layer per decode forward (None without early exit)."""

    sequences: torch.Tensor
    gen_tokens: list[int]
    prompt_tokens: list[int]
    depths: list[torch.Tensor] | None
    hook: SteeringHook | None
    exits: list[torch.Tensor] | None = None


def hf_sampling_kwargs(generation_kwargs: dict) -> dict:
    """lm-eval's reading of generation kwargs (``HFLM._model_generate``): an absent temperature
    is 0, and temperature 0 means greedy."""
    kwargs = dict(generation_kwargs)
    kwargs["temperature"] = kwargs.get("temperature", 0.0)
    do_sample = kwargs.get("do_sample")
    if kwargs["temperature"] == 0.0 and do_sample is None:
        kwargs["do_sample"] = do_sample = False
    if do_sample is False and kwargs["temperature"] == 0.0:
        kwargs.pop("temperature")
    return kwargs


def check_model_dtype(dtype: Any) -> None:
    """Refuse a ``dtype=`` model arg that is no floating-point torch dtype (``int8``, a typo)
    before transformers does so in a traceback; every value HFLM takes (``auto``, a torch
    dtype or its name, ``half``) passes."""
    if isinstance(dtype, torch.dtype) or str(dtype) == "auto":
        return
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise PonderError(f"model arg dtype={dtype!r} is not a floating-point torch dtype: "
                          "pass e.g. dtype=float32, bfloat16, float16 or auto")


def default_max_rows(device: str) -> int:
    """Rows in flight when the user gives none. 128 on CPU: measured end to end on arith
    (``benchmarks/max_rows.py``: 16, 32, 64, 128 rows took 158, 113, 101, 90 s in float32;
    docs/results.md). 256 on CUDA, where wide batches keep a GPU busy: not measured yet."""
    return 256 if str(device).startswith("cuda") else 128


def total_memory_bytes(device: str) -> int | None:
    """The memory generation runs in: the GPU's for CUDA, else the machine's RAM or the
    container's limit (cgroup), whichever is smaller; None when it cannot be read."""
    device = str(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index
        return int(torch.cuda.get_device_properties(index or 0).total_memory)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and (ram is None or int(limit) < ram):
            ram = int(limit)
    return ram


def parse_cache_gib(value: float | str | None, device: str) -> float | None:
    """``max_cache_gib``: a number of GiB, ``auto``/unset (``default_cache_gib``) or ``none``
    (no budget: ``max_rows`` alone bounds the batch)."""
    if value is None or str(value).strip().lower() in ("", "auto"):
        return default_cache_gib(device)
    if str(value).strip().lower() == "none":
        return None
    try:
        gib = float(value)
    except ValueError:
        gib = float("nan")
    if not gib > 0:
        raise PonderError(f"max_cache_gib must be a positive number of GiB, auto or none; "
                          f"got {value!r}")
    return gib


def default_cache_gib(device: str) -> float | None:
    """The key/value cache budget of the rows in flight when the user gives none: a sixth of
    the memory on CPU (4 GiB of this 24 GiB machine: GSM8K's 128 rows need about 2.5 GiB and
    are not held back; GPQA's longest prompt is, which a 128-row batch took past 13 GiB), a
    third of the GPU's (the weights and activations need the rest). From the total, not the
    free memory, so the batches, and with them bf16 outputs, do not depend on other jobs."""
    total = total_memory_bytes(device)
    if total is None:
        return None
    return total / (3 if str(device).startswith("cuda") else 6) / 2**30


def unknown_model_arg(error: TypeError, given: dict[str, Any]) -> PonderError | None:
    """The one-line error for a model arg that nothing takes (a typo such as ``controler=``),
    or None if ``error`` is not that. HFLM hands every arg it does not know to
    ``from_pretrained``, which passes those that are not config fields to the model class:
    the mistake surfaces as a ``TypeError`` from deep inside transformers, after the config is
    read, and cannot be caught earlier without refusing the args ``from_pretrained`` takes."""
    found = re.search(r"unexpected keyword argument '([^']+)'", str(error))
    if found is None or found.group(1) not in given:
        return None
    name = found.group(1)
    known = {p for cls in (PonderLM, HFLM) for p in inspect.signature(cls.__init__).parameters}
    close = difflib.get_close_matches(name, sorted(known - {"self", "kwargs"}), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return PonderError(f"unknown model arg {name!r}: neither ponder, lm-eval's HFLM nor the "
                       f"model's from_pretrained takes it{hint}")


@register_model("ponder")
class PonderLM(HFLM):
    """HFLM plus steering-vector pondering; with pondering off it is token-identical to HFLM.

    Ponder model args (all optional; lm-eval passes them with ``--model_args``):
    ``steering`` (vector directory; default: the one shipped for the backbone),
    ``controller`` (controller directory; ``none`` for no pondering; default: the controller
    shipped for the backbone, if any), ``alpha`` (fixed offset, no controller: the Fractional
    Reasoning baseline), ``tau``, ``k_max``, ``alpha0``, ``beta``, ``alpha_start``,
    ``granularity`` (``prompt``|``token``), ``layer``, ``allow_backbone_mismatch`` (use a
    controller whose config records another backbone). Unset ponder settings come from the
    controller's config.json (what it was trained with), else from ``PonderConfig``.
    ``alpha``, ``alpha0`` and ``alpha_start`` are fractions of the steering layer's mean
    residual norm. The plain baseline (Direct/CoT/BoN) is ``controller=none``.
    Batching (not part of the configuration): ``max_rows`` (rows in flight) and
    ``max_cache_gib`` (their key/value cache; ``default_cache_gib``, ``none`` for no budget);
    ``decode_step`` (``dynamic`` by default; ``static``, ``captured``, ``cudagraphs`` or
    ``inductor`` decode unsteered calls in fixed shapes a GPU replays as a CUDA graph:
    ``evaluation.static_decode``).
    The early-exit baseline (``evaluation.early_exit``, with ``controller=none``):
    ``early_exit`` (top-1 probability threshold) and ``exit_layers`` (``start[:stop[:step]]``,
    the layers that may exit; default every layer).
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
        generation: str = "loop",
        max_rows: int | str | None = None,
        max_cache_gib: float | str | None = None,
        decode_step: str | None = None,
        allow_backbone_mismatch: bool | str = False,
        early_exit: float | str | None = None,
        exit_layers: str | None = None,
        **kwargs,
    ) -> None:
        install_excepthook()
        self.generation = str(generation).strip().lower()
        if self.generation not in GENERATION_MODES:
            raise PonderError(f"generation must be one of {GENERATION_MODES}, got {generation!r}")
        self.ponder_args = PonderArgs.from_model_args(
            steering=steering, controller=controller, alpha=alpha, layer=layer, tau=tau,
            k_max=k_max, alpha0=alpha0, beta=beta, alpha_start=alpha_start,
            granularity=granularity, allow_backbone_mismatch=allow_backbone_mismatch)
        self.early_exit = ExitSettings.from_model_args(early_exit, exit_layers, self.ponder_args)
        if pretrained is None or isinstance(pretrained, str):
            resolved = bb.resolve_backbone(pretrained, gguf_file)
            source = resolved.path
        else:  # an already-loaded PreTrainedModel, as HFLM allows
            resolved = bb.ResolvedBackbone("<in-memory model>", type(pretrained).__name__, None)
            source = pretrained
        kwargs["device"] = bb.resolve_device(kwargs.get("device"),
                                             parallelize=bool(kwargs.get("parallelize", False)))
        device = kwargs["device"]
        if kwargs.get("dtype") is None:  # HFLM's own default, "auto", is the checkpoint's dtype
            kwargs["dtype"] = bb.native_dtype(device)
        else:
            check_model_dtype(kwargs["dtype"])
        self.max_rows = default_max_rows(device) if max_rows in (None, "", "auto") \
            else model_arg_number("max_rows", max_rows, int)
        if self.max_rows < 1:
            raise PonderError(f"max_rows must be >= 1, got {max_rows!r}")
        self.max_cache_gib = parse_cache_gib(max_cache_gib, device)
        self.decode_step = check_decode_step(decode_step)
        if self.decode_step != "dynamic" and self.generation != "loop":
            raise PonderError(f"decode_step={self.decode_step} is a mode of the generation loop; "
                              f"it does not apply to generation={self.generation}")
        try:
            super().__init__(pretrained=source, **kwargs)
        except OSError as error:
            raise PonderError(
                f"could not load backbone {resolved.path!r}: {error}. Without network access "
                "only local directories, files already in the Hugging Face cache, and the "
                "embedded default (no `pretrained=`) can be loaded."
            ) from error
        except TypeError as error:
            mistake = unknown_model_arg(error, kwargs)
            if mistake is None:
                raise
            raise mistake from error
        self.backbone_info = resolved
        bb.freeze(self.model)
        self.flops_spec = FlopsSpec.from_model(self.model)
        # the prefill's logits as generation computes them (flops.generation_flops): the last
        # position's where forward takes logits_to_keep (the loop and generate pass 1), else all
        self.prefill_logits = 1 if supports_logits_to_keep(self.model) else 0
        per_token = cache_bytes_per_token(self.model.config, self.model.dtype)
        self.max_cache_tokens = None if self.max_cache_gib is None or per_token is None \
            else max(1, int(self.max_cache_gib * 2**30 // per_token))
        self._pending_rows: deque[dict[str, float]] = deque()
        self.ponder: Pondering | None = load_pondering(
            self.ponder_args, resolved.name, self.model.config, self.device,
            resolved.source_sha256)
        # the vector steered calls add to: the pondering's, or one the trainer loads
        self.steering: Steering | None = self.ponder.steering if self.ponder else None
        # how a call without a hook of its own is steered: this model's pondering, except
        # inside ``steered``
        self.call_pondering: Pondering | None = self.ponder
        if self.early_exit is not None:  # refuses a layer range or a model it cannot read
            ExitHook(self.model, self.early_exit)
        if self.decode_step != "dynamic" and (self.ponder is not None
                                              or self.early_exit is not None):
            LOGGER.warning("decode_step=%s applies to unsteered calls; this model %s, so its "
                           "calls decode with the dynamic cache", self.decode_step,
                           "ponders" if self.ponder is not None else "exits early")
        self._fallback_warned: set[str] = set()
        self._answers_db: Any = None  # lm-eval's --use_cache store, once it hooks in
        self._keeper: SampledAnswers | None = None  # while generate_until keeps sampled answers
        self._call_contexts: list[str] = []
        self._progress: RowProgress | None = None  # generate_until's bar, per finished row

    @property
    def requests_per_call(self) -> int:
        """Requests handed to the loop at once: enough that finished rows are replaced by
        waiting ones instead of leaving the batch to shrink."""
        return REQUESTS_PER_ROW * self.max_rows

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
        return self.require_steering().layer

    @property
    def steer_vector(self) -> torch.Tensor:
        return self.require_steering().vector

    @property
    def steer_scale(self) -> float:
        return self.require_steering().scale

    @property
    def steering_dir(self):
        return self.require_steering().steering_dir

    def require_steering(self) -> Steering:
        if self.steering is None:
            raise PonderError("this model has no steering vector loaded (pondering is off)")
        return self.steering

    @classmethod
    def unsteered(cls, steering: str | None = None, layer: int | None = None,
                  **kwargs) -> PonderLM:
        """A model without pondering (``controller=none``: a call steers nothing unless it
        says how) that holds the steering vector ``steering`` at ``layer`` (None: the shipped
        vector, its default layer) for the calls that do: ``steered``, ``generate_rendered``
        with offsets, ``generate_batch`` with a hook. The trainer's model."""
        lm = cls(controller=None, **kwargs)
        lm.steering = load_steering(steering, layer, lm.backbone_info.name, lm.model.config,
                                    lm.backbone_info.source_sha256)
        return lm

    @contextlib.contextmanager
    def steered(self, pondering: Pondering | None):
        """Calls inside ponder with ``pondering`` (None: unsteered) in place of this model's
        own pondering, which is restored on leaving, however the block ends. E.g.
        ``with lm.steered(Pondering.fixed(lm.steering, c_k)): lm.generate_until(...)``."""
        saved, self.call_pondering = self.call_pondering, pondering
        try:
            yield self
        finally:
            self.call_pondering = saved

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> dict[str, Any]:
        """Everything besides the prompt and generation kwargs that changes what is generated."""
        fingerprint = {
            "backbone": self.backbone_info.path,
            "backbone_sha256": self.backbone_info.source_sha256,
            "dtype": str(self.model.dtype),
            "generation": self.generation,
            "pondering": None if self.ponder is None else self.ponder.fingerprint(),
        }
        if self.early_exit is not None:  # absent otherwise: earlier runs keep their identity
            fingerprint["early_exit"] = self.early_exit.fingerprint()
        return fingerprint

    def get_model_info(self) -> dict[str, Any]:
        """HFLM's model info plus our fingerprint: lm-eval writes this into the results JSON
        (``config``), where the report reads it as the run's identity, so runs that differ in
        dtype, backbone file, steering vector or controller are never merged into one row."""
        return {**super().get_model_info(), "ponder_fingerprint": self.fingerprint(),
                "ponder_fingerprint_hash": self.fingerprint_hash(),
                "ponder_batching": {"max_rows": self.max_rows,
                                    "max_cache_gib": self.max_cache_gib,
                                    "max_cache_tokens": self.max_cache_tokens,
                                    "decode_step": self.decode_step},
                # speed only (no number depends on it), so not part of the identity
                "ponder_preload": os.environ.get("LD_PRELOAD", ""),
                "ponder_malloc": allocator.malloc_settings()}

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
            LOGGER.info("--use_cache: sampled answers are kept too, each repeat under its own key "
                        "(lm_eval_ponder.evaluation.resume); lm-eval's warning that it will not "
                        "cache them is about its own keys")
        self._answers_db = db
        super().set_cache_hook(cache_hook)

    # ------------------------------------------------------------------ generation
    def generate_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *,
                       max_new_tokens: int, stop: list[str], hook: SteeringHook | None = None,
                       on_finish: Callable[[int], None] | None = None,
                       on_row_done: Callable[[int, list[int], dict[str, float]], None] | None = None,
                       **generation_kwargs) -> BatchGeneration:
        """Generate for one left-padded batch: the public call under ``generate_until`` (lm-eval)
        and the trainer's online rollouts.

        ``hook``: a ``SteeringHook`` the caller built to steer this batch (e.g. around a training
        policy); None: the call's pondering (this model's own, or the one ``steered`` puts in
        its place; with none, early exit if this model exits early, else unsteered). With
        ``generation="loop"`` (default) finished rows leave the batch and waiting rows join it
        (``evaluation.generation``); settings the loop cannot reproduce exactly fall back to
        HF's ``generate`` with one warning, as does ``generation="hf"``. ``on_finish(row)`` is
        called as each row finishes (the loop; ``generate`` calls it for all rows at the end);
        ``on_row_done(row, tokens, stats)`` too, with the row's generated tokens and accounting
        (the loop only: ``generate`` returns all rows at once).
        """
        if max_new_tokens < 1:  # generate_rows would return empty answers, scored as wrong
            raise PonderError(f"max_gen_toks must be at least 1, got {max_new_tokens}")
        n_rows, width = input_ids.shape
        if on_finish is None and self._progress is not None:
            on_finish = self._progress.finish
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        decider = None
        # fixed-shape decode steps only for calls no hook watches: a graph replays no hooks
        decode_step = self.decode_step if hook is None and self.call_pondering is None \
            and self.early_exit is None else "dynamic"
        if hook is None:
            ponder = self.call_pondering
            hook, decider = ponder.hook(self.model, self.device) if ponder else no_hook()
            if ponder is None and self.early_exit is not None:
                hook = ExitHook(self.model, self.early_exit)
        if isinstance(hook, SteeringHook):
            hook.expect_rows(n_rows)
        kwargs = hf_sampling_kwargs(generation_kwargs)
        result = None
        if self.generation == "loop":
            try:
                sampling = SamplingConfig.from_kwargs(self.model.generation_config, **kwargs)
                check_model_supported(self.model)
            except UnsupportedGeneration as why:
                self._warn_fallback(why)
            else:
                eos = set(sampling.eos_token_ids) or {self.eot_token_id}
                on_tokens = None if on_row_done is None else \
                    self.row_reader(hook, decider, attention_mask, on_row_done)
                with hook, self._autocast():
                    result = generate_rows(
                        self.model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                        eos_token_ids=eos, pad_token_id=self.tokenizer.pad_token_id, stop=stop,
                        decode=self.tok_decode, sampling=sampling, max_rows=self.max_rows,
                        max_cache_tokens=self.max_cache_tokens, on_finish=on_finish,
                        steering=hook if isinstance(hook, RowObserver) else None,
                        on_tokens=on_tokens, decode_step=decode_step,
                        on_unhooked_forward=None if self._progress is None else
                        self._progress.decode_forward)
                sequences, gen_tokens = result.sequences, list(result.gen_tokens)
        else:  # what generate would refuse from deep inside, in one line (PonderError)
            with contextlib.suppress(UnsupportedGeneration):
                SamplingConfig.from_kwargs(self.model.generation_config, **kwargs)
        if result is None:
            with hook:
                sequences = HFLM._model_generate(self, input_ids, width + max_new_tokens, stop,
                                                 attention_mask=attention_mask, **kwargs)
            # ``generate`` pads a row only after its EOS or stop string, both of which end the
            # count; the pad token itself is no end (the model may generate it mid-answer)
            eos_ids = {self.eot_token_id}
            for ids in (self.model.generation_config.eos_token_id, kwargs.get("eos_token_id")):
                eos_ids |= {ids} if isinstance(ids, int) else set(ids or ())
            gen_tokens = [count_generated_tokens(self.tok_decode, row, stop, eos_ids)
                          for row in sequences[:, width:].tolist()]
            if on_finish is not None:
                for row in range(n_rows):
                    on_finish(row)
        depths = None
        if decider is not None and isinstance(hook, SteeringHook):
            depths = hook.per_row(decider.depths, n_rows)
        return BatchGeneration(sequences, gen_tokens, attention_mask.sum(dim=1).tolist(),
                               depths, hook if isinstance(hook, SteeringHook) else None,
                               hook.per_row(n_rows) if isinstance(hook, ExitHook) else None)

    def row_reader(self, hook: Any, decider: Any, attention_mask: torch.Tensor,
                   on_row_done: Callable[[int, list[int], dict[str, float]], None]
                   ) -> Callable[[int, list[int]], None]:
        """The loop's ``on_tokens``: a finished row's accounting, read from the hook's records
        so far (all of the row's decisions and exits are in: they precede its last token), as
        ``row_stats`` reads it after the batch."""
        prompt_tokens = attention_mask.sum(dim=1).tolist()
        depths, exits = RowRecords(), RowRecords()
        ponder = self.call_pondering
        reads_depths = decider is not None and isinstance(hook, SteeringHook)
        reads_exits = isinstance(hook, ExitHook)

        def on_tokens(row: int, tokens: list[int]) -> None:
            if reads_depths:
                depths.read(decider.depths, hook.decision_rows)
            if reads_exits:
                exits.read(hook.exits, hook.exit_rows)
            on_row_done(row, tokens, self.stats_of(
                int(prompt_tokens[row]), len(tokens), depths.of(row) if reads_depths else None,
                exits.of(row) if reads_exits else None, ponder))

        return on_tokens

    def generate_rendered(self, contexts: list[str], gen_kwargs: dict, *,
                          offsets: list[float] | None = None,
                          on_finish: Callable[[int], None] | None = None) -> list[GenerationText]:
        """Rendered contexts as one chunk of lm-eval's ``generate_until`` (the same encoding,
        truncation, ``until``/EOS handling, final cut and accounting), in one ``generate_batch``
        call, so the loop keeps ``max_rows`` rows in flight whatever the contexts are.

        ``offsets``: one fixed steering offset per context (fractions of the residual norm, as
        ``alpha``) in place of this model's pondering. This is how the trainer's rollout cache
        generates every depth of many prompts at once: HFLM's own ``generate_until`` groups
        requests by their generation kwargs, so an offset per request would split a call into
        one small batch per depth. Contexts keep the caller's order (rows join the loop in it).
        """
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        if not contexts:
            return []
        kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None),
                                      eos=self.tok_decode(self.eot_token_id,
                                                          skip_special_tokens=False))
        max_gen_toks = kwargs.pop("max_gen_toks")
        ids, mask = self.tok_batch_encode(contexts, left_truncate_len=self.max_length - max_gen_toks,
                                          truncation=self.truncation)
        hook, ponder = None, self.call_pondering
        if offsets is not None:
            if len(offsets) != len(contexts):
                raise ValueError(f"internal: {len(offsets)} offsets for {len(contexts)} contexts")
            hook = self.require_steering().offsets_hook(self.model, offsets, self.device)
            ponder = None
        out = self.generate_batch(ids.to(self.device), mask.to(self.device),
                                  max_new_tokens=max_gen_toks, stop=until, hook=hook,
                                  on_finish=on_finish, **kwargs)
        return [self.row_text(self.finish_text(toks, until), self.row_stats(out, row, ponder))
                for row, toks in enumerate(out.sequences[:, ids.shape[1]:].tolist())]

    def finish_text(self, tokens: list[int], until: list[str]) -> str:
        """A row's answer from its generated tokens, made as HFLM's ``generate_until`` makes it
        (after the last think-end token, decoded, cut at the first stop string)."""
        from lm_eval.models.utils import postprocess_generated_text

        think = self.think_end_token
        if isinstance(think, int) and think in tokens:  # as HFLM: after the last one
            tokens = tokens[len(tokens) - tokens[::-1].index(think):]
        text = self.tok_decode(tokens)
        return postprocess_generated_text(
            generation=text.lstrip() if isinstance(think, int) else text, stop=until,
            think_end_token=think if isinstance(think, str) else None)

    def generate(self, contexts: list[str], gen_kwargs: dict, *, alpha: float | None = None,
                 disable_tqdm: bool = True) -> list[GenerationText]:
        """Generate for rendered contexts through lm-eval's own path (``generate_until``: the
        same encoding, ``until`` and ``max_gen_toks`` handling and accounting as an evaluation),
        optionally at a fixed steering offset ``alpha`` instead of this model's pondering: the
        trainer's rollout cache generates every depth this way with one loaded model."""
        from lm_eval.api.instance import Instance

        requests = [Instance("generate_until", {}, (c, dict(gen_kwargs)), i)
                    for i, c in enumerate(contexts)]
        if alpha is None:
            return self.generate_until(requests, disable_tqdm=disable_tqdm)
        with self.steered(Pondering.fixed(self.require_steering(), alpha)):
            return self.generate_until(requests, disable_tqdm=disable_tqdm)

    def _autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                              enabled=self.mixed_precision_dtype is not None)

    def _warn_fallback(self, why: Exception) -> None:
        if str(why) not in self._fallback_warned:
            self._fallback_warned.add(str(why))
            LOGGER.warning("generation loop: %s; using transformers' generate for these "
                           "requests (finished rows keep decoding)", why)

    def tok_batch_encode(self, strings: list[str], *args, **kwargs):
        if self._keeper is not None:  # the contexts of the call ``_model_generate`` gets next
            self._call_contexts = list(strings)
        return super().tok_batch_encode(strings, *args, **kwargs)

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        attention_mask = generation_kwargs.pop("attention_mask", None)
        on_row_done = None
        if self._keeper is not None:  # sampled answers kept as each row ends
            keeper, contexts = self._keeper, self._call_contexts
            if len(contexts) != context.shape[0]:
                raise RuntimeError("internal: the encoded contexts do not match the batch")

            def on_row_done(row: int, tokens: list[int], stats: dict[str, float]) -> None:
                keeper.keep_early(contexts[row], self.row_text(self.finish_text(tokens, stop),
                                                               stats))

        out = self.generate_batch(context, attention_mask,
                                  max_new_tokens=max_length - context.shape[1], stop=stop,
                                  on_row_done=on_row_done, **generation_kwargs)
        ponder = self.call_pondering
        for row in range(len(out.gen_tokens)):
            self._pending_rows.append(self.row_stats(out, row, ponder))
        return out.sequences

    def _finish_row(self, text: str, gen_kwargs: Any) -> GenerationText:
        return self.row_text(text, self._pending_rows.popleft())

    def row_stats(self, out: BatchGeneration, row: int,
                  ponder: Pondering | None) -> dict[str, float]:
        """One row's accounting: prompt and generated tokens, ponder steps and controller
        evaluations, and under early exit its mean exit layer and FLOPs (which depend on the
        layer of every token, not on the counts alone)."""
        return self.stats_of(int(out.prompt_tokens[row]), int(out.gen_tokens[row]),
                             None if out.depths is None else out.depths[row],
                             None if out.exits is None else out.exits[row], ponder)

    def stats_of(self, prompt: int, n: int, depths: torch.Tensor | None,
                 exits: torch.Tensor | None, ponder: Pondering | None) -> dict[str, float]:
        """``row_stats`` from one row's values: its prompt and generated tokens, the depths of
        its decisions and the exit layers of its decode steps, in order."""
        steps, evals = ponder.row_stats(depths, n) if ponder else (0.0, 0)
        stats = {"prompt_tokens": prompt, "gen_tokens": n, "ponder_steps": steps,
                 "controller_evals": evals}
        if exits is not None and self.early_exit is not None:
            stats.update(exit_accounting(self.flops_spec, self.early_exit, exits, prompt, n,
                                          self.prefill_logits))
        return stats

    def row_text(self, text: str, row: dict[str, float]) -> GenerationText:
        """A generated text with its row's accounting, FLOPs priced from its counts (unless
        the row priced its own: early exit)."""
        if "flops" in row:
            return GenerationText(text, dict(row))
        flops = generation_flops(self.flops_spec, row["prompt_tokens"], row["gen_tokens"],
                                 self.prefill_logits)
        if row["controller_evals"]:
            flops += self.controller.evaluation_flops(row["controller_evals"])
        return GenerationText(text, {**row, "flops": float(flops)})

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """HFLM's ``generate_until`` with each text carrying its accounting; with lm-eval's
        ``--use_cache`` sampled answers are kept too (``evaluation.resume``), so only the
        missing ones are drawn."""
        sampled = SampledAnswers(self._answers_db) if self._answers_db is not None else None
        kept, todo = sampled.split(requests) if sampled else ({}, list(range(len(requests))))
        fresh_sampled = [i for i in todo if is_sampled(requests[i].args[1])]
        if kept:
            LOGGER.warning(
                "%d of %d sampled answers come from the --use_cache file of an interrupted run; "
                "the other %d are drawn now. Together they are a valid sample at these settings, "
                "not the one an uninterrupted run with this seed would draw.",
                len(kept), len(kept) + len(fresh_sampled), len(fresh_sampled))
        inner = self.cache_hook
        collector = RowCollector(sampled.hook(inner) if sampled else inner, self._finish_row)
        self._pending_rows.clear()
        self.cache_hook = collector
        saved = self.batch_size_per_gpu
        if self.generation == "loop" and isinstance(saved, int):
            # rows in flight are max_rows whatever lm-eval's batch_size (its CLI default is 1):
            # hand the loop every request at once: each call ends in a tail where the batch
            # shrinks to its few longest answers, so one call has one tail
            # (``benchmarks/loop_tail.py --requests-per-call``: 4 calls of 64 prompts against
            # one of 256, 16 rows, bf16: 6% more forwards per useful token, 0.87x and 0.97x
            # the useful tok/s in two pairs). HFLM hands answers to the
            # cache hook only when a call returns, so sampled answers go to the store as each
            # row ends (``_model_generate``), greedy ones too (lm-eval keeps those only when the
            # call returns, which is the end of the run): a killed run loses only the rows in
            # flight.
            # (Settings the loop hands to ``generate`` are kept per call.)
            self.batch_size_per_gpu = max(saved, self.requests_per_call, len(todo))
            if sampled and todo:
                self._keeper = sampled
        elif sampled and fresh_sampled and isinstance(saved, int):
            # ``generate`` returns a call's rows together: keep answers every max_rows rows
            self.batch_size_per_gpu = max(saved, self.max_rows)
        fresh = [requests[i] for i in todo]
        # HFLM's bar moves once per batch of 512 requests: a GPQA run would sit at 0% for its
        # whole length. This one moves as each row finishes, and says what is in flight
        # (evaluation.progress).
        self._progress = RowProgress(len(fresh), "Running generate_until requests",
                                     disable=disable_tqdm or self.rank != 0 or not fresh)
        try:
            with self._progress.watch(self.model):
                texts = super().generate_until(fresh, disable_tqdm=True) if fresh else []
        finally:
            self.cache_hook = inner
            self.batch_size_per_gpu = saved
            self._keeper = None
            self._progress.close()
            self._progress = None
        if self._pending_rows:
            raise RuntimeError("internal: generated rows were not paired with their texts")
        out: list[str] = [kept.get(i) for i in range(len(requests))]
        for i, text in zip(todo, texts):
            req = requests[i]
            out[i] = collector.take(req.args[0], req.args[1], text)
        return out

    # ------------------------------------------------------------------ scoring
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self._refuse_scoring("loglikelihood")
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        self._refuse_scoring("loglikelihood_rolling")
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def _refuse_scoring(self, kind: str) -> None:
        if self.early_exit is not None:
            raise PonderError(
                f"early_exit= applies to generated tokens only, and this task asks for {kind} "
                "(multiple-choice or perplexity scoring), which would run every layer. Run "
                "such tasks without early_exit=.")
        if self.pondering:
            raise PonderError(
                f"--model ponder steers generation only, and this task asks for {kind} "
                "(multiple-choice or perplexity scoring), which would run unsteered. Run such "
                "tasks with controller=none (no pondering) or --model hf, and our generative "
                "tasks (e.g. gsm8k_ponder, gpqa_ponder) with pondering.")

"""What lm-eval itself writes for a ``--model ponder`` run: the folder its results land in and
the FLOPs in its results table.

- **Result folder and ``model_name``.** lm-eval 0.4.13 names both after the ``pretrained=``
  model arg (``GeneralConfigTracker.log_experiment_args``, sanitised by
  ``lm_eval.utils.sanitize_model_name``), and without one, a random 8-letter id: every run of
  the embedded default landed in ``<output_path>/qdpv68r5/``-like folders. For ``ponder`` runs
  without ``pretrained=`` we name them after the backbone instead (``SmolLM2-135M-Instruct``,
  or a GGUF file's stem), sanitised the same way. Runs with ``pretrained=`` keep lm-eval's
  name. The report and the suite find results by ``rglob`` and read both layouts.
- **FLOPs in the table.** lm-eval prints every metric as ``f"{value:.4f}"``. Our tasks report
  per-document FLOPs as ``flops.FlopCount`` (the same float, formatted readably); lm-eval's
  ``mean`` keeps the type, and its standard error (``lm_eval.api.metrics.mean_stderr``) is
  given the type back when its inputs have it. Nothing else reads the type: the numbers in
  results files are unchanged.

Both are wrappers around lm-eval functions, installed once when ``evaluation.lm`` is imported
(lm-eval imports it to build ``--model ponder``, before it logs the run's arguments).
"""

from __future__ import annotations

import functools
from typing import Any

from lm_eval_ponder.backbone import display_name
from lm_eval_ponder.flops import FlopCount

MODEL = "ponder"


def ponder_model_name(model_args: str | dict[str, Any] | None) -> str:
    """The backbone's name for a ``ponder`` run's model args (string or dict, as lm-eval logs
    them)."""
    from lm_eval.utils import simple_parse_args_string

    args = simple_parse_args_string(model_args) if isinstance(model_args, str) \
        else dict(model_args or {})
    pretrained, gguf = args.get("pretrained"), args.get("gguf_file")
    return display_name(None if pretrained is None else str(pretrained),
                        None if gguf is None else str(gguf))


def name_results_after_the_backbone() -> None:
    """Wrap ``GeneralConfigTracker.log_experiment_args`` (idempotent): a ``ponder`` run for
    which lm-eval finds no model name gets the backbone's, not a random id."""
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker
    from lm_eval.utils import sanitize_model_name

    original = GeneralConfigTracker.log_experiment_args
    if getattr(original, "_lm_eval_ponder", False):
        return

    @functools.wraps(original)
    def log_experiment_args(self, model_source, model_args, *args, **kwargs):
        original(self, model_source, model_args, *args, **kwargs)
        if model_source == MODEL and GeneralConfigTracker._get_model_name(model_args) is None:
            self.model_name = ponder_model_name(model_args)
            self.model_name_sanitized = sanitize_model_name(self.model_name)

    log_experiment_args._lm_eval_ponder = True  # type: ignore[attr-defined]
    GeneralConfigTracker.log_experiment_args = log_experiment_args


def keep_flops_readable() -> None:
    """Wrap lm-eval's ``mean_stderr`` (idempotent) so that the standard error of FLOPs values
    is a ``FlopCount`` too, and its table shows both readably."""
    from lm_eval.api import metrics

    original = metrics.mean_stderr
    if getattr(original, "_lm_eval_ponder", False):
        return

    @functools.wraps(original)
    def mean_stderr(arr):
        result = original(arr)
        return FlopCount(result) if arr and isinstance(arr[0], FlopCount) else result

    mean_stderr._lm_eval_ponder = True  # type: ignore[attr-defined]
    metrics.mean_stderr = mean_stderr


def install() -> None:
    name_results_after_the_backbone()
    keep_flops_readable()

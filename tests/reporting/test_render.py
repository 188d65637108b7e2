"""Drawing the report page with a headless browser (skipped where none is installed)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.reporting import render

HAVE_BROWSER = any(shutil.which(b) for b in render.BROWSERS)


def test_no_browser_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LM_EVAL_PONDER_BROWSER", raising=False)
    with pytest.raises(PonderError, match="apt install chromium"):
        render.find_browser()


def test_blank_band_under_the_page_is_cut(tmp_path):
    pixels = np.full((300, 50, 3), 255, dtype=np.uint8)
    pixels[10:40, 5:20] = 0
    Image.fromarray(pixels).save(tmp_path / "p.png")
    render.crop_blank_bottom(tmp_path / "p.png", margin=5)
    with Image.open(tmp_path / "p.png") as img:
        assert img.size == (50, 45)


@pytest.mark.skipif(not HAVE_BROWSER, reason="no headless Chromium installed")
def test_a_page_is_drawn_and_cropped(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<!doctype html><body style='margin:0'><div style='height:200px;"
                    "background:#c00'></div></body>")
    png = render.screenshot(page, tmp_path / "shot.png", width=400, height=3000)
    with Image.open(png) as img:
        rgb = np.asarray(img.convert("RGB"))
    assert rgb.shape[1] == 400 and 200 <= rgb.shape[0] < 400
    assert tuple(rgb[100, 200]) == (204, 0, 0)

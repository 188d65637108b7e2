"""Drawing the report page with a headless browser (skipped where none is installed)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import screenshot as render  # scripts/ is on the path (conftest)
from PIL import Image

from lm_eval_ponder.errors import PonderError

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


def test_a_webp_target_gets_the_drawing_compressed(tmp_path, monkeypatch):
    """What the docs keep: the browser's PNG cropped, resized to 800 px and saved as WebP.
    A stand-in browser draws a page of a red band on white."""
    import sys

    fake = tmp_path / "fake-browser"
    fake.write_text(f"#!{sys.executable}\n" + "\n".join([
        "import sys, numpy as np",
        "from PIL import Image",
        "args = dict(a[2:].split('=', 1) for a in sys.argv[1:] if '=' in a)",
        "w, h = map(int, args['window-size'].split(','))",
        "px = np.full((h, w, 3), 255, dtype=np.uint8)",
        "px[:1000] = (204, 0, 0)",
        "Image.fromarray(px).save(args['screenshot'])"]) + "\n")
    fake.chmod(0o755)
    monkeypatch.setenv("LM_EVAL_PONDER_BROWSER", str(fake))
    page = tmp_path / "page.html"
    page.write_text("<!doctype html>")
    out = render.screenshot(page, tmp_path / "docs" / "page.webp", width=1600, height=3000)
    assert [p.name for p in out.parent.iterdir()] == ["page.webp"]  # no PNG left beside it
    with Image.open(out) as img:
        assert img.format == "WEBP" and img.size == (800, round(1016 * 800 / 1600))
        r, g, b = img.convert("RGB").getpixel((400, 100))
    assert r > 180 and g < 40 and b < 40


def test_a_page_picture_is_resized_and_converted(tmp_path):
    Image.fromarray(np.full((3000, 1280, 3), 250, dtype=np.uint8)).save(tmp_path / "p.png")
    for name, fmt in (("p.webp", "WEBP"), ("p.jpg", "JPEG")):
        with Image.open(render.save_page(tmp_path / "p.png", tmp_path / name)) as img:
            assert img.format == fmt and img.size == (800, 1875)
    Image.fromarray(np.zeros((100, 300, 3), dtype=np.uint8)).save(tmp_path / "narrow.png")
    with Image.open(render.save_page(tmp_path / "narrow.png", tmp_path / "narrow.webp")) as img:
        assert img.size == (300, 100)  # never enlarged

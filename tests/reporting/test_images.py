"""Small images for the docs (issue 35): palette figures and compressed page pictures."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from lm_eval_ponder.reporting.images import save_figure, save_page  # noqa: E402


def test_a_figure_is_a_palette_png_that_looks_the_same(tmp_path):
    fig, ax = plt.subplots(figsize=(4, 3))
    for i, colour in enumerate(("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")):
        ax.errorbar(range(5), np.arange(5) * (i + 1), yerr=0.5, color=colour, marker="o")
    plain = io.BytesIO()
    fig.savefig(plain, format="png", dpi=100)
    path = save_figure(fig, tmp_path / "f.png", dpi=100)
    plt.close(fig)
    plain.seek(0)
    with Image.open(path) as small, Image.open(plain) as full:
        assert small.format == "PNG" and small.mode == "P" and small.size == full.size
        diff = np.abs(np.asarray(small.convert("RGB"), dtype=int)
                      - np.asarray(full.convert("RGB"), dtype=int))
    assert diff.max() <= 64 and (diff > 16).mean() < 0.001
    assert path.stat().st_size < 0.6 * len(plain.getvalue())


def test_a_page_picture_is_resized_and_converted(tmp_path):
    Image.fromarray(np.full((3000, 1280, 3), 250, dtype=np.uint8)).save(tmp_path / "p.png")
    for name, fmt in (("p.webp", "WEBP"), ("p.jpg", "JPEG")):
        with Image.open(save_page(tmp_path / "p.png", tmp_path / name)) as img:
            assert img.format == fmt and img.size == (800, 1875)
    Image.fromarray(np.zeros((100, 300, 3), dtype=np.uint8)).save(tmp_path / "narrow.png")
    with Image.open(save_page(tmp_path / "narrow.png", tmp_path / "narrow.webp")) as img:
        assert img.size == (300, 100)  # never enlarged

"""Small images for the docs (issue 35): palette figures and compressed page pictures."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from lm_eval_ponder.reporting.images import save_figure  # noqa: E402


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

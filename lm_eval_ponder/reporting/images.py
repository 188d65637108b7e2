"""The images reports and analyses write, kept small: every tracked file travels to a GPU
machine in one transfer, and the docs hold about a hundred figures and a few
pictures of report pages.

- Figures: matplotlib's PNG re-saved with a palette of 256 colours (Pillow's fast octree, no
  dithering). A plot is a few flat colours and their anti-aliased edges; on the docs' 110
  figures this keeps 28% of the bytes and moves no pixel by more than 44 of 255 (measured; the
  method colours stay what they are, which a 64-colour median cut does not guarantee).
- Page pictures (``scripts/screenshot.py``): a target ending in ``.webp`` (or ``.jpg``) gets the
  browser's PNG resized to ``PAGE_WIDTH`` pixels and saved in that format at ``PAGE_QUALITY``:
  the tables stay legible and a 10,000-pixel page is 0.25 MB instead of 1.5 MB. A ``.png``
  target keeps the browser's drawing as it is.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

FIGURE_COLOURS = 256
PAGE_WIDTH = 800
PAGE_QUALITY = 50


def save_figure(fig, path: str | Path, **savefig: object) -> Path:
    """``fig.savefig(path, **savefig)`` as a palette PNG (see the module docstring)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig)
    buffer.seek(0)
    return save_palette_png(buffer, path)


def save_palette_png(image: str | Path | BinaryIO, path: str | Path) -> Path:
    """An image (a file or an open PNG) as a palette PNG in ``path``, which may be the same
    file: how figures are kept (see the module docstring)."""
    from PIL import Image

    with Image.open(image) as img:
        palette = img.convert("RGB").quantize(FIGURE_COLOURS, method=Image.Quantize.FASTOCTREE,
                                              dither=Image.Dither.NONE)
    palette.save(path, format="PNG", optimize=True)
    return Path(path)


def save_page(png: str | Path, target: str | Path, width: int = PAGE_WIDTH,
              quality: int = PAGE_QUALITY) -> Path:
    """A picture of a page, from the browser's PNG, ``width`` pixels wide (a narrower page
    keeps its width) in the format ``target``'s suffix names (see the module docstring)."""
    from PIL import Image

    target = Path(target)
    with Image.open(png) as img:
        img = img.convert("RGB")
        if img.width > width:
            img = img.resize((width, round(img.height * width / img.width)),
                             Image.Resampling.LANCZOS)
        if target.suffix.lower() == ".png":
            img.save(target, format="PNG", optimize=True)
        else:
            img.save(target, quality=quality, **({"method": 6} if target.suffix.lower() ==
                                                 ".webp" else {"optimize": True}))
    return target

"""A picture of the report's HTML page as a browser draws it, to check that the page renders and
to put a picture of it in the docs: ``python scripts/screenshot.py PAGE.html IMAGE`` (the
repository's upkeep, not the installed package's; ``report --screenshot`` until 2026-12-04).

Headless Chromium from the OS packages (``apt install chromium``) draws the page; nothing is
fetched from the network (the page and its figures are local files). Chromium's
``--screenshot`` takes the window, not the page, so the window is made tall and the blank band
below the page is cut off afterwards. A ``.png`` target keeps that drawing; ``.webp`` (what
the docs keep) or ``.jpg`` gets it resized to ``PAGE_WIDTH`` pixels and saved in that format
at ``PAGE_QUALITY`` (``save_page``): the tables stay legible and a 10,000-pixel page is 0.25 MB
instead of 1.5 MB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from lm_eval_ponder.errors import PonderError, command, run_program

PAGE_WIDTH = 800
PAGE_QUALITY = 50
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome-headless-shell",
            "headless_shell")



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

def find_browser() -> str:
    """The first Chromium-family browser on PATH (or in ``$LM_EVAL_PONDER_BROWSER``)."""
    wanted = os.environ.get("LM_EVAL_PONDER_BROWSER")
    for name in ([wanted] if wanted else []) + list(BROWSERS):
        path = shutil.which(name)
        if path:
            return path
    raise PonderError("no headless browser found to draw the report (looked for "
                      f"{', '.join(BROWSERS)}); install one (Debian/Ubuntu: "
                      "`apt install chromium`) or set LM_EVAL_PONDER_BROWSER")


def screenshot(page: str | Path, target: str | Path, width: int = 1280, height: int = 12000,
               timeout: float = 120.0) -> Path:
    """Draw ``page`` (a local HTML file) into ``target``, cropped to the page's content and,
    unless ``target`` is a PNG, compressed (see the module docstring)."""
    page, target = Path(page).resolve(), Path(target)
    if not page.is_file():
        raise PonderError(f"no such page: {page}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        png = target if target.suffix.lower() == ".png" else Path(scratch) / "page.png"
        cmd = [find_browser(), "--headless", "--no-sandbox", "--disable-gpu",
               "--hide-scrollbars", f"--user-data-dir={Path(scratch) / 'profile'}",
               f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
               page.as_uri()]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise PonderError(f"the browser did not finish drawing {page} in {timeout:.0f} s") from e
        if done.returncode != 0 or not png.is_file():
            raise PonderError(f"the browser could not draw {page} (exit {done.returncode}): "
                              f"{done.stderr.strip()[-500:]}")
        crop_blank_bottom(png)
        if png != target:
            save_page(png, target)
    return target


def crop_blank_bottom(png: Path, margin: int = 16) -> None:
    """Cut the uniform band under the page's last drawn row (the tall window's remainder)."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as img:
        pixels = np.asarray(img.convert("RGB"))
    background = pixels[-1, 0]
    drawn = np.nonzero((pixels != background).any(axis=(1, 2)))[0]
    bottom = int(drawn[-1]) + 1 + margin if drawn.size else margin
    if bottom < pixels.shape[0]:
        Image.fromarray(pixels[:bottom]).save(png)


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/screenshot.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("page", help="a local HTML file (a report's leaderboard.html)")
    parser.add_argument("image", help="a .png as drawn, a .webp (what the docs keep) or .jpg "
                                      "800 px wide and compressed")
    args = parser.parse_args(argv)
    print(f"page drawn: {screenshot(args.page, args.image)}")
    return 0


if __name__ == "__main__":
    run_program(main)

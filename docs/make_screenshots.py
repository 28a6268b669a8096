"""Make the two screenshots of docs/report.md: the HTML report of a Bayesian NMF run on the Reuters sample and
of an IMF run on the noisy 6 x 6 images, each opened from its file by headless Chromium.

Needs the ``lda`` package (in the ``docs`` and ``test`` extras) and Chromium (Debian: ``apt-get install -y
chromium``). Run from the repository root:

    .venv/bin/python docs/make_screenshots.py

It writes docs/_static/report-bnmf.png and docs/_static/report-imf.png (the fits take a few seconds).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.ibp_images import make_images
from buffet.data.splits import add_split, holdout_entries
from buffet.pipeline.experiments.demo import reuters_files

OUT = Path(__file__).resolve().parent / "_static"
WINDOW = "1280,1700"  # a laptop screen's width; the first part of the page


def buffet(folder: Path, *args: str) -> None:
    """``buffet ARGS`` run in ``folder``, so that the pages show short relative run paths."""
    subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", *args], cwd=folder, check=True,
                   stdout=subprocess.DEVNULL)


def bnmf_page(folder: Path) -> Path:
    """12 topics of the Reuters sample by SVI (3 passes), reported with --html."""
    files = reuters_files()
    if files is None:
        sys.exit("the package lda is not installed: .venv/bin/pip install lda")
    buffet(folder, "ingest", "ldac", str(files[0]), str(files[1]), "--out", "reuters.zarr", "--holdout", "0.1")
    buffet(folder, "fit", "bnmf", "reuters.zarr", "--out", "runs/reuters", "--k", "12", "--batch-size", "50",
           "--passes", "3", "--eval-every", "2", "--quiet")
    buffet(folder, "report", "runs/reuters", "--out", "report-bnmf", "--html")
    return folder / "report-bnmf" / "report.html"


def imf_page(folder: Path) -> Path:
    """IMF on 100 noisy images made of four 6 x 6 features, 10% of the pixels held out, reported with --html."""
    images = make_images(n_rows=100, noise_var=0.5, variant="four", seed=0)[0]
    dataset = from_array(images, folder / "images.zarr", "real", rows_per_chunk=50)
    add_split(dataset, "heldout", {"test_mask": holdout_entries(np.ones(images.shape, bool), 0.1, 0)},
              {"kind": "entries"})
    buffet(folder, "fit", "imf", "images.zarr", "--out", "runs/images", "--max-k", "6", "--select", "none", "--quiet")
    buffet(folder, "report", "runs/images", "--out", "report-imf", "--html")
    return folder / "report-imf" / "report.html"


def screenshot(page: Path, png: Path) -> None:
    """Chromium's headless screenshot of ``page`` opened from its file:// URL (with a fresh profile beside it)."""
    chromium = shutil.which("chromium") or sys.exit("no chromium on PATH (Debian: apt-get install -y chromium)")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={page.parent / 'profile'}", f"--window-size={WINDOW}", f"--screenshot={png}",
                    page.as_uri()],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"wrote {png}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        screenshot(bnmf_page(folder), OUT / "report-bnmf.png")
        screenshot(imf_page(folder), OUT / "report-imf.png")


if __name__ == "__main__":
    main()

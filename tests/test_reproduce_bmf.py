"""The BMF reproductions' --quick versions (paper 003 figures 2 and 4): their tables, CSV and PNG, and the
numbers in them against what the method must achieve."""

import numpy as np

from buffet.pipeline.experiments.bmf import digits_data
from buffet.pipeline.registry import run_experiment

from helpers import read_csv


def _run(name: str, stem: str, out, column: str) -> dict[str, str]:
    """Run the quick reproduction with one seed; check its files; the CSV row of seed 0."""
    files = run_experiment(name, out, 1, True)
    assert {f.name for f in files} == {f"{stem}.md", f"{stem}.png", f"{stem}.csv"}
    assert column in (out / f"{stem}.md").read_text()
    assert (out / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
    (row,) = read_csv(out / f"{stem}.csv")
    assert row["seed"] == "0"
    return row


def test_quick_bars_reconstruct_held_out_bottom_halves(tmp_path):
    """The posterior predictive mean of the held-out bottom halves is closer to the noise-free bars than the
    prior mean 0 and than the bottom half of the image whose top half is nearest (paper 003 figure 2).
    Measured (60 sweeps, 100 images): 2.11 against 3.67 and 2.41."""
    row = _run("bmf-bars", "bmf_bars", tmp_path, "BMF posterior mean")
    bmf, prior, nearest = (float(row[c]) for c in ("BMF posterior mean", "prior mean 0",
                                                    "nearest neighbour (top half)"))
    assert bmf < 0.75 * prior and bmf < nearest, row
    assert int(row["K+"]) >= 1 and int(row["L+ (16 bars)"]) >= 1


def test_quick_digits_predict_held_out_pixels(tmp_path):
    """Logistic BMF scores the held-out pixels of 16 bottom halves: it must rank them (AUC 0.5 by chance) and
    predict them better than the best constant, even one told the share of ones over all pixels (0.31: log
    loss 0.62, accuracy 0.69). Measured (40 sweeps): AUC 0.959, log loss 0.246, mode accuracy 0.910."""
    row = _run("bmf-digits", "bmf_digits", tmp_path, "held-out AUC")
    rate = digits_data(30).mean()
    constant_loss = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    assert float(row["held-out AUC"]) > 0.85, row
    assert float(row["log loss"]) < 0.6 * constant_loss, row
    assert float(row["mode pixel accuracy"]) > max(rate, 1 - rate) + 0.1, row

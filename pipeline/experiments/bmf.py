"""``buffet reproduce bmf-bars`` and ``bmf-digits``: paper 003 figures 2 and 4 (Secs. 4.1-4.2).

bmf-bars: 200 images of 8x8 pixels, V fixed to the 16 bars, U ~ IBP(alpha = 2), W ~ N(0, 1/phi),
theta = phi = 1/2 (``data.bmf_data.bars_data``); the bottom halves of a quarter of the images
are held out. Linear-Gaussian BMF (IBP priors on U and V, learned from a prior draw as in the
paper) reconstructs them; the table compares the RMSE of the posterior predictive mean against the
noise-free images with the prior mean 0 and with the bottom half of the nearest neighbour in the
observed top halves (the paper's figure 2 E), and the figure shows rows A-E of figure 2.

bmf-digits: scikit-learn's bundled 8x8 digits (the paper used USPS 16x16), 100 each of 1, 2 and 3,
binarised at 8 of 16 grey levels; the bottom halves of 16 images are held out. Logistic BMF gives
the mean reconstruction P(x = 1) and the mode (P > 0.5) of figure 4 C and D; the table gives the
held-out AUC, log loss and pixel accuracy of the mode and of the nearest neighbour.

Both fit through the engine's driver (``BMFDriver``) on a dataset store with the held-out halves
as its ``heldout`` split, on an in-process engine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.data.bmf_data import bars_data
from buffet.data.errors import UserError
from buffet.kernels.bmf import heldout_scores
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.experiments.common import markdown_table, mean_std, write_csv, write_markdown, write_store
from buffet.pipeline.models.bmf import BMFConfig, BMFDriver
from buffet.pipeline.reports.plots import new_figure, save_figure

SIDE = 8
HALF = SIDE * SIDE // 2  # pixels of the top half (row-major images)
SHOWN = 8                # images shown in a figure


def fit_bmf(x: np.ndarray, missing: np.ndarray, kind: str, config: BMFConfig,
            path: Path) -> tuple[BMFDriver, list[dict]]:
    """A finished BMF driver on ``x`` with the ``missing`` entries as the held-out split, and its trace (one
    record per sweep)."""
    driver = BMFDriver(config, source_of(write_store(x, None, missing, path, kind, 64)), ProcessEngine())
    driver.start()
    return driver, run_loop(driver, None, Position(), config.checkpoint_every, quiet=True).trace


def nearest_bottom(x: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """For every image with a missing bottom half, the bottom half of the complete image whose top half is
    nearest in pixel space (paper figures 2 E and 4 E)."""
    complete, cut = ~missing.any(axis=1), missing.any(axis=1)
    dist = ((x[complete][None, :, :HALF] - x[cut][:, None, :HALF]) ** 2).sum(axis=2)
    return x[complete][np.argmin(dist, axis=1)][:, HALF:]


def image_rows(rows: dict[str, np.ndarray], path: Path) -> Path:
    """One figure row per labelled set of images (each SHOWN x 64) on one grey scale, missing pixels (NaN)
    in a lighter grey."""
    fig, axes = new_figure(len(rows), SHOWN, figsize=(SHOWN * 1.1, len(rows) * 1.25), squeeze=False)
    values = np.concatenate([images[:SHOWN].ravel() for images in rows.values()])
    low, high = np.nanmin(values), np.nanmax(values)
    for r, (label, images) in enumerate(rows.items()):
        for c in range(SHOWN):
            ax = axes[r, c]
            ax.imshow(np.ma.masked_invalid(images[c].reshape(SIDE, SIDE)), cmap="gray", vmin=low, vmax=high)
            ax.set_facecolor("#c8c8ff")
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    return save_figure(fig, path)


def with_bottom(x: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    out = x.copy()
    out[:, HALF:] = bottom
    return out


def run_bars(out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    """Bars reconstruction over ``seeds`` data sets: table, CSV and the figure of the first seed."""
    sweeps = 60 if quick else 400
    n_images = 100 if quick else 200
    rows, figure = [], None
    for seed in range(seeds):
        data = bars_data(n_images, np.random.default_rng(seed), alpha=2.0)
        config = BMFConfig(sweeps=sweeps, burn_in=sweeps // 2, alpha=2.0, lam=4.0, panel_rows=50, seed=seed)
        driver, _ = fit_bmf(data.X, data.missing, "real", config, out_dir / "work" / f"bars-{seed}.zarr")
        pred = driver.predictive_mean()
        cut = data.missing.any(axis=1)
        truth = data.clean[cut][:, HALF:]
        rmse = {"BMF posterior mean": np.sqrt(np.mean((pred[cut][:, HALF:] - truth) ** 2)),
                "prior mean 0": np.sqrt(np.mean(truth ** 2)),
                "nearest neighbour (top half)": np.sqrt(np.mean((nearest_bottom(data.X, data.missing) - truth) ** 2))}
        rows.append([seed, data.U.shape[1], driver.state.W.shape[0], driver.state.W.shape[1], *rmse.values()])
        if figure is None:
            shown = np.flatnonzero(cut)[:SHOWN]
            figure = image_rows({"A data": np.where(data.missing, np.nan, data.X)[shown], "B noise-free":
                                 data.clean[shown], "D BMF mean": pred[shown],
                                 "E nearest": with_bottom(data.X[cut], nearest_bottom(data.X, data.missing))[:SHOWN]},
                                out_dir / "bmf_bars.png")
    header = ["seed", "true K", "K+", "L+ (16 bars)", *rmse]
    means = [[name, *mean_std([r[4 + i] for r in rows])] for i, name in enumerate(rmse)]
    notes = (f"{seeds} data sets of {n_images} images, {sweeps} sweeps (half burn-in); RMSE of the held-out bottom "
             "halves against the noise-free images (noise sd sqrt(2)). Paper 003 figure 2: reconstruction of the "
             "vertical bars very good, of the horizontal bars good (no numbers given).")
    return [write_markdown("BMF bars (paper 003 figure 2)", [notes, markdown_table(["method", "mean RMSE", "sd"],
                                                                                    means),
                                                             markdown_table(header, rows)], out_dir / "bmf_bars.md"),
            write_csv(header, rows, out_dir / "bmf_bars.csv"), figure]


def digits_data(per_digit: int) -> np.ndarray:
    """``per_digit`` images each of the digits 1, 2, 3 of scikit-learn's 8x8 digits, binarised (> 7 of 16)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UserError("the bmf-digits experiment needs scikit-learn's bundled digits "
                        "(pip install 'buffet[datasets]')") from None
    digits = load_digits()
    picks = [np.flatnonzero(digits.target == d)[:per_digit] for d in (1, 2, 3)]
    return (digits.data[np.concatenate(picks)] > 7).astype(np.float64)


def run_digits(out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    """Logistic BMF on binarised digits with 16 bottom halves held out: table, CSV and figure (first seed)."""
    sweeps = 40 if quick else 300
    x = digits_data(30 if quick else 100)
    rows, figure = [], None
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        missing = np.zeros(x.shape, bool)
        missing[np.ix_(rng.choice(x.shape[0], size=16, replace=False), np.arange(HALF, SIDE * SIDE))] = True
        config = BMFConfig(likelihood="logistic", sweeps=sweeps, burn_in=sweeps // 2, alpha=2.0, lam=2.0,
                           panel_rows=100, seed=seed)
        driver, _ = fit_bmf(x, missing, "binary", config, out_dir / "work" / f"digits-{seed}.zarr")
        mean = driver.predictive_mean()
        cut = missing.any(axis=1)
        truth, nearest = x[cut][:, HALF:], nearest_bottom(x, missing)
        scores = heldout_scores("logistic", mean[cut][:, HALF:].ravel(), truth.ravel())
        rows.append([seed, driver.state.W.shape[0], driver.state.W.shape[1], scores["auc"], scores["log_loss"],
                     float(np.mean((mean[cut][:, HALF:] > 0.5) == truth)), float(np.mean(nearest == truth))])
        if figure is None:
            figure = image_rows({"A digits": x[cut], "B shown": np.where(missing, np.nan, x)[cut],
                                 "C mean": with_bottom(x[cut], mean[cut][:, HALF:]),
                                 "D mode": with_bottom(x[cut], (mean[cut][:, HALF:] > 0.5).astype(float)),
                                 "E nearest": with_bottom(x[cut], nearest)}, out_dir / "bmf_digits.png")
    header = ["seed", "K+", "L+", "held-out AUC", "log loss", "mode pixel accuracy", "nearest-neighbour accuracy"]
    notes = (f"{x.shape[0]} binarised 8x8 digits (1, 2, 3), 16 bottom halves held out, {sweeps} sweeps (half "
             f"burn-in), {seeds} seeds. Paper 003 figure 4 (USPS 16x16, no numbers given): mean and mode "
             "reconstructions of the bottom halves.")
    return [write_markdown("BMF digits (paper 003 figure 4)", [notes, markdown_table(header, rows)],
                           out_dir / "bmf_digits.md"),
            write_csv(header, rows, out_dir / "bmf_digits.csv"), figure]

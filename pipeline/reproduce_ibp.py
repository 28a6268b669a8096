"""``buffet reproduce ibp-evidence``: paper 000 figure 2 (SPEC 4 "IBP images, K+ choice"; paper 000
section 2.3).

Data: X = Z A + noise with the four 6x6 latent images, Z ~ Bern(0.5) of size 50 x 4 and noise of
variance 0.5 (``kernels.ibp_images.make_images``), a new draw per seed. IMF and INMF run through the
engine's ``IMFDriver`` with growth forced up to K+ = 8 (patience = max_k = 8), so the converged
evidence L(q; K+) is recorded for every K+ = 1..8; the paper's figure peaks at K+ = 4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.kernels.ibp_images import make_images
from buffet.pipeline import reproduce
from buffet.pipeline.imf import IMFConfig, INMFConfig
from buffet.pipeline.plots import plt, save_figure
from buffet.pipeline.reproduce_common import fit_engine, markdown_table, write_csv, write_markdown, write_store

N_ROWS = 50
NOISE_VAR = 0.5
TRUE_K = 4  # paper 000 figure 2: the evidence peaks at the true number of latent images
MODELS = {"IMF": IMFConfig, "INMF": INMFConfig}


def evidence_by_k(history: list[tuple[int, float]], k_max: int) -> np.ndarray:
    """The best converged L(q; K+) for K+ = 1..k_max from a driver's history; NaN where K+ was never
    reached (a new feature pruned away)."""
    out = np.full(k_max, np.nan)
    for k, value in history:
        if 1 <= k <= k_max:
            out[k - 1] = np.fmax(out[k - 1], value)
    return out


def seed_curves(seed: int, k_max: int, work: Path) -> dict[str, np.ndarray]:
    """Evidence by K+ of IMF and INMF on the images drawn with ``seed``."""
    x, _, _ = make_images(N_ROWS, NOISE_VAR, "four", seed=seed)
    store = write_store(x, None, np.zeros(x.shape, dtype=bool), work / f"images-{seed}.zarr", "real", 16)
    return {name: evidence_by_k(fit_engine(cls(max_k=k_max, patience=k_max, chunk_rows=16, split=None),
                                           store).history, k_max)
            for name, cls in MODELS.items()}


def figure(curves: dict[str, np.ndarray], path: Path) -> Path:
    """L(q; K+) - max_K L(q; K) against K+ for every seed (thin) and their mean (thick), per model."""
    fig, axes = plt.subplots(1, len(curves), figsize=(11, 4), squeeze=False)
    for ax, (name, values) in zip(axes[0], curves.items()):
        ks = np.arange(1, values.shape[1] + 1)
        relative = values - np.nanmax(values, axis=1, keepdims=True)
        ax.plot(ks, relative.T, color="tab:blue", alpha=0.3, linewidth=1)
        ax.plot(ks, np.ma.masked_invalid(relative).mean(axis=0), color="tab:blue", linewidth=2.5, marker="o",
                label="mean over seeds")
        ax.axvline(TRUE_K, color="tab:red", alpha=0.5, label=f"true K = {TRUE_K} (paper's peak)")
        ax.set_xlabel("K+")
        ax.set_ylabel("L(q; K+) - max over K+")
        ax.set_title(f"{name}: evidence by K+ ({values.shape[0]} seeds)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def run(out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    """Evidence for K+ = 1..8 (1..5 with ``quick``) over ``seeds`` data sets: tables and figure."""
    k_max = 5 if quick else 8
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    per_seed = [seed_curves(seed, k_max, work) for seed in range(seeds)]
    curves = {name: np.array([c[name] for c in per_seed]) for name in MODELS}
    header = ["model", "seed", *[f"L(K+={k})" for k in range(1, k_max + 1)], "argmax K+"]
    rows = [[name, seed, *values[seed].tolist(), int(np.nanargmax(values[seed])) + 1]
            for name, values in curves.items() for seed in range(seeds)]
    summary = [[name, float(np.mean(np.nanargmax(values, axis=1) + 1 == TRUE_K)),
                float(np.mean(np.nanargmax(values, axis=1) + 1)), TRUE_K]
               for name, values in curves.items()]
    notes = (f"{seeds} data sets (seeds), N = {N_ROWS}, noise variance {NOISE_VAR}, four latent 6x6 images. "
             f"L(q; K+) is the converged evidence at each K+ = 1..{k_max} (empty: K+ not reached). "
             f"Paper 000 figure 2 (the paper's result, one data set): the evidence peaks at K+ = {TRUE_K}.")
    summary_header = ["model", f"fraction of seeds peaking at {TRUE_K}", "mean argmax K+", "paper's peak K+"]
    return [write_markdown("IBP images: evidence by K+ (paper 000 figure 2)",
                           [notes, markdown_table(summary_header, summary), markdown_table(header, rows)],
                           out_dir / "ibp_evidence.md"),
            write_csv(header, rows, out_dir / "ibp_evidence.csv"),
            figure(curves, out_dir / "ibp_evidence.png")]


reproduce.register("ibp-evidence", run)

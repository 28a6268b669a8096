"""Draw the plots of docs/performance.md from the figures recorded there.

Nothing is measured here: every number below is copied from a recorded run (the tables of
docs/performance.md, whose rows are also in benchmarks/results.jsonl), so the plots can be redrawn on any
machine without re-running a benchmark. Run from the repository root:

    .venv/bin/python docs/performance_plots.py

It writes docs/_static/perf-*.png.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).resolve().parent / "_static"

# Topic models against the peers: documents/s of one pass, rounds 1 and 2 (Intel host, 2026-11-25).
PEERS = {
    "buffet, whole command": (2517, 2849),
    "buffet, loop in one process": (2961, 3445),
    "scikit-learn (n_jobs=2)": (571, 647),
    "gensim LdaModel": (275, 267),
}

# The 1.8M-document pass: what an SVI step of 1000 documents costs, in ms (low, high).
STEP_BUDGET_MS = 133
STEP_PARTS_MS = {
    "local steps of the minibatch": (157, 172),
    "the rest of the step (K = 100)": (80, 86),
    "a whole step, measured (200k pass)": (283, 318),
}

# The peers as the vocabulary grows (host vm, 2026-11-27, loaded): V -> documents/s and held-out LL per word.
VOCAB = [8000, 25000, 50000, 100000]
VOCAB_RATE = {"buffet": [1229, 1180, 1464, 1248], "scikit-learn": [220, 233, 180, 147],
              "gensim LdaModel": [183, 194, 178, 194]}
VOCAB_LL = {"buffet": [-7.462, -7.904, -8.055, -8.421], "scikit-learn": [-7.536, -8.162, -8.555, -8.741],
            "gensim LdaModel": [-7.592, -8.073, -8.050, -8.109]}

# IMF and INMF on the masked 100,000 x 1,000 matrix: steps spent at each K+ = 0..10, then on the refused 11th.
IMF_STEPS = [2, 27, 73, 92, 71, 66, 70, 34, 18, 14, 16, 32]
INMF_STEPS = [2, 18, 30, 57, 45, 73, 65, 63, 59, 32, 29, 33]

# Samplers: mean ZZ^T error against seconds per run (2026-11-24, loaded host).
LINEAR_GAUSSIAN = {
    "filter, plain (P = 10 ... 5000)": ([0.3, 0.4, 0.6, 1.4, 2.7, 8.6, 16.3], [2638, 2796, 2623, 2616, 2497, 2424, 2194]),
    "filter, 10 moves (P = 10 ... 500)": ([4.8, 14.9, 51, 156], [2083, 2097, 1580, 1217]),
    "Gibbs (10 ... 200 sweeps)": ([1.3, 2.4, 5.4, 8.1, 20], [2130, 1520, 999, 881, 837]),
}
LINEAR_GAUSSIAN_ORACLE = (812 + 861 + 788) / 3
NOISY_OR = {
    "filter, plain (P = 10 ... 5000)": ([0.02, 0.03, 0.05, 0.06, 0.08, 0.2, 0.4, 0.8, 3.2],
                                        [7.11, 7.59, 0.99, 0.94, 1.11, 3.99, 5.51, 0.91, 4.71]),
    "filter, 2 moves (P = 10 ... 200)": ([0.41, 0.68, 1.6, 2.9, 6.2], [3.75, 1.04, 0.89, 2.58, 0.36]),
    "Gibbs (10 ... 100 sweeps)": ([0.45, 0.24, 0.87, 2.3], [0.24, 0.09, 0.04, 0.03]),
}

# Start-up and small fits: seconds of each fit command on its reproduction's smallest data (host `vm`,
# 2026-11-26): the command as it runs by default, the estimator's fit plus the command's start-up, and the
# command forced onto an embedded LocalCluster.
SMALL_FITS = {
    "bnmf": (0.81, 0.14 + 0.61, 1.12),
    "cnmf": (0.91, 0.28 + 0.61, 1.31),
    "imf": (3.37, 4.77 + 0.61, 20.57),
    "inmf": (10.36, 24.25 + 0.71, 33.05),
    "vfmf": (1.53, None, 22.94),
    "tvimf": (1.53, None, 31.54),
    "bmf": (29.44, 31.25 + 0.61, 49.48),
    "pf-linear-gaussian": (3.34, 2.69 + 0.61, 8.15),
    "pf-noisy-or": (3.16, 2.47 + 0.72, 4.10),
    "gibbs-linear-gaussian": (6.62, 5.61 + 0.72, 15.75),
    "gibbs-noisy-or": (2.35, 1.46 + 0.92, 11.26),
}


def plot_peers(path: Path) -> None:
    """Grouped bars: documents/s of each system in the two rounds."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = list(PEERS)
    for r in range(2):
        ys = [i + (r - 0.5) * 0.38 for i in range(len(names))]
        ax.barh(ys, [PEERS[n][r] for n in names], height=0.36, label=f"round {r + 1}")
        for y, n in zip(ys, names):
            ax.text(PEERS[n][r] + 40, y, f"{PEERS[n][r]:,}", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("documents per second, one pass (K = 100, both cores)")
    ax.set_xlim(0, 4000)
    ax.legend(loc="lower right", frameon=False)
    _save(fig, path)


def plot_vocab(path: Path) -> None:
    """Documents/s and held-out score of each system against the vocabulary size."""
    fig, (rate, score) = plt.subplots(1, 2, figsize=(8, 3.2))
    for name in VOCAB_RATE:
        rate.plot(VOCAB, VOCAB_RATE[name], marker="o", label=name)
        score.plot(VOCAB, VOCAB_LL[name], marker="o", label=name)
    for ax in (rate, score):
        ax.set_xscale("log")
        ax.set_xticks(VOCAB, [f"{v // 1000}k" for v in VOCAB])
        ax.set_xlabel("vocabulary size V")
    rate.set_ylabel("documents per second, one pass")
    rate.set_ylim(0, None)
    score.set_ylabel("held-out log likelihood per word")
    rate.legend(frameon=False)
    _save(fig, path)


def plot_step_budget(path: Path) -> None:
    """Bars from the low to the high measurement, against the 133 ms a step may take for a 4-minute pass."""
    fig, ax = plt.subplots(figsize=(7, 2.4))
    names = list(STEP_PARTS_MS)
    for i, n in enumerate(names):
        low, high = STEP_PARTS_MS[n]
        ax.barh(i, low, color="tab:blue")
        ax.barh(i, high - low, left=low, color="tab:blue", alpha=0.4)
        ax.text(high + 4, i, f"{low}-{high} ms", va="center", fontsize=8)
    ax.axvline(STEP_BUDGET_MS, color="tab:red", linestyle="--")
    ax.set_title("dashed: the 133 ms a step may take for one pass of 1.8M documents in 4 minutes", fontsize=8,
                 color="tab:red")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 400)
    ax.set_xlabel("milliseconds per SVI step of 1000 documents")
    _save(fig, path)


def plot_imf_steps(path: Path) -> None:
    """Steps the search spends at each K+ on the way to 10 features, IMF and INMF."""
    fig, ax = plt.subplots(figsize=(7, 2.8))
    labels = [str(k) for k in range(11)] + ["11\n(refused)"]
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], IMF_STEPS, width=0.4, label="IMF, A ~ N(0, 1): 515 steps, 1,400 s")
    ax.bar([x + 0.2 for x in xs], INMF_STEPS, width=0.4, label="INMF, A = |N(0, 1)|: 506 steps, 1,535 s")
    ax.set_xticks(list(xs), labels)
    ax.set_xlabel("K+ being fitted")
    ax.set_ylabel("steps")
    ax.legend(frameon=False, fontsize=8)
    _save(fig, path)


def plot_samplers(path: Path) -> None:
    """ZZ^T error against wall time for the particle filters with and without moves, and for Gibbs."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, curves, title, corner in ((left, LINEAR_GAUSSIAN, "linear-Gaussian, four 6x6 images, 100 rows", "upper right"),
                                      (right, NOISY_OR, "noisy-OR, 6 x 250", "lower left")):
        for name, (seconds, errors) in curves.items():
            ax.plot(seconds, errors, marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("seconds per run")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=7, loc=corner)
    left.axhline(LINEAR_GAUSSIAN_ORACLE, color="grey", linestyle=":")
    left.text(25, LINEAR_GAUSSIAN_ORACLE + 40, "Gibbs from the true Z", fontsize=7, color="grey")
    left.set_ylabel("mean ZZ^T error")
    right.set_yscale("log")
    _save(fig, path)


def plot_small_fits(path: Path) -> None:
    """Seconds per small fit: the command by default, the estimator plus start-up, the forced LocalCluster."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = list(SMALL_FITS)
    kinds = ("buffet fit (default: this process)", "estimator fit + start-up", "forced LocalCluster")
    for j, kind in enumerate(kinds):
        ys = [i + (j - 1) * 0.27 for i in range(len(names))]
        xs = [SMALL_FITS[n][j] for n in names]
        ax.barh([y for y, x in zip(ys, xs) if x is not None], [x for x in xs if x is not None], height=0.26,
                label=kind)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds, command to exit (log scale)")
    ax.set_xlim(0.5, 300)
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    plot_peers(OUT / "perf-peers.png")
    plot_vocab(OUT / "perf-vocab.png")
    plot_step_budget(OUT / "perf-step-budget.png")
    plot_imf_steps(OUT / "perf-imf-steps.png")
    plot_samplers(OUT / "perf-samplers.png")
    plot_small_fits(OUT / "perf-small-fits.png")


if __name__ == "__main__":
    main()

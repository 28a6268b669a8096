"""PNG figures for reports (matplotlib, no screen needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def metric_curve(trace: list[dict], x_key: str, y_key: str, x_label: str, y_label: str, path: Path) -> Path:
    """Plot one recorded quantity of a trace against another (steps without it are skipped)."""
    points = [(r[x_key], r[y_key]) for r in trace if y_key in r and x_key in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", markersize=3)
    else:
        ax.text(0.5, 0.5, f"no {y_label} recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def topic_summary(words: list[list[str]], mass: np.ndarray, path: Path, show: int = 20) -> Path:
    """Topic weights as bars, each labelled with its top words (the heaviest ``show`` topics)."""
    order = np.argsort(-mass)[:show]
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(order) + 1))
    ax.barh(range(len(order)), mass[order], color="tab:blue", alpha=0.35)
    for row, k in enumerate(order):
        ax.text(0, row, f"  topic {k}: " + ", ".join(words[k][:8]), va="center", fontsize=8)
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("topic weight (sum of E beta over words)")
    ax.set_title("topics and their top words")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""PNG figures for reports (matplotlib, no screen needed).

Figures are ``matplotlib.figure.Figure`` objects drawn with the object-oriented API: they render
through their own Agg canvas when saved, so neither pyplot nor a backend switch is involved, and
matplotlib is imported only when a figure is drawn (importing buffet never imports it, and never
changes the backend a notebook uses).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (6, 4),
               squeeze: bool = True) -> tuple["Figure", Any]:
    """A new figure and its grid of axes (``Figure.subplots``), outside pyplot's figure manager."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def save_figure(fig: "Figure", path: Path) -> Path:
    """Lay out and write ``fig`` as PNG at ``path`` (the figure holds no global state to release)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def trace_panels(trace: list[dict], path: Path, columns: int = 3) -> Path:
    """Every quantity the trace records besides ``step`` and ``seconds``, one panel each against the step
    (the common first figure of every report)."""
    keys = sorted({k for r in trace for k in r} - {"step", "seconds"})
    rows = max(1, -(-len(keys) // columns))
    fig, axes = new_figure(rows, columns, figsize=(4.2 * columns, 2.8 * rows), squeeze=False)
    for ax, key in zip(axes.ravel(), keys):
        points = [(r["step"], r[key]) for r in trace if key in r]
        ax.plot(*zip(*points), marker="o" if len(points) < 40 else None, markersize=3)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(keys):]:
        ax.axis("off")
    if not keys:
        axes[0, 0].text(0.5, 0.5, "no steps recorded", ha="center", va="center", transform=axes[0, 0].transAxes)
    fig.suptitle("trace")
    return save_figure(fig, path)


def metric_curve(trace: list[dict], x_key: str, y_key: str, x_label: str, y_label: str, path: Path) -> Path:
    """Plot one recorded quantity of a trace against another (steps without it are skipped)."""
    points = [(r[x_key], r[y_key]) for r in trace if y_key in r and x_key in r]
    fig, ax = new_figure(figsize=(6, 4))
    if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", markersize=3)
    else:
        ax.text(0.5, 0.5, f"no {y_label} recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def topic_summary(words: list[list[str]], share: np.ndarray, path: Path, show: int = 20) -> Path:
    """Topics' shares of the tokens as bars, each labelled with its top words (the ``show`` largest)."""
    order = np.argsort(-share, kind="stable")[:show]
    fig, ax = new_figure(figsize=(11, 0.4 * len(order) + 1))
    ax.barh(range(len(order)), 100 * share[order], color="tab:blue", alpha=0.35)
    for row, k in enumerate(order):
        ax.text(0, row, f"  topic {k}: " + ", ".join(words[k][:8]), va="center", fontsize=8)
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("share of the tokens (%)")
    ax.set_title("topics and their top words")
    return save_figure(fig, path)


def evidence_by_k(history: np.ndarray, path: Path) -> Path:
    """The converged evidence L(q; K+) for every K+ tried (paper 000 figure 2)."""
    fig, ax = new_figure(figsize=(6, 4))
    ax.plot(history[:, 0], history[:, 1], marker="o")
    best = int(np.argmax(history[:, 1]))
    ax.axvline(history[best, 0], color="tab:red", alpha=0.4, label=f"best K+ = {int(history[best, 0])}")
    ax.set_xlabel("K+")
    ax.set_ylabel("evidence L(q; K+)")
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def bases(A: np.ndarray, path: Path) -> Path:
    """Learned bases (K x D): as square images when D is a perfect square, else as heat-map rows."""
    k, d = A.shape
    side = int(round(np.sqrt(d)))
    if side * side == d and k > 0:
        fig, axes = new_figure(1, k, figsize=(1.8 * k, 2.0), squeeze=False)
        for i, ax in enumerate(axes[0]):
            ax.imshow(A[i].reshape(side, side), cmap="gray_r")
            ax.set_title(f"feature {i}", fontsize=8)
            ax.axis("off")
    else:
        fig, ax = new_figure(figsize=(8, 0.4 * max(k, 1) + 1.5))
        ax.imshow(A if k else np.zeros((1, d)), aspect="auto", cmap="RdBu_r")
        ax.set_xlabel("column")
        ax.set_ylabel("feature")
    fig.suptitle("posterior mean of the bases")
    return save_figure(fig, path)


def feature_usage(usage: np.ndarray, path: Path) -> Path:
    """Posterior feature usage: the mean of E[z_ik] over rows for every feature."""
    fig, ax = new_figure(figsize=(6, 3.5))
    ax.bar(np.arange(len(usage)), usage)
    ax.set_xlabel("feature")
    ax.set_ylabel("mean E[z_ik]")
    ax.set_ylim(0, 1)
    return save_figure(fig, path)


def correlation_map(corr: np.ndarray, path: Path) -> Path:
    """A K x K correlation matrix as a heat map on a fixed [-1, 1] colour scale."""
    fig, ax = new_figure(figsize=(6, 5))
    image = ax.imshow(corr, cmap="RdBu_r", vmin=-1.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="correlation")
    ax.set_xlabel("topic")
    ax.set_ylabel("topic")
    ax.set_title("topic correlations")
    return save_figure(fig, path)

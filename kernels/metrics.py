"""Scores of predictions against held-out truths (SPEC 4): AUC for binary entries, RMSE/MAE/NMAE for
real ones. Plain NumPy/SciPy."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula, ties averaged; NaN when the labels
    are all of one class."""
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def error_metrics(predicted: np.ndarray, truth: np.ndarray, value_range: float) -> dict:
    """RMSE, MAE and NMAE = MAE / (r_max - r_min) (SPEC 4, collaborative filtering)."""
    err = predicted - truth
    mae = float(np.abs(err).mean())
    return {"rmse": float(np.sqrt((err ** 2).mean())), "mae": mae, "nmae": mae / value_range}

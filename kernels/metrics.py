"""Scores of predictions against held-out truths: AUC for binary entries, RMSE/MAE/NMAE for
real ones, and the IBP experiments' ZZ^T and base errors against the true Z and features. Plain
NumPy/SciPy."""

from __future__ import annotations

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``values``, tied values sharing the mean of their ranks (what the rank-sum needs;
    plain NumPy, so the CLI does not import scipy.stats, a second of start-up)."""
    values = np.asarray(values).ravel()
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = ((starts + 1 + ends) / 2.0)[np.cumsum(first) - 1]
    return ranks


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula, ties averaged; NaN when the labels
    are all of one class."""
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = average_ranks(scores)
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def error_metrics(predicted: np.ndarray, truth: np.ndarray, value_range: float) -> dict:
    """RMSE, MAE and NMAE = MAE / (r_max - r_min) (paper 000, Sec. 4.2, collaborative filtering)."""
    err = predicted - truth
    mae = float(np.abs(err).mean())
    return {"rmse": float(np.sqrt((err ** 2).mean())), "mae": mae, "nmae": mae / value_range}


def zzt_error(expected_zzt: np.ndarray, Z_true: np.ndarray) -> float:
    """L1 norm of the upper triangle (with diagonal) of E[Z Z^T] - Z Z^T (paper 001, Sec. 4.2)."""
    Zt = np.asarray(Z_true, np.float64)
    return float(np.abs(np.triu(expected_zzt - Zt @ Zt.T)).sum())


def constant_zzt_error(Z_true: np.ndarray) -> float:
    """ZZ^T error of the best constant guess, which uses no data: the median of the true diagonal on the
    diagonal and the median of the true off-diagonal entries elsewhere (L1 is smallest at the median)."""
    G = np.asarray(Z_true, np.float64) @ np.asarray(Z_true, np.float64).T
    guess = np.full(G.shape, np.median(G[np.triu_indices(len(G), 1)]))
    np.fill_diagonal(guess, np.median(np.diag(G)))
    return zzt_error(guess, Z_true)


def base_error(A_true: np.ndarray, A_est: np.ndarray) -> float:
    """Mean over true features of the mean squared difference to the closest estimated feature (paper 000, Sec. 4.1)."""
    sq = ((A_true[:, None, :] - A_est[None, :, :]) ** 2).mean(axis=2)
    return float(sq.min(axis=1).mean())


def z_agreement(Z_true: np.ndarray, expected_z: np.ndarray) -> float:
    """Fraction of the entries of the true Z (N x K) equal to E[Z] (N x K+) thresholded at 0.5, after matching
    the true features to the estimated ones one to one (Hungarian matching on the number of agreeing rows).
    True features left without a match (K+ < K) count as wrong in every row."""
    from scipy.optimize import linear_sum_assignment  # here: at module level the CLI imported it (0.16 s)
    truth = np.asarray(Z_true, np.float64)
    estimate = (expected_z > 0.5).astype(np.float64)
    agree = truth.T @ estimate + (1.0 - truth).T @ (1.0 - estimate)
    rows, cols = linear_sum_assignment(agree, maximize=True)
    return float(agree[rows, cols].sum() / truth.size)

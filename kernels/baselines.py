"""Baselines of paper 000's experiments (paper 000, Secs. 4.2-4.3), plain NumPy.

Every function takes the data ``x`` (N x D) and a boolean ``mask`` (True = observed, i.e. a
training entry) and returns a dense N x D array of scores (predicted values) from the observed
entries only; values of ``x`` where ``mask`` is False are never read.

* ``mean_fill`` + ``svd_factors`` / ``low_rank``: truncated SVD of the matrix with its missing
  entries replaced by column means (paper 000's "SVD");
* ``svd_impute``: iterative SVD imputation (hard impute: refill the missing entries with the rank-k
  reconstruction until it stops changing);
* ``masked_nmf``: NMF fitted to the observed entries only, multiplicative updates on
  ||mask * (X - W H)||^2 (paper 000's "NMF");
* ``popularity``: row rate + column rate, the observed means of the entry's row and column;
* ``fit_biases``: row + column offsets by ridge-regularised alternating least squares (the user +
  item bias baseline of collaborative filtering; the same updates as IMF's offsets extension);
* ``residual_svd``: a base score (popularity, biases) plus a rank-k SVD of its residual.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from . import imf

EPS = 1e-12


def observed_means(x: np.ndarray, mask: np.ndarray, axis: int | None) -> np.ndarray:
    """Means of the observed entries along ``axis`` (axis 0: one per column, None: of all); the overall
    observed mean where a column (row) has no observed entry."""
    counts = mask.sum(axis=axis)
    sums = np.where(mask, x, 0.0).sum(axis=axis)
    overall = np.sum(sums) / max(np.sum(counts), 1)
    return np.where(counts > 0, sums / np.maximum(counts, 1), overall)


def mean_fill(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``x`` with every missing entry replaced by the observed mean of its column."""
    return np.where(mask, x, observed_means(x, mask, axis=0)[None, :])


def svd_factors(x: np.ndarray, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(L, R) with L R the rank-``rank`` truncated SVD of ``x`` (all of it by default), singular values
    largest first: L = U S, R = V^T (or L = U, R = S V^T for a wide ``x``), so L[:, :k] R[:k] is the
    rank-k truncation for any k <= rank. Computed from the leading eigenvectors of the smaller Gram
    matrix: several times faster than LAPACK's SVD here, and as accurate for the leading directions,
    the only ones the baselines keep."""
    if x.shape[0] < x.shape[1]:
        left, right = svd_factors(x.T, rank)
        return right.T, left.T
    d = x.shape[1]
    rank = d if rank is None else min(rank, d)
    _, v = scipy.linalg.eigh(x.T @ x, subset_by_index=[d - rank, d - 1])
    v = v[:, ::-1]
    return x @ v, v.T


def low_rank(left: np.ndarray, right: np.ndarray, k: int) -> np.ndarray:
    """The rank-``k`` truncation L[:, :k] R[:k] of ``svd_factors``."""
    return left[:, :k] @ right[:k]


def svd_impute(x: np.ndarray, mask: np.ndarray, k: int, start: np.ndarray | None = None,
               n_iter: int = 100, tol: float = 1e-5) -> np.ndarray:
    """Rank-``k`` iterative SVD imputation (hard impute): fill the missing entries (from ``start``, or
    column means), take the rank-k SVD, refill the missing entries from it; stop when the relative change
    of the reconstruction is below ``tol``. Returns the last rank-k reconstruction. With nothing missing
    this is the plain rank-k SVD."""
    filled = mean_fill(x, mask) if start is None else np.where(mask, x, start)
    recon = low_rank(*svd_factors(filled, k), k)
    for _ in range(n_iter - 1):
        previous = recon
        recon = low_rank(*svd_factors(np.where(mask, x, recon), k), k)
        if np.linalg.norm(recon - previous) <= tol * max(np.linalg.norm(previous), EPS):
            break
    return recon


def nmf_objective(x: np.ndarray, mask: np.ndarray, w: np.ndarray, h: np.ndarray) -> float:
    """||mask * (X - W H)||_F^2, the masked NMF objective."""
    return float(np.sum(np.where(mask, x - w @ h, 0.0) ** 2))


def masked_nmf(x: np.ndarray, mask: np.ndarray, k: int, rng: np.random.Generator, n_iter: int = 300,
               tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """NMF X ~ W H (W N x k, H k x D, both >= 0) fitted to the observed entries only, by Lee-Seung
    multiplicative updates with the mask (W <- W (M*X) H^T / (M*(WH)) H^T, H alike), which never increase
    ``nmf_objective``. ``x`` must be >= 0 on the observed entries. Returns W, H and the objective after
    every iteration; stops when its relative decrease is below ``tol``."""
    xo = np.where(mask, x, 0.0)
    m = mask.astype(np.float64)
    scale = np.sqrt(max(xo.sum() / max(m.sum(), 1.0), EPS) / k)
    w = scale * rng.uniform(0.5, 1.5, (x.shape[0], k))
    h = scale * rng.uniform(0.5, 1.5, (k, x.shape[1]))
    trace: list[float] = []
    for _ in range(n_iter):
        w *= (xo @ h.T) / ((m * (w @ h)) @ h.T + EPS)
        h *= (w.T @ xo) / (w.T @ (m * (w @ h)) + EPS)
        trace.append(nmf_objective(x, mask, w, h))
        if len(trace) > 1 and trace[-2] - trace[-1] <= tol * trace[-2]:
            break
    return w, h, trace


def popularity(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row rate + column rate: score_ij = mean of row i's observed entries + mean of column j's."""
    return observed_means(x, mask, axis=1)[:, None] + observed_means(x, mask, axis=0)[None, :]


def fit_biases(x: np.ndarray, mask: np.ndarray, reg: float = 5.0,
               n_iter: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Row offsets b (N,) and column offsets c (D,) (the observed mean folded into c) minimising
    sum_Omega (x_ij - b_i - c_j)^2 + reg (|b|^2 + |c - mean|^2), by ``n_iter`` alternations of IMF's
    offset updates (``imf.row_offsets``, ``imf.column_offsets``) on the whole matrix as one chunk."""
    mean = float(observed_means(x, mask, axis=None))
    col = np.full(x.shape[1], mean)
    for _ in range(n_iter):
        row = imf.row_offsets(x, mask, col, reg)
        col = imf.column_offsets(imf.column_offset_stats(x, mask, row), mean, reg)
    return row, col


def bias_scores(x: np.ndarray, mask: np.ndarray, reg: float = 5.0) -> np.ndarray:
    """The scores b_i + c_j of ``fit_biases``."""
    row, col = fit_biases(x, mask, reg)
    return row[:, None] + col[None, :]


def residual_svd(x: np.ndarray, mask: np.ndarray, base: np.ndarray,
                 rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``svd_factors`` of the residual X - base on the observed entries (0 where missing); the score of
    rank k is base + low_rank(left, right, k)."""
    return svd_factors(np.where(mask, x - base, 0.0), rank)

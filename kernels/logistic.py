"""L2-regularised logistic regression and its cross-validated scores, plain NumPy and SciPy.

Used to ask whether features a model learned without labels carry a known class: fit
P(y = 1 | x) = sigmoid(x . w + b) on some samples, score the rest, and rank the held-out scores by AUC.
The inputs are standardised on the training fold; the intercept is not penalised.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit


def penalised_loss(params: np.ndarray, X: np.ndarray, y: np.ndarray, l2: float) -> tuple[float, np.ndarray]:
    """Negative log likelihood plus (l2 / 2) |w|^2 at ``params`` = (w, b), and its gradient."""
    w, b = params[:-1], params[-1]
    margin = X @ w + b
    sign = 2.0 * y - 1.0
    loss = -np.sum(log_expit(sign * margin)) + 0.5 * l2 * (w @ w)
    residual = expit(margin) - y
    return float(loss), np.append(X.T @ residual + l2 * w, residual.sum())


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
    """The (w, b) minimising ``penalised_loss`` for 0/1 labels ``y`` (L-BFGS)."""
    start = np.zeros(X.shape[1] + 1)
    result = minimize(penalised_loss, start, args=(X, y.astype(np.float64), l2), jac=True, method="L-BFGS-B")
    return result.x


def standardiser(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and standard deviations of ``X`` (1 where a column is constant)."""
    sd = X.std(axis=0)
    return X.mean(axis=0), np.where(sd > 0, sd, 1.0)


def stratified_folds(y: np.ndarray, n_folds: int, rng: np.random.Generator) -> np.ndarray:
    """A fold number in [0, n_folds) for each sample, each class dealt round the folds in a random order so
    every fold holds about the same share of each class."""
    folds = np.empty(y.size, dtype=np.int64)
    offset = 0
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        folds[members] = (offset + np.arange(members.size)) % n_folds
        offset += members.size
    return folds


def cross_validated_scores(X: np.ndarray, y: np.ndarray, folds: np.ndarray, l2: float) -> np.ndarray:
    """Each sample's P(y = 1) from a model fitted on the other folds (inputs standardised on those folds)."""
    scores = np.empty(y.size)
    for fold in np.unique(folds):
        test = folds == fold
        mean, sd = standardiser(X[~test])
        params = fit_logistic((X[~test] - mean) / sd, y[~test], l2)
        scores[test] = expit((X[test] - mean) / sd @ params[:-1] + params[-1])
    return scores

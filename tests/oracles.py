"""Exact references the IBP samplers' tests compare against (tiny problems only): every IBP class by
enumeration and its exact posterior, the noisy-OR likelihood with Y summed out by enumeration, linear-Gaussian
BMF's likelihood with W integrated out, and the distribution over classes that a set of weighted samples
gives (paper 001, eq. 2)."""

from __future__ import annotations

import itertools
import math
from typing import Callable, Iterator

import numpy as np
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from buffet.kernels.ibp_prior import class_key, ibp_log_prob, left_order
from buffet.kernels.pf_noisy_or import NoisyORParams, log_lik_entries


def enumerate_ibp_classes(n_rows: int, max_features: int) -> Iterator[np.ndarray]:
    """One N x K+ representative of every IBP class with K+ <= max_features.

    Classes are multisets of non-zero column patterns: C(2^N - 1 + K, K) of them have K+ = K.
    """
    patterns = ((np.arange(1, 2 ** n_rows)[None, :] >> np.arange(n_rows)[::-1, None]) & 1).astype(bool)
    for k in range(max_features + 1):
        for combo in itertools.combinations_with_replacement(range(patterns.shape[1]), k):
            yield patterns[:, list(combo)]


def exact_class_posterior(n_rows: int, max_features: int, alpha: float,
                          log_likelihood: Callable[[np.ndarray], float]) -> dict[bytes, float]:
    """Exact posterior over IBP classes with K+ <= max_features, by enumeration: P([Z] | X) is
    proportional to P([Z]) p(X | Z) (eq. 2 times a column-order-invariant likelihood)."""
    keys, log_p = [], []
    for Z in enumerate_ibp_classes(n_rows, max_features):
        keys.append(class_key(Z))
        log_p.append(ibp_log_prob(Z, alpha) + log_likelihood(Z))
    log_p = np.asarray(log_p)
    return dict(zip(keys, np.exp(log_p - logsumexp(log_p))))


def noisy_or_log_marginal(X: np.ndarray, Z: np.ndarray, params: NoisyORParams,
                          observed: np.ndarray | None = None) -> float:
    """log P(X | Z) of the noisy-OR model (eq. 8) with Y summed out by enumeration, O(D 2^K N).

    The columns of Y are independent, so P(X | Z) = prod_d sum_y P(y) prod_{i observed} P(x_id | z_i . y).
    """
    k = Z.shape[1]
    configs = ((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1).astype(np.int64)      # (2^K, K)
    n_on = configs.sum(axis=1)
    log_prior = n_on * math.log(params.p) + (k - n_on) * math.log1p(-params.p)
    eta = configs @ Z.T.astype(np.int64)                                              # (2^K, N)
    entries = log_lik_entries(X.T[:, None, :], eta[None], params)                     # (D, 2^K, N)
    if observed is not None:
        entries = np.where(observed.T[:, None, :], entries, 0.0)
    per_col = entries.sum(axis=2) + log_prior                                         # (D, 2^K)
    return float(logsumexp(per_col, axis=1).sum())


def bmf_log_marginal(X: np.ndarray, mask: np.ndarray, U: np.ndarray, V: np.ndarray, theta: float, phi: float,
                     w0: float) -> float:
    """log p(X_obs | U, V) of linear-Gaussian BMF with W ~ N(w0, 1/phi) integrated out (paper 003, Sec. 2):
    Cov(x_ij, x_i'j') = (UU^T)_ii' (VV^T)_jj' / phi + [same entry] / theta."""
    U, V = U.astype(float), V.astype(float)
    cov = np.kron(U @ U.T, V @ V.T) / phi + np.eye(X.size) / theta
    obs = mask.ravel()
    mean = w0 * np.outer(U.sum(axis=1), V.sum(axis=1)).ravel()
    return float(multivariate_normal.logpdf(X.ravel()[obs], mean[obs], cov[np.ix_(obs, obs)]))


def class_distribution(Z: np.ndarray, weights: np.ndarray) -> dict[bytes, float]:
    """Mass of each IBP equivalence class (``ibp_prior.class_key``) among weighted samples Z (L, N, K)."""
    flat = Z.reshape(Z.shape[0], -1)
    unique, first, inverse = np.unique(flat, axis=0, return_index=True, return_inverse=True)
    mass = np.bincount(inverse.ravel(), weights=weights, minlength=unique.shape[0])
    out: dict[bytes, float] = {}
    for l, w in zip(first, mass):
        key = class_key(Z[l])
        out[key] = out.get(key, 0.0) + w
    return out


def total_variation(p: dict[bytes, float], q: dict[bytes, float]) -> float:
    """Total-variation distance between two distributions over IBP classes."""
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in p.keys() | q.keys())


def moved_exact_draws(exact: dict[bytes, float], classes: dict[bytes, np.ndarray], n_draws: int,
                      move: Callable[[np.ndarray], np.ndarray],
                      rng: np.random.Generator) -> tuple[dict[bytes, float], dict[bytes, float], int]:
    """``n_draws`` exact draws of a class from ``exact`` (class key -> posterior probability), each moved by
    ``move`` (the class's representative in ``classes`` in, the new Z out): the laws of the classes before and
    after the move, and how many draws changed class. A move that leaves the posterior invariant keeps the law
    after as close to ``exact`` as the law before, up to sampling noise."""
    keys = list(exact)
    draws = rng.choice(len(keys), size=n_draws, p=np.array([exact[key] for key in keys]))
    before: dict[bytes, float] = {}
    after: dict[bytes, float] = {}
    moved = 0
    for d in draws:
        key = class_key(move(classes[keys[d]]))
        before[keys[d]] = before.get(keys[d], 0.0) + 1 / n_draws
        after[key] = after.get(key, 0.0) + 1 / n_draws
        moved += key != keys[d]
    return before, after, moved


def class_mean_features(Z: np.ndarray, M: np.ndarray, key: bytes) -> np.ndarray | None:
    """E[A | [Z] = key, X] (K+ x D) of linear-Gaussian particles, features in left-ordered form, or None if
    no particle is in the class: within one class the posterior mean M of A is the same up to the column
    order of Z, so any member, reordered, gives it."""
    for Zl, Ml in zip(Z, M):
        if class_key(Zl) == key:
            return Ml[left_order(Zl)]
    return None


TINY_Z = np.array([[1, 0], [1, 1], [0, 1]], bool)  # the tiny problems' true Z: 3 rows, 2 features


def masked_noisy_or_problem(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, NoisyORParams,
                                                                 dict[bytes, float]]:
    """Noisy-OR data from ``TINY_Z`` (7 columns) with two entries missing: X, the observed mask, the
    parameters and the exact class posterior of Z at alpha 0.5 (Y summed out)."""
    from buffet.data.ibp_synthetic import noisy_or_x

    params = NoisyORParams(p=0.5, lam=0.8, eps=0.1)
    X = noisy_or_x(TINY_Z, rng.random((2, 7)) < params.p, params, rng)
    observed = np.ones(X.shape, bool)
    observed[[0, 2], [3, 5]] = False
    exact = exact_class_posterior(3, 7, 0.5, lambda Z: noisy_or_log_marginal(X, Z, params, observed))
    return X, observed, params, exact


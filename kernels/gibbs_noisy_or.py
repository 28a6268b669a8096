"""Gibbs sampler for the infinite noisy-OR model (Wood, Griffiths & Ghahramani 2006; docs/models/gibbs.md).

Model as in ``pf_noisy_or`` (paper 001 eq. 8): X binary N x D, Z ~ IBP(alpha), Y (K+ x D) iid
Bern(p). A sweep:

* row i, features used by other rows: z_ik from prior odds m_{-i,k} : (N - m_{-i,k}) times the
  likelihood ratio of row i;
* row i, features only row i uses: removed and replaced, together with their rows of Y, by
  K_new new features drawn from the truncated posterior Poisson(K_new; alpha/N) P(x_i | K_new) with
  the new rows of Y summed out (paper 001 eq. 11), then the new rows of Y from their posterior
  given x_i. This is an exact block Gibbs step on (singletons of row i, their rows of Y);
* Y: y_kd from prior odds p : (1 - p) times the likelihood ratio of column d (all d at once);
* alpha from its conjugate Gamma when a prior is given. p, lambda and eps are held fixed.

Missing entries (``observed`` False) are left out of every likelihood.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import expit

from .ibp_prior import ibp_log_prob, new_feature_log_prior, sample_alpha, sample_categorical_log
from .pf_noisy_or import NoisyORParams, log_lik_entries, row_log_lik, sample_new_feature_rows


@dataclass(frozen=True)
class NoisyORGibbsState:
    """Sampler state: Z (N x K+ bool, no zero columns), Y (K+ x D bool) and alpha."""

    Z: np.ndarray
    Y: np.ndarray
    alpha: float


@dataclass(frozen=True)
class NoisyORObservation:
    """The noisy-OR likelihood as an observation model of rows with linear predictor eta = z_i Y
    (eq. 8; eta may be fractional, e.g. with an average of Y), for ``bmf.conditional_sweep``."""

    params: NoisyORParams

    def rows(self, X: np.ndarray, mask: np.ndarray | None, eta: np.ndarray) -> np.ndarray:
        """log P(x_i | eta_i) over each row's observed entries (vector over rows)."""
        return row_log_lik(np.asarray(X, bool), eta, self.params, 0, mask)


def log_joint(X: np.ndarray, state: NoisyORGibbsState, params: NoisyORParams,
              observed: np.ndarray | None = None) -> float:
    """log P([Z] | alpha) + log P(Y) + log P(X | Z, Y) (eqs. 2 and 8): the trace to monitor a chain."""
    eta = state.Z.astype(np.int64) @ state.Y
    n_ones = int(state.Y.sum())
    return (ibp_log_prob(state.Z, state.alpha) + n_ones * math.log(params.p)
            + (state.Y.size - n_ones) * math.log1p(-params.p)
            + float(row_log_lik(X, eta, params, 0, observed).sum()))


def _sample_row_existing(x: np.ndarray, z: np.ndarray, Y: np.ndarray, m_minus: np.ndarray, n_rows: int,
                         params: NoisyORParams, rng: np.random.Generator, observed: np.ndarray | None) -> None:
    """z_ik for the features other rows use, in place (module docstring, first step)."""
    eta = z.astype(np.int64) @ Y
    for k in np.flatnonzero(m_minus):
        eta0 = eta - z[k] * Y[k]
        ll = row_log_lik(x, np.stack([eta0, eta0 + Y[k]]), params, 0, observed)
        z[k] = rng.random() < expit(math.log(m_minus[k] / (n_rows - m_minus[k])) + ll[1] - ll[0])
        eta = eta0 + z[k] * Y[k]


def _sample_row_new(x: np.ndarray, z: np.ndarray, Y: np.ndarray, log_prior_new: np.ndarray,
                    params: NoisyORParams, rng: np.random.Generator,
                    observed: np.ndarray | None) -> tuple[int, np.ndarray]:
    """K_new and the new rows of Y for row i, given z_i without its singletons (module docstring)."""
    eta = z.astype(np.int64) @ Y
    n_new = np.arange(log_prior_new.size)
    k_new = sample_categorical_log(log_prior_new + row_log_lik(x, eta, params, n_new[:, None], observed), rng)
    return k_new, sample_new_feature_rows(x, eta[None], np.array([k_new]), params, rng, observed)[0]


def gibbs_row(i: int, X: np.ndarray, Z: np.ndarray, Y: np.ndarray, log_prior_new: np.ndarray,
               params: NoisyORParams, rng: np.random.Generator,
               observed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Resample row i of Z, with the rows of Y of its singletons (module docstring); returns (Z, Y)."""
    obs = None if observed is None else observed[i]
    z = Z[i].copy()
    m_minus = Z.sum(axis=0) - z
    _sample_row_existing(X[i], z, Y, m_minus, X.shape[0], params, rng, obs)
    keep = m_minus > 0
    k_new, Y_new = _sample_row_new(X[i], z[keep], Y[keep], log_prior_new, params, rng, obs)
    Z = np.concatenate([Z[:, keep], np.zeros((Z.shape[0], k_new), bool)], axis=1)
    Z[i] = np.concatenate([z[keep], np.ones(k_new, bool)])
    return Z, np.concatenate([Y[keep], Y_new])


def sample_y(X: np.ndarray, Z: np.ndarray, Y: np.ndarray, params: NoisyORParams, rng: np.random.Generator,
             observed: np.ndarray | None = None) -> np.ndarray:
    """Gibbs on Y, one feature at a time, all columns at once (module docstring, third step)."""
    Y = Y.copy()
    eta = Z.astype(np.int64) @ Y
    prior_logit = math.log(params.p / (1.0 - params.p))
    for k in range(Y.shape[0]):
        rows = Z[:, k]
        base = eta[rows] - Y[k]
        diff = log_lik_entries(X[rows], base + 1, params) - log_lik_entries(X[rows], base, params)
        if observed is not None:
            diff = np.where(observed[rows], diff, 0.0)
        y = rng.random(Y.shape[1]) < expit(prior_logit + diff.sum(axis=0))
        eta[rows] += y.astype(np.int64) - Y[k]
        Y[k] = y
    return Y


def gibbs_sweep(X: np.ndarray, state: NoisyORGibbsState, params: NoisyORParams, rng: np.random.Generator,
                observed: np.ndarray | None = None, alpha_prior: tuple[float, float] | None = (1.0, 1.0),
                max_new: int = 4) -> NoisyORGibbsState:
    """One sweep: every row of Z (with new features), then Y, then alpha.

    X (N x D) 0/1, ``observed`` (N x D) bool or None, ``alpha_prior`` Gamma (shape, rate) or None
    to hold alpha fixed, ``max_new`` the truncation of K_new. Returns the new state.
    """
    X = np.asarray(X, bool)
    n = X.shape[0]
    log_prior_new = new_feature_log_prior(n, state.alpha, max_new)
    Z, Y = state.Z, state.Y
    for i in range(n):
        Z, Y = gibbs_row(i, X, Z, Y, log_prior_new, params, rng, observed)
    Y = sample_y(X, Z, Y, params, rng, observed)
    alpha = state.alpha if alpha_prior is None else sample_alpha(Z.shape[1], n, *alpha_prior, rng)
    return replace(state, Z=Z, Y=Y, alpha=alpha)

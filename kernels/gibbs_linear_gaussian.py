"""Collapsed Gibbs sampler for the infinite linear-Gaussian model (SPEC 3.4; Griffiths & Ghahramani 2005).

Model as in ``pf_linear_gaussian``: X = Z A + N(0, sigma_X^2), A iid N(0, sigma_A^2), Z ~ IBP(alpha),
with A integrated out (collapsed likelihood, paper 001 eq. 6).

A sweep visits every row i. With r = sigma_X^2 / sigma_A^2, W = Z^T Z + r I, P = W_{-i}^{-1}
(row i left out) and M_{-i} = P Z_{-i}^T X_{-i} (posterior mean of A from the other rows),
p(X | Z) as a function of z_i is, up to a constant, the predictive density

    log N(x_i; z_i M_{-i}, sigma_X^2 (1 + q) I),   q = z_i P z_i^T,

so for each feature with m_{-i,k} > 0 the two values of z_ik are compared with scalar updates
of q and of the squared predictive residual |x_i - z_i M_{-i}|^2 (O(K) per feature), under the
prior odds m_{-i,k} : (N - m_{-i,k}). Features only row i uses are then replaced by K_new new ones drawn
from the truncated posterior Poisson(K_new; alpha/N) N(x_i; z_i M_{-i}, (sigma_X^2 (1 + q) +
K_new sigma_A^2) I). [W^{-1} | W^{-1} Z^T X] is kept as one K x (K + D) array, and removing or
adding row i is one rank-one (Sherman-Morrison / RLS) update of it.

Inside a sweep Z has spare all-zero columns; they do not change p(X | Z) (each contributes
sigma_X^D sigma_A^-D r^{-D/2} = 1 to eq. 6) and give new features a place without reallocation.
At the end of the sweep alpha, sigma_X and sigma_A are resampled exactly: alpha from its
conjugate Gamma, the sigmas by drawing A from its Gaussian posterior and then the noise and
feature precisions from their conjugate Gammas (A is then discarded).

Missing entries (``observed`` False) are imputed: the state carries their current values, the
Z updates see the completed X, and after the sigmas they are redrawn from N(Z A, sigma_X^2) with
the same draw of A (an exact data-augmentation step; SPEC 1 masks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from .ibp_prior import ibp_log_prob, new_feature_log_prior, sample_alpha, sample_categorical_log


@dataclass(frozen=True)
class LGGibbsState:
    """Sampler state: Z (N x K+, bool, no zero columns), the hyperparameters and, with missing
    entries, their current imputed values (in the order of ``X[~observed]``; None before the first sweep)."""

    Z: np.ndarray
    alpha: float
    sigma_x: float
    sigma_a: float
    imputed: np.ndarray | None = None


@dataclass(frozen=True)
class LGHyperPrior:
    """Gamma (shape, rate) priors on alpha, 1/sigma_X^2 and 1/sigma_A^2; None holds one fixed (SPEC 3.4)."""

    alpha: tuple[float, float] | None = (1.0, 1.0)
    tau_x: tuple[float, float] | None = (1.0, 1.0)
    tau_a: tuple[float, float] | None = (1.0, 1.0)


# Hold alpha, sigma_X and sigma_A at the values of the state (e.g. to compare with an exact posterior).
FIXED = LGHyperPrior(None, None, None)


def feature_posterior(Z: np.ndarray, X: np.ndarray, sigma_x: float,
                      sigma_a: float) -> tuple[np.ndarray, np.ndarray, float]:
    """W^{-1}, posterior mean W^{-1} Z^T X of A, and log|W|, W = Z^T Z + sigma_X^2/sigma_A^2 I (eq. 6)."""
    Zf = np.asarray(Z, np.float64)
    W = Zf.T @ Zf + (sigma_x / sigma_a) ** 2 * np.eye(Zf.shape[1])
    factor = cho_factor(W)
    W_inv = cho_solve(factor, np.eye(W.shape[0]))
    return W_inv, W_inv @ (Zf.T @ X), 2.0 * float(np.log(np.diag(factor[0])).sum())


def collapsed_log_likelihood(X: np.ndarray, Z: np.ndarray, sigma_x: float, sigma_a: float,
                             observed: np.ndarray | None = None) -> float:
    """log p(X | Z, sigma_X, sigma_A) with A integrated out, paper 001 eq. 6 (K x K form).

    -ND/2 log 2pi - (N-K)D log sigma_X - K D log sigma_A - D/2 log|W|
    - 1/(2 sigma_X^2) tr(X^T (I - Z W^{-1} Z^T) X).
    With ``observed`` (N x D bool): the sum over columns of eq. 6 on each column's observed rows.
    """
    if observed is not None:
        return sum(collapsed_log_likelihood(X[o, d:d + 1], Z[o], sigma_x, sigma_a)
                   for d, o in enumerate(observed.T))
    n, d = X.shape
    k = Z.shape[1]
    _, M, log_det = feature_posterior(Z, X, sigma_x, sigma_a)
    quad = np.sum(X * X) - np.sum((np.asarray(Z, np.float64).T @ X) * M)
    return float(-0.5 * n * d * np.log(2 * np.pi) - (n - k) * d * np.log(sigma_x) - k * d * np.log(sigma_a)
                 - 0.5 * d * log_det - 0.5 * quad / sigma_x ** 2)


def log_joint(X: np.ndarray, state: LGGibbsState, observed: np.ndarray | None = None) -> float:
    """log P([Z] | alpha) + log p(X_observed | Z, sigmas) (eqs. 2 and 6): the trace to monitor a chain."""
    return (ibp_log_prob(state.Z, state.alpha)
            + collapsed_log_likelihood(X, state.Z, state.sigma_x, state.sigma_a, observed))


@dataclass
class _Sweep:
    """Per-sweep constants and the running caches of one sweep (module docstring)."""

    X: np.ndarray
    Z: np.ndarray          # (N, Kc) float64 with spare zero columns
    m: np.ndarray          # (Kc,) column counts
    SM: np.ndarray         # (Kc, Kc + D): [W^{-1} | W^{-1} Z^T X]
    var_x: float
    var_a: float
    log_prior_new: list[float]
    rng: np.random.Generator


def _rank_one(SM: np.ndarray, z: np.ndarray, x: np.ndarray, sign: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Add (sign = +1) or remove (sign = -1) the observation (z, x) from [W^{-1} | M] (RLS update).

    Updates SM in place and returns it, v = [W^{-1} z | z M - x] and c = 1 + sign z W^{-1} z, both taken
    before the update.
    """
    k = z.size
    v = z @ SM
    v[k:] -= x
    c = 1.0 + sign * (v[:k] @ z)
    SM -= (v[:k] * (sign / c))[:, None] * v
    return SM, v, c


def _sample_existing(z: np.ndarray, m_minus: np.ndarray, P: np.ndarray, Mi: np.ndarray, Pz: np.ndarray,
                     r: np.ndarray, q: float, sw: _Sweep) -> tuple[float, float]:
    """Gibbs on z_ik for the features in use, in place (module docstring).

    With the predictive residual r = x_i - z_i M_{-i}, R = |r|^2 and q = z_i P z_i^T,
    log p(X | Z) = -D/2 log(1 + q) - R / (2 sigma_X^2 (1 + q)) + const; the prior odds are
    m_{-i,k} / (N - m_{-i,k}). Row i's singletons (m_{-i,k} = 0) stay in the likelihood while the
    other features are updated (a Gibbs step on those given the singletons) and are then switched
    off, to be replaced in ``_sample_new``. Pz = P z_i^T is updated in place; returns the final (q, R).
    """
    n, d = sw.X.shape
    half_d, two_var = 0.5 * d, 2.0 * sw.var_x
    R = float(r @ r)
    rM = (Mi @ r).tolist()
    norms = np.einsum("kd,kd->k", Mi, Mi).tolist()
    diag = P.diagonal().tolist()
    zl, ml = z.tolist(), m_minus.tolist()
    # Features of other rows first, with row i's singletons still in the likelihood; then the
    # singletons are switched off (the block they form is redrawn by ``_sample_new``).
    used = [k for k, mk in enumerate(ml) if mk] + [k for k, (mk, zk) in enumerate(zip(ml, zl)) if zk and not mk]
    for k, u in zip(used, sw.rng.random(len(used)).tolist()):
        zk, pkk, nk = zl[k], diag[k], norms[k]
        pk = float(Pz[k]) - zk * pkk
        rk = rM[k] + zk * nk                    # (M_{-i} r)_k with z_ik = 0
        q0, R0 = q - zk * (2.0 * pk + pkk), R + zk * (2.0 * rM[k] + nk)
        q1, R1 = q0 + 2.0 * pk + pkk, R0 - 2.0 * rk + nk
        mk = ml[k]
        on = mk > 0 and u * (1.0 + math.exp(min(700.0, -math.log(mk / (n - mk))
                                                + half_d * (math.log1p(q1) - math.log1p(q0))
                                                + (R1 / (1.0 + q1) - R0 / (1.0 + q0)) / two_var))) < 1.0
        if on != zk:
            delta = 1.0 if on else -1.0
            z[k] = zl[k] = float(on)
            Pz += delta * P[:, k]
            r -= delta * Mi[k]
            rM = (Mi @ r).tolist()
        q, R = (q1, R1) if on else (q0, R0)
    return q, R


def _sample_new(q: float, sq_resid: float, sw: _Sweep) -> int:
    """K_new from the truncated Poisson(alpha/N) x N(x_i; z_i M_{-i}, (sigma_X^2 (1+q) + K_new sigma_A^2) I)
    posterior (SPEC 3.4); q and sq_resid are those of z_i without its singletons."""
    d = sw.X.shape[1]
    var = [sw.var_x * (1.0 + q) + j * sw.var_a for j in range(len(sw.log_prior_new))]
    return sample_categorical_log([lp - 0.5 * (d * math.log(v) + sq_resid / v)
                                   for lp, v in zip(sw.log_prior_new, var)], sw.rng)


def _grow(sw: _Sweep, extra: int) -> None:
    """Add ``extra`` zero columns to Z (prior block sigma_A^2/sigma_X^2 I in W^{-1}, zero rows in M)."""
    k, d = sw.m.size, sw.X.shape[1]
    SM = np.zeros((k + extra, k + extra + d))
    SM[:k, :k], SM[:k, k + extra:] = sw.SM[:, :k], sw.SM[:, k:]
    SM[k:, k:k + extra] = (sw.var_a / sw.var_x) * np.eye(extra)
    sw.SM = SM
    sw.Z = np.pad(sw.Z, [(0, 0), (0, extra)])
    sw.m = np.pad(sw.m, (0, extra))


def _gibbs_row(i: int, sw: _Sweep) -> None:
    """Resample row i of Z given the others (module docstring), updating the sweep caches."""
    x = sw.X[i]
    z = sw.Z[i].copy()
    k = z.size
    sw.SM, v, c = _rank_one(sw.SM, z, x, -1.0)
    m_minus = sw.m - z
    # Row i removed: P z^T = W^{-1} z^T / c, q = (1 - c) / c, residual x - z M_{-i} = -(z M - x) / c.
    q, R = _sample_existing(z, m_minus, sw.SM[:, :k], sw.SM[:, k:], v[:k] / c, v[k:] / -c, (1.0 - c) / c, sw)
    n_new = _sample_new(q, R, sw)
    if n_new:
        free = np.flatnonzero(m_minus == 0)
        if free.size < n_new:
            _grow(sw, len(sw.log_prior_new))
            z, m_minus = np.pad(z, (0, sw.m.size - k)), np.pad(m_minus, (0, sw.m.size - k))
            free = np.flatnonzero(m_minus == 0)
        z[free[:n_new]] = 1.0
    sw.SM = _rank_one(sw.SM, z, x, 1.0)[0]
    sw.Z[i] = z
    sw.m = m_minus + z


def _start_sweep(X: np.ndarray, state: LGGibbsState, max_new: int, rng: np.random.Generator) -> _Sweep:
    """Caches for a sweep: Z with max_new spare columns, counts, and [W^{-1} | M] from scratch."""
    Z = np.pad(np.asarray(state.Z, np.float64), [(0, 0), (0, max_new)])
    W_inv, M, _ = feature_posterior(Z, X, state.sigma_x, state.sigma_a)
    return _Sweep(X=X, Z=Z, m=Z.sum(axis=0), SM=np.hstack([W_inv, M]), var_x=state.sigma_x ** 2,
                  var_a=state.sigma_a ** 2,
                  log_prior_new=new_feature_log_prior(X.shape[0], state.alpha, max_new).tolist(), rng=rng)


def sample_features(X: np.ndarray, Z: np.ndarray, sigma_x: float, sigma_a: float,
                    rng: np.random.Generator) -> np.ndarray:
    """A ~ p(A | Z, X): columns N(W^{-1} Z^T x_d, sigma_X^2 W^{-1}) (the conjugate posterior behind eq. 6)."""
    W_inv, M, _ = feature_posterior(Z, X, sigma_x, sigma_a)
    return M + sigma_x * np.linalg.cholesky(W_inv) @ rng.standard_normal(M.shape)


def sample_sigmas(X: np.ndarray, state: LGGibbsState, A: np.ndarray, prior: LGHyperPrior,
                  rng: np.random.Generator) -> LGGibbsState:
    """sigma_X and sigma_A given A ~ p(A | Z, X) (SPEC 3.4): 1/sigma_X^2 ~ Gamma(a + ND/2, b + |X - ZA|^2/2)
    and 1/sigma_A^2 ~ Gamma(a + K D/2, b + |A|^2/2); a fixed one (prior None) is kept.
    """
    sigma_x, sigma_a = state.sigma_x, state.sigma_a
    if prior.tau_x is not None:
        shape, rate = prior.tau_x
        resid = X - np.asarray(state.Z, np.float64) @ A
        sigma_x = rng.gamma(shape + 0.5 * X.size, 1.0 / (rate + 0.5 * np.sum(resid ** 2))) ** -0.5
    if prior.tau_a is not None:
        shape, rate = prior.tau_a
        sigma_a = rng.gamma(shape + 0.5 * A.size, 1.0 / (rate + 0.5 * np.sum(A ** 2))) ** -0.5
    return replace(state, sigma_x=float(sigma_x), sigma_a=float(sigma_a))


def _completed(X: np.ndarray, state: LGGibbsState, observed: np.ndarray | None) -> np.ndarray:
    """X with the state's imputed values at the missing entries (zeros before the first sweep)."""
    if observed is None:
        return X
    filled = np.where(observed, X, 0.0)
    if state.imputed is not None:
        filled[~observed] = state.imputed
    return filled


def gibbs_sweep(X: np.ndarray, state: LGGibbsState, rng: np.random.Generator,
                prior: LGHyperPrior = LGHyperPrior(), max_new: int = 6,
                observed: np.ndarray | None = None) -> LGGibbsState:
    """One sweep of collapsed Gibbs over all rows, then the hyperparameters and imputations (SPEC 3.4).

    ``max_new`` truncates the number of new features per row; ``observed`` (N x D bool) marks the
    entries that are data (the others are imputed). Returns the new state.
    """
    X = _completed(X, state, observed)
    sw = _start_sweep(X, state, max_new, rng)
    for i in range(X.shape[0]):
        _gibbs_row(i, sw)
    state = replace(state, Z=sw.Z[:, sw.m > 0] > 0)
    if prior.alpha is not None:
        state = replace(state, alpha=sample_alpha(state.Z.shape[1], X.shape[0], *prior.alpha, rng))
    if prior.tau_x is None and prior.tau_a is None and observed is None:
        return state
    A = sample_features(X, state.Z, state.sigma_x, state.sigma_a, rng)
    state = sample_sigmas(X, state, A, prior, rng)
    if observed is None:
        return state
    completed = state.Z @ A + state.sigma_x * rng.standard_normal(X.shape)
    return replace(state, imputed=completed[~observed])

"""Collapsed Gibbs sampler for the infinite linear-Gaussian model (Griffiths & Ghahramani 2005; docs/models/gibbs.md).

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
K_new sigma_A^2) I). [W^{-1} | W^{-1} Z^T X] of all rows is kept as one K x (K + D) array; the
quantities of row i left out follow from it by Sherman-Morrison without changing it, and removing
and re-adding row i (one rank-one RLS update each) happens only when z_i changes.

Inside a sweep Z has spare all-zero columns; they do not change p(X | Z) (each contributes
sigma_X^D sigma_A^-D r^{-D/2} = 1 to eq. 6) and give new features a place without reallocation.
After the rows, optional split-merge Metropolis-Hastings moves (``split_merge``; Meeds et al.
2007, paper 003) split one feature into two or merge two into one, which single-entry Gibbs
updates can only do through unlikely intermediate states, and optional recombination moves
(``recombine``) propose three columns in place of two that hold the same two features, or back
(``exchange``, which divides the rows of two features between them afresh, serves the particle
filter's moves). Then alpha, sigma_X and sigma_A are
resampled exactly: alpha from its conjugate Gamma, the sigmas by drawing A from its Gaussian
posterior and then the noise and feature precisions from their conjugate Gammas (A is then
discarded).

Missing entries (``observed`` False) are imputed: the state carries their current values, the
Z updates see the completed X, and after the sigmas they are redrawn from N(Z A, sigma_X^2) with
the same draw of A (an exact data-augmentation step).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import compress
from typing import Iterable

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs
from scipy.special import gammaln

from .ibp_prior import categorical_index, categorical_weights, ibp_log_prob, new_feature_log_prior, sample_alpha


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
    """Gamma (shape, rate) priors on alpha, 1/sigma_X^2 and 1/sigma_A^2; None holds one fixed."""

    alpha: tuple[float, float] | None = (1.0, 1.0)
    tau_x: tuple[float, float] | None = (1.0, 1.0)
    tau_a: tuple[float, float] | None = (1.0, 1.0)


# Hold alpha, sigma_X and sigma_A at the values of the state (e.g. to compare with an exact posterior).
FIXED = LGHyperPrior(None, None, None)


def feature_posterior(Z: np.ndarray, X: np.ndarray, sigma_x: float,
                      sigma_a: float) -> tuple[np.ndarray, np.ndarray, float]:
    """W^{-1}, posterior mean W^{-1} Z^T X of A, and log|W|, W = Z^T Z + sigma_X^2/sigma_A^2 I (eq. 6).

    By the upper Cholesky factor of W (LAPACK potrf / potrs, called directly: the small matrices here
    make scipy.linalg.cho_factor's checks cost more than the factorisation).
    """
    Zf = np.asarray(Z, np.float64)
    k = Zf.shape[1]
    if k == 0:
        return np.zeros((0, 0)), np.zeros((0, X.shape[1])), 0.0
    W = Zf.T @ Zf + (sigma_x / sigma_a) ** 2 * np.eye(k)
    factor, info = dpotrf(W, lower=0, clean=0, overwrite_a=1)
    if info:
        raise np.linalg.LinAlgError(f"W is not positive definite (potrf info {info})")
    W_inv, _ = dpotrs(factor, np.eye(k), lower=0, overwrite_b=1)
    return W_inv, W_inv @ (Zf.T @ X), 2.0 * float(np.log(np.diag(factor)).sum())


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
    m: list[float]         # (Kc,) column counts
    SM: np.ndarray         # (Kc, Kc + D): [W^{-1} | W^{-1} Z^T X] of all rows
    M: np.ndarray          # the view SM[:, Kc:]
    diag: list[float]      # diagonal of W^{-1}
    norms: list[float]     # |M_k|^2 of the rows of M = W^{-1} Z^T X
    var_x: float
    var_a: float
    log_prior_new: list[float]
    new_var: list[float]   # j sigma_A^2 for K_new = j = 0..max_new
    log_odds_off: dict[float, float]   # -log(m / (N - m)) for m = 1..N-1: prior log odds of z_ik = 0
    rng: np.random.Generator


def _row_vector(SM: np.ndarray, z: np.ndarray, x: np.ndarray) -> np.ndarray:
    """v = [W^{-1} z^T | z M - x] for the observation (z, x) and SM = [W^{-1} | M]."""
    v = z.dot(SM)
    v[z.size:] -= x
    return v


def _update(SM: np.ndarray, v: np.ndarray, c: float, sign: float) -> None:
    """SM -= sign / c (W^{-1} z^T) v in place: adds (sign = +1) or removes (sign = -1) the observation
    of v = ``_row_vector`` and c = 1 + sign z W^{-1} z^T (Sherman-Morrison / RLS update of [W^{-1} | M])."""
    SM -= np.multiply.outer(v[:SM.shape[0]] * (sign / c), v)


def _add_row(SM: np.ndarray, z: np.ndarray, x: np.ndarray) -> None:
    """Add the observation (z, x) to [W^{-1} | M] in place (one rank-one RLS update, ``_update``)."""
    v = _row_vector(SM, z, x)
    _update(SM, v, 1.0 + float(v[:z.size].dot(z)), 1.0)


def _refresh(sw: _Sweep) -> None:
    """Recompute the caches that follow from sw.SM: the view M, the diagonal of W^{-1} and the |M_k|^2."""
    sw.M = M = sw.SM[:, len(sw.m):]
    sw.diag = sw.SM.diagonal().tolist()
    sw.norms = np.einsum("kd,kd->k", M, M).tolist()


def _visit_order(zl: list[float], ml: list[float]) -> list[int]:
    """The features ``_sample_existing`` visits, in order: those of other rows (m_{-i,k} > 0), then
    row i's singletons (z_ik = 1, m_{-i,k} = 0)."""
    kc = range(len(ml))
    return list(compress(kc, ml)) + list(compress(kc, map(operator.gt, zl, ml)))


def _sample_existing(zl: list[float], ml: list[float], used: list[int], u: list[float],
                     al: list[float], b: np.ndarray, c: float, sw: _Sweep) -> tuple[float, float]:
    """Gibbs on z_ik for the features ``used`` (``_visit_order``), in place (module docstring).

    With the predictive residual r = x_i - z_i M_{-i}, R = |r|^2 and q = z_i P z_i^T,
    log p(X | Z) = -D/2 log(1 + q) - R / (2 sigma_X^2 (1 + q)) + const; the prior odds are
    m_{-i,k} / (N - m_{-i,k}). Row i's singletons (m_{-i,k} = 0) stay in the likelihood while the
    other features are updated (a Gibbs step on those given the singletons) and are then switched
    off, to be replaced in ``_sample_new``. zl and ml are z_i and m_{-i} as lists (zl is updated in
    place), u one uniform per feature of ``used``. For each feature, (q, R) of z_i with z_ik flipped
    follow from the current ones by O(1) updates. Returns the final (q, R).

    Row i is left out without changing sw.SM (Sherman-Morrison): with a = W^{-1} z_i^T (``al``),
    b = z_i M - x_i and c = 1 - z_i a, P = W^{-1} + a a^T / c and M_{-i} = M + a b^T / c, so
    P z_i^T = a / c, q = (1 - c) / c, r = -b / c, (M_{-i} r)_k = -(M_k b + a_k |b|^2 / c) / c,
    |M_{-i,k}|^2 = |M_k|^2 + a_k (2 M_k b + a_k |b|^2 / c) / c and P_kk = W^{-1}_kk + a_k^2 / c.
    Until a z_ik changes, (P z_i^T)_k and (M_{-i} r)_k are taken from these formulas feature by
    feature; after a change they are kept as lists.
    """
    half_d, two_var = 0.5 * sw.X.shape[1], 2.0 * sw.var_x
    log_odds_off, diag, norms = sw.log_odds_off, sw.diag, sw.norms
    M = sw.M
    Mb = M.dot(b).tolist()
    bb = float(b.dot(b))
    q, R = (1.0 - c) / c, bb / (c * c)
    log_q, fit = math.log1p(q), R / (1.0 + q)
    pz = rM = r = None
    for k, uk in zip(used, u):
        zk, ak = zl[k], al[k]
        pkk = diag[k] + ak * ak / c                             # P_kk
        nk = norms[k] + ak * (2.0 * Mb[k] + ak * bb / c) / c    # |M_{-i,k}|^2
        pk = (ak / c if pz is None else pz[k]) - zk * pkk       # (P z_i^T)_k with z_ik = 0
        rk = (-(Mb[k] + ak * bb / c) / c if rM is None else rM[k]) + zk * nk   # (M_{-i} r)_k with z_ik = 0
        step = 1.0 - 2.0 * zk                                   # +1 switches z_ik on, -1 off
        q_flip, R_flip = q + step * (2.0 * pk + pkk), R - step * (2.0 * rk - nk)
        log_q_flip, fit_flip = math.log1p(q_flip), R_flip / (1.0 + q_flip)
        mk = ml[k]
        # log p(z_ik = 0 | rest) - log p(z_ik = 1 | rest), then z_ik = 1 with probability 1 / (1 + exp of it)
        on = mk > 0 and uk * (1.0 + math.exp(min(700.0, log_odds_off[mk] + step * (
            half_d * (log_q_flip - log_q) + (fit_flip - fit) / two_var)))) < 1.0
        if on != zk:
            q, R, log_q, fit = q_flip, R_flip, log_q_flip, fit_flip
            delta = 1.0 if on else -1.0
            zl[k] = float(on)
            pz = [(aj / c if pz is None else pz[j]) + delta * (w + aj * ak / c)
                  for j, (w, aj) in enumerate(zip(sw.SM[:, k].tolist(), al))]
            r = (b / -c if r is None else r) - delta * (M[k] + (ak / c) * b)
            br = float(b.dot(r))
            rM = [mr + aj * br / c for mr, aj in zip(M.dot(r).tolist(), al)]
    return q, R


def _sample_new(q: float, sq_resid: float, u: float, sw: _Sweep) -> int:
    """K_new from the truncated Poisson(alpha/N) x N(x_i; z_i M_{-i}, (sigma_X^2 (1+q) + K_new sigma_A^2) I)
    posterior, by inverting the uniform u; q and sq_resid are those of z_i without its singletons."""
    d, log = sw.X.shape[1], math.log
    base = sw.var_x * (1.0 + q)
    _, weights, total = categorical_weights([lp - 0.5 * (d * log(v := base + extra) + sq_resid / v)
                                             for lp, extra in zip(sw.log_prior_new, sw.new_var)])
    return categorical_index(weights, total, u)


def _grow(sw: _Sweep, extra: int) -> None:
    """Add ``extra`` zero columns to Z (prior block sigma_A^2/sigma_X^2 I in W^{-1}, zero rows in M)."""
    k, d = len(sw.m), sw.X.shape[1]
    SM = np.zeros((k + extra, k + extra + d))
    SM[:k, :k], SM[:k, k + extra:] = sw.SM[:, :k], sw.SM[:, k:]
    SM[k:, k:k + extra] = (sw.var_a / sw.var_x) * np.eye(extra)
    sw.SM = SM
    sw.Z = np.pad(sw.Z, [(0, 0), (0, extra)])
    sw.m = sw.m + [0.0] * extra


def _gibbs_row(i: int, sw: _Sweep) -> None:
    """Resample row i of Z given the others (module docstring), updating the sweep caches.

    The uniforms of the row (one per visited feature, then one for K_new) are drawn in one call,
    the same stream as drawing them one at a time. [W^{-1} | M] is updated (row i removed, then
    added with its new z_i) only when z_i changes.
    """
    x = sw.X[i]
    zi = sw.Z[i]
    k = zi.size
    v = _row_vector(sw.SM, zi, x)
    al = v[:k].tolist()
    zl = zi.tolist()
    c = 1.0 - sum(compress(al, zl))
    ml = list(map(operator.sub, sw.m, zl))
    used = _visit_order(zl, ml)
    u = sw.rng.random(len(used) + 1).tolist()
    q, R = _sample_existing(zl, ml, used, u, al, v[k:], c, sw)
    n_new = _sample_new(q, R, u[-1], sw)
    if not n_new and zl == zi.tolist():
        return
    _update(sw.SM, v, c, -1.0)
    z = np.array(zl)
    if n_new:
        free = [f for f, mk in enumerate(ml) if mk == 0.0]
        if len(free) < n_new:
            _grow(sw, len(sw.log_prior_new))
            z, ml = np.pad(z, (0, len(sw.m) - k)), ml + [0.0] * (len(sw.m) - k)
            free = [f for f, mk in enumerate(ml) if mk == 0.0]
        z[free[:n_new]] = 1.0
    _add_row(sw.SM, z, x)
    sw.Z[i] = z
    sw.m = [mk + zk for mk, zk in zip(ml, z.tolist())]
    _refresh(sw)


@lru_cache(maxsize=8)
def _log_odds_off(n: int) -> dict[float, float]:
    """-log(m / (N - m)) for m = 1..N-1, keyed by float(m): the prior log odds of z_ik = 0 given m_{-i,k} = m
    (read only; cached per N)."""
    return {float(m): -math.log(m / (n - m)) for m in range(1, n)}


def _start_sweep(X: np.ndarray, state: LGGibbsState, max_new: int, rng: np.random.Generator) -> _Sweep:
    """Caches for a sweep: Z with max_new spare columns, counts, and [W^{-1} | M] from scratch."""
    n, k = state.Z.shape
    Z = np.zeros((n, k + max_new))
    Z[:, :k] = state.Z
    W_inv, M, _ = feature_posterior(Z, X, state.sigma_x, state.sigma_a)
    var_a = state.sigma_a ** 2
    SM = np.hstack([W_inv, M])
    sw = _Sweep(X=X, Z=Z, m=Z.sum(axis=0).tolist(), SM=SM, M=SM[:, Z.shape[1]:], diag=[], norms=[],
                var_x=state.sigma_x ** 2, var_a=var_a,
                log_prior_new=new_feature_log_prior(n, state.alpha, max_new).tolist(),
                new_var=[j * var_a for j in range(max_new + 1)],
                log_odds_off=_log_odds_off(n), rng=rng)
    _refresh(sw)
    return sw


def gibbs_rows(X: np.ndarray, state: LGGibbsState, rows: Iterable[int], max_new: int,
               rng: np.random.Generator) -> np.ndarray:
    """Collapsed Gibbs updates of the given rows of Z in turn (repeats allowed), X complete (module docstring).
    Returns the new Z (N x K+, bool, no zero columns)."""
    sw = _start_sweep(X, state, max_new, rng)
    for i in rows:
        _gibbs_row(int(i), sw)
    return sw.Z[:, np.array(sw.m) > 0] > 0


_OPTIONS = ((1, 0), (0, 1), (1, 1))   # a row of a split feature in a only, b only or both (``_option_log_weights``)


def _log_feature_prior(m: np.ndarray, n: int) -> float:
    """sum_k log[(N - m_k)! (m_k - 1)! / N!], the per-feature factor of eq. 2."""
    return float(np.sum(gammaln(n - m + 1) + gammaln(m) - gammaln(n + 1)))


def _option_log_weights(SM: np.ndarray, v: np.ndarray, c: float, cols: tuple[int, int], m_a: float, m_b: float,
                        n: int, two_var: float) -> list[float]:
    """Unnormalised log probabilities of the ``_OPTIONS`` of one row in ``_allocate``.

    SM = [W^{-1} | M] includes the row as z (a and b off), v is its ``_row_vector`` and c = 1 - z W^{-1} z^T.
    The row is left out by Sherman-Morrison as in ``_sample_existing``: with w = W^{-1} z^T and
    b = z M - x, P = W^{-1} + w w^T / c and M_{-r} = M + w b^T / c, so q_0 = (1 - c) / c, R_0 = |b|^2 / c^2,
    p = (P z^T)_{a,b} = w_{a,b} / c, l = M_{-r,{a,b}} r with r = -b / c, and G = M_{-r,{a,b}} M_{-r,{a,b}}^T.
    Option delta gives q = q_0 + 2 delta p + delta P_{ab} delta^T and R = R_0 - 2 delta l + delta G delta^T;
    its IBP odds are (m_a / N or 1 - m_a / N) (m_b / N or 1 - m_b / N) (``_log_fractions``).
    """
    k = SM.shape[0]
    a, b = cols
    d = SM.shape[1] - k
    resid = v[k:]
    Mab = SM[[a, b], k:]
    mb_a, mb_b = Mab.dot(resid).tolist()
    (G_aa, G_ab), (_, G_bb) = Mab.dot(Mab.T).tolist()
    bb = float(resid.dot(resid))
    w_a, w_b = v.item(a), v.item(b)
    q0, R0 = (1.0 - c) / c, bb / (c * c)
    p_a, p_b = w_a / c, w_b / c
    p_aa, p_ab, p_bb = SM.item(a, a) + w_a * w_a / c, SM.item(a, b) + w_a * w_b / c, SM.item(b, b) + w_b * w_b / c
    l_a, l_b = -(mb_a + w_a * bb / c) / c, -(mb_b + w_b * bb / c) / c
    g_aa = G_aa + w_a * (2.0 * mb_a + w_a * bb / c) / c
    g_bb = G_bb + w_b * (2.0 * mb_b + w_b * bb / c) / c
    g_ab = G_ab + (w_a * mb_b + w_b * mb_a + w_a * w_b * bb / c) / c
    log_in, log_out = _log_fractions(n)
    in_a, out_a, in_b, out_b = log_in[int(m_a)], log_out[int(m_a)], log_in[int(m_b)], log_out[int(m_b)]
    q_a, R_a = q0 + 2.0 * p_a + p_aa, R0 - 2.0 * l_a + g_aa              # a only
    q_b, R_b = q0 + 2.0 * p_b + p_bb, R0 - 2.0 * l_b + g_bb              # b only
    q_ab, R_ab = q_a + 2.0 * (p_b + p_ab) + p_bb, R_a - 2.0 * (l_b - g_ab) + g_bb   # both
    half_d, log1p = 0.5 * d, math.log1p
    return [in_a + out_b - half_d * log1p(q_a) - R_a / (two_var * (1.0 + q_a)),
            out_a + in_b - half_d * log1p(q_b) - R_b / (two_var * (1.0 + q_b)),
            in_a + in_b - half_d * log1p(q_ab) - R_ab / (two_var * (1.0 + q_ab))]


@lru_cache(maxsize=8)
def _log_fractions(n: int) -> tuple[list[float], list[float]]:
    """log(m / N) and log(1 - m / N) for m = 0..N (-inf at the ends): the IBP odds of a split's rows
    (read only; cached per N)."""
    inside = [math.log(m / n) if m else -math.inf for m in range(n + 1)]
    outside = [math.log(1.0 - m / n) if m < n else -math.inf for m in range(n + 1)]
    return inside, outside


def _reassign(SM: np.ndarray, v: np.ndarray, c: float, z: np.ndarray, cols: tuple[int, int],
              delta: tuple[int, int]) -> None:
    """Update SM = [W^{-1} | M] in place for a row whose z gained delta = (delta_a, delta_b) in columns cols.

    v and c are the row's ``_row_vector`` and 1 - z W^{-1} z^T before the change, z the row after it.
    The row is removed (SM + w v / c, w = W^{-1} z^T) and added back with z' = z + delta, whose vector
    against the removed SM is v' = v (1 + delta w_{a,b}) / c + delta SM_{a,b} (two rank-one RLS updates).
    """
    a, b = cols
    da, db = delta
    v_new = v * ((1.0 + da * v.item(a) + db * v.item(b)) / c)
    if da:
        v_new += SM[a]
    if db:
        v_new += SM[b]
    c_new = 1.0 + float(v_new[:SM.shape[0]].dot(z))
    _update(SM, v, c, -1.0)
    _update(SM, v_new, c_new, 1.0)


def _allocate(X: np.ndarray, Z: np.ndarray, cols: tuple[int, int], rows: np.ndarray, sigma_x: float,
              sigma_a: float, rng: np.random.Generator, given: np.ndarray | None = None) -> float:
    """Sequential allocation of a split (Dahl 2003; Jain & Neal 2004, adapted to the IBP as in paper 003).

    Z (float, modified in place) holds the anchors, row i in column a = cols[0] and row j in
    column b = cols[1], and ``rows`` (the other rows of the feature being split) in neither. Each row
    r of ``rows`` in turn goes to a only, b only or both (delta = (1, 0), (0, 1), (1, 1) added to
    z_r) with probability proportional to the IBP odds of the current counts, (m_a / N or
    1 - m_a / N) (m_b / N or 1 - m_b / N), times the predictive density of x_r given the rows
    allocated so far (module docstring), from q and the residual of z_r without a and b by the
    same scalar updates as in ``_sample_existing`` (``_option_log_weights``). With ``given`` (one
    option index per row) the allocation is scored instead of drawn (one uniform per row
    otherwise). Returns log q, the log probability of the allocation.
    """
    n = X.shape[0]
    k = Z.shape[1]
    a, b = cols
    two_var = 2.0 * sigma_x ** 2
    W_inv, M, _ = feature_posterior(Z, X, sigma_x, sigma_a)
    SM = np.hstack([W_inv, M])
    m_a, m_b = float(Z[:, a].sum()), float(Z[:, b].sum())
    choices = given.tolist() if given is not None else None
    uniforms = rng.random(rows.size).tolist() if given is None else None
    log_q = 0.0
    for t, r in enumerate(rows.tolist()):
        z = Z[r]
        v = _row_vector(SM, z, X[r])
        c = 1.0 - float(v[:k].dot(z))
        log_w = _option_log_weights(SM, v, c, cols, m_a, m_b, n, two_var)
        top, weights, total = categorical_weights(log_w)
        choice = categorical_index(weights, total, uniforms[t]) if choices is None else choices[t]
        log_q += log_w[choice] - (top + math.log(total))
        da, db = _OPTIONS[choice]
        z[a], z[b] = da, db
        m_a, m_b = m_a + da, m_b + db
        _reassign(SM, v, c, z, cols, (da, db))
    return log_q


def split_merge(X: np.ndarray, Z: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                rng: np.random.Generator) -> np.ndarray:
    """One split-merge Metropolis-Hastings move on Z (N x K+, bool), exact for P([Z]) p(X | Z) (eqs. 2, 6).

    After Meeds et al. 2007 (paper 003, Sec. 3.3): an ordered pair of
    rows i != j is drawn uniformly, then a feature k of row i and a feature l of row j, uniformly.
    If k = l, feature k is split into a (holding i) and b (holding j), the other rows of k
    allocated by ``_allocate``; if k != l, features k and l are merged into their union (only when
    i lacks l and j lacks k, otherwise no split could undo it and nothing is proposed).

    Ratio: on column-exchangeable matrices the prior of eq. 2 is alpha^K+ / K+! prod_k f(m_k),
    f(m) = (N - m)! (m - 1)! / N!; drawing the new column's position uniformly (1 / (K+ + 1))
    cancels the factorials, and the move changes neither row i's nor row j's number of features,
    so the feature choices cancel too. For a split (Z_m merged, Z_s split, allocation probability q)
    log R = log alpha + log f(m_a) + log f(m_b) - log f(m_k) + log p(X | Z_s) - log p(X | Z_m) - log q,
    accepted with probability min(1, R) for a split and min(1, 1 / R) for a merge. Returns the new Z.
    """
    n = X.shape[0]
    if n < 2:
        return Z     # no pair of rows to split or merge by
    i, j = rng.choice(n, size=2, replace=False)
    own_i, own_j = np.flatnonzero(Z[i]), np.flatnonzero(Z[j])
    if not own_i.size or not own_j.size:
        return Z
    k, l = int(rng.choice(own_i)), int(rng.choice(own_j))
    if k != l and (Z[i, l] or Z[j, k]):
        return Z
    if k == l:
        merged, split = Z, np.hstack([Z, np.zeros((n, 1), bool)])
        cols = (k, Z.shape[1])
    else:
        merged, split = np.delete(Z, l, axis=1), Z
        merged[:, k if k < l else k - 1] |= Z[:, l]
        cols = (k, l)
    union = split[:, cols].any(axis=1)
    rows = rng.permutation(np.flatnonzero(union & (np.arange(n) != i) & (np.arange(n) != j)))
    start = split.astype(np.float64)
    start[:, cols] = 0.0
    start[i, cols[0]] = start[j, cols[1]] = 1.0
    if k == l:
        log_q = _allocate(X, start, cols, rows, sigma_x, sigma_a, rng)
        split = start > 0
    else:
        given = split[rows][:, cols].astype(np.int64) @ np.array([1, 2]) - 1   # a only 0, b only 1, both 2
        log_q = _allocate(X, start, cols, rows, sigma_x, sigma_a, rng, given)
    m_split = split[:, cols].sum(axis=0)
    log_ratio = (math.log(alpha) + _log_feature_prior(m_split, n) - _log_feature_prior(union.sum(keepdims=True), n)
                 + collapsed_log_likelihood(X, split, sigma_x, sigma_a)
                 - collapsed_log_likelihood(X, merged, sigma_x, sigma_a) - log_q)
    accept = rng.random() < math.exp(min(0.0, log_ratio if k == l else -log_ratio))
    return (split if k == l else merged) if accept else Z


def exchange(X: np.ndarray, Z: np.ndarray, sigma_x: float, sigma_a: float, rng: np.random.Generator) -> np.ndarray:
    """One exchange Metropolis-Hastings move on Z (N x K+, bool), exact for P([Z]) p(X | Z) (eqs. 2, 6): the rows
    of two features are divided between them afresh, K+ unchanged.

    It undoes a wrong basis that neither single entries nor ``split_merge`` can leave in one step, e.g. the
    columns "T or R" and "T but not R" where the data hold T and R (a move of 100 entries or more). An ordered
    pair of rows i != j is drawn uniformly, then a feature k of row i and a feature l != k of row j, uniformly
    (k = l: nothing is proposed). Rows i and j keep their entries; the other rows of k or l are allocated
    afresh to k only, l only or both by ``_allocate`` (k as a, l as b), in a random order. The choices of i, j,
    k, l and the order have the same probability from the proposed Z (i and j keep their features), so with
    the allocation probabilities q of the proposed and the current columns and f of ``_log_feature_prior``
    log R = log f(m'_k) + log f(m'_l) - log f(m_k) - log f(m_l) + log p(X | Z') - log p(X | Z)
            + log q(current) - log q(proposed),
    accepted with probability min(1, R). Returns the new Z.
    """
    n = X.shape[0]
    if n < 2:
        return Z
    i, j = rng.choice(n, size=2, replace=False)
    own_i, own_j = np.flatnonzero(Z[i]), np.flatnonzero(Z[j])
    if not own_i.size or not own_j.size:
        return Z
    k, l = int(rng.choice(own_i)), int(rng.choice(own_j))
    if k == l:
        return Z
    cols = (k, l)
    rows = rng.permutation(np.flatnonzero(Z[:, cols].any(axis=1) & (np.arange(n) != i) & (np.arange(n) != j)))
    start = Z.astype(np.float64)
    start[np.ix_(rows, cols)] = 0.0
    given = Z[rows][:, cols].astype(np.int64) @ np.array([1, 2]) - 1   # k only 0, l only 1, both 2
    log_q_current = _allocate(X, start.copy(), cols, rows, sigma_x, sigma_a, rng, given)
    log_q_proposed = _allocate(X, start, cols, rows, sigma_x, sigma_a, rng)
    proposed = start > 0
    log_ratio = (_log_feature_prior(proposed[:, cols].sum(axis=0), n) - _log_feature_prior(Z[:, cols].sum(axis=0), n)
                 + collapsed_log_likelihood(X, proposed, sigma_x, sigma_a)
                 - collapsed_log_likelihood(X, Z, sigma_x, sigma_a) + log_q_current - log_q_proposed)
    return proposed if rng.random() < math.exp(min(0.0, log_ratio)) else Z


def recombine(X: np.ndarray, Z: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
              rng: np.random.Generator) -> np.ndarray:
    """One recombination Metropolis-Hastings move on Z (N x K+, bool), exact for P([Z]) p(X | Z) (eqs. 2, 6):
    three columns c, a, b become two, f and g, or back, in one of three forms drawn with probability 1/3.

    It leaves the modes where two true features f and g are held as three columns, which neither single
    entries nor split-merge or exchange moves leave through a likely state (docs/models/gibbs.md):
    - the joint form, where rows with both use a column c of their own (values f + g) beside an f-only
      column a and a g-only column b (f = a | c, g = b | c);
    - the union form, where c holds the rows with either (values f + g), a those with f only (values -g) and
      b those with g only (values -f) (f = c & ~b, g = c & ~a; rows in a and b both hold neither);
    - the carried form, where the column of g carries f too (c = g, values f + g), a holds the rows of g
      without f (values -f) and b those of f without g (values f) (f = b | c & ~a, g = c).
    With probability 1/2 a column is to go: c uniformly of the K+ columns, then an ordered pair (a, b)
    uniformly of the others, and nothing is proposed unless a and b lie outside c (joint), inside it (union),
    or a inside and b outside (carried), and f and g are not empty. Otherwise a column is to come from an
    ordered pair (f, g) drawn uniformly: in the joint and union forms each of the m eligible rows (those of
    f & g in the joint form, of neither in the union form) joins a set S with probability 1/2, and c = S,
    a = f & ~S, b = g & ~S (joint) or c = f | g | S, a = f & ~g | S, b = g & ~f | S (union); in the carried
    form c = g, a = g & ~f, b = f & ~g (m = 0). c goes last (as all moves treat the columns exchangeably, the
    same as a uniform one of the K+ + 1 positions); nothing is proposed if c, a or b is empty. Each form's two
    maps are inverse, with proposal probabilities 1 / (6 K (K - 1) (K - 2)) for the removal from K columns and
    that times 2^-m for its reverse. With the prior of eq. 2 on column-exchangeable matrices,
    alpha^K+ / K+! prod_k f(m_k) (``split_merge``), the removal has
    log R = log K - log alpha - m log 2 + sum of log f(m_k) over f, g - the same over c, a, b
            + log p(X | Z_two) - log p(X | Z_three),
    accepted with probability min(1, R); an addition is its reverse, accepted with min(1, 1 / R).
    Returns the new Z.
    """
    proposal = _recombination(X, Z, alpha, sigma_x, sigma_a, rng)
    if proposal is None:
        return Z
    proposed, log_ratio = proposal
    return proposed if rng.random() < math.exp(min(0.0, log_ratio)) else Z


JOINT, UNION, CARRIED = range(3)   # the forms of ``recombine``


def _two_of_three(form: int, z_c: np.ndarray, z_a: np.ndarray,
                  z_b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The features (f, g) that columns c, a, b hold in ``form`` (``recombine``); None if they are not in it."""
    if form == JOINT:
        return None if ((z_a | z_b) & z_c).any() else (z_a | z_c, z_b | z_c)
    if form == UNION:
        return None if ((z_a | z_b) & ~z_c).any() else (z_c & ~z_b, z_c & ~z_a)
    return None if (z_a & ~z_c).any() or (z_b & z_c).any() else (z_b | z_c & ~z_a, z_c)


def _eligible(form: int, f: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The rows whose place is drawn when features f, g become three columns in ``form`` (``recombine``): those
    of f & g in the joint form, of neither in the union form, none in the carried form."""
    if form == CARRIED:
        return np.zeros_like(f)
    return f & g if form == JOINT else ~(f | g)


def _three_of_two(form: int, f: np.ndarray, g: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns c, a, b holding features f, g in ``form`` (``recombine``), each ``_eligible`` row joining S with
    probability 1/2."""
    if form == CARRIED:
        return g, g & ~f, f & ~g
    chosen = _eligible(form, f, g) & (rng.random(len(f)) < 0.5)
    if form == JOINT:
        return chosen, f & ~chosen, g & ~chosen
    return f | g | chosen, f & ~g | chosen, g & ~f | chosen


def _recombination(X: np.ndarray, Z: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, float] | None:
    """The proposal of ``recombine`` and its log acceptance ratio (log R of a removal, -log R of an addition);
    None when nothing is proposed."""
    n, k = Z.shape
    remove, form = rng.random() < 0.5, int(3 * rng.random())
    if remove:
        if k < 3:
            return None
        c = int(rng.integers(k))
        pair = rng.choice(np.delete(np.arange(k), c), size=2, replace=False)
        features = _two_of_three(form, Z[:, c], Z[:, pair[0]], Z[:, pair[1]])
        if features is None or not (features[0].any() and features[1].any()):
            return None
        f, g = features
        three, two = Z, Z.copy()
        two[:, pair[0]], two[:, pair[1]] = f, g
        two = np.delete(two, c, axis=1)
    else:
        if k < 2:
            return None
        pair = rng.choice(k, size=2, replace=False)
        f, g = Z[:, pair[0]], Z[:, pair[1]]
        z_c, z_a, z_b = _three_of_two(form, f, g, rng)
        if not (z_c.any() and z_a.any() and z_b.any()):
            return None
        two, three = Z, np.column_stack([Z, z_c])
        three[:, pair[0]], three[:, pair[1]] = z_a, z_b
    log_ratio = (math.log(three.shape[1]) - math.log(alpha) - _eligible(form, f, g).sum() * math.log(2.0)
                 + _log_feature_prior(two.sum(axis=0), n) - _log_feature_prior(three.sum(axis=0), n)
                 + collapsed_log_likelihood(X, two, sigma_x, sigma_a)
                 - collapsed_log_likelihood(X, three, sigma_x, sigma_a))
    return (two, log_ratio) if remove else (three, -log_ratio)


def sample_features(X: np.ndarray, Z: np.ndarray, sigma_x: float, sigma_a: float,
                    rng: np.random.Generator) -> np.ndarray:
    """A ~ p(A | Z, X): columns N(W^{-1} Z^T x_d, sigma_X^2 W^{-1}) (the conjugate posterior behind eq. 6)."""
    W_inv, M, _ = feature_posterior(Z, X, sigma_x, sigma_a)
    return M + sigma_x * np.linalg.cholesky(W_inv) @ rng.standard_normal(M.shape)


def sample_sigmas(X: np.ndarray, state: LGGibbsState, A: np.ndarray, prior: LGHyperPrior,
                  rng: np.random.Generator) -> LGGibbsState:
    """sigma_X and sigma_A given A ~ p(A | Z, X): 1/sigma_X^2 ~ Gamma(a + ND/2, b + |X - ZA|^2/2)
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
                observed: np.ndarray | None = None, split_merge_moves: int = 0,
                recombine_moves: int = 0) -> LGGibbsState:
    """One sweep of collapsed Gibbs over all rows, then ``split_merge_moves`` split-merge moves
    (``split_merge``) and ``recombine_moves`` recombination moves (``recombine``), then the hyperparameters
    and imputations.

    ``max_new`` truncates the number of new features per row; ``observed`` (N x D bool) marks the
    entries that are data (the others are imputed). Returns the new state.
    """
    X = _completed(X, state, observed)
    Z = gibbs_rows(X, state, range(X.shape[0]), max_new, rng)
    for _ in range(split_merge_moves):
        Z = split_merge(X, Z, state.alpha, state.sigma_x, state.sigma_a, rng)
    for _ in range(recombine_moves):
        Z = recombine(X, Z, state.alpha, state.sigma_x, state.sigma_a, rng)
    state = replace(state, Z=Z)
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

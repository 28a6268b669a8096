"""Particle filter for the infinite noisy-OR binary model (paper 001, Algorithm 3, eqs. 8-11).

Model: X (N x D) binary, Z ~ IBP(alpha), Y (K+ x D) iid Bern(p),
P(x_id = 1 | Z, Y) = 1 - (1 - eps) (1 - lambda)^(z_i . y_:d)          (eq. 8).
A particle holds Z and Y. For row i the K_new new rows of Y are summed out for the weight,
P(x_id = 1) = 1 - (1 - eps) (1 - lambda)^eta_d (1 - lambda p)^K_new   (eq. 11, eta_d = z_i . y_:d),
and then drawn from their posterior given x_i. Drawing them in the same step as the weight (before
the caller resamples) gives the same joint distribution as Alg. 3, which draws them after
resampling, and keeps the per-row protocol identical to the linear-Gaussian filter.

Block layout (``NoisyORParticles``, extending ``IBPParticles``): Z (L, N, Kc) bool, m (L, Kc)
int64, Y (L, Kc, D) bool (zero rows for padding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.special import gammaln

from .ibp_prior import IBPParticles, propose_ibp_row


@dataclass(frozen=True)
class NoisyORParams:
    """Noisy-OR parameters (paper 001, Sec. 5): p = P(y_kd = 1), lam = lambda, eps = epsilon."""

    p: float = 0.1
    lam: float = 0.9
    eps: float = 0.01

    def out_of_range(self) -> str | None:
        """What is wrong if a parameter lies outside (0, 1), where eq. 8 is a probability model; None if
        none does."""
        for name in ("p", "lam", "eps"):
            if not 0.0 < getattr(self, name) < 1.0:
                return f"{name} must be in (0, 1), got {getattr(self, name)}"
        return None


@dataclass(frozen=True)
class NoisyORParticles(IBPParticles):
    """A block of noisy-OR particles (module docstring for the array layout)."""

    Y: np.ndarray

    FEATURE_AXES: ClassVar[dict[str, tuple[int, ...]]] = {"Z": (2,), "m": (1,), "Y": (1,)}


def init_noisy_or_particles(n_particles: int, n_rows: int, n_cols: int) -> NoisyORParticles:
    """An empty block (paper 001 Alg. 3 line 1)."""
    return NoisyORParticles(Z=np.zeros((n_particles, n_rows, 0), bool), m=np.zeros((n_particles, 0), np.int64),
                            n_rows=0, Y=np.zeros((n_particles, 0, n_cols), bool))


def log_lik_entries(x: np.ndarray, eta: np.ndarray, params: NoisyORParams,
                    n_new: np.ndarray | int = 0) -> np.ndarray:
    """log P(x | eta, K_new) per entry, eqs. 8 and 11 (broadcasting over x, eta, n_new).

    log P(x = 0) = log(1 - eps) + eta log(1 - lambda) + K_new log(1 - lambda p).
    """
    log_off = np.log1p(-params.eps) + eta * np.log1p(-params.lam) + n_new * np.log1p(-params.lam * params.p)
    return np.where(x, np.log(-np.expm1(log_off)), log_off)


def row_log_lik(x: np.ndarray, eta: np.ndarray, params: NoisyORParams, n_new: np.ndarray | int = 0,
                observed: np.ndarray | None = None) -> np.ndarray:
    """log P(x_i | eta, K_new) summed over the observed entries of the row (eq. 11); eta (..., D)."""
    entries = log_lik_entries(x, eta, params, n_new)
    return (entries if observed is None else np.where(observed, entries, 0.0)).sum(axis=-1)


UNOBSERVED = 2   # the x_d code of a missing entry in ``entry_tables``


def entry_tables(params: NoisyORParams, max_eta: int, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-entry tables over x_d in {0, 1, UNOBSERVED}, eta_d = 0..max_eta, K_new = 0..top (eq. 11; Alg. 3 line 10).

    log_marginal (3, E, T): log P(x_d | eta_d, K_new), the new rows of Y summed out (0 if missing);
    cdf (top + 1, 3, E, T): CDF over c = 0..top of the number of ones among the column's K_new new
    entries, P(c) prop. to Binom(c; K_new, p) P(x_d | eta_d + c). Tables instead of per-entry
    transcendental functions: a row of a block costs a few gathers whatever L and D.
    """
    x = np.arange(2)[:, None, None].astype(bool)
    eta = np.arange(max_eta + 1)[:, None]
    n = np.arange(top + 1)
    log_marginal = np.concatenate([log_lik_entries(x, eta, params, n), np.zeros((1, max_eta + 1, top + 1))])
    c = np.arange(top + 1)[:, None, None, None]
    log_binom = gammaln(n + 1) - gammaln(c + 1) - gammaln(np.maximum(n - c, 0) + 1) \
        + c * np.log(params.p) + (n - c) * np.log1p(-params.p)                      # (top+1, 1, 1, T)
    log_lik = np.concatenate([log_lik_entries(x, eta + c, params), np.zeros((top + 1, 1, max_eta + 1, 1))], axis=1)
    log_post = np.where(c <= n, log_binom + log_lik, -np.inf)
    cumulative = np.cumsum(np.exp(log_post - log_post.max(axis=0)), axis=0)
    return log_marginal, cumulative / cumulative[-1]   # the last entry exactly 1, so a count never exceeds K_new


def entry_index(x: np.ndarray, eta: np.ndarray, n_new: np.ndarray, observed: np.ndarray | None,
                max_eta: int, top: int) -> np.ndarray:
    """Flat index (L, D) of (x_d, eta_ld, K_new_l) into the last three axes of ``entry_tables``."""
    code = x.astype(np.int64) if observed is None else np.where(observed, x, UNOBSERVED)
    return (code * (max_eta + 1) + eta) * (top + 1) + n_new[:, None]


def draw_new_rows(cdf: np.ndarray, index: np.ndarray, n_new: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The K_new new rows of Y of particles with ``index`` (L, D) into ``entry_tables`` (Alg. 3 line 10).

    Per column the number of ones c is drawn from its CDF and the c ones are put at uniformly random
    new rows (selection sampling), only for the entries with c > 0 (few: most columns of x_i are 0).
    Returns (L, max K_new, D) bool, rows j >= K_new_l zero.
    """
    top = int(n_new.max(initial=0))
    count = (np.take(cdf.reshape(cdf.shape[0], -1), index, axis=1) <= rng.random(index.shape)).sum(axis=0)
    out = np.zeros((index.shape[0], top, index.shape[1]), bool)
    particle, column = np.nonzero(count)
    count, n = count[particle, column], n_new[particle]
    for j in range(top):
        out[particle, j, column] = pick = (rng.random(count.size) * (n - j) < count) & (j < n)
        count = count - pick
    return out


def sample_new_feature_rows(x: np.ndarray, eta: np.ndarray, n_new: np.ndarray, params: NoisyORParams,
                            rng: np.random.Generator, observed: np.ndarray | None = None) -> np.ndarray:
    """Draw the K_new new rows of Y from their posterior given x_i (paper 001 Alg. 3 line 10).

    Per column d the new entries are exchangeable, so their number of ones c is drawn from
    P(c) prop. to Binom(c; K_new, p) P(x_id | eta_d + c) and the c ones are put at uniformly random
    new rows (``entry_tables``, ``draw_new_rows``). x (D,), eta (L, D), n_new (L,); returns
    (L, max K_new, D) bool, rows j >= K_new_l zero. Only particles with K_new > 0 cost anything.
    """
    top = int(n_new.max(initial=0))
    out = np.zeros((n_new.size, top, x.size), bool)
    has = np.flatnonzero(n_new)
    if has.size:
        max_eta = int(eta[has].max(initial=0))
        _, cdf = entry_tables(params, max_eta, top)
        out[has] = draw_new_rows(cdf, entry_index(x, eta[has], n_new[has], observed, max_eta, top), n_new[has], rng)
    return out


def pf_noisy_or_step(block: NoisyORParticles, x: np.ndarray, alpha: float, params: NoisyORParams,
                     rng: np.random.Generator,
                     observed: np.ndarray | None = None) -> tuple[NoisyORParticles, np.ndarray]:
    """Propagate a block of particles through the next row x (D,) of 0/1 (paper 001, Algorithm 3).

    Z row from the IBP conditional, log-weight log P(x_i | z_i, Y, K_new) with the new Y rows
    summed out (eq. 11), then the new Y rows drawn from their posterior given x_i. Returns the
    new block and the incremental log-weights (L,).
    """
    x = np.asarray(x, bool)
    grown, new = propose_ibp_row(block, alpha, rng, spare=True)
    k_new = np.count_nonzero(new, axis=1)
    eta = np.einsum("lk,lkd->ld", grown.Z[:, grown.n_rows - 1].view(np.uint8),
                    grown.Y.view(np.uint8))                      # (L, D) uint8; new rows of Y are still zero
    max_eta, top = int(eta.max(initial=0)), int(k_new.max(initial=0))
    log_marginal, cdf = entry_tables(params, max_eta, top)
    index = entry_index(x, eta, k_new, observed, max_eta, top)
    log_w = np.take(log_marginal, index).sum(axis=1)
    if top == 0:
        return grown, log_w
    has = np.flatnonzero(k_new)
    Y = grown.Y.copy()
    Y[new] = draw_new_rows(cdf, index[has], k_new[has], rng)[np.arange(top) < k_new[has, None]]
    return dataclasses.replace(grown, Y=Y), log_w

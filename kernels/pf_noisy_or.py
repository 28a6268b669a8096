"""Particle filter for the infinite noisy-OR binary model (SPEC 3.3; paper 001 Alg. 3, eqs. 8-11).

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

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.special import gammaln

from .ibp_prior import IBPParticles, propose_ibp_row


@dataclass(frozen=True)
class NoisyORParams:
    """Noisy-OR parameters (paper 001 section 5): p = P(y_kd = 1), lam = lambda, eps = epsilon."""

    p: float = 0.1
    lam: float = 0.9
    eps: float = 0.01


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


def sample_new_feature_rows(x: np.ndarray, eta: np.ndarray, n_new: np.ndarray, params: NoisyORParams,
                            rng: np.random.Generator, observed: np.ndarray | None = None) -> np.ndarray:
    """Draw the K_new new rows of Y from their posterior given x_i (paper 001 Alg. 3 line 10).

    Per column d the new entries are exchangeable, so their number of ones c is drawn from
    P(c) prop. to Binom(c; K_new, p) P(x_id | eta_d + c) and the c ones are put at uniformly random
    new rows. x (D,), eta (L, D), n_new (L,); returns (L, max K_new, D) bool, rows j >= K_new_l zero.
    Only particles with K_new > 0 cost anything.
    """
    top = int(n_new.max(initial=0))
    out = np.zeros((n_new.size, top, x.size), bool)
    has = np.flatnonzero(n_new)
    if has.size == 0:
        return out
    c = np.arange(top + 1)
    nn = n_new[has, None, None]
    log_binom = gammaln(nn + 1) - gammaln(c + 1) - gammaln(np.maximum(nn - c, 0) + 1) \
        + c * np.log(params.p) + (nn - c) * np.log1p(-params.p)
    log_lik = log_lik_entries(x[:, None], eta[has, :, None] + c, params)
    if observed is not None:
        log_lik = np.where(observed[:, None], log_lik, 0.0)
    log_post = np.where(c <= nn, log_binom + log_lik, -np.inf)                    # (L', D, top+1)
    cdf = np.cumsum(np.exp(log_post - log_post.max(axis=-1, keepdims=True)), axis=-1)
    count = (rng.random(cdf.shape[:2])[..., None] * cdf[..., -1:] >= cdf).sum(axis=-1)  # (L', D)
    n = nn[:, :, 0]
    for j in range(top):                 # selection sampling: a uniform subset of size count
        pick = (rng.random(count.shape) * (n - j) < count) & (j < n)
        out[has, j] = pick
        count = count - pick
    return out


def pf_noisy_or_step(block: NoisyORParticles, x: np.ndarray, alpha: float, params: NoisyORParams,
                     rng: np.random.Generator,
                     observed: np.ndarray | None = None) -> tuple[NoisyORParticles, np.ndarray]:
    """Propagate a block of particles through the next row x (D,) of 0/1 (SPEC 3.3; Alg. 3).

    Z row from the IBP conditional, log-weight log P(x_i | z_i, Y, K_new) with the new Y rows
    summed out (eq. 11), then the new Y rows drawn from their posterior given x_i. Returns the
    new block and the incremental log-weights (L,).
    """
    x = np.asarray(x, bool)
    grown, (particle, feature, j) = propose_ibp_row(block, alpha, rng)
    z = grown.Z[:, grown.n_rows - 1]
    k_new = np.bincount(particle, minlength=grown.n_particles)
    eta = (grown.Y & z[:, :, None]).sum(axis=1)                  # new rows of Y are still zero
    log_w = row_log_lik(x, eta, params, k_new[:, None], observed)
    grown.Y[particle, feature] = sample_new_feature_rows(x, eta, k_new, params, rng, observed)[particle, j]
    return grown, log_w

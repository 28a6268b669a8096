"""Collapsed particle filter for the infinite linear-Gaussian model (paper 001, Algorithm 2).

Model: X = Z A + noise, noise iid N(0, sigma_X^2), A (K+ x D) iid N(0, sigma_A^2), Z ~ IBP(alpha).
A is integrated out: each particle carries the Gaussian posterior of A given its Z and the rows
seen so far (``lg_particles``: mean M, K x D, and covariance S, K x K, the same for every column when
rows are fully observed). One row costs O(K^2 + K D) per particle; the growing N x N matrix of the
paper's eq. 7 is never formed. z_i comes from a named proposal (``pf_proposals``: the paper's IBP
prior, or "guided" by x_i), and the weight is the exact importance weight of eq. 5 for it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .ibp_prior import append_row
from .lg_particles import LGParticles
from .pf_proposals import PROPOSALS, row_log_density


def _diagonal(S: np.ndarray) -> np.ndarray:
    """Writable view of the diagonals of a fresh, contiguous stack of square matrices (..., K, K) -> (..., K)."""
    k = S.shape[-1]
    return S.reshape(*S.shape[:-2], k * k)[..., ::k + 1]


def kalman_row_update(z: np.ndarray, new: np.ndarray, M: np.ndarray, S: np.ndarray, x: np.ndarray, sigma_x: float,
                      sigma_a: float, observed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predictive log-density of row x and the RLS update of (M, S) for every particle.

    The new features (``new``, a subset of z) enter with prior variance sigma_A^2:
    S' = S + sigma_A^2 diag(new) (their rows of M and S are zero padding). Then
    s = sigma_X^2 + z S' z^T, log-weight = sum_{d observed} log N(x_d; z M_d, s_d);
    g = S' z^T / s, M += g (x - z M), S = S' - g z S' (the S' - g z S' part only for observed columns).
    Shapes: z, new (L, K) bool, M (L, K, D), S (L, G, K, K) with G in {1, D}, x (D,), observed (D,)
    bool or None (all observed). Returns (log-weights (L,), M, S), new arrays.
    """
    if not (S.shape[1] == x.size or observed is None or observed.all()):
        raise ValueError("missing entries need one covariance per column (init_lg_particles(per_column=True))")
    zf = z.astype(np.float64)
    prior_var = sigma_a ** 2 * new
    Sz = (S @ zf[:, None, :, None])[..., 0] + prior_var[:, None, :]                # S' z^T (L, G, K)
    s = sigma_x ** 2 + np.einsum("lgk,lk->lg", Sz, zf)                               # (L, G)
    r = x - (zf[:, None, :] @ M)[:, 0]                                                # (L, D)
    if observed is not None:
        r = np.where(observed, r, 0.0)
    log_w = row_log_density(r, s, observed)
    g = Sz / s[..., None]
    S_new = g[..., :, None] * Sz[..., None, :]
    if observed is not None and S.shape[1] > 1:
        S_new *= observed[:, None, None]
    np.subtract(S, S_new, out=S_new)
    _diagonal(S_new)[...] += prior_var[:, None, :]
    M_new = g.transpose(0, 2, 1) * r[:, None, :]        # one (L, K, D) array, updated in place
    M_new += M
    return log_w, M_new, S_new


def pf_linear_gaussian_step(block: LGParticles, x: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                            rng: np.random.Generator, observed: np.ndarray | None = None,
                            proposal: str = "prior") -> tuple[LGParticles, np.ndarray]:
    """Propagate a block of particles through the next row x (D,) (paper 001, Algorithm 2).

    Draws z_i from ``proposal`` (``pf_proposals``: "prior" is the paper's IBP conditional), gives
    new features M rows 0 and prior variance sigma_A^2 in S, weights by
    log N(x_i; z_i M, (sigma_X^2 + z_i S z_i^T) I) (= eq. 7) plus the proposal's
    log p(z_i | past) - log q(z_i) (eq. 5) and applies the RLS update. The feature axes grow by
    doubling (``ibp_prior.feature_capacity``). Returns the new block and the incremental
    log-weights (L,). Resampling is the caller's job (``resampling``), across all blocks.
    """
    x = np.asarray(x, np.float64)
    z_old, k_new, log_ratio = PROPOSALS[proposal](block, x, alpha, sigma_x, sigma_a, rng, observed)
    grown, new = append_row(block, z_old, k_new, spare=True)
    log_w, M, S = kalman_row_update(grown.Z[:, grown.n_rows - 1], new, grown.M, grown.S, x, sigma_x, sigma_a,
                                    observed)
    return dataclasses.replace(grown, M=M, S=S), log_w + log_ratio

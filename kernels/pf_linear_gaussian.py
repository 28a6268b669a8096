"""Collapsed particle filter for the infinite linear-Gaussian model (SPEC 3.3; paper 001 Alg. 2).

Model: X = Z A + noise, noise iid N(0, sigma_X^2), A (K+ x D) iid N(0, sigma_A^2), Z ~ IBP(alpha).
A is integrated out: each particle carries the Gaussian posterior of A given its Z and the rows
seen so far, mean M (K x D) and covariance S (K x K, the same for every column when rows are
fully observed). One row costs O(K^2 + K D) per particle; the growing N x N matrix of the
paper's eq. 7 is never formed. z_i comes from a named proposal (``pf_proposals``: the paper's IBP
prior, or "guided" by x_i), and the weight is the exact importance weight of eq. 5 for it.

Block layout (``LGParticles``, extending ``IBPParticles``):
    Z (L, N, Kc) bool, m (L, Kc) int64   -- see ``ibp_prior``
    M (L, Kc, D) float64                 -- posterior mean of A; zero rows for padding
    S (L, G, Kc, Kc) float64             -- posterior covariance of the columns of A; G = 1 when
                                            it is shared by all columns, G = D with missing entries
Padding columns have zero rows/columns in M and S, so they never enter z S z^T or z M.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .ibp_prior import IBPParticles
from .pf_proposals import PROPOSALS, append_row, row_log_density


@dataclass(frozen=True)
class LGParticles(IBPParticles):
    """A block of linear-Gaussian particles (module docstring for the array layout)."""

    M: np.ndarray
    S: np.ndarray

    FEATURE_AXES: ClassVar[dict[str, tuple[int, ...]]] = {"Z": (2,), "m": (1,), "M": (1,), "S": (2, 3)}


def init_lg_particles(n_particles: int, n_rows: int, n_cols: int, per_column: bool = False) -> LGParticles:
    """An empty block (SPEC 3.3). ``per_column=True`` keeps one S per column (needed with masks)."""
    n_cov = n_cols if per_column else 1
    return LGParticles(Z=np.zeros((n_particles, n_rows, 0), bool), m=np.zeros((n_particles, 0), np.int64),
                       n_rows=0, M=np.zeros((n_particles, 0, n_cols)),
                       S=np.zeros((n_particles, n_cov, 0, 0)))


def kalman_row_update(z: np.ndarray, M: np.ndarray, S: np.ndarray, x: np.ndarray, sigma_x: float,
                      observed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predictive log-density of row x and the RLS update of (M, S) for every particle (SPEC 3.3).

    s = sigma_X^2 + z S z^T, log-weight = sum_{d observed} log N(x_d; z M_d, s_d);
    g = S z^T / s, M += g (x - z M), S -= g z S (only for observed columns).
    Shapes: z (L, K) float, M (L, K, D), S (L, G, K, K) with G in {1, D}, x (D,), observed (D,) bool
    or None (all observed). Returns (log-weights (L,), M, S).
    """
    per_column = S.shape[1] == x.size
    observed = np.ones(x.size, bool) if observed is None else observed
    if not (per_column or observed.all()):
        raise ValueError("missing entries need one covariance per column (init_lg_particles(per_column=True))")
    Sz = (S @ z[:, None, :, None])[..., 0]                      # (L, G, K)
    s = sigma_x ** 2 + np.einsum("lgk,lk->lg", Sz, z)           # (L, G)
    r = np.where(observed, x - np.einsum("lk,lkd->ld", z, M), 0.0)  # (L, D)
    log_w = row_log_density(r, s, observed)
    g = Sz / s[..., None]
    keep = observed[:, None, None] if per_column else True
    return log_w, M + g.transpose(0, 2, 1) * r[:, None, :], S - keep * (g[..., :, None] * Sz[..., None, :])


def pf_linear_gaussian_step(block: LGParticles, x: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                            rng: np.random.Generator, observed: np.ndarray | None = None,
                            proposal: str = "prior") -> tuple[LGParticles, np.ndarray]:
    """Propagate a block of particles through the next row x (D,) (SPEC 3.3; paper 001 Alg. 2).

    Draws z_i from ``proposal`` (``pf_proposals``: "prior" is the paper's IBP conditional), gives
    new features M rows 0 and prior variance sigma_A^2 in S, weights by
    log N(x_i; z_i M, (sigma_X^2 + z_i S z_i^T) I) (= eq. 7) plus the proposal's
    log p(z_i | past) - log q(z_i) (eq. 5) and applies the RLS update. Returns the new block and
    the incremental log-weights (L,). Resampling is the caller's job (``resampling``), across all blocks.
    """
    x = np.asarray(x, np.float64)
    z_old, k_new, log_ratio = PROPOSALS[proposal](block, x, alpha, sigma_x, sigma_a, rng, observed)
    grown, (particle, feature, _) = append_row(block, z_old, k_new)
    S = grown.S.copy()
    S[particle, :, feature, feature] = sigma_a ** 2
    z = grown.Z[:, grown.n_rows - 1].astype(np.float64)
    log_w, M, S = kalman_row_update(z, grown.M, S, x, sigma_x, observed)
    return dataclasses.replace(grown, M=M, S=S), log_w + log_ratio

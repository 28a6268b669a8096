"""The particle block of the collapsed linear-Gaussian filter (paper 001, Algorithm 2;
docs/models/particle-filters.md): what the filter's step (``pf_linear_gaussian``) and its proposals
(``pf_proposals``) both read.

Each particle carries the Gaussian posterior of A given its Z and the rows seen so far. Layout
(``LGParticles``, extending ``ibp_prior.IBPParticles``):
    Z (L, N, Kc) bool, m (L, Kc) int64   -- see ``ibp_prior``
    M (L, Kc, D) float64                 -- posterior mean of A; zero rows for padding
    S (L, G, Kc, Kc) float64             -- posterior covariance of the columns of A; G = 1 when
                                            it is shared by all columns, G = D with missing entries
Padding columns have zero rows/columns in M and S, so they never enter z S z^T or z M.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .ibp_prior import IBPParticles


@dataclass(frozen=True)
class LGParticles(IBPParticles):
    """A block of linear-Gaussian particles (module docstring for the array layout)."""

    M: np.ndarray
    S: np.ndarray

    FEATURE_AXES: ClassVar[dict[str, tuple[int, ...]]] = {"Z": (2,), "m": (1,), "M": (1,), "S": (2, 3)}


def init_lg_particles(n_particles: int, n_rows: int, n_cols: int, per_column: bool = False) -> LGParticles:
    """An empty block. ``per_column=True`` keeps one S per column (needed with masks)."""
    n_cov = n_cols if per_column else 1
    return LGParticles(Z=np.zeros((n_particles, n_rows, 0), bool), m=np.zeros((n_particles, 0), np.int64),
                       n_rows=0, M=np.zeros((n_particles, 0, n_cols)),
                       S=np.zeros((n_particles, n_cov, 0, 0)))

"""Resample-move for the noisy-OR particle filter (Gilks and Berzuini 2001; issue 13 item 2, named in
paper 001's conclusion as the remedy for a filter that never revisits the past).

Sequential importance resampling fixes a particle's past: the rows of Z it chose and the rows of Y it
drew when a feature was born, given that single row of X. With rows of hundreds of entries the weights
are so uneven that a resampling keeps one or two ancestors, and a larger P only makes it likelier that
the survivor is an outlier that overfits the next row. After a resampling, every particle therefore
gets MCMC moves whose stationary law is its target, the posterior P(Z_1:t, Y | X_1:t) of the rows seen
so far: the noisy-OR Gibbs updates of SPEC 3.4 (``gibbs_noisy_or``) of ``rows`` past rows of Z picked at
random (each with its singleton features re-drawn, K_new truncated at ``max_new`` as in the sampler),
then of every entry of Y. Each update leaves that posterior invariant, so the weighted particles stay a
valid sample, now with a past that reflects every row seen.
"""

from __future__ import annotations

import numpy as np

from .gibbs_noisy_or import gibbs_row, sample_y
from .ibp_prior import feature_capacity, new_feature_log_prior
from .pf_noisy_or import NoisyORParams, NoisyORParticles


def move_particle(X: np.ndarray, Z: np.ndarray, Y: np.ndarray, observed: np.ndarray | None, alpha: float,
                  params: NoisyORParams, rows: int, max_new: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One particle's move (module docstring): Z (t x K+, no empty column) and Y (K+ x D) given the rows X
    (t x D) seen so far; returns the new (Z, Y)."""
    n = X.shape[0]
    log_prior_new = new_feature_log_prior(n, alpha, max_new)
    for i in rng.choice(n, size=min(rows, n), replace=False):
        Z, Y = gibbs_row(int(i), X, Z, Y, log_prior_new, params, rng, observed)
    return Z, sample_y(X, Z, Y, params, rng, observed)


def move_noisy_or_particles(block: NoisyORParticles, X: np.ndarray, observed: np.ndarray | None, alpha: float,
                            params: NoisyORParams, rows: int, rng: np.random.Generator,
                            max_new: int = 4) -> NoisyORParticles:
    """Every particle of ``block`` moved (``move_particle``) given the first ``block.n_rows`` rows of X (all
    rows, N x D, 0/1; ``observed`` N x D or None); the block's feature axes are re-packed to the new K+."""
    t = block.n_rows
    seen = np.asarray(X[:t], bool)
    seen_observed = None if observed is None else np.asarray(observed[:t], bool)
    moved = []
    for z, y, m in zip(block.Z, block.Y, block.m):
        active = m > 0
        moved.append(move_particle(seen, z[:t][:, active], y[active], seen_observed, alpha, params, rows, max_new,
                                   rng))
    return pack_particles(block, moved)


def pack_particles(block: NoisyORParticles, particles: list[tuple[np.ndarray, np.ndarray]]) -> NoisyORParticles:
    """A block holding ``particles`` ((Z, Y) of the rows done, features compact), padded to the capacity of
    one more than their largest K+ (``ibp_prior.feature_capacity``), with room for the block's rows."""
    capacity = feature_capacity(max((Z.shape[1] for Z, _ in particles), default=0) + 1)
    L, (n_total, n_cols), t = len(particles), (block.Z.shape[1], block.Y.shape[2]), block.n_rows
    Z_all = np.zeros((L, n_total, capacity), bool)
    Y_all = np.zeros((L, capacity, n_cols), bool)
    for l, (Z, Y) in enumerate(particles):
        Z_all[l, :t, :Z.shape[1]] = Z
        Y_all[l, :Y.shape[0]] = Y
    return NoisyORParticles(Z=Z_all, m=Z_all.sum(axis=1, dtype=np.int64), n_rows=t, Y=Y_all)

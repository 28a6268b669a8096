"""Resample-move for the particle filters (Gilks and Berzuini 2001, named in paper 001's
conclusion as the remedy for a filter that never revisits the past).

Sequential importance resampling fixes a particle's past: the rows of Z it chose and, for noisy-OR, the
rows of Y it drew when a feature was born, given that single row of X. With rows of many entries the
weights are so uneven that a resampling keeps one or two ancestors, and a larger P only makes it likelier
that the survivor is an outlier that overfits the next row. After a resampling, every particle therefore
gets MCMC moves whose stationary law is its target, the posterior of the t rows seen so far:

* noisy-OR, P(Z_1:t, Y | X_1:t): the Gibbs updates of the noisy-OR sampler (``gibbs_noisy_or``) of ``rows`` past rows
  of Z picked at random (each with its singleton features re-drawn, K_new truncated at ``max_new`` as in
  the sampler), then of every entry of Y;
* linear-Gaussian, P(Z_1:t | X_1:t) with A integrated out: the collapsed Gibbs updates
  (``gibbs_linear_gaussian.gibbs_rows``) of ``rows`` past rows of Z picked at random, singletons
  re-drawn the same way (with missing entries, given values imputed from the particle's posterior), then
  ``feature_moves`` rounds of a split-merge, an exchange and a recombination move
  (``gibbs_linear_gaussian.split_merge``, ``exchange`` and ``recombine``), which change whole features: a
  particle whose early rows merged two features, made a wrong basis of them or held two as three columns
  cannot leave that by single entries; the particle's posterior of A (M, S) is then recomputed for the new Z.

Each update leaves that posterior invariant, so the weighted particles stay a valid sample, now with a
past that reflects every row seen.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .gibbs_linear_gaussian import LGGibbsState, exchange, feature_posterior, gibbs_rows, recombine, split_merge
from .gibbs_noisy_or import gibbs_row, sample_y
from .ibp_prior import Block, feature_capacity, new_feature_log_prior
from .lg_particles import LGParticles
from .pf_noisy_or import NoisyORParams, NoisyORParticles


def past_rows(n: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` distinct rows of the first n picked uniformly at random (all n if fewer), in random order."""
    return rng.choice(n, size=min(rows, n), replace=False)


def move_noisy_or_particle(X: np.ndarray, Z: np.ndarray, Y: np.ndarray, observed: np.ndarray | None,
                           alpha: float, params: NoisyORParams, rows: int, max_new: int,
                           rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One noisy-OR particle's move (module docstring): Z (t x K+, no empty column) and Y (K+ x D) given
    the rows X (t x D) seen so far; returns the new {"Z", "Y"}."""
    log_prior_new = new_feature_log_prior(X.shape[0], alpha, max_new)
    for i in past_rows(X.shape[0], rows, rng):
        Z, Y = gibbs_row(int(i), X, Z, Y, log_prior_new, params, rng, observed)
    return {"Z": Z, "Y": sample_y(X, Z, Y, params, rng, observed)}


def move_noisy_or_particles(block: NoisyORParticles, X: np.ndarray, observed: np.ndarray | None, alpha: float,
                            params: NoisyORParams, rows: int, rng: np.random.Generator,
                            max_new: int = 4) -> NoisyORParticles:
    """Every particle of ``block`` moved (``move_noisy_or_particle``) given the first ``block.n_rows`` rows
    of X (all rows, N x D, 0/1; ``observed`` N x D or None); feature axes re-packed to the new K+."""
    t = block.n_rows
    seen = np.asarray(X[:t], bool)
    seen_observed = None if observed is None else np.asarray(observed[:t], bool)
    return pack_particles(block, [move_noisy_or_particle(seen, z[:t][:, m > 0], y[m > 0], seen_observed, alpha,
                                                         params, rows, max_new, rng)
                                  for z, y, m in zip(block.Z, block.Y, block.m)])


def column_posteriors(Z: np.ndarray, X: np.ndarray, observed: np.ndarray, sigma_x: float,
                      sigma_a: float) -> tuple[np.ndarray, np.ndarray]:
    """The posterior of A given Z (t x K) and the observed entries of X (t x D): mean (K x D) and one covariance
    per column (D x K x K), column d from the rows where it is observed (``lg_particles``'s per-column layout);
    the values of X at missing entries are never read."""
    Zf = np.asarray(Z, np.float64)
    W = Zf.T @ (observed.T[:, :, None] * Zf) + (sigma_x / sigma_a) ** 2 * np.eye(Zf.shape[1])     # (D, K, K)
    W_inv = np.linalg.inv(W)
    ZtX = Zf.T @ np.where(observed, X, 0.0)                                                       # (K, D)
    return np.einsum("dkj,jd->kd", W_inv, ZtX), sigma_x ** 2 * W_inv


def impute_missing(X: np.ndarray, observed: np.ndarray, Z: np.ndarray, M: np.ndarray, S: np.ndarray,
                   sigma_x: float, rng: np.random.Generator) -> np.ndarray:
    """X (t x D) with its missing entries drawn from p(X_missing | Z, X_observed): every column of A from its
    posterior (mean M[:, d], covariance S[d]; ``column_posteriors``), then N(Z A, sigma_X^2)."""
    A = M + np.einsum("dkj,dj->kd", np.linalg.cholesky(S), rng.standard_normal(M.shape[::-1]))
    return np.where(observed, X, Z @ A + sigma_x * rng.standard_normal(X.shape))


def moved_z(X: np.ndarray, state: LGGibbsState, rows: int, feature_moves: int, max_new: int,
            rng: np.random.Generator) -> np.ndarray:
    """Z (t x K+) after the Gibbs updates of ``rows`` random rows and then ``feature_moves`` rounds of a
    split-merge, an exchange and a recombination move, given the complete rows X (t x D) seen so far (module
    docstring)."""
    Z = gibbs_rows(X, state, past_rows(X.shape[0], rows, rng), max_new, rng)
    for _ in range(feature_moves):
        Z = split_merge(X, Z, state.alpha, state.sigma_x, state.sigma_a, rng)
        Z = exchange(X, Z, state.sigma_x, state.sigma_a, rng)
        Z = recombine(X, Z, state.alpha, state.sigma_x, state.sigma_a, rng)
    return Z


def move_lg_particle(X: np.ndarray, observed: np.ndarray | None, Z: np.ndarray, alpha: float, sigma_x: float,
                     sigma_a: float, rows: int, feature_moves: int, max_new: int,
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One linear-Gaussian particle's move (module docstring): Z (t x K+, no empty column) given the rows X
    (t x D) seen so far; returns the new {"Z", "M", "S"} (S: 1 x K+ x K+ shared, or D x K+ x K+ per column).

    With missing entries (``observed``, t x D), the move is an exact data augmentation: the missing entries
    are drawn given Z (``impute_missing``), the rows of Z updated given the completed X, and the imputed
    values dropped, which keeps P(Z | X_observed) invariant."""
    state = LGGibbsState(Z, alpha, sigma_x, sigma_a)
    if observed is None:
        Z = moved_z(X, state, rows, feature_moves, max_new, rng)
        W_inv, M, _ = feature_posterior(Z, X, sigma_x, sigma_a)
        return {"Z": Z, "M": M, "S": sigma_x ** 2 * W_inv[None]}
    filled = impute_missing(X, observed, Z, *column_posteriors(Z, X, observed, sigma_x, sigma_a), sigma_x, rng)
    Z = moved_z(filled, state, rows, feature_moves, max_new, rng)
    M, S = column_posteriors(Z, X, observed, sigma_x, sigma_a)
    return {"Z": Z, "M": M, "S": S}


def move_lg_particles(block: LGParticles, X: np.ndarray, observed: np.ndarray | None, alpha: float, sigma_x: float,
                      sigma_a: float, rows: int, rng: np.random.Generator, max_new: int = 4,
                      feature_moves: int = 0) -> LGParticles:
    """Every particle of ``block`` moved (``move_lg_particle``) given the first ``block.n_rows`` rows of X (all
    rows, N x D; ``observed`` N x D, with a block of one S per column (``init_lg_particles(per_column=True)``),
    or None); feature axes re-packed to the new K+."""
    t = block.n_rows
    seen = np.asarray(X[:t], np.float64)
    seen_observed = None if observed is None else np.asarray(observed[:t], bool)
    return pack_particles(block, [move_lg_particle(seen, seen_observed, z[:t][:, m > 0], alpha, sigma_x, sigma_a,
                                                   rows, feature_moves, max_new, rng)
                                  for z, m in zip(block.Z, block.m)])


def pack_particles(block: Block, particles: list[dict[str, np.ndarray]]) -> Block:
    """A block like ``block`` holding ``particles`` (each its feature arrays by name, e.g. Z (t x K+) of the
    rows done and Y or M and S, features compact and in the same order), padded with zeros to the capacity
    of one more than their largest K+ (``ibp_prior.feature_capacity``) and to the block's rows; m recounted."""
    capacity = feature_capacity(max((p["Z"].shape[1] for p in particles), default=0) + 1)
    arrays = {}
    for name, axes in block.FEATURE_AXES.items():
        if name == "m":
            continue
        shape = [len(particles), *getattr(block, name).shape[1:]]
        for a in axes:
            shape[a] = capacity
        arrays[name] = np.zeros(shape, getattr(block, name).dtype)
        for l, particle in enumerate(particles):
            arrays[name][(l, *map(slice, particle[name].shape))] = particle[name]
    return dataclasses.replace(block, m=arrays["Z"].sum(axis=1, dtype=np.int64), **arrays)

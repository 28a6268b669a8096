"""Resampling and weighted posterior summaries for particle blocks (docs/models/particle-filters.md).

The filter runs on several blocks of particles. Per row the caller gathers the incremental
log-weights of all blocks, normalises them (``normalise_log_weights``), draws one uniform and
computes global ancestor indices (``systematic_resample``), maps them to (block, index in
block) (``ancestor_locations``) and rebuilds each block from the particles it needs
(``select_particles``, ``concatenate_blocks``). Systematic indices are sorted, so block b's
new particles come from block b and its neighbours.

Summaries take globally normalised weights restricted to one block, so the results of the
blocks add up: E[Z Z^T] and the distribution of K+ here; the posterior mass of IBP classes, from
which E[A] is read in the most probable class (feature order is only defined within a class), in
``ibp_summary``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .ibp_prior import Block, feature_capacity, resize_features


def normalise_log_weights(log_w: np.ndarray) -> tuple[np.ndarray, float]:
    """Normalised weights and log of their mean (the row's log-evidence increment), stably."""
    top = log_w.max()
    scaled = np.exp(log_w - top)
    total = scaled.sum()
    return scaled / total, float(top + np.log(total / log_w.size))


def effective_sample_size(weights: np.ndarray) -> float:
    """1 / sum w^2 for normalised weights."""
    return float(1.0 / np.sum(weights ** 2))


def systematic_resample(weights: np.ndarray, u: float, n_out: int | None = None) -> np.ndarray:
    """Sorted ancestor indices by systematic resampling from normalised weights.

    Points (u + j) / n for j = 0..n-1 with one uniform u in [0, 1); particle l is copied
    floor or ceil of n w_l times and n w_l times on average over u. Deterministic given u.
    """
    n = weights.size if n_out is None else n_out
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, (u + np.arange(n)) / n, side="right"), weights.size - 1)


def ancestor_locations(ancestors: np.ndarray, block_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(block, index within block) of global particle indices, blocks laid end to end."""
    starts = np.concatenate([[0], np.cumsum(block_sizes)[:-1]])
    block = np.searchsorted(starts, ancestors, side="right") - 1
    return block, ancestors - starts[block]


def _first_features(arr: np.ndarray, axes: tuple[int, ...], capacity: int) -> np.ndarray:
    """View of ``arr`` with its feature ``axes`` cut to the first ``capacity`` columns."""
    return arr[tuple(slice(0, capacity) if a in axes else slice(None) for a in range(arr.ndim))]


def select_particles(block: Block, index: np.ndarray) -> Block:
    """The particles ``index`` of a block (with repeats), feature axes cut or padded to
    ``ibp_prior.feature_capacity`` of one more than their largest K+: room for a new feature, so
    blocks are not regrown at every row, and a width that depends only on the particles selected
    (the random draws of the next row depend on it; ``concatenate_blocks`` of selections pads to
    the widest, the width of selecting all their particles at once).

    The arrays of the result are new (contiguous copies), so callers may write into them.
    """
    capacity = feature_capacity(int(block.n_features[index].max(initial=0)) + 1)
    if capacity == block.m.shape[1]:
        return dataclasses.replace(block, **{name: getattr(block, name)[index] for name in block.FEATURE_AXES})
    picked = dataclasses.replace(block, **{name: _first_features(getattr(block, name), axes, capacity)[index]
                                           for name, axes in block.FEATURE_AXES.items()})
    return picked if capacity <= block.m.shape[1] else resize_features(picked, capacity)


def concatenate_blocks(blocks: list[Block], capacity: int | None = None) -> Block:
    """One block from several (same type and row count), feature axes padded with zeros to
    ``capacity`` columns (default: the widest block's).

    A single block already that wide is returned as it is; otherwise the arrays of the result are new.
    """
    capacity = max(b.m.shape[1] for b in blocks) if capacity is None else capacity
    if len(blocks) == 1 and blocks[0].m.shape[1] == capacity:
        return blocks[0]
    starts = np.cumsum([0] + [b.n_particles for b in blocks])
    arrays = {}
    for name, axes in blocks[0].FEATURE_AXES.items():
        shape = list(getattr(blocks[0], name).shape)
        shape[0] = starts[-1]
        for a in axes:
            shape[a] = capacity
        arrays[name] = np.zeros(shape, getattr(blocks[0], name).dtype)
        for b, lo, hi in zip(blocks, starts[:-1], starts[1:]):
            part = getattr(b, name)
            arrays[name][(slice(lo, hi), *map(slice, part.shape[1:]))] = part
    return dataclasses.replace(blocks[0], **arrays)


def expected_zzt(Z: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_l w_l Z_l Z_l^T (N x N) for Z (L, N, K) (the E[ZZ^T] of the ZZ^T error, paper 001, Sec. 4.2)."""
    scaled = Z * np.sqrt(weights)[:, None, None]
    flat = scaled.transpose(1, 0, 2).reshape(Z.shape[1], -1)
    return flat @ flat.T


def k_plus_distribution(m: np.ndarray, weights: np.ndarray, max_k: int | None = None) -> np.ndarray:
    """P(K+ = k), k = 0..max_k, from weighted particles with column counts m (L, Kc)."""
    k_plus = np.count_nonzero(m, axis=1)
    size = (int(k_plus.max(initial=0)) if max_k is None else max_k) + 1
    return np.bincount(k_plus, weights=weights, minlength=size)[:size]

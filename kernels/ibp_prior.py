"""The Indian buffet process prior shared by the IBP samplers (paper 001, eq. 2 and Algorithm 1).

Two representations of Z are used:

* a *particle block* (``IBPParticles``): L binary matrices stored as one padded array
  ``Z[l, i, k]`` (L x N x Kc), with the column counts ``m[l, k]`` kept alongside so that the
  IBP conditional of the next row costs O(L Kc) instead of O(L N Kc). Features of particle l
  occupy columns ``0 .. K_l - 1`` in order of appearance; columns ``K_l .. Kc - 1`` are zero
  padding, so ``K_l = (m[l] > 0).sum()``. Model blocks subclass it and list every per-particle
  array (axis 0 = particle) with its feature axes in ``FEATURE_AXES``, so one padding / selection
  routine serves every model;
* a single matrix Z (N x K) for the Gibbs samplers, where all-zero columns are ignored.

The IBP is a distribution on equivalence classes of binary matrices (left-ordered form);
``class_key`` gives a canonical label of a class, ``ibp_log_prob`` its probability (eq. 2).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Sequence, TypeVar

import numpy as np
from scipy.special import gammaln

Block = TypeVar("Block", bound="IBPParticles")


@dataclass(frozen=True)
class IBPParticles:
    """L binary matrices in a padded array (module docstring).

    Z: (L, N, Kc) bool, rows ``0 .. n_rows - 1`` filled; m: (L, Kc) int64 column counts of
    those rows; n_rows: rows processed so far (the same for every particle of a block).
    """

    Z: np.ndarray
    m: np.ndarray
    n_rows: int

    FEATURE_AXES: ClassVar[dict[str, tuple[int, ...]]] = {"Z": (2,), "m": (1,)}

    @property
    def n_particles(self) -> int:
        """Number of particles L in the block."""
        return self.Z.shape[0]

    @property
    def n_features(self) -> np.ndarray:
        """K+ of every particle, shape (L,)."""
        return np.count_nonzero(self.m, axis=1)


def init_ibp_particles(n_particles: int, n_rows: int) -> IBPParticles:
    """An empty block: L particles, room for ``n_rows`` rows, no features (paper 001, Algorithm 2, line 1)."""
    return IBPParticles(Z=np.zeros((n_particles, n_rows, 0), bool),
                        m=np.zeros((n_particles, 0), np.int64), n_rows=0)


def resize_features(block: Block, capacity: int) -> Block:
    """Pad with zeros or cut the feature axes of every array of ``block`` to ``capacity`` columns.

    Cutting is only valid for columns that are padding in every particle.
    The arrays of the result are new (never views of the input), so callers may write into them.
    """
    changes = {}
    for name, axes in block.FEATURE_AXES.items():
        arr = getattr(block, name)
        kept = tuple(slice(0, min(capacity, n)) if a in axes else slice(None) for a, n in enumerate(arr.shape))
        changes[name] = np.zeros([capacity if a in axes else n for a, n in enumerate(arr.shape)], arr.dtype)
        changes[name][kept] = arr[kept]          # (np.pad costs ~0.4 ms a call here, mostly overhead)
    return dataclasses.replace(block, **changes)


def sample_ibp_conditional(m: np.ndarray, i: int, alpha: float,
                           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw row i (1-based) of Z given the counts m of rows 1..i-1, for many matrices at once.

    Paper 001, Algorithm 1: z_ik ~ Bern(m_k / i) for the existing features and
    K_new ~ Poisson(alpha / i). ``m`` is (L, Kc) (zero = padding); returns z (L, Kc) bool and
    K_new (L,) int64.
    """
    z = rng.random(m.shape) * i < m
    return z, rng.poisson(alpha / i, size=m.shape[0]).astype(np.int64)


def feature_capacity(k_max: int) -> int:
    """Columns a particle block reserves for K+ up to ``k_max``: the next power of two.

    The filters grow and cut their blocks to this size, so a block that gains features is copied
    into wider arrays only when K+ passes a power of two, not at every new feature.
    """
    return 0 if k_max <= 0 else 1 << (k_max - 1).bit_length()


def append_row(block: Block, z: np.ndarray, k_new: np.ndarray, spare: bool = False) -> tuple[Block, np.ndarray]:
    """Block with row i = (z, K_new new features) appended (paper 001 Alg. 1 lines 9-13).

    z (L, Kz) bool holds the existing features' entries (Kz at most the block's width); the new
    features of particle l take columns K_l .. K_l + K_new_l - 1 (order of appearance). The feature
    axes grow (zero padding) only when the new features do not fit: to the block's largest K+, or
    with ``spare`` to ``feature_capacity`` of it. Z and m of the result are new arrays; the model's
    other arrays are the input's (zero-padded copies if the axes grew), so kernels never write into
    them in place. Returns the block and the new features' mask (L, Kc) bool.
    """
    i = block.n_rows + 1
    k_before = block.n_features
    k_after = k_before + k_new
    need = int(k_after.max(initial=0))
    if need > block.m.shape[1]:
        grown = resize_features(block, feature_capacity(need) if spare else need)
        Z = grown.Z
    else:
        grown, Z = block, block.Z.copy()
    cols = np.arange(grown.m.shape[1])
    new = (cols >= k_before[:, None]) & (cols < k_after[:, None])
    row = new.copy()
    row[:, :z.shape[1]] |= z
    Z[:, i - 1] = row
    return dataclasses.replace(grown, Z=Z, m=grown.m + row, n_rows=i), new


def propose_ibp_row(block: Block, alpha: float, rng: np.random.Generator,
                    spare: bool = False) -> tuple[Block, np.ndarray]:
    """Append one row drawn from the IBP conditional to every particle (paper 001 Alg. 1).

    ``append_row`` with z and K_new from ``sample_ibp_conditional``: new entries of the model's
    arrays are zero, and the result's model arrays may be the input's. Returns the block and the
    new features' mask (L, Kc), where the model initialises their parameters.
    """
    z, k_new = sample_ibp_conditional(block.m, block.n_rows + 1, alpha, rng)
    return append_row(block, z, k_new, spare)


def sample_ibp(n_rows: int, alpha: float, rng: np.random.Generator, size: int = 1) -> IBPParticles:
    """``size`` independent draws of an N-row matrix from the IBP, row by row (paper 001 Alg. 1)."""
    block = init_ibp_particles(size, n_rows)
    for _ in range(n_rows):
        block, _ = propose_ibp_row(block, alpha, rng)
    return block


def harmonic_number(n: int) -> float:
    """H_N = sum_{i=1}^N 1/i (paper 001 eq. 2)."""
    return float(np.sum(1.0 / np.arange(1, n + 1)))


def class_keys(Z: np.ndarray) -> list[tuple[bytes, np.ndarray]]:
    """``class_key`` and ``left_order`` of every matrix of Z (G, N, K) with a few array calls in all.

    Each column is packed into bytes (row 1 the most significant bit) and the columns of every
    matrix are sorted by those bytes at once (``np.lexsort`` along the last axis); all-zero
    columns sort last and are dropped.
    """
    packed = np.packbits(np.asarray(Z, bool), axis=1)                                # (G, bytes, K)
    order = np.lexsort(np.moveaxis(packed, 1, 0)[::-1], axis=-1)[:, ::-1]            # largest first
    columns = np.take_along_axis(packed, order[:, None, :], axis=2).transpose(0, 2, 1).copy()  # (G, K, bytes)
    k_plus = np.count_nonzero(np.any(Z, axis=1), axis=1)
    return [(c[:k].tobytes(), o[:k]) for c, o, k in zip(columns, order, k_plus)]


def left_order(Z: np.ndarray) -> np.ndarray:
    """Column indices of the non-zero columns of Z (N x K) in left-ordered form (paper 001 eq. 2).

    Columns are sorted by their binary value read top to bottom (row 1 most significant),
    largest first (equal columns in reverse order of index).
    """
    return class_keys(Z[None])[0][1]


def class_key(Z: np.ndarray) -> bytes:
    """Canonical label of the IBP equivalence class of Z (N x K): equal iff same left-ordered form.

    The bytes of the packed non-zero columns in left order (``class_keys``).
    """
    return class_keys(Z[None])[0][0]


def ibp_log_prob(Z: np.ndarray, alpha: float) -> float:
    """log P([Z]) of the left-ordered class of Z (N x K), paper 001 eq. 2 (zero columns ignored).

    alpha^K+ / prod_h K_h! exp(-alpha H_N) prod_k (N - m_k)! (m_k - 1)! / N!.
    """
    Zb = np.asarray(Z, bool)
    Zb = Zb[:, np.any(Zb, axis=0)]
    n, k_plus = Zb.shape
    m = Zb.sum(axis=0)
    _, multiplicity = np.unique(Zb, axis=1, return_counts=True)
    return float(k_plus * np.log(alpha) - gammaln(multiplicity + 1).sum() - alpha * harmonic_number(n)
                 + np.sum(gammaln(n - m + 1) + gammaln(m) - gammaln(n + 1)))


def new_feature_log_prior(n_rows: int, alpha: float, max_new: int) -> np.ndarray:
    """log Poisson(j; alpha / N) for j = 0..max_new: the prior on a row's new features."""
    j = np.arange(max_new + 1)
    rate = alpha / n_rows
    return j * np.log(rate) - rate - gammaln(j + 1)


def categorical_weights(log_p: Sequence[float]) -> tuple[float, list[float], float]:
    """(top, weights, total) of unnormalised log probabilities: top = max(log_p),
    weights exp(log_p - top) and their exactly rounded sum (log normaliser = top + log total)."""
    top = max(log_p)
    weights = [math.exp(v - top) for v in log_p]
    return top, weights, math.fsum(weights)


def categorical_index(weights: Sequence[float], total: float, u: float) -> int:
    """Index j with probability weights[j] / total, by inverting the uniform u in [0, 1)."""
    u *= total
    for j, w in enumerate(weights):
        u -= w
        if u < 0.0:
            return j
    return len(weights) - 1


def sample_categorical_log(log_p: Sequence[float], rng: np.random.Generator) -> int:
    """Index drawn with probability proportional to exp(log_p): a truncated posterior.

    Plain Python, as the vectors are short (a handful of K_new values) and this sits in the
    Gibbs samplers' per-row loops; one uniform of ``rng``.
    """
    _, weights, total = categorical_weights(log_p)
    return categorical_index(weights, total, rng.random())


def sample_alpha(k_plus: int, n_rows: int, shape: float, rate: float, rng: np.random.Generator) -> float:
    """alpha | Z ~ Gamma(shape + K+, rate + H_N), the conjugate update under paper 001's eq. 2."""
    return float(rng.gamma(shape + k_plus, 1.0 / (rate + harmonic_number(n_rows))))

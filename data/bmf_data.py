"""Synthetic data for binary matrix factorization: the modified bars problem (paper 003, Sec. 4.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from buffet.kernels.ibp_prior import sample_ibp


@dataclass(frozen=True)
class BarsData:
    """X (I x 64) noisy images, ``clean`` = U W V^T, the generating U, W, V and the held-out mask ``missing``."""

    X: np.ndarray
    clean: np.ndarray
    U: np.ndarray
    W: np.ndarray
    V: np.ndarray
    missing: np.ndarray


def bar_features(side: int = 8) -> np.ndarray:
    """V (side^2 x 2 side): the vertical bars (one column of the image each), then the horizontal ones."""
    image = np.arange(side * side).reshape(side, side)
    V = np.zeros((side * side, 2 * side), bool)
    for b in range(side):
        V[image[:, b], b] = True
        V[image[b, :], side + b] = True
    return V


def bars_data(n_images: int, rng: np.random.Generator, alpha: float = 3.0, theta: float = 0.5, phi: float = 0.5,
              missing_fraction: float = 0.25, side: int = 8) -> BarsData:
    """Paper 003, Sec. 4.1: V fixed to the bars, U ~ IBP(alpha), W ~ N(0, 1/phi), noise precision
    theta; the bottom halves of ``missing_fraction`` of the images are marked missing."""
    V = bar_features(side)
    block = sample_ibp(n_images, alpha, rng)
    U = block.Z[0][:, :block.n_features[0]]
    W = rng.standard_normal((U.shape[1], V.shape[1])) / math.sqrt(phi)
    clean = U @ W @ V.T
    X = clean + rng.standard_normal(clean.shape) / math.sqrt(theta)
    missing = np.zeros(X.shape, bool)
    rows = rng.choice(n_images, size=round(missing_fraction * n_images), replace=False)
    missing[np.ix_(rows, np.arange(side * side // 2, side * side))] = True
    return BarsData(X, clean, U, W, V, missing)

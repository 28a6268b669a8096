"""Synthetic data of the IBP experiments (paper 001, Secs. 4.2 and 5.2); their error metrics are
``kernels.metrics.zzt_error`` and ``base_error``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from buffet.kernels.ibp_prior import sample_ibp
from buffet.kernels.pf_noisy_or import NoisyORParams, log_lik_entries

# Four 6x6 latent images with eight ones each (paper 001, Fig. 2).
_IMAGES = """
######  ......  ......  ......
#....#  ..##..  .#....  ....##
......  ..##..  .#....  ....##
......  ..##..  .#....  ....##
......  ..##..  .#....  ....##
......  ......  .####.  ......
"""


@dataclass(frozen=True)
class IBPData:
    """A synthetic data set: X (N x D), the true Z (N x K) and true features A (K x D) or Y."""

    X: np.ndarray
    Z: np.ndarray
    A: np.ndarray


def latent_images() -> np.ndarray:
    """The four 6x6 binary latent images as rows of a 4 x 36 array (paper 001, Fig. 2)."""
    rows = [line.split() for line in _IMAGES.strip("\n").splitlines()]
    return np.array([[c == "#" for r in rows for c in r[k]] for k in range(4)], np.float64)


def linear_gaussian_x(Z: np.ndarray, A: np.ndarray, sigma_x: float, rng: np.random.Generator) -> np.ndarray:
    """X = Z A + iid N(0, sigma_x^2) noise (the linear-Gaussian model, paper 001, Sec. 4)."""
    return np.asarray(Z, np.float64) @ A + sigma_x * rng.standard_normal((Z.shape[0], A.shape[1]))


def noisy_or_x(Z: np.ndarray, Y: np.ndarray, params: NoisyORParams, rng: np.random.Generator) -> np.ndarray:
    """Binary X with P(x_id = 1) = 1 - (1 - eps)(1 - lambda)^(z_i . y_:d) (paper 001 eq. 8)."""
    eta = np.asarray(Z, np.int64) @ Y
    return np.log(rng.random(eta.shape)) < log_lik_entries(True, eta, params)


def image_data(rng: np.random.Generator, n_rows: int = 100, noise_sd: float = 0.5) -> IBPData:
    """Paper 001 Fig. 3 data: z_ik ~ Bern(0.5) for the 4 images, X = Z A + N(0, noise_sd^2) (Sec. 4.2)."""
    A = latent_images()
    Z = rng.random((n_rows, A.shape[0])) < 0.5
    return IBPData(X=linear_gaussian_x(Z, A, noise_sd, rng), Z=Z, A=A)


def noisy_or_data(rng: np.random.Generator, n_rows: int = 6, n_features: int = 4, n_cols: int = 250,
                  alpha: float = 3.0, params: NoisyORParams = NoisyORParams(0.1, 0.9, 0.01)) -> IBPData:
    """Paper 001, Sec. 5.2, noisy-OR data: Z (n_rows x n_features) from the IBP(alpha),
    redrawn until K+ = n_features; Y ~ Bern(p) (n_features x n_cols); X from eq. 8. ``A`` holds Y.
    """
    Z = np.zeros((n_rows, 0), bool)
    while Z.shape[1] != n_features:
        Z = sample_ibp(n_rows, alpha, rng).Z[0]
    Y = rng.random((n_features, n_cols)) < params.p
    return IBPData(X=noisy_or_x(Z, Y, params, rng), Z=Z, A=Y)


def planted_features(rng: np.random.Generator, n_rows: int, n_cols: int, n_features: int,
                     nonnegative: bool = False, noise_sd: float = 0.5,
                     usage: tuple[float, float] = (0.2, 0.4)) -> IBPData:
    """Planted linear-Gaussian structure: feature k used by each row with probability
    p_k ~ U(usage), bases a_kd ~ N(0, 1) (|N(0, 1)| when ``nonnegative``, for INMF), X = Z A + N(0, noise_sd^2)."""
    p = rng.uniform(*usage, size=n_features)
    Z = rng.random((n_rows, n_features)) < p
    A = rng.standard_normal((n_features, n_cols))
    A = np.abs(A) if nonnegative else A
    return IBPData(X=linear_gaussian_x(Z, A, noise_sd, rng), Z=Z, A=A)

"""Synthetic IBP image data and the base-error metric (SPEC 4; paper 000 section 4.1, paper 001).

X = Z A + noise with Z ~ Bern(0.5) (N x K), A the K latent 6x6 binary images flattened to rows
(K x 36) and Gaussian noise of variance 0.5, as in Griffiths & Ghahramani (2005) and paper 000.
"""

from __future__ import annotations

import numpy as np

SIDE = 6

# Four 6x6 latent images in the style of Griffiths & Ghahramani (2005), one per 3x3 quadrant:
# a plus, a square ring, a triangle and a T, as (row, column) lists of their ones.
FOUR_IMAGE_PIXELS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 1), (1, 0), (1, 1), (1, 2), (2, 1)),
    ((0, 3), (0, 4), (0, 5), (1, 3), (1, 5), (2, 3), (2, 4), (2, 5)),
    ((3, 0), (4, 0), (4, 1), (5, 0), (5, 1), (5, 2)),
    ((3, 3), (3, 4), (3, 5), (4, 4), (5, 4)),
)


def four_images() -> np.ndarray:
    """The four latent images of the K+ choice experiment (SPEC 4, paper 000 Fig. 1), shape (4, 36)."""
    a = np.zeros((len(FOUR_IMAGE_PIXELS), SIDE, SIDE))
    for k, pixels in enumerate(FOUR_IMAGE_PIXELS):
        rows, cols = zip(*pixels)
        a[k, list(rows), list(cols)] = 1.0
    return a.reshape(len(FOUR_IMAGE_PIXELS), SIDE * SIDE)


def random_images(rng: np.random.Generator, n_images: int = 4, n_ones: int = 8) -> np.ndarray:
    """Random 6x6 binary images with ``n_ones`` ones each (SPEC 4 speed experiment, paper 000 s. 4.1)."""
    a = np.zeros((n_images, SIDE * SIDE))
    for k in range(n_images):
        a[k, rng.choice(SIDE * SIDE, size=n_ones, replace=False)] = 1.0
    return a


def make_images(n_rows: int = 50, noise_var: float = 0.5, variant: str = "four",
                seed: int | np.random.SeedSequence = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Generate (X, Z, A): A from ``four_images`` (variant "four") or ``random_images`` (variant
    "eight_ones"), Z ~ Bern(0.5) of shape (n_rows, 4), X = Z A + N(0, noise_var) (SPEC 4)."""
    rng = np.random.default_rng(seed)
    if variant == "four":
        a = four_images()
    elif variant == "eight_ones":
        a = random_images(rng)
    else:
        raise ValueError(f"unknown IBP image variant {variant!r}: use 'four' or 'eight_ones'")
    z = (rng.random((n_rows, a.shape[0])) < 0.5).astype(np.float64)
    x = z @ a + np.sqrt(noise_var) * rng.standard_normal((n_rows, a.shape[1]))
    return x, z, a


def closest_base_msd(true_a: np.ndarray, est_a: np.ndarray) -> np.ndarray:
    """For each true base (row of ``true_a``), the mean squared difference to its closest estimated
    base (row of ``est_a``), shape (K_true,) (SPEC 4, paper 000 s. 4.1)."""
    diff = true_a[:, None, :] - est_a[None, :, :]
    return np.mean(diff * diff, axis=2).min(axis=1)


def base_error(true_a: np.ndarray, est_a: np.ndarray) -> float:
    """Base error: mean over true bases of the MSD to the closest estimate (SPEC 4)."""
    return float(closest_base_msd(true_a, est_a).mean())

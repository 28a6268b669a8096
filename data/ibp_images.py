"""Synthetic IBP image data of paper 000, Sec. 4.1.

X = Z A + noise with Z ~ Bern(0.5) (N x 4), A four 6x6 binary latent images flattened to rows
(4 x 36) and Gaussian noise of variance 0.5. Variant "four" uses the project's four fixed images
(``ibp_synthetic.latent_images``, shared with the particle-filter and Gibbs experiments); variant
"eight_ones" draws each image at random with eight ones, as in paper 000's speed comparison. The
base error of that comparison is ``kernels.metrics.base_error``.
"""

from __future__ import annotations

import numpy as np

from buffet.data.ibp_synthetic import latent_images

PIXELS = 36


def random_images(rng: np.random.Generator, n_images: int = 4, n_ones: int = 8) -> np.ndarray:
    """Random 6x6 binary images with ``n_ones`` ones each, shape (n_images, 36) (paper 000 s. 4.1)."""
    a = np.zeros((n_images, PIXELS))
    for k in range(n_images):
        a[k, rng.choice(PIXELS, size=n_ones, replace=False)] = 1.0
    return a


def make_images(n_rows: int = 50, noise_var: float = 0.5, variant: str = "four",
                seed: int | np.random.SeedSequence = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, Z, A) with A the fixed images (variant "four") or ``random_images`` (variant "eight_ones"),
    Z ~ Bern(0.5) of shape (n_rows, 4) and X = Z A + N(0, noise_var) noise."""
    rng = np.random.default_rng(seed)
    if variant == "four":
        a = latent_images()
    elif variant == "eight_ones":
        a = random_images(rng)
    else:
        raise ValueError(f"unknown IBP image variant {variant!r}: use 'four' or 'eight_ones'")
    z = (rng.random((n_rows, a.shape[0])) < 0.5).astype(np.float64)
    x = z @ a + np.sqrt(noise_var) * rng.standard_normal((n_rows, a.shape[1]))
    return x, z, a

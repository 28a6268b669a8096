"""IMF and INMF on the 4-image data, N = 100: wall time and base error per seed.

Each seed's data (``data.ibp_images.make_images``, noise variance 0.5) is written to a
dataset store and fitted by the engine's driver on an in-process engine (``models.imf.fit_to_end``),
the same code path as ``buffet fit imf``. Timed: the fit only (driver set-up included, store writing
excluded). Base error (paper 000, Sec. 4.1): mean over the true bases of the mean squared difference to the
closest posterior-mean base.

Beside each fit, the base error of three oracles that know the TRUE Z and noise variance, computed
from the same X (the statistical floor of the base error; untimed):

* ``oracle_ls``: least squares of X on Z (Var(a_kd) = sigma^2 [(Z^T Z)^-1]_kk, ~3.2 sigma^2 / N here);
* ``oracle_post``: posterior mean of A under the Gaussian prior a_kd ~ N(0, 1/eta_A) (IMF's) with
  eta_A = 1 / mean(A_true^2), the value that fits the true bases;
* ``oracle_trunc``: posterior mean under the same prior truncated at 0 (INMF's prior): per
  pixel a K-variate normal truncated to the positive orthant, its mean by Rao-Blackwellised Gibbs
  sampling (``TRUNC_SWEEPS`` sweeps after ``TRUNC_BURN_IN``).

    python benchmarks/imf_speed.py --seeds 10 [--noise-var 0.25]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.special import log_ndtr, ndtri_exp

from buffet.data.arrays import from_array
from buffet.data.ibp_images import make_images
from buffet.kernels.metrics import base_error
from buffet.pipeline.models.imf import IMFConfig, INMFConfig, fit_to_end

TARGET_ERROR = 0.0075
TRUNC_BURN_IN = 200
TRUNC_SWEEPS = 2000


def truncated_posterior_mean(mean: np.ndarray, precision: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """E[a] for a ~ N(mean[:, j], precision^-1) truncated to a >= 0, for every column j of ``mean`` (K x D):
    Gibbs sampling over the K coordinates, vectorised over columns, averaging each coordinate's
    conditional truncated-normal mean (Rao-Blackwellised) instead of its draws."""
    k = mean.shape[0]
    a = np.maximum(mean, 0.0)
    total = np.zeros_like(mean)
    scale = 1.0 / np.sqrt(np.diag(precision))
    for sweep in range(TRUNC_BURN_IN + TRUNC_SWEEPS):
        for r in range(k):
            others = np.arange(k) != r
            m = mean[r] - precision[r, others] @ (a[others] - mean[others]) / precision[r, r]
            alpha = -m / scale[r]
            # a_r | rest ~ N(m, scale^2) truncated to [0, inf): mean m + scale phi(alpha) / (1 - Phi(alpha))
            hazard = np.exp(-0.5 * alpha ** 2 - 0.5 * np.log(2 * np.pi) - log_ndtr(-alpha))
            if sweep >= TRUNC_BURN_IN:
                total[r] += m + scale[r] * hazard
            u = rng.random(m.shape)
            # inverse CDF in the upper tail of the standard normal, in log space for stability
            a[r] = m + scale[r] * -ndtri_exp(np.log1p(-u) + log_ndtr(-alpha))
    return total / TRUNC_SWEEPS


def oracle_errors(X: np.ndarray, Z: np.ndarray, A: np.ndarray, noise_var: float, seed: int) -> dict:
    """Base errors of the oracles of the module docstring, which know Z and the noise variance."""
    ls = np.linalg.lstsq(Z, X, rcond=None)[0]
    precision = Z.T @ Z / noise_var + np.eye(Z.shape[1]) / np.mean(A ** 2)
    post = np.linalg.solve(precision, Z.T @ X / noise_var)
    trunc = truncated_posterior_mean(post, precision, np.random.default_rng(seed))
    return {"oracle_ls": base_error(A, ls), "oracle_post": base_error(A, post), "oracle_trunc": base_error(A, trunc)}


def fit_seed(config_cls: type, seed: int, folder: Path, max_k: int, noise_var: float, restart: bool) -> dict:
    X, Z, A = make_images(n_rows=100, noise_var=noise_var, variant="four", seed=seed)
    store = from_array(X, folder / f"{config_cls.__name__}-{seed}.zarr", "real", rows_per_chunk=100)
    start = time.perf_counter()
    driver = fit_to_end(config_cls(max_k=max_k, chunk_rows=100, restart=restart), str(store.path))
    seconds = time.perf_counter() - start
    error = base_error(A, driver.state.post["m"].T) if driver.k_plus else float("inf")
    return {"model": config_cls.__name__.replace("Config", "").lower(), "seed": seed, "seconds": seconds,
            "k_plus": driver.k_plus, "base_error": error, "hit": bool(error <= TARGET_ERROR and seconds < 1.0),
            **oracle_errors(X, Z, A, noise_var, seed)}


ORACLES = ("oracle_ls", "oracle_post", "oracle_trunc")


def print_table(rows: list[dict]) -> None:
    """The method's base error per seed beside the oracles'."""
    print(f"{'model':5s} {'seed':>4s} {'seconds':>8s} {'K+':>3s} {'base_error':>10s} "
          + " ".join(f"{name:>12s}" for name in ORACLES))
    for r in rows:
        print(f"{r['model']:5s} {r['seed']:4d} {r['seconds']:8.3f} {r['k_plus']:3d} {r['base_error']:10.5f} "
              + " ".join(f"{r[name]:12.5f}" for name in ORACLES))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--max-k", type=int, default=8)
    p.add_argument("--noise-var", type=float, default=0.5,
                   help="0.5 as in paper 000; 0.25 is paper 001's noise sigma 0.5")
    p.add_argument("--no-restart", action="store_true",
                   help="growth without the ICA restart candidate (IMFConfig.restart = False)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for config_cls in (IMFConfig, INMFConfig):
            rows = [fit_seed(config_cls, seed, Path(tmp), args.max_k, args.noise_var,
                             not args.no_restart) for seed in range(args.seeds)]
            for row in rows:
                print(json.dumps(row))
            print_table(rows)
            print(json.dumps({"summary": rows[0]["model"], "noise_var": args.noise_var, "hits": sum(r["hit"] for r in rows), "seeds": len(rows),
                              "median_seconds": float(np.median([r["seconds"] for r in rows])),
                              "median_base_error": float(np.median([r["base_error"] for r in rows])),
                              **{f"median_{name}": float(np.median([r[name] for r in rows])) for name in ORACLES},
                              **{f"{name}_at_target": sum(r[name] <= TARGET_ERROR for r in rows) for name in ORACLES}}))


if __name__ == "__main__":
    main()

"""INMF against IMF and the user + item biases on the MovieLens sample of the collaborative-filtering
reproduction, and the INMF evidence curve from fits that start with features.

Per repeat (the reproduction's held-out ratings of that seed): the biases baseline, then IMF and INMF
fitted by the engine's driver with the offsets candidate the reproduction offers (ridge ``--offset-reg``)
or none (``--no-offsets``), no validation choice (``select="none"``), K+ capped at ``--max-k``. Prints
K+ and held-out NMAE per model and repeat, and the means.

The evidence curve (repeat 0): for K = 1 up to IMF's K+ on that repeat, INMF started at q(z) = the first
K columns of IMF's converged E[Z] (features that work for the signed model), the cap at K, so the search
does not grow further; the line gives the K+ it converged to (pruning may drop started features) and
its evidence beside the K+ = 0 evidence.

    python benchmarks/inmf_ratings.py --workdir /tmp/inmf-ratings [--repeats 10] [--max-k 8] [--no-offsets]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from buffet.kernels import baselines
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.experiments import collaborative_filtering as cf
from buffet.pipeline.experiments.common import write_store
from buffet.pipeline.models.imf import IMFConfig, INMFConfig, IMFDriver, fit_to_end


def nmae_of(predicted: np.ndarray, truth: np.ndarray, value_range: float) -> float:
    """Mean absolute error over the rating range (the reproduction's NMAE)."""
    return float(np.abs(predicted - truth).mean() / value_range)


def fit(config: IMFConfig, store: str, value_range: float, start: np.ndarray | None = None
        ) -> tuple[IMFDriver, float, float]:
    """The fitted driver, its held-out NMAE and the seconds it took."""
    began = time.perf_counter()
    driver = fit_to_end(config, store, start=start)
    return driver, nmae_of(*driver.predictions(), value_range), time.perf_counter() - began


def evidence_curve(config: INMFConfig, store: str, z: np.ndarray, value_range: float) -> None:
    """INMF started at the first K columns of ``z`` for K = 1..z.shape[1], one line per K."""
    for k in range(1, z.shape[1] + 1):
        driver, value, seconds = fit(INMFConfig(**{**vars(config), "max_k": k}), store, value_range, z[:, :k])
        k_first, evidence = driver.state.history[0]
        print(f"  evidence curve: started K={k}  converged K+={k_first}  L={evidence:.1f}  NMAE={value:.4f}  "
              f"({seconds:.0f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--no-offsets", action="store_true")
    parser.add_argument("--no-curve", action="store_true", help="skip the evidence curve on repeat 0")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}", flush=True)
    data = cf.movielens(None)
    reg = None if args.no_offsets else cf.OFFSET_REG
    common = dict(max_k=args.max_k, chunk_rows=128, offset_reg=reg, select="none")
    results: dict[str, list[tuple[int, float]]] = {"biases": [], "IMF": [], "INMF": []}
    for seed in range(args.repeats):
        x, observed = data.repeat(seed)
        test = cf.per_user_holdout(observed, stream(seed, "cf-test"), data.held_out, data.held_out_divisor)
        train = observed & ~test
        store = write_store(x, observed, test, args.workdir / f"repeat-{seed}.zarr", "real", 128)
        biases = baselines.bias_scores(x, train, cf.BIAS_REG)
        results["biases"].append((0, nmae_of(biases[test], x[test], data.value_range)))
        imf_fit, imf_nmae, imf_s = fit(IMFConfig(**common), store, data.value_range)
        inmf_fit, inmf_nmae, inmf_s = fit(INMFConfig(**common), store, data.value_range)
        results["IMF"].append((imf_fit.k_plus, imf_nmae))
        results["INMF"].append((inmf_fit.k_plus, inmf_nmae))
        print(f"repeat {seed}: biases NMAE={results['biases'][-1][1]:.4f} | IMF K+={imf_fit.k_plus} "
              f"NMAE={imf_nmae:.4f} ({imf_s:.0f} s) | INMF K+={inmf_fit.k_plus} NMAE={inmf_nmae:.4f} "
              f"({inmf_s:.0f} s) | INMF evidence by K+ {[(k, round(e, 1)) for k, e in inmf_fit.state.history]}",
              flush=True)
        if seed == 0 and not args.no_curve and imf_fit.k_plus > 0:
            evidence_curve(INMFConfig(**common), store, imf_fit.expected_z(), data.value_range)
    for name, rows in results.items():
        print(f"mean over {args.repeats}: {name:6s} K+={np.mean([k for k, _ in rows]):.1f} "
              f"NMAE={np.mean([v for _, v in rows]):.4f}")
    print(f"load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()

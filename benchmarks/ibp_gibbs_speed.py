"""Collapsed Gibbs for the linear-Gaussian IBP model on the paper-001 figure-3 data.

For each seed: N = 100 rows of the four 6x6 images with noise sigma 0.5, a chain started with no
features at alpha = sigma_X = sigma_A = 1, every hyperparameter resampled each sweep
(``kernels.gibbs_linear_gaussian.gibbs_sweep``), with ``--split-merge`` split-merge and ``--recombine``
recombination moves per sweep (defaults: those of ``buffet fit gibbs-linear-gaussian``; 0 turns them off).
Records milliseconds per sweep, wall and CPU time (after a warm-up; the moves included; CPU time is
less sensitive to other work on the host).

Stuck chains, judged against the true Z by the chain's final state: the last ``WINDOW`` sweeps give the
median K+ and the ZZ^T error of their average Z Z^T (``kernels.metrics.zzt_error``) against the true Z. The reference is an
oracle chain on the same data started at the true Z (same moves, its own random stream,
``ORACLE_SWEEPS`` sweeps, the same window): the error an exact sampler of this posterior reaches. A
chain is stuck when its error exceeds ``STUCK_RATIO`` times the oracle's (docs/performance.md,
"Samplers"); its median K+ is recorded but not judged, as the posterior holds small extra features too.

    python benchmarks/ibp_gibbs_speed.py --seeds 20 --sweeps 1000
    python benchmarks/ibp_gibbs_speed.py --seeds 20 --sweeps 1000 --split-merge 0 --recombine 0
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from buffet.data.ibp_synthetic import image_data
from buffet.kernels.gibbs_linear_gaussian import LGGibbsState, gibbs_sweep
from buffet.kernels.metrics import zzt_error
from buffet.pipeline.models.gibbs import LGGibbsConfig

STUCK_RATIO = 2.0
WINDOW = 100
ORACLE_SWEEPS = 200
WARM_UP = 20


def run_chain(X: np.ndarray, Z_true: np.ndarray, state: LGGibbsState, sweeps: int, moves: dict,
              rng: np.random.Generator) -> dict:
    """``sweeps`` sweeps from ``state``: wall and CPU seconds after the warm-up, and the final window's
    median K+ and ZZ^T error against Z_true."""
    zzt_sum = np.zeros((X.shape[0], X.shape[0]))
    k_plus = []
    timed = cpu = 0.0
    for sweep in range(sweeps):
        start, start_cpu = time.perf_counter(), time.process_time()
        state = gibbs_sweep(X, state, rng, **moves)
        if sweep >= WARM_UP:
            timed += time.perf_counter() - start
            cpu += time.process_time() - start_cpu
        if sweep >= sweeps - WINDOW:
            Z = state.Z.astype(np.float64)
            zzt_sum += Z @ Z.T
            k_plus.append(Z.shape[1])
    return {"seconds": timed, "cpu_seconds": cpu, "k_plus_median": float(np.median(k_plus)),
            "zzt_error": zzt_error(zzt_sum / len(k_plus), Z_true)}


def run_seed(seed: int, sweeps: int, moves: dict) -> dict:
    """The chain from no features and the oracle chain from the true Z on the data of ``seed``."""
    rng = np.random.default_rng(seed)
    data = image_data(rng)
    empty = LGGibbsState(np.zeros((data.X.shape[0], 0), bool), 1.0, 1.0, 1.0)
    chain = run_chain(data.X, data.Z, empty, sweeps, moves, rng)
    oracle = run_chain(data.X, data.Z, LGGibbsState(data.Z.copy(), 1.0, 1.0, 1.0), ORACLE_SWEEPS, moves,
                       np.random.default_rng([seed, 1]))
    stuck = chain["zzt_error"] > STUCK_RATIO * oracle["zzt_error"]
    return {"seed": seed, "ms_per_sweep": 1000 * chain["seconds"] / (sweeps - WARM_UP),
            "cpu_ms_per_sweep": 1000 * chain["cpu_seconds"] / (sweeps - WARM_UP),
            "k_plus_median": chain["k_plus_median"], "zzt_error": chain["zzt_error"],
            "oracle_zzt_error": oracle["zzt_error"], "stuck": bool(stuck)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    p.add_argument("--sweeps", type=int, default=1000)
    p.add_argument("--split-merge", type=int, default=LGGibbsConfig.split_merge_moves,
                   help="split-merge moves per sweep (0: none)")
    p.add_argument("--recombine", type=int, default=LGGibbsConfig.recombine_moves,
                   help="recombination moves per sweep (0: none)")
    args = p.parse_args()
    if args.sweeps < max(WINDOW, WARM_UP + 1):
        p.error(f"--sweeps must be at least {max(WINDOW, WARM_UP + 1)}")
    moves = {"split_merge_moves": args.split_merge, "recombine_moves": args.recombine}
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        rows.append(run_seed(seed, args.sweeps, moves))
        print(json.dumps(rows[-1]), flush=True)
    ms = np.array([r["ms_per_sweep"] for r in rows])
    cpu_ms = np.array([r["cpu_ms_per_sweep"] for r in rows])
    print(json.dumps({"summary": True, "ms_per_sweep_median": float(np.median(ms)), "ms_per_sweep_min": float(ms.min()),
                      "ms_per_sweep_max": float(ms.max()), "cpu_ms_per_sweep_median": float(np.median(cpu_ms)),
                      "stuck_chains": int(sum(r["stuck"] for r in rows)), "stuck_seeds": [r["seed"] for r in rows
                                                                                          if r["stuck"]],
                      "chains": len(rows), "sweeps": args.sweeps, **moves}))


if __name__ == "__main__":
    main()

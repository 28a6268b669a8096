"""Collapsed Gibbs for the linear-Gaussian IBP model on the paper-001 figure-3 data.

For each seed: N = 100 rows of the four 6x6 images with noise sigma 0.5, a chain started with no
features at alpha = sigma_X = sigma_A = 1, every hyperparameter resampled each sweep
(``kernels.gibbs_linear_gaussian.gibbs_sweep``), with ``--split-merge`` split-merge moves per
sweep (default: that of ``buffet fit gibbs-linear-gaussian``; 0 = plain Gibbs). Records
milliseconds per sweep, wall and CPU time (after a warm-up; split-merge moves included; CPU time
is less sensitive to other work on the host), the K+ of the last half of
the chain, the ZZ^T error of the last half's average and whether the chain is stuck in a
merged-feature mode: K+ of the last half mostly below 4, or a ZZ^T error above ``STUCK_ERROR``
(without split-merge the other chains measured 59-1454 here, 10 seeds; the stuck ones carry
extra or merged features and measured above 2000).

    python benchmarks/ibp_gibbs_speed.py --seeds 10 --sweeps 1000
    python benchmarks/ibp_gibbs_speed.py --seeds 10 --sweeps 1000 --split-merge 0
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

STUCK_ERROR = 1500.0
WARM_UP = 20


def run_chain(seed: int, sweeps: int, split_merge_moves: int) -> dict:
    """One chain on the data of ``seed``: timing and the summary of its last half."""
    rng = np.random.default_rng(seed)
    data = image_data(rng)
    state = LGGibbsState(np.zeros((data.X.shape[0], 0), bool), 1.0, 1.0, 1.0)
    zzt_sum = np.zeros((data.X.shape[0], data.X.shape[0]))
    k_plus, kept = [], 0
    timed = cpu = 0.0
    for sweep in range(sweeps):
        start, start_cpu = time.perf_counter(), time.process_time()
        state = gibbs_sweep(data.X, state, rng, split_merge_moves=split_merge_moves)
        if sweep >= WARM_UP:
            timed += time.perf_counter() - start
            cpu += time.process_time() - start_cpu
        if sweep >= sweeps // 2:
            Z = state.Z.astype(np.float64)
            zzt_sum += Z @ Z.T
            k_plus.append(Z.shape[1])
            kept += 1
    error = zzt_error(zzt_sum / kept, data.Z)
    below = float(np.mean(np.array(k_plus) < 4))
    return {"seed": seed, "ms_per_sweep": 1000 * timed / (sweeps - WARM_UP),
            "cpu_ms_per_sweep": 1000 * cpu / (sweeps - WARM_UP), "k_plus_median": float(np.median(k_plus)),
            "fraction_k_below_4": below, "zzt_error": error, "stuck": bool(below > 0.5 or error > STUCK_ERROR),
            "sigma_x_last": state.sigma_x}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--sweeps", type=int, default=1000)
    p.add_argument("--split-merge", type=int, default=LGGibbsConfig.split_merge_moves,
                   help="split-merge moves per sweep (0: plain Gibbs)")
    p.add_argument("--seed-list", type=int, nargs="*", default=None, help="run only these seeds")
    args = p.parse_args()
    seeds = args.seed_list if args.seed_list else range(args.seeds)
    rows = [run_chain(seed, args.sweeps, args.split_merge) for seed in seeds]
    for row in rows:
        print(json.dumps(row))
    ms = np.array([r["ms_per_sweep"] for r in rows])
    cpu_ms = np.array([r["cpu_ms_per_sweep"] for r in rows])
    print(json.dumps({"summary": True, "ms_per_sweep_median": float(np.median(ms)), "ms_per_sweep_min": float(ms.min()),
                      "ms_per_sweep_max": float(ms.max()), "cpu_ms_per_sweep_median": float(np.median(cpu_ms)),
                      "stuck_chains": int(sum(r["stuck"] for r in rows)),
                      "chains": len(rows), "sweeps": args.sweeps,
                      "split_merge": args.split_merge}))


if __name__ == "__main__":
    main()

"""The noisy-OR particle filter's ZZ^T error against the number of particles P, with and
without resample-move, on paper 001's figure-5 data (Z 6 x 4 from the IBP(3), Y 4 x 250, p = 0.1,
lambda = 0.9, eps = 0.01; ``data.ibp_synthetic.noisy_or_data`` with seed 0), one particle block, in
process. For every P: the error of each filter seed, their mean and median, and the seconds of all seeds;
with ``--diagnose`` also, for the worst seed, the log joint of the heaviest particle against the true
(Z, Y)'s.

    python benchmarks/pf_noisy_or_particles.py --particles 100 200 1000 --moves 0 --seeds 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record


def fit(X: np.ndarray, particles: int, moves: int, seed: int):
    """The filter after every row (in process)."""
    from buffet.pipeline.engine.dataset import ArrayRows, source_of
    from buffet.pipeline.engine.process_executor import ProcessEngine
    from buffet.pipeline.models.particles import NoisyORParticleConfig, ParticleDriver

    config = NoisyORParticleConfig(particles=particles, blocks=1, alpha=3.0, seed=seed, moves=moves)
    driver = ParticleDriver(config, source_of(ArrayRows(X.astype(np.float64))), ProcessEngine())
    driver.start()
    for step in range(driver.total_steps()):
        driver.step(step)
    return driver


def main() -> None:
    from buffet.data.ibp_synthetic import noisy_or_data
    from buffet.kernels.gibbs_noisy_or import NoisyORGibbsState, log_joint
    from buffet.kernels.metrics import zzt_error
    from buffet.pipeline.models.noisy_or import noisy_or_params
    from buffet.pipeline.models.particles import NoisyORParticleConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--particles", type=int, nargs="+", default=[100, 200, 1000])
    p.add_argument("--moves", type=int, default=0)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--diagnose", action="store_true")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()
    data = noisy_or_data(np.random.default_rng(0))
    X = data.X.astype(bool)
    params = noisy_or_params(NoisyORParticleConfig())
    truth = log_joint(X, NoisyORGibbsState(data.Z.astype(bool), data.A.astype(bool), 3.0), params)
    for particles in args.particles:
        started, errors, drivers = time.perf_counter(), [], []
        for seed in range(args.seeds):
            driver = fit(X, particles, args.moves, seed)
            errors.append(float(zzt_error(driver.posterior()["zzt"], data.Z)))
            drivers.append(driver)
        seconds = time.perf_counter() - started
        result = {"bench": "pf_noisy_or_particles", "particles": particles, "moves": args.moves,
                  "errors": [round(e, 3) for e in errors], "mean": round(float(np.mean(errors)), 3),
                  "median": round(float(np.median(errors)), 3), "seconds_all_seeds": round(seconds, 1),
                  "machine": machine()}
        if args.diagnose:
            worst = drivers[int(np.argmax(errors))]
            [block] = worst.particle_blocks()
            best = int(np.argmax(worst.state.weights))
            active = block.m[best] > 0
            state = NoisyORGibbsState(block.Z[best][:, active], block.Y[best][active], 3.0)
            result.update(worst_seed=int(np.argmax(errors)), heaviest_log_joint=round(log_joint(X, state, params), 1),
                          true_log_joint=round(truth, 1), heaviest_k_plus=int(active.sum()))
        record(args.results, result)


if __name__ == "__main__":
    main()

"""The linear-Gaussian particle filter against the oracle: per noise level and seed, the ZZ^T error of the filter
(``--particles`` particles, its default moves unless ``--moves`` / ``--feature-moves`` are given) beside that of
a collapsed Gibbs chain started at the true Z (``pf_particles_curve.oracle_error``: alpha, sigma_X, sigma_A held
at the filter's values, ``--oracle-sweeps`` sweeps, the first 10% dropped), and their ratio.

Data: the four 6x6 images, ``--rows`` rows, each noise variance of ``--noise-var`` (``data.ibp_images.make_images``,
a new draw per seed); alpha = 1, sigma_X = sqrt(noise variance), sigma_A = 1; one particle block, in process,
through the engine's driver. Per noise level it prints one line per seed, then the mean errors, the ratio of the
means and the largest ratio of a seed, and records them (``common.record``). The seconds are only comparable
within one run on a quiet machine.

    OPENBLAS_NUM_THREADS=1 python benchmarks/pf_oracle.py --noise-var 0.5 0.25 --seeds 5 --particles 500
    OPENBLAS_NUM_THREADS=1 python benchmarks/pf_oracle.py --noise-var 0.5 --seed-list 1 --feature-moves 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record
from pf_particles_curve import oracle_error


def filter_run(X: np.ndarray, config) -> tuple[float, dict[str, np.ndarray]]:
    """Seconds and posterior of the filter with ``config`` on X (one block, in process)."""
    from buffet.pipeline.engine.dataset import ArrayRows, source_of
    from buffet.pipeline.engine.process_executor import ProcessEngine
    from buffet.pipeline.experiments.particles import timed_posterior
    from buffet.pipeline.models.particles import ParticleDriver

    return timed_posterior(lambda: ParticleDriver(config, source_of(ArrayRows(X)), ProcessEngine()))


def noise_level(noise_var: float, seeds: list[int], args: argparse.Namespace) -> dict:
    """Every seed's errors at one noise level, printed and recorded; returns the level's summary."""
    from buffet.data.ibp_images import make_images
    from buffet.kernels.metrics import constant_zzt_error, zzt_error
    from buffet.pipeline.models.particles import LGParticleConfig

    overrides = {name: value for name, value in (("moves", args.moves), ("feature_moves", args.feature_moves))
                 if value is not None}
    errors, oracles = [], []
    for seed in seeds:
        X, Z = make_images(args.rows, noise_var, "four", seed=seed)[:2]
        config = LGParticleConfig(particles=args.particles, blocks=1, alpha=1.0, sigma_x=float(np.sqrt(noise_var)),
                                  sigma_a=1.0, seed=seed, **overrides)
        seconds, post = filter_run(X, config)
        error, oracle = zzt_error(post["zzt"], Z), oracle_error(X, Z, config.sigma_x, args.oracle_sweeps, seed)
        guess = constant_zzt_error(Z)
        errors.append(error)
        oracles.append(oracle)
        record(args.results, {"bench": "pf_oracle", "noise_var": noise_var, "seed": seed,
                              "particles": args.particles, "moves": config.moves,
                              "feature_moves": config.feature_moves, "filter_error": round(error, 2),
                              "oracle_error": round(oracle, 2), "ratio": round(error / oracle, 3),
                              "filter_vs_constant_guess": round(error / guess, 3),
                              "oracle_vs_constant_guess": round(oracle / guess, 3),
                              "k_plus_mean": round(float(post["k_plus_mean"]), 2), "seconds": round(seconds, 1)})
    ratios = np.asarray(errors) / np.asarray(oracles)
    summary = {"bench": "pf_oracle", "noise_var": noise_var, "seeds": seeds, "particles": args.particles,
               "mean_filter_error": round(float(np.mean(errors)), 2),
               "mean_oracle_error": round(float(np.mean(oracles)), 2),
               "ratio_of_means": round(float(np.mean(errors) / np.mean(oracles)), 3),
               "largest_seed_ratio": round(float(ratios.max()), 3), "machine": machine()}
    record(args.results, summary)
    return summary


def main() -> None:
    from buffet.pipeline.models.particles import LGParticleConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--noise-var", type=float, nargs="+", default=[0.5, 0.25])
    p.add_argument("--seeds", type=int, default=5, help="seeds 0 .. seeds - 1")
    p.add_argument("--seed-list", type=int, nargs="*", help="run only these seeds")
    p.add_argument("--particles", type=int, default=500)
    p.add_argument("--moves", type=int, help=f"the filter's --moves (default {LGParticleConfig.moves})")
    p.add_argument("--feature-moves", type=int,
                   help=f"the filter's --feature-moves (default {LGParticleConfig.feature_moves})")
    p.add_argument("--rows", type=int, default=100)
    p.add_argument("--oracle-sweeps", type=int, default=200)
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()
    seeds = args.seed_list if args.seed_list else list(range(args.seeds))
    for noise_var in args.noise_var:
        noise_level(noise_var, seeds, args)


if __name__ == "__main__":
    main()

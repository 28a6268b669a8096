"""The ZZ^T error of a particle filter against the number of particles P, with and without
resample-move (``--moves``), beside Gibbs sampling at equal wall time (paper 001 figures 3 and 5).

Models and data (one particle block or one chain, in process, through the engine's drivers as in
``buffet reproduce pf-images``; filter and chain seeds 0, 1, ...):

* ``linear-gaussian``: the four 6x6 images, ``--rows`` rows, noise variance ``--noise-var``
  (``data.ibp_images.make_images``, a new draw per seed; the defaults are 100 rows at 0.5,
  paper 001's figure 3 has 0.25); alpha = 1, sigma_X = sqrt(noise variance), sigma_A = 1 (Gibbs
  resamples all three, as in the reproduction). ``--oracle-sweeps S`` adds the error of the posterior
  mean of a collapsed Gibbs chain started at the true Z with alpha, sigma_X, sigma_A held at those values
  (S sweeps, the first 10% dropped): what an exact sampler of the filter's posterior reaches.
* ``noisy-or``: paper 001's figure-5 data (Z 6 x 4 from the IBP(3), Y 4 x 250, p = 0.1, lambda = 0.9,
  eps = 0.01; ``data.ibp_synthetic.noisy_or_data`` with seed 0, the same for every seed); alpha = 3.

Every point is recorded (``common.record``) with the errors of all seeds, their mean, and the mean
error relative to the best constant guess (``metrics.constant_zzt_error``). Then, per filter with moves,
the error of the filter without moves at its wall time (interpolated in log time), and the filter
against Gibbs (``pipeline.experiments.particles.comparison_rows``). The seconds are only comparable
within one run on a quiet machine. Paper 001's range: P and sweeps 1-5,000 in figure 3, 1-1,000 in figure 5.

    python benchmarks/pf_particles_curve.py --model linear-gaussian --particles 10 100 500 --moves 0 10 \\
        --sweeps 1 10 100 --seeds 3
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record

MODELS = ("linear-gaussian", "noisy-or")


@dataclass(frozen=True)
class Problem:
    """One model's data per seed and its filter and Gibbs configurations (module docstring)."""

    data: Callable[[int], tuple[np.ndarray, np.ndarray]]           # seed -> (X, true Z)
    filter_config: Callable[[int, int, int], object]               # (P, moves, seed) -> config
    gibbs_config: Callable[[int, int], object]                     # (sweeps, seed) -> config


def problem(model: str, rows: int, noise_var: float) -> Problem:
    """The data and configurations of ``model`` (module docstring)."""
    from buffet.data.ibp_images import make_images
    from buffet.data.ibp_synthetic import noisy_or_data
    from buffet.pipeline.models.gibbs import LGGibbsConfig, NoisyORGibbsConfig
    from buffet.pipeline.models.particles import LGParticleConfig, NoisyORParticleConfig

    if model == "linear-gaussian":
        sigma_x = float(np.sqrt(noise_var))
        return Problem(lambda seed: make_images(rows, noise_var, "four", seed=seed)[:2],
                       lambda p, moves, seed: LGParticleConfig(particles=p, blocks=1, alpha=1.0, sigma_x=sigma_x,
                                                               sigma_a=1.0, seed=seed, moves=moves),
                       lambda s, seed: LGGibbsConfig(sweeps=s, chains=1, alpha=1.0, sigma_x=sigma_x, sigma_a=1.0,
                                                     seed=seed))
    data = noisy_or_data(np.random.default_rng(0))
    return Problem(lambda seed: (data.X.astype(np.float64), data.Z),
                   lambda p, moves, seed: NoisyORParticleConfig(particles=p, blocks=1, alpha=3.0, seed=seed,
                                                                moves=moves),
                   lambda s, seed: NoisyORGibbsConfig(sweeps=s, chains=1, alpha=3.0, seed=seed))


def oracle_error(X: np.ndarray, Z: np.ndarray, sigma_x: float, sweeps: int, seed: int) -> float:
    """ZZ^T error of the posterior mean of a collapsed Gibbs chain (alpha 1, sigma_A 1, sigma_X held) started
    at the true Z (module docstring)."""
    from buffet.kernels.gibbs_linear_gaussian import FIXED, LGGibbsState, gibbs_sweep
    from buffet.kernels.metrics import zzt_error

    rng = np.random.default_rng(seed)
    state = LGGibbsState(np.asarray(Z, bool), 1.0, sigma_x, 1.0)
    total, kept = np.zeros((X.shape[0], X.shape[0])), 0
    for sweep in range(sweeps):
        state = gibbs_sweep(X, state, rng, FIXED)
        if sweep >= sweeps // 10:
            Zf = state.Z.astype(np.float64)
            total, kept = total + Zf @ Zf.T, kept + 1
    return zzt_error(total / kept, Z)


def point_record(model: str, point, guesses: list[float], **extra) -> dict:
    """The result line of one point (module docstring)."""
    errors = np.asarray(point.errors)
    return {"bench": "pf_particles_curve", "model": model, "method": point.method, "setting": point.setting,
            **extra, "errors": [round(float(e), 2) for e in errors], "mean": round(float(errors.mean()), 2),
            "sd": round(float(errors.std()), 2),
            "mean_vs_constant_guess": round(float(np.mean(errors / np.asarray(guesses[:errors.size]))), 3),
            "mean_seconds": round(point.time[0], 3), "machine": machine()}


def moves_against_plain(curves: dict[int, list], plain: list) -> list[dict]:
    """Per point of every filter with moves: the plain filter's error at its wall time and which is lower
    (None where the plain curve does not reach that time)."""
    from buffet.pipeline.experiments.particles import error_at

    rows = []
    for moves, points in curves.items():
        for p in points:
            plain_error = error_at(plain, p.time[0])
            rows.append({"moves": moves, "particles": p.setting, "seconds": round(p.time[0], 3),
                         "error": round(p.error[0], 2),
                         "plain_error_at_that_time": None if plain_error is None else round(plain_error, 2),
                         "moves_lower": None if plain_error is None else bool(p.error[0] < plain_error)})
    return rows


def main() -> None:
    from buffet.kernels.metrics import constant_zzt_error, zzt_error
    from buffet.pipeline.engine.dataset import ArrayRows, source_of
    from buffet.pipeline.engine.process_executor import ProcessEngine
    from buffet.pipeline.experiments.particles import COMPARISON_HEADER, comparison_rows, measure
    from buffet.pipeline.models.gibbs import GibbsDriver
    from buffet.pipeline.models.particles import ParticleDriver

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, required=True)
    p.add_argument("--particles", type=int, nargs="+", default=[10, 20, 50, 100, 200, 500, 1000, 2000, 5000])
    p.add_argument("--moves", type=int, nargs="+", default=[0, 10], help="--moves of the filter; 0 is plain SIR")
    p.add_argument("--moved-particles", type=int, nargs="+", help="P of the filters with moves (default: --particles)")
    p.add_argument("--sweeps", type=int, nargs="*", default=[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
                   help="Gibbs sweeps (none: no Gibbs curve)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--rows", type=int, default=100, help="linear-gaussian: rows of the image data")
    p.add_argument("--noise-var", type=float, default=0.5, help="linear-gaussian: noise variance of the data")
    p.add_argument("--oracle-sweeps", type=int, default=0, help="linear-gaussian: the oracle's sweeps (0: none)")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()
    prob = problem(args.model, args.rows, args.noise_var)
    data = [prob.data(seed) for seed in range(args.seeds)]
    guesses = [constant_zzt_error(Z) for _, Z in data]

    def runs(driver_cls: type, config: Callable[[int, int], object]) -> Callable[[int, int], Callable]:
        return lambda setting, seed: lambda: driver_cls(config(setting, seed), source_of(ArrayRows(data[seed][0])),
                                                        ProcessEngine())

    def error(post: dict, seed: int) -> float:
        return zzt_error(post["zzt"], data[seed][1])

    filters = {}
    for moves in args.moves:
        config = (lambda m: lambda particles, seed: prob.filter_config(particles, m, seed))(moves)
        particles = args.moved_particles if moves and args.moved_particles else args.particles
        filters[moves] = measure(f"filter, moves {moves}", particles, args.seeds, runs(ParticleDriver, config), error)
        for point in filters[moves]:
            record(args.results, point_record(args.model, point, guesses, moves=moves))
    gibbs = measure("Gibbs", args.sweeps, args.seeds, runs(GibbsDriver, prob.gibbs_config), error) \
        if args.sweeps else []
    for point in gibbs:
        record(args.results, point_record(args.model, point, guesses))
    if args.oracle_sweeps and args.model == "linear-gaussian":
        oracle = [oracle_error(X, Z, float(np.sqrt(args.noise_var)), args.oracle_sweeps, seed)
                  for seed, (X, Z) in enumerate(data)]
        record(args.results, {"bench": "pf_particles_curve", "model": args.model, "method": "oracle",
                              "setting": args.oracle_sweeps, "errors": [round(e, 2) for e in oracle],
                              "mean_vs_constant_guess": round(float(np.mean(np.asarray(oracle) / guesses)), 3)})
    if 0 in filters:
        rows = moves_against_plain({m: c for m, c in filters.items() if m}, filters[0])
        for row in rows:
            record(None, {"bench": "pf_particles_curve", "model": args.model, "equal_time": "moves vs plain", **row})
        for moves in filters.keys() - {0}:
            verdicts = [r["moves_lower"] for r in rows if r["moves"] == moves and r["moves_lower"] is not None]
            record(None, {"bench": "pf_particles_curve", "model": args.model, "moves": moves,
                          "lower_than_plain_at_equal_time": f"{sum(verdicts)} of {len(verdicts)} points"})
    for moves, points in filters.items() if gibbs else ():
        for row in comparison_rows(points, gibbs):
            record(None, {"bench": "pf_particles_curve", "model": args.model, "equal_time": "filter vs Gibbs",
                          "moves": moves, **{k: round(v, 3) if isinstance(v, float) else v
                                             for k, v in zip(COMPARISON_HEADER, row)}})


if __name__ == "__main__":
    main()

"""``buffet reproduce pf-images | pf-noisy-or | ibp-speed``: particle filter against Gibbs sampling
(paper 001 figures 3 and 5; paper 000 figure 3).

Every method runs through its engine driver on an in-process engine (``ProcessEngine()``), one
particle block or one chain, so both samplers get the same engineering: the kernels of
``kernels/`` called by the drivers of ``pipeline/models/particles.py`` and ``pipeline/models/gibbs.py``. The
wall time of a run covers building the driver, every row or sweep and the posterior summary.
Each setting (P particles, or S sweeps with the first 10% discarded) is run ``--seeds`` times
with run seeds 0, 1, ...; points are the mean time and mean error with standard deviations.

* ``pf-images`` (paper 001 figure 3): one data set, 100 rows of the four 6x6 images, z ~ Bern(0.5),
  sigma_X = 0.5; ZZ^T error (paper 001, Sec. 4.2). The filters and the Gibbs chains use alpha = 1,
  sigma_X = 0.5, sigma_A = 1 (Gibbs resamples all three each sweep); the filters of all three
  experiments are the paper's algorithms, without resample-move (``moves`` 0; with moves:
  benchmarks/pf_particles_curve.py). Option ``proposal`` (``run_experiment(..., options={"proposal":
  "prior"})``): the filter's proposal of z_i.
* ``pf-noisy-or`` (paper 001 figure 5): Z 6 x 4 from the IBP(3), Y 4 x 250 with p = 0.1, X from
  eq. 8 with lambda = 0.9, eps = 0.01; ZZ^T error; alpha = 3, p, lambda, eps at their true values
  (Gibbs resamples alpha).
* ``ibp-speed`` (paper 000 figure 3): 50 rows, four random 6x6 images with eight ones each (a new
  draw per seed), noise variance 0.5; base error (paper 000, Sec. 4.1) of E[A] against wall time for IMF and
  INMF (on an in-process engine, K+ chosen by evidence), VFMF and TVIMF (at truncations 4 to 10, the
  best of 3 random restarts), the particle filter and Gibbs: paper 000's six algorithms.

The table states, for every particle-filter point, how long Gibbs needed to reach the same error
(first crossing of its mean curve, interpolated in log time) and the speed-up, i.e. whether the
paper's "order of magnitude faster" holds at that error level, and Gibbs's error at the filter's
wall time (interpolated) beside the filter's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from buffet.data.ibp_images import make_images
from buffet.data.ibp_synthetic import image_data, noisy_or_data
from buffet.kernels.metrics import base_error, zzt_error
from buffet.pipeline.engine.dataset import ArrayRows, source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.models.gibbs import GibbsDriver, LGGibbsConfig, NoisyORGibbsConfig
from buffet.pipeline.models.imf import IMFConfig, INMFConfig, fit_to_end
from buffet.pipeline.models.particles import LGParticleConfig, NoisyORParticleConfig, ParticleDriver
from buffet.pipeline.models.vfmf import TVIMFConfig, VFMFConfig
from buffet.pipeline.models.vfmf import fit_to_end as fit_variational
from buffet.pipeline.reports.plots import new_figure, save_figure
from buffet.pipeline.experiments.common import markdown_table, mean_std, write_csv, write_markdown, write_store

PF, GIBBS = "particle filter", "Gibbs"
SPEED_UP = 10.0  # "an order of magnitude faster" (paper 001, Sec. 4.2)


@dataclass(frozen=True)
class Point:
    """One method at one setting (particles or sweeps), over the runs: wall times and errors."""

    method: str
    setting: int
    times: tuple[float, ...]
    errors: tuple[float, ...]

    @property
    def time(self) -> tuple[float, float]:
        return mean_std(self.times)

    @property
    def error(self) -> tuple[float, float]:
        return mean_std(self.errors)


# ----- running the samplers -----

def timed_posterior(make_driver: Callable[[], object]) -> tuple[float, dict[str, np.ndarray]]:
    """Wall time of building a driver and running every step, and its posterior (module docstring)."""
    start = time.perf_counter()
    driver = make_driver()
    driver.start()
    for step in range(driver.total_steps()):
        driver.step(step)
    post = driver.posterior()
    return time.perf_counter() - start, post


def measure(method: str, settings: Sequence[int], seeds: int, make_driver: Callable[[int, int], Callable],
            error: Callable[[dict[str, np.ndarray], int], float]) -> list[Point]:
    """Every setting run ``seeds`` times; ``make_driver(setting, seed)`` gives a driver factory and
    ``error(posterior, seed)`` the run's error."""
    points = []
    for setting in settings:
        runs = [timed_posterior(make_driver(setting, seed)) for seed in range(seeds)]
        points.append(Point(method, setting, tuple(t for t, _ in runs),
                            tuple(error(post, seed) for seed, (_, post) in enumerate(runs))))
        print(f"{method} {setting}: {points[-1].time[0]:.3f} s, error {points[-1].error[0]:.4g}", flush=True)
    return points


def filter_and_gibbs(pf_config: Callable[[int, int], object], gibbs_config: Callable[[int, int], object],
                     rows: Callable[[int], ArrayRows], particles: Sequence[int], sweeps: Sequence[int], seeds: int,
                     error: Callable[[dict[str, np.ndarray], int], float]) -> tuple[list[Point], list[Point]]:
    """The particle-filter and Gibbs curves; ``rows(seed)`` is the data of run ``seed``."""
    def factory(driver_cls: type, config: Callable[[int, int], object]) -> Callable[[int, int], Callable]:
        return lambda setting, seed: lambda: driver_cls(config(setting, seed), source_of(rows(seed)), ProcessEngine())

    return (measure(PF, particles, seeds, factory(ParticleDriver, pf_config), error),
            measure(GIBBS, sweeps, seeds, factory(GibbsDriver, gibbs_config), error))


# ----- comparing the curves -----

def _log_interpolate(t0: float, t1: float, frac: float) -> float:
    return float(np.exp(np.log(t0) + frac * (np.log(t1) - np.log(t0))))


def time_to_reach(curve: Sequence[Point], level: float) -> tuple[str, float]:
    """When the mean error of ``curve`` (sorted by time) first falls to ``level``: ("=", t) by
    interpolation in log time, ("<=", t) if its fastest point is already there, (">", t_max) if never."""
    pts = sorted(curve, key=lambda p: p.time[0])
    (t_prev, e_prev) = pts[0].time[0], pts[0].error[0]
    if e_prev <= level:
        return "<=", t_prev
    for p in pts[1:]:
        t, e = p.time[0], p.error[0]
        if e <= level:
            return "=", _log_interpolate(t_prev, t, (e_prev - level) / (e_prev - e))
        t_prev, e_prev = t, e
    return ">", t_prev


def error_at(curve: Sequence[Point], when: float) -> float | None:
    """Mean error of ``curve`` at wall time ``when``, interpolated in log time; None outside its range."""
    pts = sorted(curve, key=lambda p: p.time[0])
    times = np.log([p.time[0] for p in pts])
    if not times[0] <= np.log(when) <= times[-1]:
        return None
    return float(np.interp(np.log(when), times, [p.error[0] for p in pts]))


def speed_verdict(relation: str, ratio: float) -> str:
    """Whether Gibbs needed at least ``SPEED_UP`` times the filter's time ("unclear" when only bounded)."""
    if relation == "=":
        return "yes" if ratio >= SPEED_UP else "no"
    if relation == "<=":
        return "no" if ratio < SPEED_UP else "unclear"
    return "yes" if ratio >= SPEED_UP else "unclear"


def equal_time_errors(gibbs: Sequence[Point], when: float, pf_error: float) -> tuple[str, str]:
    """Gibbs's error at wall time ``when`` (or why there is none) and whether the filter's is lower."""
    e_gibbs = error_at(gibbs, when)
    if e_gibbs is None:
        fastest = min(g.time[0] for g in gibbs)
        return ("no Gibbs result this fast" if when < fastest else "beyond the Gibbs runs"), ""
    return f"{e_gibbs:.4g}", "yes" if pf_error < e_gibbs else "no"


def comparison_rows(pf: Sequence[Point], gibbs: Sequence[Point]) -> list[list[object]]:
    """Per filter point: Gibbs's time to the same error, the speed-up and verdict, Gibbs's error at equal time."""
    rows = []
    for p in pf:
        t_pf, e_pf = p.time[0], p.error[0]
        relation, t_gibbs = time_to_reach(gibbs, e_pf)
        ratio = t_gibbs / t_pf
        bound = "" if relation == "=" else f"{relation} "
        rows.append([p.setting, t_pf, e_pf, f"{bound}{t_gibbs:.4g}", f"{bound}{ratio:.3g}x",
                     speed_verdict(relation, ratio), *equal_time_errors(gibbs, t_pf, e_pf)])
    return rows


COMPARISON_HEADER = ["P", "PF time (s)", "PF error", "Gibbs time to same error (s)", "speed-up",
                     ">= 10x faster?", "Gibbs error at PF time", "PF error lower?"]
CURVE_HEADER = ["method", "setting", "runs", "time mean (s)", "time sd", "error mean", "error sd"]


def curve_rows(points: Sequence[Point]) -> list[list[object]]:
    return [[p.method, p.setting, len(p.times), *p.time, *p.error] for p in points]


# ----- outputs -----

def figure(curves: dict[str, Sequence[Point]], setting_names: dict[str, str], y_label: str, title: str,
           path: Path) -> Path:
    """Mean error against mean wall time with standard-deviation bars in both directions (log time)."""
    fig, ax = new_figure(figsize=(7, 4.5))
    for method, points in curves.items():
        (t, t_sd), (e, e_sd) = zip(*[p.time for p in points]), zip(*[p.error for p in points])
        ax.errorbar(t, e, xerr=t_sd, yerr=e_sd, marker="o", capsize=3, label=method)
        if setting_names.get(method):
            for p in points:
                ax.annotate(str(p.setting), (p.time[0], p.error[0]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("wall-clock time per run (s)")
    ax.set_ylabel(y_label)
    ax.set_title(title)
    ax.legend(title=", ".join(f"{m}: {s}" for m, s in setting_names.items() if s), title_fontsize=7, fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def write_outputs(out_dir: Path, name: str, title: str, paper: str, curves: dict[str, Sequence[Point]],
                  y_label: str, notes: Sequence[str]) -> list[Path]:
    """Curve table (markdown + CSV), the PF-vs-Gibbs comparison (when both ran) and the figure."""
    all_points = [p for points in curves.values() for p in points]
    sections = [f"Paper: {paper}", *notes, "## Measured curves", markdown_table(CURVE_HEADER, curve_rows(all_points))]
    if PF in curves and GIBBS in curves:
        sections += ["## Particle filter against Gibbs", markdown_table(COMPARISON_HEADER,
                                                                        comparison_rows(curves[PF], curves[GIBBS]))]
    files = [write_csv(CURVE_HEADER, curve_rows(all_points), out_dir / f"{name}.csv"),
             figure(curves, {PF: "P particles", GIBBS: "sweeps", "VFMF": "T", "TVIMF": "T"}, y_label, title,
                    out_dir / f"{name}.png")]
    return files + [write_markdown(title, sections, out_dir / f"{name}.md")]


# ----- the experiments -----

def pf_images(out_dir: Path, seeds: int, quick: bool, proposal: str = LGParticleConfig.proposal) -> list[Path]:
    """Paper 001 figure 3 (module docstring); ``proposal`` names the filter's proposal of z_i."""
    n_rows, particles, sweeps = (30, [1, 10, 100], [2, 5, 20]) if quick else \
        (100, [1, 10, 100, 500, 1000, 2500, 5000], [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])
    data = image_data(np.random.default_rng(0), n_rows=n_rows, noise_sd=0.5)
    rows = ArrayRows(data.X)
    pf, gibbs = filter_and_gibbs(
        lambda p, seed: LGParticleConfig(particles=p, blocks=1, alpha=1.0, sigma_x=0.5, sigma_a=1.0, seed=seed,
                                         proposal=proposal, moves=0),
        lambda s, seed: LGGibbsConfig(sweeps=s, chains=1, alpha=1.0, sigma_x=0.5, sigma_a=1.0, seed=seed),
        lambda seed: rows, particles, sweeps, seeds, lambda post, seed: zzt_error(post["zzt"], data.Z))
    p100 = next((p for p in pf if p.setting == 100), None)
    notes = [f"Data: {n_rows} x 36, four 6x6 images, z ~ Bern(0.5), sigma_X = 0.5; {seeds} runs per point; "
             f"one particle block / one chain per run, in process; the filter's proposal: {proposal}."]
    if p100 is not None:
        e_gibbs = error_at(gibbs, p100.time[0])
        notes.append(f"At the wall time of the filter with P = 100 ({p100.time[0]:.3g} s) its ZZ^T error is "
                     f"{p100.error[0]:.4g}; Gibbs's interpolated error at that time is "
                     + ("not defined (no Gibbs run is that fast)" if e_gibbs is None else
                        f"{e_gibbs:.4g}: the filter is {'below' if p100.error[0] < e_gibbs else 'not below'} Gibbs")
                     + ".")
    return write_outputs(out_dir, "pf_images", "Particle filter vs Gibbs, linear-Gaussian images (paper 001 fig. 3)",
                         "PF attains low error an order of magnitude or more faster than Gibbs in most cases",
                         {PF: pf, GIBBS: gibbs}, "ZZ^T error", notes)


def pf_noisy_or(out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    """Paper 001 figure 5 (module docstring)."""
    settings = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    particles, sweeps = ([1, 10, 50], [2, 5, 20]) if quick else (settings, settings)
    data = noisy_or_data(np.random.default_rng(0))
    rows = ArrayRows(data.X.astype(np.float64))
    pf, gibbs = filter_and_gibbs(
        lambda p, seed: NoisyORParticleConfig(particles=p, blocks=1, alpha=3.0, seed=seed, moves=0),
        lambda s, seed: NoisyORGibbsConfig(sweeps=s, chains=1, alpha=3.0, seed=seed),
        lambda seed: rows, particles, sweeps, seeds, lambda post, seed: zzt_error(post["zzt"], data.Z))
    notes = [f"Data: Z 6 x 4 from the IBP(3), Y 4 x 250 with p = 0.1, lambda = 0.9, eps = 0.01; "
             f"{seeds} runs per point; one particle block / one chain per run, in process."]
    return write_outputs(out_dir, "pf_noisy_or", "Particle filter vs Gibbs, noisy-OR (paper 001 fig. 5)",
                         "PF gives a better approximation (lower ZZ^T error) than Gibbs in less time",
                         {PF: pf, GIBBS: gibbs}, "ZZ^T error", notes)


def _base_error(A_true: np.ndarray, A_est: np.ndarray) -> float:
    """The base error of paper 000, Sec. 4.1; an estimate without features counts as one all-zero base."""
    return base_error(A_true, A_est if A_est.shape[0] else np.zeros((1, A_true.shape[1])))


def _imf_point(config_cls: type, stores: list[str], truths: list[np.ndarray], max_k: int) -> Point:
    """IMF or INMF (K+ chosen by evidence) on every seed's store: wall time and base error of E[A]."""
    times, errors = [], []
    for store, A_true in zip(stores, truths):
        start = time.perf_counter()
        driver = fit_to_end(config_cls(max_k=max_k, chunk_rows=64, split=None), store)
        times.append(time.perf_counter() - start)
        errors.append(_base_error(A_true, driver.state.post["m"].T))
    return Point("INMF" if config_cls is INMFConfig else "IMF", 0, tuple(times), tuple(errors))


def _variational_curve(config_cls: type, stores: list[str], truths: list[np.ndarray], truncations: Sequence[int],
                       restarts: int) -> list[Point]:
    """VFMF or TVIMF at every truncation T (the setting) on every seed's store, the best bound of ``restarts``
    random starts (paper 000 ran T = 4 to 10 and kept the best of several restarts): wall time and base error
    of E[A] (its unused features stay near the prior mean 0 and match no true base)."""
    points = []
    for truncation in truncations:
        times, errors = [], []
        for seed, (store, A_true) in enumerate(zip(stores, truths)):
            start = time.perf_counter()
            config = config_cls(truncation=truncation, restarts=restarts, seed=seed, chunk_rows=64, split=None)
            driver = fit_variational(config, store)
            times.append(time.perf_counter() - start)
            errors.append(_base_error(A_true, driver.state.post["m"].T))
        points.append(Point("TVIMF" if config_cls is TVIMFConfig else "VFMF", truncation, tuple(times), tuple(errors)))
    return points


def ibp_speed(out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    """Paper 000 figure 3 (module docstring)."""
    n_rows, particles, sweeps, max_k = (20, [10, 50], [5, 20], 6) if quick else \
        (50, [100, 400, 1000, 2500, 5000], [10, 20, 50, 100, 200, 500], 20)
    truncations, restarts = ([4, 6], 1) if quick else ([4, 6, 8, 10], 3)
    draws = [make_images(n_rows, 0.5, "eight_ones", seed=seed) for seed in range(seeds)]
    stores = [write_store(x, None, np.zeros(x.shape, bool), out_dir / "data" / f"images-{seed}.zarr", "real", 64)
              for seed, (x, _, _) in enumerate(draws)]
    sigma_x = float(np.sqrt(0.5))
    pf, gibbs = filter_and_gibbs(
        lambda p, seed: LGParticleConfig(particles=p, blocks=1, alpha=1.0, sigma_x=sigma_x, sigma_a=1.0, seed=seed,
                                         moves=0),
        lambda s, seed: LGGibbsConfig(sweeps=s, chains=1, alpha=1.0, sigma_x=sigma_x, sigma_a=1.0, seed=seed),
        lambda seed: ArrayRows(draws[seed][0]), particles, sweeps, seeds,
        lambda post, seed: _base_error(draws[seed][2], post["A_mean"]))
    truths = [a for _, _, a in draws]
    curves = {"IMF": [_imf_point(IMFConfig, stores, truths, max_k)],
              "INMF": [_imf_point(INMFConfig, stores, truths, max_k)],
              "VFMF": _variational_curve(VFMFConfig, stores, truths, truncations, restarts),
              "TVIMF": _variational_curve(TVIMFConfig, stores, truths, truncations, restarts), PF: pf, GIBBS: gibbs}
    notes = [f"Data: {n_rows} x 36, four random 6x6 images with eight ones each (new draw per seed), noise variance "
             f"0.5; {seeds} seeds. E[A] of the filter and Gibbs is the posterior mean in the most probable IBP class; "
             "IMF/INMF use the converged q(A) at the K+ chosen by evidence; their one point per seed is a whole fit "
             f"(setting 0). VFMF and TVIMF: one point per truncation T (the setting), the best bound of "
             f"{restarts} random start(s) of q(z) each."]
    return write_outputs(out_dir, "ibp_speed", "Base error against wall time (paper 000 fig. 3)",
                         "IMF/INMF converge fastest; INMF lowest error; the comparators VFMF and TVIMF are unstable "
                         "and need restarts; PF fluctuates heavily", curves, "base error", notes)

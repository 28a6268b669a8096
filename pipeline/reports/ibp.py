"""What a finished IBP particle-filter or Gibbs run gives a user: E[ZZ^T], the
distribution of K+, E[A] in the most probable class, the ZZ^T error when the truth is known, plots.

Defines the ``ModelSpec`` of ``pf-linear-gaussian``, ``pf-noisy-or``, ``gibbs-linear-gaussian`` and
``gibbs-noisy-or`` (``pipeline.registry``). The posterior is computed from the run's
driver restored at its last checkpoint (the particle blocks or the chains, ``Outputs.states``): the
weighted summaries of the blocks, or the sums of the chains' retained sweeps. For synthetic data the
true Z can be stored beside X as the array ``true_Z`` of the dataset store (``add_true_z``);
``evaluate`` then reports the ZZ^T error of paper 001, Sec. 4.2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from buffet.data.urls import normalise, zarr_store
from buffet.kernels.metrics import zzt_error
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.gibbs import CHAINS, GibbsDriver, LGGibbsConfig, NoisyORGibbsConfig
from buffet.pipeline.models.particles import PARTICLES, LGParticleConfig, NoisyORParticleConfig, ParticleDriver
from buffet.pipeline.registry import ModelSpec
from buffet.pipeline.reports import plots
from buffet.pipeline.reports.outputs import Outputs

TRUE_Z = "true_Z"
IBPDriver = ParticleDriver | GibbsDriver


def add_true_z(store: str | Path, Z: np.ndarray) -> None:
    """Store the true Z (N x K) of synthetic data in the dataset store as the array ``true_Z``."""
    group = zarr.open_group(store=zarr_store(normalise(store), read_only=False), mode="a")
    group.create_array(TRUE_Z, shape=Z.shape, dtype=bool, overwrite=True)[:] = np.asarray(Z, bool)


def true_z(store: str | Path) -> np.ndarray | None:
    """The true Z of a dataset store, or None when it has none."""
    group = zarr.open_group(store=zarr_store(normalise(store)), mode="r")
    return np.asarray(group[TRUE_Z][:]) if TRUE_Z in group else None


def evaluate(driver: IBPDriver, run: RunStore) -> dict:
    """Posterior mean of K+, the most probable class's size and mass, the log-evidence (particle filters)
    and, when the dataset store has ``true_Z``, the ZZ^T error."""
    post = driver.posterior()
    out = {"k_plus": float(post["k_plus_mean"]), "k_plus_map": int(post["A_mean"].shape[0]),
           "map_class_prob": float(post["map_class_prob"])}
    if isinstance(driver, ParticleDriver):
        out["log_evidence"] = float(driver.state.log_evidence)
    truth = true_z(run.meta["dataset"])
    if truth is not None:
        out["zzt_error"] = zzt_error(post["zzt"], truth)
    return out


def export(driver: IBPDriver, run: RunStore) -> dict[str, np.ndarray]:
    """E[ZZ^T] (N x N), P(K+), E[K+], E[A] and Z of the most probable class, and its mass."""
    return driver.posterior()


def _zzt_image(zzt: np.ndarray, path: Path) -> Path:
    fig, ax = plots.new_figure(figsize=(5, 4.5))
    shown = ax.imshow(zzt, cmap="viridis")
    fig.colorbar(shown, ax=ax)
    ax.set_title("posterior E[Z Z^T]")
    ax.set_xlabel("row")
    ax.set_ylabel("row")
    return plots.save_figure(fig, path)


def _k_plus_bars(k_dist: np.ndarray, path: Path) -> Path:
    fig, ax = plots.new_figure(figsize=(5, 3.5))
    ax.bar(np.arange(k_dist.size), k_dist)
    ax.set_xlabel("K+")
    ax.set_ylabel("posterior probability")
    ax.set_title("distribution of K+")
    return plots.save_figure(fig, path)


def _chain_traces(trace: list[dict], key: str, label: str, path: Path) -> Path:
    """One line per Gibbs chain of the recorded ``key_c`` values against the sweep (the step)."""
    fig, ax = plots.new_figure(figsize=(6, 4))
    chains = sorted({k for r in trace for k in r if k.startswith(f"{key}_") and k[len(key) + 1:].isdigit()})
    sweeps = [r["step"] for r in trace]
    for name in chains:
        ax.plot(sweeps, [r[name] for r in trace], label=f"chain {name[len(key) + 1:]}", lw=1)
    burn = [r["step"] for r in trace if not r["retained"]]
    if burn:
        ax.axvspan(0, max(burn), color="grey", alpha=0.15, label="burn-in")
    ax.set_xlabel("sweep")
    ax.set_ylabel(label)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return plots.save_figure(fig, path)


def _figures(driver: IBPDriver, run: RunStore, trace: list[dict], out_dir: Path) -> list[Path]:
    """E[ZZ^T] image, K+ distribution and the bases E[A] of the most probable class."""
    post = driver.posterior()
    return [_zzt_image(post["zzt"], out_dir / "zzt.png"), _k_plus_bars(post["k_plus_dist"], out_dir / "k_plus.png"),
            plots.bases(post["A_mean"], out_dir / "bases.png")]


def _gibbs_figures(driver: GibbsDriver, run: RunStore, trace: list[dict], out_dir: Path) -> list[Path]:
    """The common figures and per-chain traces of K+ and of the log joint."""
    return [*_figures(driver, run, trace, out_dir),
            _chain_traces(trace, "k_plus", "K+", out_dir / "trace_k_plus.png"),
            _chain_traces(trace, "log_joint", "log joint", out_dir / "trace_log_joint.png")]


def _summary(driver: IBPDriver, run: RunStore, trace: list[dict]) -> list[str]:
    """The metrics of ``evaluate`` as a table."""
    lines = ["| quantity | value |", "| --- | --- |"]
    return lines + [f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |"
                    for k, v in evaluate(driver, run).items()]


def _spec(config_cls: type, driver_cls: type, label: str, title: str, summary: str) -> ModelSpec:
    def make_driver(config: object, source: Source, engine: Engine) -> IBPDriver:
        return driver_cls(config, source, engine, label)

    particles = driver_cls is ParticleDriver
    outputs = Outputs(title, evaluate=evaluate, export=export, figures=_figures if particles else _gibbs_figures,
                      summary=_summary, states=(PARTICLES,) if particles else (CHAINS,))
    return ModelSpec(config_cls=config_cls, make_driver=make_driver, outputs=outputs, summary=summary)


SPECS = {
    "pf-linear-gaussian": _spec(LGParticleConfig, ParticleDriver, "pf-lg", "IBP linear-Gaussian particle filter",
                                "IBP linear-Gaussian model (X = Z A + noise) by a particle filter over the rows, "
                                "for real data made of binary latent features"),
    "pf-noisy-or": _spec(NoisyORParticleConfig, ParticleDriver, "pf-noisy-or", "IBP noisy-OR particle filter",
                         "IBP noisy-OR model by a particle filter over the rows, for binary data caused by "
                         "hidden binary causes"),
    "gibbs-linear-gaussian": _spec(LGGibbsConfig, GibbsDriver, "gibbs-lg", "IBP linear-Gaussian Gibbs sampler",
                                   "IBP linear-Gaussian model by collapsed Gibbs sampling in parallel chains, the "
                                   "MCMC baseline for real data"),
    "gibbs-noisy-or": _spec(NoisyORGibbsConfig, GibbsDriver, "gibbs-noisy-or", "IBP noisy-OR Gibbs sampler",
                            "IBP noisy-OR model by Gibbs sampling in parallel chains, the MCMC baseline for binary "
                            "data"),
}

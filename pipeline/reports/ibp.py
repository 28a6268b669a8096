"""What a finished IBP particle-filter or Gibbs run gives a user (SPEC 3.3, 3.4, 4): E[ZZ^T], the
distribution of K+, E[A] in the most probable class, the ZZ^T error when the truth is known, plots.

Registers ``pf-linear-gaussian``, ``pf-noisy-or``, ``gibbs-linear-gaussian`` and
``gibbs-noisy-or`` with the run layer (``pipeline.runs``). The posterior summary is stored in the
run's final checkpoint (``summary_*`` arrays, see ``ibp_summary``). For synthetic data the true Z
can be stored beside X as the array ``true_Z`` of the dataset store (``add_true_z``); ``evaluate``
then reports the ZZ^T error of paper 001 section 4.2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import zarr

from buffet.data.errors import UserError
from buffet.data.urls import normalise, zarr_store
from buffet.kernels.ibp_synthetic import zzt_error
from buffet.pipeline.models import ibp_summary
from buffet.pipeline.reports import plots
from buffet.pipeline.engine.executors import Executor
from buffet.pipeline.models.gibbs import GibbsDriver, LGGibbsConfig, NoisyORGibbsConfig
from buffet.pipeline.models.particles import LGParticleConfig, NoisyORParticleConfig, ParticleDriver
from buffet.pipeline.engine.runs import ModelSpec, register, trace_arrays
from buffet.pipeline.engine.runstore import RunStore

TRUE_Z = "true_Z"


def add_true_z(store: str | Path, Z: np.ndarray) -> None:
    """Store the true Z (N x K) of synthetic data in the dataset store as the array ``true_Z``."""
    group = zarr.open_group(store=zarr_store(normalise(store), read_only=False), mode="a")
    group.create_array(TRUE_Z, shape=Z.shape, dtype=bool, overwrite=True)[:] = np.asarray(Z, bool)


def true_z(store: str | Path) -> np.ndarray | None:
    """The true Z of a dataset store, or None when it has none."""
    group = zarr.open_group(store=zarr_store(normalise(store)), mode="r")
    return np.asarray(group[TRUE_Z][:]) if TRUE_Z in group else None


def posterior(run: RunStore) -> tuple[dict[str, np.ndarray], list[dict], dict[str, np.ndarray]]:
    """(posterior expectations, trace, raw checkpoint arrays) of a finished run."""
    arrays, state, _ = run.load_checkpoint()
    if not ibp_summary.has_summary(arrays, "summary_"):
        raise UserError(f"{run.path}: the run has not finished (status {run.status}); `buffet resume` it first")
    return ibp_summary.finalise(ibp_summary.from_arrays(arrays, "summary_")), state["trace"], arrays


def evaluate(run: RunStore, executor: Executor | None = None) -> dict:
    """Posterior mean of K+, the most probable class's mass, the log-evidence (particle filters)
    and, when the dataset store has ``true_Z``, the ZZ^T error (SPEC 4)."""
    post, trace, arrays = posterior(run)
    out = {"model": run.model, "run": str(run.path), "status": run.status,
           "k_plus": float(post["k_plus_mean"]), "k_plus_map": int(post["A_mean"].shape[0]),
           "map_class_prob": float(post["map_class_prob"]), "seconds": float(trace[-1]["seconds"])}
    if "log_evidence" in arrays:
        out["log_evidence"] = float(arrays["log_evidence"])
    truth = true_z(run.meta["dataset"])
    if truth is not None:
        out["zzt_error"] = zzt_error(post["zzt"], truth)
    return out


def export(run: RunStore) -> dict[str, np.ndarray]:
    """E[ZZ^T] (N x N), P(K+), E[K+], E[A] and Z of the most probable class, and the trace."""
    post, trace, _ = posterior(run)
    return {**post, **trace_arrays(trace)}


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
    """One line per Gibbs chain of the recorded ``key_c`` values against the sweep."""
    fig, ax = plots.new_figure(figsize=(6, 4))
    chains = sorted({k for r in trace for k in r if k.startswith(f"{key}_") and k[len(key) + 1:].isdigit()})
    sweeps = [r["sweep"] for r in trace]
    for name in chains:
        ax.plot(sweeps, [r[name] for r in trace], label=f"chain {name[len(key) + 1:]}", lw=1)
    burn = [r["sweep"] for r in trace if not r["retained"]]
    if burn:
        ax.axvspan(0, max(burn), color="grey", alpha=0.15, label="burn-in")
    ax.set_xlabel("sweep")
    ax.set_ylabel(label)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return plots.save_figure(fig, path)


def _report(run: RunStore, out_dir: Path, extra: Callable[[list[dict], Path], list[Path]]) -> list[Path]:
    """E[ZZ^T] image, K+ distribution, E[A] bases, the model's trace plots and a summary table."""
    post, trace, _ = posterior(run)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [_zzt_image(post["zzt"], out_dir / "zzt.png"), _k_plus_bars(post["k_plus_dist"], out_dir / "k_plus.png"),
             plots.bases(post["A_mean"], out_dir / "bases.png"), *extra(trace, out_dir)]
    result = evaluate(run)
    lines = [f"# {run.model} run `{run.path}`", "", "| quantity | value |", "| --- | --- |",
             *[f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in result.items()]]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return files + [out_dir / "summary.md"]


def _particle_plots(trace: list[dict], out_dir: Path) -> list[Path]:
    return [plots.metric_curve(trace, "row", "ess", "row", "effective sample size", out_dir / "ess.png")]


def _gibbs_plots(trace: list[dict], out_dir: Path) -> list[Path]:
    return [_chain_traces(trace, "k_plus", "K+", out_dir / "trace_k_plus.png"),
            _chain_traces(trace, "log_joint", "log joint", out_dir / "trace_log_joint.png")]


def report_particles(run: RunStore, out_dir: Path) -> list[Path]:
    """Particle-filter report: the common plots and the effective sample size per row."""
    return _report(run, out_dir, _particle_plots)


def report_gibbs(run: RunStore, out_dir: Path) -> list[Path]:
    """Gibbs report: the common plots and per-chain traces of K+ and of the log joint."""
    return _report(run, out_dir, _gibbs_plots)


def _spec(config_cls: type, driver_cls: type, label: str, report: Callable, summary: str) -> ModelSpec:
    return ModelSpec(config_cls=config_cls, make_driver=lambda config, store, ex: driver_cls(config, store, ex, label),
                     evaluate=evaluate, export=export, report=report, summary=summary)


MODELS_BY_NAME = {
    "pf-linear-gaussian": _spec(LGParticleConfig, ParticleDriver, "pf-lg", report_particles,
                                "IBP linear-Gaussian model (X = Z A + noise) by a particle filter over the rows, "
                                "for real data made of binary latent features"),
    "pf-noisy-or": _spec(NoisyORParticleConfig, ParticleDriver, "pf-noisy-or", report_particles,
                         "IBP noisy-OR model by a particle filter over the rows, for binary data caused by "
                         "hidden binary causes"),
    "gibbs-linear-gaussian": _spec(LGGibbsConfig, GibbsDriver, "gibbs-lg", report_gibbs,
                                   "IBP linear-Gaussian model by collapsed Gibbs sampling in parallel chains, the "
                                   "MCMC baseline for real data"),
    "gibbs-noisy-or": _spec(NoisyORGibbsConfig, GibbsDriver, "gibbs-noisy-or", report_gibbs,
                            "IBP noisy-OR model by Gibbs sampling in parallel chains, the MCMC baseline for binary "
                            "data"),
}
for _name, _spec_value in MODELS_BY_NAME.items():
    register(_name, _spec_value)

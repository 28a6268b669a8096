"""What a finished binary matrix factorization run gives a user (SPEC 3.7, 4): held-out scores of the
posterior predictive mean, K+ and L+, exports and plots.

Registers the ``bmf`` model with the run layer (``pipeline.runs``). Everything is read from the
run's last checkpoint: the last sample of U, V, W and the sums of the predictive means over the
retained sweeps (``pipeline.models.bmf``). Averages of U, V or W over sweeps are not exported: features
appear, die and swap labels between sweeps, so only quantities such as the predictive mean
U W V^T are comparable across samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.data.errors import UserError
from buffet.pipeline.reports import plots as plots
from buffet.pipeline.reports import selection
from buffet.pipeline.engine.blocks import resolve
from buffet.data.splits import EntrySample
from buffet.pipeline.models.bmf import BMFConfig, BMFDriver, structural_candidates
from buffet.pipeline.engine.executors import Executor
from buffet.kernels.metrics import auc
from buffet.pipeline.engine.runs import ModelSpec, register, trace_arrays
from buffet.pipeline.engine.runstore import RunStore


def _finished(run: RunStore) -> tuple[dict[str, np.ndarray], list[dict]]:
    """Checkpoint arrays and trace of a run with at least one retained sweep."""
    arrays, state, _ = run.load_checkpoint()
    if float(arrays["retained"]) < 1:
        raise UserError(f"{run.path}: no sweep after burn-in yet (status {run.status}); `buffet resume` it first")
    return arrays, state["trace"]


def predictive_mean(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """E[x_ij | X] for every entry: the retained sweeps' predictive means averaged (paper section 3.4)."""
    return arrays["pred_sum"] / float(arrays["retained"])


def heldout_scores(likelihood: str, predicted: np.ndarray, truth: np.ndarray) -> dict:
    """RMSE and MAE (Gaussian, Poisson) or AUC and log loss (logistic) of held-out entries (SPEC 4)."""
    if likelihood == "logistic":
        p = np.clip(predicted, 1e-12, 1 - 1e-12)
        return {"auc": auc(predicted, truth),
                "log_loss": float(-np.mean(truth * np.log(p) + (1 - truth) * np.log1p(-p)))}
    err = predicted - truth
    return {"rmse": float(np.sqrt(np.mean(err ** 2))), "mae": float(np.mean(np.abs(err)))}


def evaluate(run: RunStore, executor: Executor | None = None) -> dict:
    """K+ and L+ (last sample and mean over retained sweeps) and, with a held-out split, its scores."""
    arrays, trace = _finished(run)
    kept = [r for r in trace if r["retained"]]
    out = {"model": run.model, "run": str(run.path), "status": run.status, "likelihood": run.params["likelihood"],
           **selection.chosen(run),
           "k_plus": int(arrays["U"].shape[1]), "l_plus": int(arrays["V"].shape[1]),
           "k_plus_mean": float(np.mean([r["k_plus"] for r in kept])),
           "l_plus_mean": float(np.mean([r["l_plus"] for r in kept])), "retained_sweeps": len(kept),
           "seconds": float(trace[-1]["seconds"])}
    ds = resolve(run.meta["dataset"])
    split = run.params.get("split")
    if split and split in ds.split_names():
        test = ds.read_split_rows(split, "test_mask", 0, ds.n_rows)
        truth = ds.read_rows(0, ds.n_rows).X[test]
        out["heldout_entries"] = int(truth.size)
        out.update(heldout_scores(run.params["likelihood"], predictive_mean(arrays)[test], truth))
    return out


def export(run: RunStore) -> dict[str, np.ndarray]:
    """The last sample's U, V, W, the posterior predictive mean of every entry and the trace."""
    arrays, trace = _finished(run)
    return {"U": arrays["U"], "V": arrays["V"], "W": arrays["W"], "predictive_mean": predictive_mean(arrays),
            **trace_arrays(trace)}


def _traces(trace: list[dict], path: Path) -> Path:
    """K+ and L+ against the sweep, burn-in shaded."""
    fig, ax = plots.new_figure(figsize=(6, 4))
    sweeps = [r["sweep"] for r in trace]
    for key, label in (("k_plus", "K+ (features of U)"), ("l_plus", "L+ (features of V)")):
        ax.plot(sweeps, [r[key] for r in trace], label=label, lw=1)
    burn = [r["sweep"] for r in trace if not r["retained"]]
    if burn:
        ax.axvspan(0, max(burn), color="grey", alpha=0.15, label="burn-in")
    ax.set_xlabel("sweep")
    ax.set_ylabel("features")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return plots.save_figure(fig, path)


def _binary_matrices(U: np.ndarray, V: np.ndarray, path: Path) -> Path:
    """The last sample's U (I x K+) and V (J x L+) side by side."""
    fig, axes = plots.new_figure(1, 2, figsize=(8, 5))
    for ax, Z, name in zip(axes, (U, V), ("U", "V")):
        ax.imshow(Z, aspect="auto", cmap="Greys", interpolation="nearest")
        ax.set_title(f"{name} ({Z.shape[0]} x {Z.shape[1]})")
        ax.set_xlabel("feature")
        ax.set_ylabel("row" if name == "U" else "column")
    return plots.save_figure(fig, path)


def report(run: RunStore, out_dir: Path) -> list[Path]:
    """Traces of K+, L+ and the log joint, the last U and V, and a summary table."""
    arrays, trace = _finished(run)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [_traces(trace, out_dir / "trace_features.png"),
             plots.metric_curve(trace, "sweep", "log_joint", "sweep", "log joint", out_dir / "trace_log_joint.png"),
             _binary_matrices(arrays["U"], arrays["V"], out_dir / "features.png")]
    result = evaluate(run)
    lines = [f"# BMF run `{run.path}`", "", "| quantity | value |", "| --- | --- |",
             *[f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in result.items()],
             *selection.summary_lines(run)]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return files + [out_dir / "summary.md"]


def make_driver(config: BMFConfig, store: str, executor: Executor, validation: EntrySample | None = None) -> BMFDriver:
    return BMFDriver(config, store, executor, validation)


register("bmf", ModelSpec(config_cls=BMFConfig, make_driver=make_driver, evaluate=evaluate, export=export,
                          report=report, candidates=structural_candidates,
                          summary="binary MF X ~ f(U W V^T) with binary row and column features (IBP priors) by "
                                  "Gibbs sampling, for real, binary or count data"))

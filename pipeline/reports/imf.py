"""What a finished IMF/INMF run gives a user: K+, held-out error or AUC, exports and plots.

Registers the ``imf`` and ``inmf`` models with the run layer (``pipeline.runs``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.kernels.metrics import auc, error_metrics
from buffet.pipeline.reports import plots as plots
from buffet.pipeline.reports import selection
from buffet.pipeline.engine.blocks import resolve
from buffet.pipeline.engine.executors import Executor, SyncExecutor
from buffet.data.splits import EntrySample
from buffet.pipeline.models.imf import IMFConfig, IMFDriver, INMFConfig, structural_candidates
from buffet.pipeline.engine.runs import ModelSpec, config_from, register, trace_arrays
from buffet.pipeline.engine.runstore import RunStore


def _restored(run: RunStore, executor: Executor) -> IMFDriver:
    spec = MODELS_BY_NAME[run.model]
    driver = IMFDriver(config_from(spec, run.params), run.meta["dataset"], executor)
    arrays, _, folder = run.load_checkpoint()
    driver.restore(arrays, folder)
    driver.adopt_best()
    return driver


def evaluate(run: RunStore, executor: Executor) -> dict:
    """Learned K+ and the held-out metrics of the stored split: AUC for binary data, errors otherwise."""
    driver = _restored(run, executor)
    out = {"model": run.model, "run": str(run.path), "status": run.status, "k_plus": driver.k_plus,
           "evidence": float(driver.best["evidence"]), **selection.chosen(run)}
    if driver.split:
        predicted, truth = driver.predictions()
        ds = resolve(run.meta["dataset"])
        out["heldout_entries"] = int(truth.size)
        if ds.kind == "binary":
            out["auc"] = auc(predicted, truth)
        else:
            out.update(error_metrics(predicted, truth, float(ds.attrs.get("value_range", np.ptp(truth)))))
    return out


def export(run: RunStore) -> dict[str, np.ndarray]:
    """Posterior means of A (D x K+), q(pi), q(eta), E[Z] (N x K+), evidence by K+ and the trace."""
    driver = _restored(run, SyncExecutor())
    post = driver.post
    _, state, _ = run.load_checkpoint()
    return {"A_mean": post["m"].T, "A_cov": post["V"], "pi_t1": post["t1"], "pi_t2": post["t2"],
            "Z_mean": np.concatenate(driver.nu), "evidence_by_k": np.array(driver.history).reshape(-1, 2),
            "eta_x_mean": np.float64(post["ax"] / post["bx"]), **trace_arrays(state["trace"])}


def report(run: RunStore, out_dir: Path) -> list[Path]:
    """Evidence against K+, the learned bases (as images when D is a square), feature usage."""
    arrays = export(run)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [plots.evidence_by_k(arrays["evidence_by_k"], out_dir / "evidence_by_k.png"),
             plots.bases(arrays["A_mean"], out_dir / "bases.png"),
             plots.feature_usage(arrays["Z_mean"].mean(axis=0), out_dir / "feature_usage.png")]
    k_plus = arrays["A_mean"].shape[0]
    lines = [f"# {run.model.upper()} run `{run.path}`", "", f"- status: {run.status}",
             f"- learned K+: {k_plus}", "", "| K+ | evidence |", "| --- | --- |",
             *[f"| {int(k)} | {ev:.4f} |" for k, ev in arrays["evidence_by_k"]], *selection.summary_lines(run)]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return files + [out_dir / "summary.md"]


def make_driver(config: IMFConfig, store: str, executor: Executor, validation: EntrySample | None = None) -> IMFDriver:
    return IMFDriver(config, store, executor, validation)


SUMMARIES = {
    "imf": "infinite linear-Gaussian MF (IBP features, variational, K+ chosen by evidence), for real or binary "
           "matrices with missing entries such as ratings",
    "inmf": "infinite nonnegative MF: IMF with nonnegative features by Power-EP, for real or binary matrices "
            "such as ratings or user-permission tables",
}
MODELS_BY_NAME = {name: ModelSpec(config_cls=cls, make_driver=make_driver, evaluate=evaluate, export=export,
                                  report=report, summary=SUMMARIES[name],
                                  candidates=structural_candidates)
                  for name, cls in (("imf", IMFConfig), ("inmf", INMFConfig))}
for _name, _spec in MODELS_BY_NAME.items():
    register(_name, _spec)

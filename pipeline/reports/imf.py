"""What an IMF/INMF run gives a user: K+, held-out error or AUC, exports and plots,
from the best converged state of the search. Defines the ``imf`` and ``inmf`` models'
``ModelSpec`` (``pipeline.registry``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from buffet.data.splits import EntrySample
from buffet.kernels.metrics import auc, error_metrics
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.imf import IMFConfig, IMFDriver, INMFConfig, structural_candidates
from buffet.pipeline.registry import ModelSpec
from buffet.pipeline.reports import plots
from buffet.pipeline.reports.outputs import Outputs


def make_driver(config: IMFConfig, source: Source, engine: Engine, validation: EntrySample | None = None) -> IMFDriver:
    return IMFDriver(config, source, engine, validation)


def _best(driver: IMFDriver) -> IMFDriver:
    """The driver at the best converged state (a run stopped during growth is one column ahead)."""
    driver.adopt_best()
    return driver


def heldout_metrics(driver: Any) -> dict:
    """The held-out metrics of the stored split from ``driver.predictions()``: AUC for binary data, errors
    otherwise; nothing without a split (any driver with ``split``, ``source`` and ``predictions``)."""
    if not driver.split:
        return {}
    predicted, truth = driver.predictions()
    ds = driver.source.open()
    if ds.kind == "binary":
        return {"heldout_entries": int(truth.size), "auc": auc(predicted, truth)}
    return {"heldout_entries": int(truth.size),
            **error_metrics(predicted, truth, float(ds.attrs.get("value_range", np.ptp(truth))))}


def evaluate(driver: IMFDriver, run: RunStore) -> dict:
    """Learned K+, its evidence and the held-out metrics of the stored split (``heldout_metrics``)."""
    driver = _best(driver)
    return {"k_plus": driver.k_plus, "evidence": float(driver.state.best_evidence), **heldout_metrics(driver)}


def export(driver: IMFDriver, run: RunStore) -> dict[str, np.ndarray]:
    """Posterior means of A (K+ x D), its covariances, q(pi), E[eta_X], E[Z] (N x K+) and the evidence by K+."""
    driver = _best(driver)
    post = driver.state.post
    return {"A_mean": post["m"].T, "A_cov": post["V"], "pi_t1": post["t1"], "pi_t2": post["t2"],
            "Z_mean": driver.expected_z(), "evidence_by_k": np.array(driver.state.history).reshape(-1, 2),
            "eta_x_mean": np.float64(post["ax"] / post["bx"])}


def figures(driver: IMFDriver, run: RunStore, trace: list[dict], out_dir: Path) -> list[Path]:
    """Evidence against K+, the learned bases (as images when D is a square), feature usage."""
    driver = _best(driver)
    return [plots.evidence_by_k(np.array(driver.state.history).reshape(-1, 2), out_dir / "evidence_by_k.png"),
            plots.bases(driver.state.post["m"].T, out_dir / "bases.png"),
            plots.feature_usage(driver.expected_z().mean(axis=0), out_dir / "feature_usage.png")]


def summary(driver: IMFDriver, run: RunStore, trace: list[dict]) -> list[str]:
    """The learned K+ and the evidence of every K+ the search reached."""
    driver = _best(driver)
    return [f"- learned K+: {driver.k_plus}", "", "| K+ | evidence |", "| --- | --- |",
            *[f"| {int(k)} | {ev:.4f} |" for k, ev in driver.state.history]]


SUMMARIES = {
    "imf": "infinite linear-Gaussian MF (IBP features, variational, K+ chosen by evidence), for real or binary "
           "matrices with missing entries such as ratings",
    "inmf": "infinite nonnegative MF: IMF with nonnegative features by Power-EP, for real or binary matrices "
            "such as ratings or user-permission tables",
}
SPECS = {name: ModelSpec(config_cls=cls, make_driver=make_driver, summary=SUMMARIES[name],
                         outputs=Outputs(title, evaluate=evaluate, export=export, figures=figures, summary=summary,
                                         states=("nu", "best_nu")),
                         candidates=structural_candidates)
         for name, title, cls in (("imf", "IMF", IMFConfig), ("inmf", "INMF", INMFConfig))}

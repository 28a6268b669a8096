"""What a VFMF/TVIMF run gives a user: the bound, the features used, held-out error or AUC,
exports and plots, from the best restart. Defines the ``vfmf`` and ``tvimf`` models'
``ModelSpec`` (``pipeline.registry``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.vfmf import TVIMFConfig, VariationalDriver, VFMFConfig
from buffet.pipeline.registry import ModelSpec
from buffet.pipeline.reports import plots
from buffet.pipeline.reports.imf import heldout_metrics
from buffet.pipeline.reports.outputs import Outputs


def make_driver(config: VFMFConfig, source: Source, engine: Engine) -> VariationalDriver:
    return VariationalDriver(config, source, engine)


def _best(driver: VariationalDriver) -> VariationalDriver:
    """The driver at its best finished restart (a stopped run may be part-way through another)."""
    driver.adopt_best()
    return driver


def evaluate(driver: VariationalDriver, run: RunStore) -> dict:
    """The truncation, the features used, the bound, the restarts finished and the held-out metrics."""
    driver = _best(driver)
    return {"truncation": driver.config.truncation, "k_used": driver.k_used, "evidence": driver.bound(),
            "restarts_done": len(driver.state.history), **heldout_metrics(driver)}


def export(driver: VariationalDriver, run: RunStore) -> dict[str, np.ndarray]:
    """Posterior means of A (T x D) and its covariances, q(pi) or q(v) as (tau1, tau2), E[pi], E[Z] (N x T,
    the nu_ik), E[eta_X], the bound of every finished restart, and for TVIMF the auxiliary q_k(y)."""
    driver = _best(driver)
    post = driver.state.post
    arrays = {"A_mean": post["m"].T, "A_cov": post["V"], "tau1": post["t1"], "tau2": post["t2"],
              "pi_mean": driver.prior.pi_means(post), "Z_mean": driver.expected_z(),
              "eta_x_mean": np.float64(post["ax"] / post["bx"]),
              "bound_by_restart": np.array(driver.state.history, dtype=np.float64).reshape(-1, 2)}
    if "qy" in post:
        arrays["qy"] = post["qy"]
    return arrays


def figures(driver: VariationalDriver, run: RunStore, trace: list[dict], out_dir: Path) -> list[Path]:
    """The bound against the step (every restart), the bases (as images when D is a square), feature usage."""
    driver = _best(driver)
    return [plots.metric_curve(trace, "step", "evidence", "step", "bound", out_dir / "bound.png"),
            plots.bases(driver.state.post["m"].T, out_dir / "bases.png"),
            plots.feature_usage(driver.expected_z().mean(axis=0), out_dir / "feature_usage.png")]


def summary(driver: VariationalDriver, run: RunStore, trace: list[dict]) -> list[str]:
    """The truncation, the features used and the bound of every finished restart."""
    driver = _best(driver)
    return [f"- truncation T: {driver.config.truncation}, features used: {driver.k_used}", "",
            "| restart | bound |", "| --- | --- |", *[f"| {int(r)} | {b:.4f} |" for r, b in driver.state.history]]


SUMMARIES = {
    "vfmf": "finite variational linear-Gaussian MF (Beta-Bernoulli features, truncation T, best of random "
            "restarts), paper 000's comparator",
    "tvimf": "truncated stick-breaking variational IBP linear-Gaussian MF (truncation T, best of random restarts), "
             "paper 000's comparator",
}
SPECS = {name: ModelSpec(config_cls=cls, make_driver=make_driver, summary=SUMMARIES[name],
                         outputs=Outputs(title, evaluate=evaluate, export=export, figures=figures, summary=summary,
                                         states=("nu", "best_nu")))
         for name, title, cls in (("vfmf", "VFMF", VFMFConfig), ("tvimf", "TVIMF", TVIMFConfig))}

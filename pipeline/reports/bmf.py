"""What a binary matrix factorization run gives a user: held-out scores of the
posterior predictive mean, K+ and L+, exports and plots. Defines the ``bmf`` model's ``ModelSpec``
(``pipeline.registry``).

Everything comes from the driver restored at the run's newest checkpoint (``reports.outputs``): the
last sample of U, V, W and the running sums of the predictive means over the retained sweeps (the
named state "pred", ``models.bmf``). Averages of U, V or W over sweeps are not exported: features
appear, die and swap labels between sweeps, so only quantities such as the predictive mean
U W V^T are comparable across samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.data.splits import EntrySample
from buffet.kernels.bmf import heldout_scores
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.bmf import PRED, BMFConfig, BMFDriver, structural_candidates
from buffet.pipeline.registry import ModelSpec
from buffet.pipeline.reports import plots
from buffet.pipeline.reports.outputs import Outputs


def make_driver(config: BMFConfig, source: Source, engine: Engine, validation: EntrySample | None = None) -> BMFDriver:
    return BMFDriver(config, source, engine, validation)


def evaluate(driver: BMFDriver, run: RunStore) -> dict:
    """K+ and L+ (last sample and mean over the retained sweeps) and, with a held-out split, the scores of
    the posterior predictive mean on its entries."""
    k_mean, l_mean = driver.feature_means()
    out = {"likelihood": driver.config.likelihood, "k_plus": int(driver.k_plus), "l_plus": int(driver.full("v").shape[1]),
           "k_plus_mean": k_mean, "l_plus_mean": l_mean, "retained_sweeps": driver.state.retained}
    if driver.split:
        predicted, truth = driver.predictions()
        out["heldout_entries"] = int(truth.size)
        out.update(heldout_scores(driver.config.likelihood, predicted, truth))
    return out


def export(driver: BMFDriver, run: RunStore) -> dict[str, np.ndarray]:
    """The last sample's U, V, W and the posterior predictive mean of every entry."""
    return {"U": driver.full("u"), "V": driver.full("v"), "W": driver.state.W,
            "predictive_mean": driver.predictive_mean()}


def _features_trace(trace: list[dict], path: Path) -> Path:
    """K+ and L+ against the step (one sweep each), burn-in shaded."""
    fig, ax = plots.new_figure(figsize=(6, 4))
    steps = [r["step"] for r in trace]
    for key, label in (("k_plus", "K+ (features of U)"), ("l_plus", "L+ (features of V)")):
        ax.plot(steps, [r[key] for r in trace], label=label, lw=1)
    burn = [r["step"] for r in trace if not r["retained"]]
    if burn:
        ax.axvspan(0, max(burn), color="grey", alpha=0.15, label="burn-in")
    ax.set_xlabel("sweep")
    ax.set_ylabel("features")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return plots.save_figure(fig, path)


def _binary_matrices(U: np.ndarray, W: np.ndarray, V: np.ndarray, path: Path) -> Path:
    """The last sample's U (I x K+), W (K+ x L+, on a colour scale symmetric about 0) and V (J x L+) side by side."""
    fig, axes = plots.new_figure(1, 3, figsize=(11, 5))
    for ax, Z, name in ((axes[0], U, "U"), (axes[2], V, "V")):
        ax.imshow(Z, aspect="auto", cmap="Greys", interpolation="nearest")
        ax.set_title(f"{name} ({Z.shape[0]} x {Z.shape[1]})")
        ax.set_xlabel("feature")
        ax.set_ylabel("row" if name == "U" else "column")
    bound = float(np.abs(W).max(initial=0.0)) or 1.0
    shown = axes[1].imshow(W, aspect="auto", cmap="RdBu_r", vmin=-bound, vmax=bound, interpolation="nearest")
    fig.colorbar(shown, ax=axes[1])
    axes[1].set_title(f"W ({W.shape[0]} x {W.shape[1]})")
    axes[1].set_xlabel("feature of V")
    axes[1].set_ylabel("feature of U")
    return plots.save_figure(fig, path)


def figures(driver: BMFDriver, run: RunStore, trace: list[dict], out_dir: Path) -> list[Path]:
    """K+ and L+ over the sweeps, and the last U, W and V (the log joint is in the common trace figure)."""
    return [_features_trace(trace, out_dir / "trace_features.png"),
            _binary_matrices(driver.full("u"), driver.state.W, driver.full("v"), out_dir / "features.png")]


def feature_spread(trace: list[dict]) -> list[str]:
    """How far K+ and L+ moved over the retained sweeps and, when neither moved, a caution: a chain that sits
    at one value has not shown the posterior's spread (docs/models/bmf.md, "Limits, as measured")."""
    kept = [r for r in trace if r["retained"]]
    if not kept:
        return []
    counts = {name: np.array([r[key] for r in kept]) for key, name in (("k_plus", "K+"), ("l_plus", "L+"))}
    distinct = {name: np.unique(values).size for name, values in counts.items()}
    lines = [f"- {name} over the {len(kept)} retained sweeps: {values.min():g} to {values.max():g} "
             f"({distinct[name]} distinct value{'' if distinct[name] == 1 else 's'})" for name, values in counts.items()]
    if all(n == 1 for n in distinct.values()):
        lines.append("- K+ and L+ did not move after the burn-in: read them as this chain's values, not as the "
                     "posterior's spread; fit other seeds and compare their log joints.")
    return lines


def summary(driver: BMFDriver, run: RunStore, trace: list[dict]) -> list[str]:
    """The settings, how far K+ and L+ moved (``feature_spread``) and a table of ``evaluate``'s quantities."""
    config = driver.config
    lines = [f"- likelihood: {config.likelihood}, sweeps: {config.sweeps}, burn-in: {config.burn_in}",
             *feature_spread(trace), "", "| quantity | value |", "| --- | --- |"]
    return lines + [f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |"
                    for k, v in evaluate(driver, run).items()]


OUTPUTS = Outputs("BMF", evaluate=evaluate, export=export, figures=figures, summary=summary, states=(PRED,))

SPECS = {"bmf": ModelSpec(config_cls=BMFConfig, make_driver=make_driver, outputs=OUTPUTS,
                          candidates=structural_candidates,
                          summary="binary MF X ~ f(U W V^T) with binary row and column features (IBP priors) by "
                                  "Gibbs sampling, for real, binary or count data")}

"""``buffet reproduce bmf-genes``: paper 003 figure 5 (Sec. 4.3), binary matrix factorization of the leukemia
expression data of Golub et al. (1999), shipped with the package (``data.golub``).

Data: 72 patients x 7,129 probes, preprocessed as usual (``data.expression.standard_affymetrix``: floor 100,
ceiling 16,000, probes with max/min > 5 and max - min > 500, log10; 3,571 probes), then laid out as the paper
does, probes (genes) in rows and patients in columns, and centred on each gene's mean over the training cells
(docs/guides/gene-expression.md says why). Linear-Gaussian BMF with IBP priors on both sides runs through the
engine's driver (``BMFDriver``), as ``bmf-bars`` does.

Reported:

* figure 5: the data and the expected reconstruction U W V^T of the last sample, rows and columns ordered by
  their binary features so that feature pairs form blocks, U, V^T and W beside them, and the largest block
  of the strongest feature pairs outlined;
* held-out cells (10%, one split per seed): RMSE of the posterior predictive mean against the row + column
  means, a rank-k SVD by iterative imputation with k chosen on validation cells (10% of the training cells),
  and IMF (``buffet fit imf``'s model) on the same split;
* whether the patient features carry ALL/AML, which the model never saw: cross-validated AUC of an
  L2 logistic regression (``kernels.logistic``) on each patient's posterior feature probabilities, against
  the same on as many top principal components of the data, with the same folds;
* K+ and L+ over the retained sweeps, and the wall time of each part.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from buffet.data import expression
from buffet.data.golub import load_golub
from buffet.data.splits import holdout_entries
from buffet.kernels import bmf
from buffet.kernels.baselines import observed_means
from buffet.kernels.logistic import cross_validated_scores, stratified_folds
from buffet.kernels.metrics import auc
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.experiments.bmf import fit_bmf
from buffet.pipeline.experiments.common import (complete_with_baselines, complete_with_engine, markdown_table,
                                                mean_std, write_csv, write_markdown)
from buffet.pipeline.experiments.role_mining import svd_impute_path
from buffet.pipeline.models.bmf import BMFConfig, BMFDriver
from buffet.pipeline.models.imf import IMFConfig
from buffet.pipeline.reports.plots import new_figure, save_figure

HELD_OUT = 0.1      # share of the cells held out per split
VALIDATION = 0.1    # share of the training cells the SVD's rank is chosen on
L2 = 1.0            # penalty of the logistic regression on standardised inputs
OUTLINED = 6        # feature pairs outlined in figure 5
STAT_NAMES = ("K+", "L+")


@dataclass(frozen=True)
class Settings:
    """Sizes of a run: the full experiment or ``--quick``."""

    genes: int | None          # keep this many most variable genes after the standard filter (None: all)
    sweeps: int                # BMF sweeps, half of them burn-in
    svd_ks: tuple[int, ...]    # ranks the SVD's validation chooses from
    imf_max_k: int             # IMF's cap on K+
    imf_max_iter: int          # IMF's alternations per K+
    v_sweeps: int              # Gibbs sweeps of V given U, W for the patients' feature probabilities
    cv_repeats: int            # random fold assignments the classification AUCs are averaged over
    folds: int = 6

    @classmethod
    def of(cls, quick: bool) -> "Settings":
        if quick:
            return cls(genes=400, sweeps=40, svd_ks=tuple(range(1, 9)), imf_max_k=4, imf_max_iter=50, v_sweeps=40,
                       cv_repeats=5)
        return cls(genes=None, sweeps=150, svd_ks=tuple(range(1, 11)), imf_max_k=6, imf_max_iter=60,
                   v_sweeps=100, cv_repeats=20)


@dataclass(frozen=True)
class Table:
    """The preprocessed data: genes x patients (log10 levels), the genes' accession numbers, whether each
    patient has AML, and the preprocessing record."""

    x: np.ndarray
    genes: list[str]
    is_aml: np.ndarray
    applied: expression.Applied


def leukemia_table(genes: int | None) -> Table:
    """The shipped data preprocessed (module docstring), genes in rows; only the ``genes`` most variable
    ones when given."""
    data = load_golub()
    applied = expression.Applied()
    x, keep = expression.standard_affymetrix(data.levels.T, applied)
    names = [p for p, k in zip(data.probes, keep) if k]
    if genes is not None and genes < x.shape[0]:
        top = np.sort(np.argsort(-x.var(axis=1), kind="stable")[:genes])
        x, names = x[top], [names[i] for i in top]
        applied.note("most_variable_rows", kept=int(genes))
    return Table(x, names, data.is_aml, applied)


def gene_centred(x: np.ndarray, train: np.ndarray) -> np.ndarray:
    """``x`` minus each gene's (row's) mean over its training cells, every cell kept (held-out ones to be
    scored on the same scale)."""
    return x - expression.nan_statistic(np.where(train, x, np.nan), "row", np.nanmean)


def rmse(predicted: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(np.mean((predicted - truth) ** 2)))


def negative_rmse(predicted: np.ndarray, truth: np.ndarray) -> float:
    """-RMSE, the larger-is-better metric the validation choice of the SVD's rank maximises."""
    return -rmse(predicted, truth)


def row_column_means(x: np.ndarray, train: np.ndarray) -> np.ndarray:
    """The additive two-way fit mean_i + mean_j - overall mean, all three over the training cells."""
    return (observed_means(x, train, axis=1)[:, None] + observed_means(x, train, axis=0)[None, :]
            - observed_means(x, train, axis=None))


@dataclass(frozen=True)
class SplitResult:
    """One held-out split: (method, K, RMSE) rows, seconds per method, the BMF driver and its trace."""

    rows: list[tuple[str, int, float]]
    seconds: dict[str, float]
    driver: BMFDriver
    trace: list[dict]
    train: np.ndarray


def bmf_config(settings: Settings, x: np.ndarray, seed: int) -> BMFConfig:
    """Linear-Gaussian BMF with IBP priors on genes and patients; the noise precision theta and the weights'
    precision phi start at 1 / the data's variance, so the first weights, drawn from the prior, are on the
    data's scale (both are then resampled)."""
    precision = float(1.0 / x.var())
    return BMFConfig(sweeps=settings.sweeps, burn_in=settings.sweeps // 2, theta=precision, phi=precision,
                     panel_rows=500, panel_cols=36, seed=seed)


def held_out_split(table: Table, settings: Settings, seed: int, work: Path) -> SplitResult:
    """Every method on one random split of the cells (module docstring)."""
    shape = table.x.shape
    test = holdout_entries(np.ones(shape, bool), HELD_OUT, seed)
    train = ~test
    valid = holdout_entries(train, VALIDATION, 1000 + seed)
    x = gene_centred(table.x, train)
    seconds, rows = {}, []

    started = time.perf_counter()
    rows.append(("row + column means", 0, rmse(row_column_means(x, train)[test], x[test])))
    seconds["row + column means"] = time.perf_counter() - started

    started = time.perf_counter()
    rows += [(name, k, -value) for name, k, value in complete_with_baselines(
        x, train, test, valid, seed, negative_rmse, [("SVD (iterative imputation)", svd_impute_path,
                                                       settings.svd_ks)])]
    seconds["SVD (iterative imputation)"] = time.perf_counter() - started

    started = time.perf_counter()
    imf = IMFConfig(max_k=settings.imf_max_k, max_iter=settings.imf_max_iter, select="none", seed=seed)
    rows += [("IMF", k, -value) for _, k, value in complete_with_engine(
        x, None, test, work / f"imf-{seed}.zarr", "real", negative_rmse, [("IMF", imf)])]
    seconds["IMF"] = time.perf_counter() - started

    started = time.perf_counter()
    driver, trace = fit_bmf(x, test, "real", bmf_config(settings, x, seed), work / f"bmf-{seed}.zarr")
    rows.append(("BMF posterior mean", driver.k_plus, rmse(driver.predictive_mean()[test], x[test])))
    seconds["BMF posterior mean"] = time.perf_counter() - started
    return SplitResult(rows, seconds, driver, trace, train)


# ----- the patients' features against ALL/AML -----

def patient_feature_probabilities(x: np.ndarray, train: np.ndarray, driver: BMFDriver, sweeps: int,
                                  seed: int) -> np.ndarray:
    """P(v_jl = 1 | X, U, W, pi) for each patient j and feature l of the last sample: the share of ``sweeps``
    Gibbs sweeps of V (``bmf.conditional_sweep`` on the patients' rows of X^T) with U, W and theta held at
    the last sample and pi_l at the last sample's share of patients with feature l."""
    U, V, W = driver.state.U.astype(np.float64), driver.state.V, driver.state.W
    if V.shape[1] == 0:
        return np.zeros((V.shape[0], 0))
    beta = driver.config.beta
    pi = np.clip(V.sum(axis=0) / (V.shape[0] + beta), 1e-6, 1 - 1e-6)
    model = bmf.Observation("gaussian", driver.state.theta)
    G, rng = W.T @ U.T, stream(seed, "bmf-genes-v")
    Z, total = V.copy(), np.zeros(V.shape)
    active = np.ones(V.shape[1], bool)
    for _ in range(sweeps):
        Z = bmf.conditional_sweep(x.T, train.T, Z, G, pi, active, model, rng)
        total += Z
    return total / sweeps


def principal_components(x: np.ndarray, n: int) -> np.ndarray:
    """The patients' scores on the ``n`` leading principal components of the gene-centred data."""
    centred = x - x.mean(axis=1, keepdims=True)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    return (vt[:n] * s[:n, None]).T


def classification(inputs: dict[str, np.ndarray], is_aml: np.ndarray, settings: Settings) -> dict[str, list[float]]:
    """Cross-validated AUC of ALL/AML from each set of patient inputs, the same folds for every set, one AUC per
    random fold assignment (``cv_repeats`` of them)."""
    y = is_aml.astype(np.float64)
    out: dict[str, list[float]] = {name: [] for name in inputs}
    for repeat in range(settings.cv_repeats):
        folds = stratified_folds(is_aml, settings.folds, stream(repeat, "bmf-genes-folds"))
        for name, X in inputs.items():
            out[name].append(auc(cross_validated_scores(X, y, folds, L2), is_aml.astype(int)) if X.shape[1]
                             else float("nan"))
    return out


# ----- figure 5 -----

def feature_order(Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Features by how many rows use them (most first), and rows sorted by their binary feature vectors in that
    order (rows with the most used feature first), so each feature's rows form few contiguous runs."""
    features = np.argsort(-Z.sum(axis=0), kind="stable")
    keys = [~Z[:, k] for k in features[::-1]]
    rows = np.lexsort(keys) if keys else np.arange(Z.shape[0])
    return rows, features


def longest_run(on: np.ndarray) -> tuple[int, int]:
    """[start, end) of the longest run of True in ``on`` ((0, 0) when there is none)."""
    best, start = (0, 0), None
    for i, value in enumerate(np.append(on, False)):
        if value and start is None:
            start = i
        elif not value and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    return best


Block = tuple[int, int, int, int, int, int]  # feature pair (k, l) and its block's rows r0:r1, columns c0:c1


def outlined_blocks(U: np.ndarray, V: np.ndarray, W: np.ndarray, count: int) -> list[Block]:
    """The largest contiguous block (rows r0:r1, columns c0:c1) of the ``count`` feature pairs (k, l) that add
    the most to the reconstruction there (|W_kl| x block area): (k, l, r0, r1, c0, c1), in sorted
    coordinates."""
    blocks = []
    for k in range(U.shape[1]):
        r0, r1 = longest_run(U[:, k])
        for l in range(V.shape[1]):
            c0, c1 = longest_run(V[:, l])
            if r1 > r0 and c1 > c0:
                blocks.append((abs(W[k, l]) * (r1 - r0) * (c1 - c0), k, l, r0, r1, c0, c1))
    return [block[1:] for block in sorted(blocks, reverse=True)[:count]]


def figure5(x: np.ndarray, U: np.ndarray, V: np.ndarray, W: np.ndarray, path: Path) -> Path:
    """Paper 003 figure 5: (A) the data and (B) U W V^T, rows and columns sorted by feature (``feature_order``),
    U right of them, V^T below, W^T bottom right, the largest block of the ``OUTLINED`` strongest feature pairs
    outlined."""
    from matplotlib.patches import Rectangle

    rows, kf = feature_order(U)
    cols, lf = feature_order(V)
    Us, Vs, Ws = U[rows][:, kf], V[cols][:, lf], W[np.ix_(kf, lf)]
    panels = {"A  data X": x[np.ix_(rows, cols)], "B  expected U W V^T": Us @ Ws @ Vs.T}
    limit = float(np.percentile(np.abs(x), 99))
    fig, _ = new_figure(figsize=(13, 8))
    fig.clear()  # laid out on a grid of unequal cells instead
    widths = [8, max(Us.shape[1], 1) / 4 + 0.5] * 2
    grid = fig.add_gridspec(2, 4, width_ratios=widths, height_ratios=[6, max(Vs.shape[1], 1) / 4 + 0.5])
    colours = ["#ffd400", "#00d4ff", "#ff00c8", "#00ff6a", "#ff7a00", "#ffffff"]
    blocks = outlined_blocks(Us, Vs, Ws, OUTLINED)
    for p, (title, image) in enumerate(panels.items()):
        ax = fig.add_subplot(grid[0, 2 * p])
        ax.imshow(image, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
        for colour, (k, l, r0, r1, c0, c1) in zip(colours, blocks):
            ax.add_patch(Rectangle((c0 - 0.5, r0 - 0.5), c1 - c0, r1 - r0, fill=False, edgecolor=colour, lw=1.5))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(f"{image.shape[0]} genes (sorted)")
        ax.set_xticks([])
        side = fig.add_subplot(grid[0, 2 * p + 1])
        side.imshow(Us, aspect="auto", cmap="gray_r", interpolation="nearest")
        side.set_title(f"U ({Us.shape[1]})", fontsize=9)
        side.set_xticks([])
        side.set_yticks([])
        below = fig.add_subplot(grid[1, 2 * p])
        below.imshow(Vs.T, aspect="auto", cmap="gray_r", interpolation="nearest")
        below.set_ylabel(f"V^T ({Vs.shape[1]})", fontsize=9)
        below.set_xlabel(f"{image.shape[1]} patients (sorted)")
        below.set_yticks([])
        corner = fig.add_subplot(grid[1, 2 * p + 1])
        w_limit = float(np.abs(Ws).max()) if Ws.size else 1.0
        corner.imshow(Ws.T, aspect="auto", cmap="RdBu_r", vmin=-w_limit, vmax=w_limit, interpolation="nearest")
        corner.set_xlabel("W^T", fontsize=9)
        corner.set_xticks([])
        corner.set_yticks([])
    return save_figure(fig, path)


# ----- the run -----

def spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    """Mean, standard deviation, 5% and 95% quantiles."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std()), float(np.quantile(arr, 0.05)), float(np.quantile(arr, 0.95))


def run(out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    """Every part of the module docstring on ``seeds`` held-out splits (``--quick``: fewer genes and sweeps)."""
    return run_with(out_dir, seeds, Settings.of(quick))


def run_with(out_dir: Path, seeds: int, settings: Settings) -> list[Path]:
    """The experiment at ``settings``: figure, tables (md, csv) and the printed numbers (json) in ``out_dir``."""
    started = time.perf_counter()
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    table = leukemia_table(settings.genes)
    records, seconds, first = [], {}, None
    for seed in range(seeds):
        split = held_out_split(table, settings, seed, work)
        first = split if first is None else first
        for method, k, value in split.rows:
            records.append((seed, method, k, value))
            print(f"split {seed}: {method:28s} K={k:3d} RMSE={value:.4f} ({split.seconds[method]:.1f} s)", flush=True)
        for method, value in split.seconds.items():
            seconds[method] = seconds.get(method, 0.0) + value
    methods = list(dict.fromkeys(r[1] for r in records))
    rmse_rows = [[m, *mean_std([r[3] for r in records if r[1] == m]),
                  float(np.mean([r[2] for r in records if r[1] == m])), seconds[m] / seeds] for m in methods]

    retained = [r for r in first.trace if r["retained"]]
    features = {name: spread([r[key] for r in retained]) for name, key in zip(STAT_NAMES, ("k_plus", "l_plus"))}
    x0 = gene_centred(table.x, first.train)
    probabilities = patient_feature_probabilities(x0, first.train, first.driver, settings.v_sweeps, 0)
    n_inputs = probabilities.shape[1]
    aucs = classification({"BMF patient features": probabilities,
                           f"top {n_inputs} principal components": principal_components(x0, n_inputs)},
                          table.is_aml, settings)
    single = [auc(probabilities[:, l], table.is_aml.astype(int)) for l in range(n_inputs)]
    figure = figure5(x0, first.driver.state.U, first.driver.state.V, first.driver.state.W, out_dir / "bmf_genes.png")
    wall = time.perf_counter() - started

    numbers = {"settings": asdict(settings), "seeds": seeds, "shape": list(table.x.shape),
               "preprocessing": table.applied.as_attrs()["preprocessing"],
               "held_out_rmse": {row[0]: {"mean": row[1], "sd": row[2], "mean_k": row[3]} for row in rmse_rows},
               "features_seed0": {name: dict(zip(("mean", "sd", "q05", "q95"), values))
                                  for name, values in features.items()},
               "last_sample": {"K+": first.driver.k_plus, "L+": int(first.driver.state.V.shape[1])},
               "all_aml_auc": {name: {"mean": float(np.mean(v)), "sd": float(np.std(v))} for name, v in aucs.items()},
               "best_single_feature_auc": max((max(a, 1 - a) for a in single), default=float("nan")),
               "seconds": {**{m: seconds[m] for m in methods}, "wall": wall}}
    header = ["method", "held-out RMSE mean", "sd", "mean K", "seconds per split"]
    notes = (f"{table.x.shape[0]} genes x {table.x.shape[1]} patients (log10, centred per gene on the training "
             f"cells); {seeds} random splits holding out {HELD_OUT:.0%} of the cells; the SVD's rank "
             f"({min(settings.svd_ks)}-{max(settings.svd_ks)}) chosen on {VALIDATION:.0%} of the training cells; IMF "
             f"with K+ <= {settings.imf_max_k}; BMF {settings.sweeps} sweeps (half burn-in), IBP priors on genes and "
             "patients. Paper 003 figure 5 shows the factorization only (no numbers).")
    feature_rows = [[name, *values] for name, values in features.items()]
    auc_rows = [[name, float(np.mean(v)), float(np.std(v)), n_inputs] for name, v in aucs.items()]
    sections = [notes, markdown_table(header, rmse_rows),
                "K+ (gene features) and L+ (patient features) over the retained sweeps of split 0:",
                markdown_table(["count", "mean", "sd", "5%", "95%"], feature_rows),
                (f"ALL/AML (never seen by the model) from the patients' features: {settings.folds}-fold "
                 f"cross-validated AUC of an L2 logistic regression (penalty {L2} on standardised inputs), "
                 f"{settings.cv_repeats} random fold assignments, the same for both inputs; feature probabilities "
                 f"from {settings.v_sweeps} Gibbs sweeps of V given the last U, W. Best single feature's AUC: "
                 f"{numbers['best_single_feature_auc']:.4f}."),
                markdown_table(["inputs", "AUC mean", "sd", "inputs per patient"], auc_rows),
                f"Wall time {wall:.1f} s."]
    files = [write_markdown("BMF on leukemia gene expression (paper 003 figure 5)", sections,
                            out_dir / "bmf_genes.md"),
             write_csv(header, rmse_rows, out_dir / "bmf_genes.csv"),
             write_csv(["split", "method", "K", "RMSE"], records, out_dir / "bmf_genes_splits.csv"),
             figure]
    json_path = out_dir / "bmf_genes.json"
    json_path.write_text(json.dumps(numbers, indent=2) + "\n")
    return files + [json_path]

"""``buffet reproduce role-mining``: paper 000 table 1 (paper 000, Sec. 4.3).

Data: the HP Labs Domino and Firewall user-permission files that ship with the package
(``buffet.data.bundled``, folder ``data/datasets/rolemining/``), ingested with the product's pair
ingest and transposed so that permissions are rows. Per random split (one per seed): 20% of all
entries (ones and zeros) are held out; every method is fitted on the other 80% and scored by the AUC
of its scores on the held-out entries.

Choices are made on validation parts of the TRAINING entries, never on held-out entries, and the
chosen setting is then refitted on all training entries. The K (1..20) of every baseline is chosen
on one validation part (20% of the training entries). IMF and INMF choose as ``buffet fit`` does with
its default ``--select auto`` (``engine.selection``: offsets or not, and the cap on K+, on three
validation folds); the experiment calls the same code.

Methods: IMF, INMF (the engine's ``IMFDriver``), truncated SVD with column-mean filling, iterative SVD
imputation, masked NMF, popularity (row rate + column rate) and popularity + SVD of its residual.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from buffet.data.bundled import rolemining_path
from buffet.data.pairs import ingest_pairs
from buffet.data.splits import holdout_entries
from buffet.kernels import baselines
from buffet.pipeline.models.imf import IMFConfig, INMFConfig
from buffet.kernels.metrics import auc
from buffet.pipeline.reports.plots import new_figure, save_figure
from buffet.pipeline.experiments.common import (chosen_caps, complete_with_baselines, complete_with_engine,
                                                markdown_table, mean_std, method_family, nmf_path, offsets_chosen,
                                                write_csv, write_markdown)

DATASETS = {"Domino": "domino.txt", "Firewall": "fire1.txt"}
TEST_FRACTION = 0.2
VALID_FRACTION = 0.2
VALID_SEED = 7919  # offset that makes the validation draw independent of the held-out draw

# Paper 000, table 1: (K, AUC) on Domino and on Firewall. The paper's numbers, not measured here.
PAPER_TABLE_1 = {
    "SVD": ((5, 0.9518), (10, 0.9745)),
    "NMF": ((4, 0.9755), (6, 0.9801)),
    "IMF": ((8, 0.9400), (7, 0.9823)),
    "INMF": ((9, 0.9869), (9, 0.9853)),
}


@dataclass(frozen=True)
class Settings:
    """Sizes of a run: the full experiment or the ``--quick`` smoke version."""

    ks: tuple[int, ...]
    max_k: int
    datasets: tuple[str, ...]
    chunk_rows: int = 128
    nmf_iter: int = 300

    @classmethod
    def of(cls, quick: bool) -> "Settings":
        if quick:
            return cls(ks=(1, 2), max_k=2, datasets=("Domino",), nmf_iter=50)
        return cls(ks=tuple(range(1, 21)), max_k=20, datasets=tuple(DATASETS))


PAPER_NAMES = {"SVD (mean fill)": "SVD", "NMF (masked)": "NMF", "IMF": "IMF", "INMF": "INMF"}


# ----------------------------------------------------------------------------- baselines over K


def svd_mean_fill_path(x: np.ndarray, mask: np.ndarray, ks: Sequence[int], seed: int) -> Iterator[np.ndarray]:
    """Truncated SVD of the column-mean filled matrix, one score array per K (paper 000's SVD)."""
    left, right = baselines.svd_factors(baselines.mean_fill(x, mask), max(ks))
    return (baselines.low_rank(left, right, k) for k in ks)


def svd_impute_path(x: np.ndarray, mask: np.ndarray, ks: Sequence[int], seed: int) -> Iterator[np.ndarray]:
    """Iterative SVD imputation for each K, each warm-started from the previous K's reconstruction."""
    recon = None
    for k in ks:
        recon = baselines.svd_impute(x, mask, k, start=recon, n_iter=50, tol=1e-4)
        yield recon


def popularity_path(x: np.ndarray, mask: np.ndarray, ks: Sequence[int], seed: int) -> Iterator[np.ndarray]:
    """Row rate + column rate; it has no K, so every K gets the same scores."""
    scores = baselines.popularity(x, mask)
    return (scores for _ in ks)


def popularity_svd_path(x: np.ndarray, mask: np.ndarray, ks: Sequence[int], seed: int) -> Iterator[np.ndarray]:
    """Popularity plus a rank-K SVD of its residual on the training entries."""
    base = baselines.popularity(x, mask)
    left, right = baselines.residual_svd(x, mask, base, max(ks))
    return (base + baselines.low_rank(left, right, k) for k in ks)


def baseline_paths(settings: Settings) -> dict:
    """The baselines by name, in table order."""
    return {"SVD (mean fill)": svd_mean_fill_path, "SVD (iterative imputation)": svd_impute_path,
            "NMF (masked)": nmf_path(settings.nmf_iter), "Popularity": popularity_path,
            "Popularity + SVD of residual": popularity_svd_path}


# ----------------------------------------------------------------------------- one split


def load_matrix(name: str, work: Path) -> np.ndarray:
    """The permissions x users binary matrix of a role-mining file, through the product's pair ingest."""
    ds = ingest_pairs(rolemining_path(DATASETS[name]), work / f"{name}.zarr", transpose=True, overwrite=True)
    return np.asarray(ds.read_rows(0, ds.n_rows).X, dtype=np.float64)


def split_masks(x: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(test, valid): held-out entries (20% of all) and validation entries (20% of the rest)."""
    test = holdout_entries(np.ones(x.shape, dtype=bool), TEST_FRACTION, seed)
    return test, holdout_entries(~test, VALID_FRACTION, VALID_SEED + seed)


# ----------------------------------------------------------------------------- the experiment


def summarise(records: list[tuple[str, int, str, int, float]]) -> list[list[object]]:
    """Rows (dataset, method, mean K, AUC mean, AUC std, splits with offsets, caps on K+ chosen, paper K,
    paper AUC)."""
    rows = []
    for dataset in dict.fromkeys(r[0] for r in records):
        d_index = list(DATASETS).index(dataset)
        methods = dict.fromkeys(method_family(r[2]) for r in records if r[0] == dataset)
        for method in methods:
            mine = [r for r in records if r[0] == dataset and method_family(r[2]) == method]
            mean, std = mean_std([r[4] for r in mine])
            labels = [r[2] for r in mine]
            paper = PAPER_TABLE_1.get(PAPER_NAMES.get(method, ""))
            rows.append([dataset, method, f"{np.mean([r[3] for r in mine]):.1f}", mean, std, offsets_chosen(labels),
                         chosen_caps(labels), paper[d_index][0] if paper else "",
                         paper[d_index][1] if paper else float("nan")])
    return rows


def figure(rows: list[list[object]], path: Path) -> Path:
    """AUC mean +- std per method and data set, the paper's AUC as black marks."""
    datasets = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = new_figure(1, len(datasets), figsize=(6 * len(datasets), 4.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        mine = [r for r in rows if r[0] == dataset]
        pos = np.arange(len(mine))
        ax.bar(pos, [r[3] for r in mine], yerr=[r[4] for r in mine], color="tab:blue", alpha=0.6, capsize=3,
               label="measured (mean +- std)")
        paper = [(p, r[8]) for p, r in zip(pos, mine) if not np.isnan(r[8])]
        if paper:
            ax.scatter(*zip(*paper), color="black", marker="_", s=300, zorder=3, label="paper 000 table 1")
        ax.set_xticks(pos, [r[1] for r in mine], rotation=35, ha="right", fontsize=8)
        low = min(r[3] - r[4] for r in mine)
        ax.set_ylim(max(0.0, low - 0.02), 1.0)
        ax.set_title(f"{dataset}: held-out AUC")
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def run(out_dir: Path, seeds: int, quick: bool) -> list[Path]:
    """Every method on ``seeds`` random splits of both data sets (Domino only, smaller, with ``quick``)."""
    return run_with(out_dir, seeds, Settings.of(quick))


def run_with(out_dir: Path, seeds: int, settings: Settings) -> list[Path]:
    """Every method on ``seeds`` random splits of ``settings.datasets``; table (md, csv) and figure."""
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    records = []
    for dataset in settings.datasets:
        x = load_matrix(dataset, work)
        for seed in range(seeds):
            test, valid = split_masks(x, seed)
            baselines = [(name, path, settings.ks) for name, path in baseline_paths(settings).items()]
            engines = [("IMF", IMFConfig(max_k=settings.max_k, chunk_rows=settings.chunk_rows)),
                       ("INMF", INMFConfig(max_k=settings.max_k, chunk_rows=settings.chunk_rows))]
            for method, k, value in (complete_with_baselines(x, ~test, test, valid, seed, auc, baselines)
                                     + complete_with_engine(x, None, test, work / f"{dataset}-{seed}" / "test.zarr",
                                                            "binary", auc, engines)):
                records.append((dataset, seed, method, k, value))
                print(f"{dataset} split {seed}: {method:30s} K={k:2d} AUC={value:.4f}", flush=True)
    rows = summarise(records)
    header = ["data set", "method", "mean K", "AUC mean", "AUC std", "offsets chosen", "K+ caps chosen", "paper K",
              "paper AUC"]
    per_split = write_csv(["data set", "split", "method", "K", "AUC"], records, out_dir / "role_mining_splits.csv")
    notes = (f"{seeds} random splits per data set; 20% of the entries held out; K (1..{max(settings.ks)}) "
             "of every baseline chosen on a validation part (20%) of the training entries; IMF/INMF as "
             "`buffet fit` runs them, offsets-or-not and the cap on K+ chosen on three validation folds of "
             "the training entries. 'offsets chosen' counts the splits whose validation picked the offsets "
             "extension; 'K+ caps chosen' counts the caps on K+ validation picked for IMF/INMF (K+ grows by "
             "evidence up to the cap). Paper columns: paper 000 table 1 (the paper's numbers, not measured here).")
    files = [write_markdown("Role mining (paper 000 table 1)", [notes, markdown_table(header, rows)],
                            out_dir / "role_mining.md"),
             write_csv(header, rows, out_dir / "role_mining.csv"), per_split,
             figure(rows, out_dir / "role_mining_auc.png")]
    return files

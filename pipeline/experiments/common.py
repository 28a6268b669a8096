"""Pieces shared by the reproduction experiments of paper 000 (Sec. 4): the held-out completion harness
of role mining and collaborative filtering (``complete_with_baselines``, ``complete_with_engine``), IMF/INMF
fits through the engine's driver, validation choice of a baseline's K, summary tables and the
paper-vs-measured print.

IMF and INMF always run as ``buffet fit`` runs them: on a dataset store written with ``from_array``,
their structural settings chosen on validation entries when the config's ``select`` asks
(``runs.settle_config``), then ``IMFDriver`` (``models.imf.fit_to_end``); the experiments never fit
them any other way.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.splits import add_split
from buffet.kernels import baselines
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import settle_config
from buffet.pipeline.models.imf import IMFConfig, INMFConfig, fit_to_end
from buffet.pipeline.registry import spec_for

SPLIT = "heldout"

# A baseline's scores for each K of a grid: (x, training mask, ks, seed) -> one N x D score array per K.
ScorePath = Callable[[np.ndarray, np.ndarray, Sequence[int], int], Iterator[np.ndarray]]
# Quality of scores on entries, larger is better (AUC, or -NMAE): (scores, truths) -> float.
Metric = Callable[[np.ndarray, np.ndarray], float]
# A baseline as the harness runs it: its name, its score path and the grid of K validation chooses from.
Baseline = tuple[str, ScorePath, Sequence[int]]
# One held-out completion result: (method, K or learned K+, metric on the held-out entries).
Completion = tuple[str, int, float]


def write_store(x: np.ndarray, observed: np.ndarray | None, heldout: np.ndarray, path: Path, kind: str,
                chunk_rows: int) -> str:
    """A dataset store of ``x`` (entries outside ``observed`` missing) with the entries ``heldout`` as the
    ``heldout`` split the driver trains without and predicts."""
    ds = from_array(x, path, kind, mask=observed, rows_per_chunk=chunk_rows, overwrite=True)
    add_split(ds, SPLIT, {"test_mask": heldout}, {"kind": "entries"})
    return str(path)


@dataclass(frozen=True)
class EngineFit:
    """What an experiment keeps of an IMF/INMF fit: held-out predictions (row-major order of the split's
    entries), their truths, the learned K+, the evidence L(q; K+) of every K+ tried, the config it ran
    with and the record of the settings chosen on validation (None if none were)."""

    predictions: np.ndarray
    truths: np.ndarray
    k_plus: int
    history: list[tuple[int, float]]
    config: IMFConfig
    selection: dict | None


def fit_engine(config: IMFConfig, store: str) -> EngineFit:
    """Fit IMF or INMF (by the config's class) as ``buffet fit`` does (module docstring), on an
    in-process engine."""
    source, engine = source_of(store), ProcessEngine()
    config, selection = settle_config(spec_for("inmf" if isinstance(config, INMFConfig) else "imf"), config, source,
                                      engine)
    driver = fit_to_end(config, source, engine)
    predictions, truths = driver.predictions() if driver.split else (np.zeros(0), np.zeros(0))
    return EngineFit(predictions, truths, driver.k_plus, list(driver.state.history), config, selection)


def engine_label(name: str, config: IMFConfig) -> str:
    """An IMF/INMF row's label naming the settings it ran with, e.g. "INMF + offsets (K+ <= 8)"."""
    return f"{name}{' + offsets' if config.offset_reg is not None else ''} (K+ <= {config.max_k})"


def method_family(label: str) -> str:
    """IMF/INMF rows are reported under one name whatever validation chose (offsets, cap on K+)."""
    return re.sub(r" \+ offsets| \(K\+ <= \d+\)", "", label)


def chosen_caps(labels: list[str]) -> str:
    """How often each cap on K+ was chosen, e.g. "2: 7, 4: 3" ("" for the baselines)."""
    caps = [int(m.group(1)) for m in (re.search(r"\(K\+ <= (\d+)\)", label) for label in labels) if m]
    return ", ".join(f"{cap}: {caps.count(cap)}" for cap in sorted(set(caps)))


def offsets_chosen(labels: list[str]) -> str:
    """How many IMF/INMF fits ran with offsets, e.g. "7/10" ("" for the baselines)."""
    if not any("(K+ <=" in label for label in labels):
        return ""
    return f"{sum('+ offsets' in label for label in labels)}/{len(labels)}"


def choose_k(path: ScorePath, x: np.ndarray, fit_mask: np.ndarray, valid: np.ndarray, ks: Sequence[int],
             metric: Metric, seed: int) -> int:
    """The K of ``ks`` whose scores, fitted on ``fit_mask`` only, are best by ``metric`` on the validation
    entries ``valid`` (a part of the training entries; held-out entries are never looked at)."""
    values = [metric(scores[valid], x[valid]) for scores in path(x, fit_mask, ks, seed)]
    return int(ks[int(np.argmax(values))])


def complete_with_baselines(x: np.ndarray, train: np.ndarray, test: np.ndarray, valid: np.ndarray, seed: int,
                            metric: Metric, methods: Sequence[Baseline]) -> list[Completion]:
    """Held-out completion by each baseline: K chosen on ``valid`` (a part of ``train``) with the
    rest of ``train`` fitted, then refitted on all of ``train`` and scored by ``metric`` on ``test``."""
    out = []
    for name, path, ks in methods:
        k = choose_k(path, x, train & ~valid, valid, ks, metric, seed)
        scores = next(iter(path(x, train, [k], seed)))
        out.append((name, k, metric(scores[test], x[test])))
    return out


def complete_with_engine(x: np.ndarray, observed: np.ndarray | None, test: np.ndarray, path: Path, kind: str,
                         metric: Metric, configs: Sequence[tuple[str, IMFConfig]]) -> list[Completion]:
    """Held-out completion by IMF/INMF as ``buffet fit`` runs them (module docstring) on a store at ``path``
    holding ``test`` as its held-out split; each result is labelled with the settings chosen on validation
    (``engine_label``). ``path`` must be new for each split: stores are opened by path and cached."""
    store = write_store(x, observed, test, path, kind, configs[0][1].chunk_rows)
    out = []
    for name, config in configs:
        fit = fit_engine(config, store)
        out.append((engine_label(name, fit.config), fit.k_plus, metric(fit.predictions, fit.truths)))
    return out


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; floats with 4 decimals, NaN as an empty cell."""
    def cell(value: object) -> str:
        if isinstance(value, float):
            return "" if np.isnan(value) else f"{value:.4f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(header: Sequence[str], rows: Sequence[Sequence[object]], path: Path) -> Path:
    """Write rows as CSV with a header line."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_markdown(title: str, sections: Sequence[str], path: Path) -> Path:
    """Write a markdown report, print it (the paper's numbers beside the measured ones) and return it."""
    text = "\n\n".join([f"# {title}", *sections]) + "\n"
    path.write_text(text)
    print(text)
    return path


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and (population) standard deviation, NaN for no values."""
    arr = np.asarray(values, dtype=np.float64)
    return (float(arr.mean()), float(arr.std())) if arr.size else (float("nan"), float("nan"))


def nmf_path(n_iter: int):
    """Masked NMF (observed entries only) for each K, ``n_iter`` multiplicative updates at most."""
    def path(x: np.ndarray, mask: np.ndarray, ks: Sequence[int], seed: int) -> Iterator[np.ndarray]:
        for k in ks:
            w, h, _ = baselines.masked_nmf(x, mask, k, np.random.default_rng([seed, k]), n_iter=n_iter)
            yield w @ h
    return path

"""Preprocessing of gene-expression tables (genes or probes in rows, samples in columns), plain NumPy.

Each function does one step and returns a new array (or, for the filters, the mask of rows to keep);
missing cells are NaN on the way in and stay NaN on the way out, and every statistic skips them.
``Applied`` records the steps taken as a list of plain dictionaries, fit for a store's attributes, so a
dataset says how it was made.

The usual recipe for Affymetrix levels (Dudoit, Fridlyand and Speed 2002, on the leukemia data of Golub et
al. 1999) is ``standard_affymetrix``: floor 100, ceiling 16,000, keep probes with max/min > 5 and
max - min > 500, then log10.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import numpy as np

from buffet.data.errors import InputError

Along = Literal["row", "column"]
LOG_BASES = {"2": np.log2, "10": np.log10, "e": np.log}


@dataclass
class Applied:
    """The preprocessing steps applied to a table, in order: each a dict with ``step`` and its settings."""

    steps: list[dict[str, object]] = field(default_factory=list)

    def note(self, step: str, **settings: object) -> None:
        """Append one step and its settings (numbers, strings or None)."""
        self.steps.append({"step": step, **settings})

    def as_attrs(self) -> dict[str, list[dict[str, object]]]:
        """The record as a store attribute: ``{"preprocessing": [...]}`` with copies of the steps."""
        return {"preprocessing": [dict(step) for step in self.steps]}


def clip_levels(x: np.ndarray, floor: float | None = None, ceiling: float | None = None) -> np.ndarray:
    """``x`` with values below ``floor`` raised to it and values above ``ceiling`` lowered to it (either may
    be None for no bound); NaN cells stay NaN."""
    if floor is not None and ceiling is not None and floor > ceiling:
        raise InputError(f"floor {floor} is above ceiling {ceiling}; give a floor at or below the ceiling")
    return np.clip(np.asarray(x, dtype=np.float64), floor, ceiling)


def row_extremes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's largest and smallest observed value and whether the row has any observed value (the
    extremes of an all-NaN row are NaN)."""
    x = np.asarray(x, dtype=np.float64)
    observed = ~np.all(np.isnan(x), axis=1)
    high = np.full(x.shape[0], np.nan)
    low = np.full(x.shape[0], np.nan)
    high[observed] = np.nanmax(x[observed], axis=1)
    low[observed] = np.nanmin(x[observed], axis=1)
    return high, low, observed


def fold_change_rows(x: np.ndarray, threshold: float) -> np.ndarray:
    """The mask of rows whose largest over smallest observed value exceeds ``threshold`` (rows with no
    observed value are dropped). The values must be positive: floor them first (``clip_levels``)."""
    high, low, observed = row_extremes(x)
    if np.any(low[observed] <= 0):
        row = int(np.flatnonzero(observed & (low <= 0))[0])
        raise InputError(f"row {row} has a value <= 0, so its fold change is undefined; floor the levels "
                         "at a positive value first")
    keep = np.zeros(x.shape[0], dtype=bool)
    keep[observed] = high[observed] / low[observed] > threshold
    return keep


def range_rows(x: np.ndarray, threshold: float) -> np.ndarray:
    """The mask of rows whose largest minus smallest observed value exceeds ``threshold`` (rows with no
    observed value are dropped)."""
    high, low, observed = row_extremes(x)
    keep = np.zeros(x.shape[0], dtype=bool)
    keep[observed] = high[observed] - low[observed] > threshold
    return keep


def log_levels(x: np.ndarray, base: str = "10") -> np.ndarray:
    """The logarithm of ``x`` in ``base`` ("2", "10" or "e"); NaN cells stay NaN. The values must be
    positive."""
    if base not in LOG_BASES:
        raise InputError(f"unknown log base {base!r}; use one of {', '.join(LOG_BASES)}")
    x = np.asarray(x, dtype=np.float64)
    if np.any(x[~np.isnan(x)] <= 0):
        raise InputError("the table has values <= 0, whose logarithm is undefined; floor the levels at a "
                         "positive value first")
    return LOG_BASES[base](x)


def axis_of(along: Along) -> int:
    """The NumPy axis a per-row (1) or per-column (0) statistic reduces over."""
    if along not in ("row", "column"):
        raise InputError(f"unknown direction {along!r}; use 'row' or 'column'")
    return 1 if along == "row" else 0


def nan_statistic(x: np.ndarray, along: Along, reduce: Callable[..., np.ndarray]) -> np.ndarray:
    """``reduce`` (a NaN-skipping NumPy reduction) of each row or column, kept as a broadcastable column or
    row; a line with no observed value gives NaN without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return reduce(np.asarray(x, dtype=np.float64), axis=axis_of(along), keepdims=True)


def centre(x: np.ndarray, along: Along, statistic: Literal["mean", "median"] = "mean") -> np.ndarray:
    """``x`` with each row's (``along="row"``) or column's observed mean or median subtracted; NaN cells
    stay NaN."""
    reductions = {"mean": np.nanmean, "median": np.nanmedian}
    if statistic not in reductions:
        raise InputError(f"unknown centring statistic {statistic!r}; use 'mean' or 'median'")
    return np.asarray(x, dtype=np.float64) - nan_statistic(x, along, reductions[statistic])


def scale(x: np.ndarray, along: Along) -> np.ndarray:
    """``x`` with each row (``along="row"``) or column divided by the sample standard deviation (divisor
    n - 1) of its observed values; NaN cells stay NaN. A line needs two observed values that differ."""
    x = np.asarray(x, dtype=np.float64)
    spread = nan_statistic(x, along, partial(np.nanstd, ddof=1))
    flat = spread.ravel()
    bad = ~(flat > 0)
    if np.any(bad):
        raise InputError(f"{along} {int(np.flatnonzero(bad)[0])} has fewer than two distinct observed values, "
                         f"so it cannot be scaled; drop it first (filter rows, or leave out scaling)")
    return x / spread


def standard_affymetrix(x: np.ndarray, applied: Applied | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The usual preprocessing of Affymetrix levels (probes in rows): floor 100, ceiling 16,000, keep the
    probes with max/min > 5 and max - min > 500, log10. Returns the kept rows, transformed, and the mask of
    kept rows of ``x``; the steps are noted in ``applied`` when given."""
    clipped = clip_levels(x, floor=100.0, ceiling=16000.0)
    keep = fold_change_rows(clipped, 5.0) & range_rows(clipped, 500.0)
    if applied is not None:
        applied.note("clip", floor=100.0, ceiling=16000.0)
        applied.note("filter_rows", fold_change_above=5.0, range_above=500.0,
                     kept=int(keep.sum()), of=int(keep.size))
        applied.note("log", base="10")
    return log_levels(clipped[keep], "10"), keep

"""Preprocessing of a real table while it is stored (``buffet ingest table|h5ad --floor ... --scale ...``).

The steps run in this order, each on what the one before left: floor, ceiling (``expression.clip_levels``),
the row filters min-fold then min-range (``expression.fold_change_rows``, ``expression.range_rows``), log
(``expression.log_levels``), centring and scaling of rows or columns (``expression.centre``,
``expression.scale``). Missing cells (NaN) stay missing and are skipped by every statistic.

A table is read in batches of rows. Every step but the column ones works row by row, so it runs on each
batch as it is written. Centring or scaling columns needs each column's mean and standard deviation over
all the kept rows: a first pass over the table gathers them (``ColumnMoments``, merged batch by batch,
Chan et al.'s pairwise update) and the second pass subtracts and divides by them.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from buffet.data import expression
from buffet.data.errors import InputError

AXES = {"rows": "row", "columns": "column"}  # the options' words -> expression's directions


@dataclass
class ColumnMoments:
    """Per-column count, mean and sum of squared deviations of the observed cells seen so far."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, n_cols: int) -> "ColumnMoments":
        """No cells seen."""
        return cls(np.zeros(n_cols), np.zeros(n_cols), np.zeros(n_cols))

    def add(self, values: np.ndarray) -> None:
        """Merge a batch of rows (NaN = missing) into the moments (pairwise update of count, mean, M2)."""
        observed = ~np.isnan(values)
        n_b = observed.sum(axis=0).astype(np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_b = np.where(n_b > 0, np.nansum(values, axis=0) / np.maximum(n_b, 1), 0.0)
        m2_b = np.nansum(np.where(observed, values - mean_b, 0.0) ** 2, axis=0)
        total = self.count + n_b
        delta = mean_b - self.mean
        weight = np.divide(n_b, total, out=np.zeros_like(total), where=total > 0)
        self.m2 = self.m2 + m2_b + delta ** 2 * self.count * weight
        self.mean = self.mean + delta * weight
        self.count = total

    def column_mean(self) -> np.ndarray:
        """Each column's mean (NaN for a column with no observed cell)."""
        return np.where(self.count > 0, self.mean, np.nan)

    def column_std(self) -> np.ndarray:
        """Each column's sample standard deviation (divisor n - 1), refused where it is not positive."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            std = np.sqrt(self.m2 / (self.count - 1))
        bad = np.flatnonzero(~(std > 0))
        if bad.size:
            raise InputError(f"column {int(bad[0]) + 1} has fewer than two distinct observed values, so it cannot "
                             "be scaled; leave it out (--drop-columns) or scale rows instead")
        return std


@dataclass
class Plan:
    """What a write pass needs besides the options: the table's file (for messages), the column moments (when
    a column step is asked) and the rows kept so far by the filters."""

    path: str
    moments: ColumnMoments | None = None
    rows_in: int = 0
    rows_kept: int = 0


@dataclass(frozen=True)
class Preprocessing:
    """The preprocessing options (module docstring), unset = step skipped."""

    floor: float | None = None
    ceiling: float | None = None
    min_fold: float | None = None
    min_range: float | None = None
    log: str | None = None
    center: str | None = None
    scale: str | None = None

    @classmethod
    def from_options(cls, **options) -> "Preprocessing":
        """The checked options of an ingest call."""
        prep = cls(**options)
        if prep.log is not None and prep.log not in expression.LOG_BASES:
            raise InputError(f"--log must be one of {', '.join(expression.LOG_BASES)}, got {prep.log!r}")
        for name in ("center", "scale"):
            value = getattr(prep, name)
            if value is not None and value not in AXES:
                raise InputError(f"--{name} must be rows or columns, got {value!r}")
        if prep.floor is not None and prep.ceiling is not None and prep.floor > prep.ceiling:
            raise InputError(f"--floor {prep.floor:g} is above --ceiling {prep.ceiling:g}")
        return prep

    def steps(self) -> list[str]:
        """The names of the steps asked for, in the order they run."""
        return [name for name in ("floor", "ceiling", "min_fold", "min_range", "log", "center", "scale")
                if getattr(self, name) is not None]

    def filter_options(self) -> str:
        """The row filters asked for, as options (for a message)."""
        return " and ".join(f"--{n.replace('_', '-')} {getattr(self, n):g}" for n in ("min_fold", "min_range")
                            if getattr(self, n) is not None)

    def _column_steps(self) -> bool:
        return "columns" in (self.center, self.scale)

    def _rows_stage(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Floor, ceiling, the row filters and log of a batch: the kept rows and the mask of kept rows."""
        if self.floor is not None or self.ceiling is not None:
            values = expression.clip_levels(values, self.floor, self.ceiling)
        keep = np.ones(len(values), dtype=bool)
        if self.min_fold is not None:
            keep &= expression.fold_change_rows(values, self.min_fold)
        if self.min_range is not None:
            keep &= expression.range_rows(values, self.min_range)
        values = values[keep]
        if self.log is not None:
            values = expression.log_levels(values, self.log)
        return values, keep

    def plan(self, batches: Callable[[], Iterator], path: str) -> Plan:
        """A first pass over the table of ``path`` for the column moments when a column step is asked (the
        moments of the values as the first column step sees them), else nothing to read."""
        if not self._column_steps():
            return Plan(path)
        moments: ColumnMoments | None = None
        for batch in batches():
            with _naming(path):
                values, _ = self._rows_stage(batch.values)
                if self.center == "rows":
                    values = expression.centre(values, "row")
            moments = moments or ColumnMoments.empty(values.shape[1])
            moments.add(values)
        return Plan(path, moments)

    def apply(self, values: np.ndarray, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """Every step on a batch of rows: the kept rows, preprocessed, and the mask of kept rows."""
        with _naming(plan.path):
            values, keep = self._rows_stage(values)
            plan.rows_in += len(keep)
            plan.rows_kept += len(values)
            if self.center is not None:
                values = expression.centre(values, "row") if self.center == "rows" else \
                    values - plan.moments.column_mean()
            if self.scale is not None and len(values):
                values = expression.scale(values, "row") if self.scale == "rows" else \
                    values / plan.moments.column_std()
        return values, keep

    def record(self, plan: Plan | None = None) -> list[dict]:
        """The steps taken, in order, with their settings (and the rows the filters kept), for the provenance."""
        applied = expression.Applied()
        for name in self.steps():
            settings: dict = {"value": getattr(self, name)}
            if name in ("min_fold", "min_range") and plan is not None:
                settings.update(rows_kept=plan.rows_kept, rows_in=plan.rows_in)
            applied.note(name, **settings)
        return applied.steps


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """Prefix the file's name to a step's ``InputError`` (the steps know only the array)."""
    try:
        yield
    except InputError as exc:
        raise InputError(f"{path}: {exc} (while preprocessing)") from None

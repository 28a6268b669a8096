"""Row blocks: what a block task reads, wherever the rows live (SPEC 1-2).

A *row source* is either the path of a dataset store (each worker opens it itself) or an
in-memory matrix wrapped by ``MemoryRows``; both answer ``read_rows(r0, r1)``. A block is a
range of rows minus the rows a split holds out.
"""

from __future__ import annotations

import functools
from typing import Any, Union

import numpy as np
import scipy.sparse as sp

from buffet.data.splits import EntrySample
from buffet.data.store import CSRRows, Dataset, DenseRows
from buffet.pipeline.engine.executors import Executor


class MemoryRows:
    """An in-memory CSR matrix or dense array (+ mask) with the dataset's ``read_rows``."""

    def __init__(self, X, mask: np.ndarray | None = None):
        self.sparse = sp.issparse(X)
        self.X = sp.csr_matrix(X, dtype=np.float64) if self.sparse else np.asarray(X, dtype=np.float64)
        self.mask = mask
        self.shape = self.X.shape
        self.n_rows, self.n_cols = self.shape
        self.layout = "csr" if self.sparse else "dense"

    def __str__(self) -> str:
        return f"in-memory {'sparse' if self.sparse else 'dense'} matrix {self.n_rows} x {self.n_cols}"

    def split_names(self) -> list[str]:
        """In-memory rows carry no stored splits (a dataset store's ``split_names``)."""
        return []

    def read_rows(self, r0: int, r1: int) -> CSRRows | DenseRows:
        if self.sparse:
            m = self.X[r0:r1]
            return CSRRows(m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data, self.n_cols)
        return DenseRows(self.X[r0:r1], None if self.mask is None else self.mask[r0:r1])


Source = Union[str, MemoryRows]


@functools.lru_cache(maxsize=8)
def _open(path: str) -> Dataset:
    return Dataset(path)


def resolve(source: Source) -> Dataset | MemoryRows:
    return _open(source) if isinstance(source, str) else source


def task_source(source: Source, executor: Executor) -> Any:
    """What block tasks are given to read ``source``: a store path as it is (each worker opens it), and
    in-memory rows sent to every worker once (``Executor.broadcast``) instead of with every task."""
    return source if isinstance(source, str) else executor.broadcast(source)


def row_ranges(n_rows: int, rows_per_block: int) -> list[tuple[int, int]]:
    return [(r, min(r + rows_per_block, n_rows)) for r in range(0, n_rows, rows_per_block)]


def kept_rows(r0: int, r1: int, held_out: np.ndarray) -> np.ndarray:
    """Local indices of rows in [r0, r1) that are not held out (``held_out`` sorted)."""
    lo, hi = np.searchsorted(held_out, [r0, r1])
    keep = np.ones(r1 - r0, dtype=bool)
    keep[held_out[lo:hi] - r0] = False
    return np.flatnonzero(keep)


def read_block(source: Source, r0: int, r1: int, held_out: np.ndarray) -> CSRRows | DenseRows:
    """Rows [r0, r1) of the source without the held-out rows."""
    rows = resolve(source).read_rows(r0, r1)
    keep = kept_rows(r0, r1, held_out)
    if len(keep) == rows.n_rows:
        return rows
    if isinstance(rows, CSRRows):
        return rows.take(keep)
    return DenseRows(rows.X[keep], None if rows.mask is None else rows.mask[keep])


def read_row_set(source: Source, rows: np.ndarray, span: int = 4096) -> CSRRows:
    """Arbitrary sorted rows of a CSR source, reading each span of ``span`` rows once."""
    src = resolve(source)
    parts = []
    for start in np.unique(rows // span) * span:
        sel = rows[(rows >= start) & (rows < start + span)]
        block = src.read_rows(int(start), int(min(start + span, src.n_rows)))
        parts.append(block.to_scipy()[sel - start])
    m = sp.vstack(parts).tocsr() if parts else sp.csr_matrix((0, src.shape[1]))
    return CSRRows(m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data, m.shape[1])


def load_training_rows(source: Source, r0: int, r1: int, split: str | None,
                       exclude: EntrySample | None = None) -> DenseRows:
    """Dense rows [r0, r1) with the held-out entries of ``split`` and the entries of ``exclude`` (a
    validation sample) removed from the mask (SPEC 1 splits; issue #10 validation)."""
    ds = resolve(source)
    rows = ds.read_rows(r0, r1)
    mask = np.ones(rows.X.shape, dtype=bool) if rows.mask is None else rows.mask
    if split:
        mask = mask & ~ds.read_split_rows(split, "test_mask", r0, r1)
    if exclude is not None:
        mask = mask & ~exclude.rows(r0, r1, rows.X.shape[1])
    return DenseRows(rows.X, mask)


def target_entries(source: Source, r0: int, r1: int, split: str | None, sample: EntrySample | None) -> np.ndarray:
    """The entries of rows [r0, r1) a fit is scored on: those of the validation ``sample`` that training
    could see (observed, not held out by ``split``), or, without a sample, the held-out entries of
    ``split``."""
    ds = resolve(source)
    held = ds.read_split_rows(split, "test_mask", r0, r1) if split else None
    if sample is None:
        return held
    rows = ds.read_rows(r0, r1)
    seen = np.ones(rows.X.shape, dtype=bool) if rows.mask is None else rows.mask.copy()
    if held is not None:
        seen &= ~held
    return seen & sample.rows(r0, r1, rows.X.shape[1])

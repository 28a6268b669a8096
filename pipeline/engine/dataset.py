"""How a fit reads its data: the one data-access path of every driver (SPEC 1-2, issue #11).

A ``Source`` names the data: a dataset store (a path or an fsspec URL, opened by every worker itself, once
per process) or rows held in memory. ``count_blocks`` and ``dense_blocks`` cut it into the fit's row
blocks: on a cluster as ``dask.array``s over the store (chunks of SciPy CSR matrices for count data,
dense float64 plus a boolean array of the entries training may see for real and binary data),
whose row blocks the drivers' local steps run over; in this process as the same blocks read at once.
The kernels receive ``CSRRows`` or ``DenseRows`` either way.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from buffet.data.splits import EntrySample
from buffet.data.store import CSRRows, Dataset, DenseRows
from buffet.data.urls import normalise
from buffet.pipeline.engine.engine import BlockSet, Engine


def in_memory(X: Any) -> Any:
    """A ``dask.array.Array`` (a user's data as a Dask collection) computed into this process; anything else
    unchanged. Such data are then read as in-memory rows (``MemoryRows``)."""
    if type(X).__module__.split(".")[0] == "dask":
        return X.compute()
    return X


class MemoryRows:
    """An in-memory CSR matrix or dense array (+ mask) with the dataset's ``read_rows``."""

    def __init__(self, X: Any, mask: np.ndarray | None = None):
        self.sparse = sp.issparse(X)
        self.X = sp.csr_matrix(X, dtype=np.float64) if self.sparse else np.asarray(X, dtype=np.float64)
        self.mask = mask
        self.shape = self.X.shape
        self.n_rows, self.n_cols = self.shape
        self.layout = "csr" if self.sparse else "dense"

    def __str__(self) -> str:
        return f"in-memory {'sparse' if self.sparse else 'dense'} matrix {self.n_rows} x {self.n_cols}"

    def nnz(self) -> int:
        """Stored entries of a sparse matrix (``Dataset.nnz``)."""
        return int(self.X.nnz)

    def split_names(self) -> list[str]:
        """In-memory rows carry no stored splits (a dataset store's ``split_names``)."""
        return []

    def read_rows(self, r0: int, r1: int) -> CSRRows | DenseRows:
        """Rows [r0, r1) as the kernels take them."""
        if self.sparse:
            m = self.X[r0:r1]
            return CSRRows(m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data, self.n_cols)
        return DenseRows(self.X[r0:r1], None if self.mask is None else self.mask[r0:r1])


def row_ranges(n_rows: int, rows_per_block: int, start: int = 0) -> list[tuple[int, int]]:
    """The row blocks [r, r + rows_per_block) of rows ``start`` to ``n_rows`` (the last may be short)."""
    return [(r, min(r + rows_per_block, n_rows)) for r in range(start, n_rows, rows_per_block)]


def kept_rows(r0: int, r1: int, held_out: np.ndarray) -> np.ndarray:
    """Local indices of rows in [r0, r1) that are not held out (``held_out`` sorted)."""
    lo, hi = np.searchsorted(held_out, [r0, r1])
    keep = np.ones(r1 - r0, dtype=bool)
    keep[held_out[lo:hi] - r0] = False
    return np.flatnonzero(keep)


@dataclass(frozen=True)
class Source:
    """Where a fit's rows are: ``url`` of a dataset store, or ``memory`` rows (exactly one)."""

    url: str | None = None
    memory: MemoryRows | None = None
    storage_options: str = "{}"  # JSON, so that a Source is hashable and cheap to send
    offset: int = 0  # in-memory rows: the row of the whole matrix that ``memory`` starts at

    def open(self) -> Dataset | MemoryRows:
        """The dataset (opened once per process) or the in-memory rows."""
        return self.memory if self.url is None else _open(self.url, self.storage_options)

    def read_rows(self, r0: int, r1: int) -> CSRRows | DenseRows:
        """Rows [r0, r1) of the whole matrix."""
        return self.open().read_rows(r0 - self.offset, r1 - self.offset)

    def part(self, r0: int, r1: int) -> "Source":
        """What a task reading rows [r0, r1) is given: the store's Source, or for in-memory rows only those
        rows (so no task carries the whole matrix to a worker)."""
        if self.url is not None:
            return self
        rows = self.memory.read_rows(r0 - self.offset, r1 - self.offset)
        X = rows.to_scipy() if isinstance(rows, CSRRows) else rows.X
        return Source(memory=MemoryRows(X, None if isinstance(rows, CSRRows) else rows.mask), offset=r0)

    def __str__(self) -> str:
        return self.url or str(self.memory)


@functools.lru_cache(maxsize=16)
def _open(url: str, storage_options: str) -> Dataset:
    options = json.loads(storage_options)
    return Dataset(url, storage_options=options) if options else Dataset(url)


def source_of(data: str | MemoryRows | Source, storage_options: dict | None = None) -> Source:
    """A Source for a store path or URL, in-memory rows, or a Source."""
    if isinstance(data, Source):
        return data
    if isinstance(data, MemoryRows):
        return Source(memory=data)
    # made absolute here, never on a worker (``data.urls.normalise``)
    return Source(url=normalise(data), storage_options=json.dumps(storage_options or {}, sort_keys=True))


# ----- count data (CSR) -----

def _sparse_meta() -> sp.csr_matrix:
    return sp.csr_matrix((0, 0))


def read_count_chunk(source: Source, r0: int, r1: int, held: np.ndarray) -> sp.csr_matrix:
    """Rows [r0, r1) of a count store without the held-out rows ``held`` (sorted, global ids), as a SciPy
    CSR chunk. (SciPy's CSR rather than ``sparse.GCXS``: dask.array takes both, and GCXS compiles numba
    code in every fresh worker process, a stall of seconds on each start.)"""
    rows = source.read_rows(r0, r1)
    keep = kept_rows(r0, r1, held)
    if len(keep) < rows.n_rows:
        rows = rows.take(keep)
    return rows.to_scipy()


def csr_rows(chunk: sp.csr_matrix) -> CSRRows:
    """A CSR chunk as the ``CSRRows`` the kernels take (no copy)."""
    return CSRRows(np.asarray(chunk.indptr, dtype=np.int64), np.asarray(chunk.indices, dtype=np.int32),
                   np.asarray(chunk.data, dtype=np.float64), chunk.shape[1])


def count_blocks(engine: Engine, source: Source, ranges: Sequence[tuple[int, int]], held: np.ndarray) -> BlockSet:
    """The training documents of each row range (held-out rows removed) as ``CSRRows``: the row blocks of
    a ``dask.array`` of CSR chunks over the store (module docstring)."""
    n_cols = source.open().n_cols
    sizes = [len(kept_rows(r0, r1, held)) for r0, r1 in ranges]
    bounds = np.searchsorted(held, np.asarray(ranges, dtype=np.int64).reshape(-1, 2))
    args = [(source.part(r0, r1), r0, r1, held[lo:hi]) for (r0, r1), (lo, hi) in zip(ranges, bounds)]
    array = engine.source_array(read_count_chunk, args, sizes, n_cols, _sparse_meta())
    return engine.map(csr_rows, engine.from_array(array))


# ----- dense data (real, binary) with the entries training may see -----

def read_dense_chunk(source: Source, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of a dense store's X."""
    return source.read_rows(r0, r1).X


def read_seen_chunk(source: Source, r0: int, r1: int, split: str | None, exclude: EntrySample | None) -> np.ndarray:
    """Which entries of rows [r0, r1) training may see: observed (the store's mask), not held out by
    ``split``, not in the validation sample ``exclude``."""
    rows = source.read_rows(r0, r1)
    seen = np.ones(rows.X.shape, dtype=bool) if rows.mask is None else rows.mask.copy()
    if split:
        seen &= ~source.open().read_split_rows(split, "test_mask", r0, r1)
    if exclude is not None:
        seen &= ~exclude.rows(r0, r1, rows.X.shape[1])
    return seen


def dense_blocks(engine: Engine, source: Source, ranges: Sequence[tuple[int, int]], split: str | None,
                 exclude: EntrySample | None = None) -> BlockSet:
    """``DenseRows`` per row range: X and the entries training may see, the row blocks of two
    ``dask.array``s over the store (module docstring)."""
    n_cols = source.open().n_cols
    sizes = [r1 - r0 for r0, r1 in ranges]
    parts = [source.part(r0, r1) for r0, r1 in ranges]
    x = engine.source_array(read_dense_chunk, [(p, r0, r1) for p, (r0, r1) in zip(parts, ranges)], sizes, n_cols,
                            np.empty((0, 0)))
    seen = engine.source_array(read_seen_chunk, [(p, r0, r1, split, exclude) for p, (r0, r1) in zip(parts, ranges)],
                               sizes, n_cols, np.empty((0, 0), dtype=bool))
    return engine.map(DenseRows, engine.from_array(x), engine.from_array(seen))


def count_row_set(source: Source, rows: np.ndarray, span: int = 4096) -> CSRRows:
    """Arbitrary sorted rows of a count source (e.g. held-out documents), reading each span of ``span``
    rows once."""
    n_rows = source.open().n_rows
    parts = []
    for start in np.unique(rows // span) * span:
        chosen = rows[(rows >= start) & (rows < start + span)]
        parts.append(source.read_rows(int(start), int(min(start + span, n_rows))).to_scipy()[chosen - start])
    m = sp.vstack(parts).tocsr() if parts else sp.csr_matrix((0, source.open().n_cols))
    return CSRRows(m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data, m.shape[1])


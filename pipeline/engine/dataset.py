"""How a fit reads its data: the one data-access path of every driver.

A ``Source`` names the data: a dataset store (a path or an fsspec URL, opened by every worker itself, once
per process) or a matrix given as an array (``ArrayRows``: in memory, or a ``dask.array`` read a row range
at a time). ``count_blocks`` and ``dense_blocks`` cut it into the fit's row blocks: on a cluster as
``dask.array``s (chunks of SciPy CSR matrices for count data, dense float64 plus a boolean array of the
entries training may see for real and binary data), whose row blocks the drivers' local steps run over;
in this process as the same blocks read at once. A dask array's own graph feeds those blocks on a cluster
(rechunked lazily to the fit's row ranges), so its chunks are computed by the workers, never gathered
whole. The kernels receive ``CSRRows`` or ``DenseRows`` either way.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from buffet.data.splits import EntrySample
from buffet.data.store import CSRRows, Dataset, DenseRows, check_values
from buffet.data.urls import normalise
from buffet.pipeline.engine.engine import BlockSet, Engine

OPENED_STORES = 16  # datasets kept open per process (``_open``)


def is_dask_array(X: Any) -> bool:
    """Whether ``X`` is a ``dask.array.Array`` (dask.array is not imported for the test: an array of it
    exists only once it is)."""
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(X, module.Array)


def checked_values(X: Any, mask: np.ndarray | None, layout: str) -> tuple[Any, np.ndarray | None]:
    """In-memory values as the model reads them, refused unless it can: for the ``csr`` layout a
    CSR float64 matrix of non-negative integer counts (no mask); for ``dense`` a float64 array with its
    unobserved entries set to 0 and the mask of the observed ones (None: all), where without a ``mask``
    the NaN entries are the unobserved ones, and the observed entries must be finite."""
    if layout == "csr":
        m = sp.csr_matrix(X, dtype=np.float64)
        check_values("counts", m.data, "X")
        return m, None
    arr = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=np.float64)
    if mask is None:
        missing = np.isnan(arr)
        mask = ~missing if missing.any() else None
    check_values("real", arr, "X", mask)
    return (arr if mask is None else np.where(mask, arr, 0.0)), mask


class ArrayRows:
    """A matrix given as an array, read as a dataset store is (``read_rows``): a CSR matrix of counts or a
    dense float64 array with an optional mask (True = observed), in memory, or a ``dask.array`` (with a
    dask mask or None) of which a read computes only the rows asked for, in this process, checked as
    ``checked_values`` checks in-memory values. ``layout``: "csr" or "dense" (default: from ``X``, sparse or not)."""

    def __init__(self, X: Any, mask: Any = None, layout: str | None = None):
        self.lazy = is_dask_array(X)
        meta = X._meta if self.lazy else X
        self.layout = layout or ("csr" if sp.issparse(meta) else "dense")
        if self.lazy:
            self.X, self.mask = X, mask
        elif self.layout == "csr":
            self.X, self.mask = sp.csr_matrix(X, dtype=np.float64), None
        else:
            self.X, self.mask = np.asarray(X, dtype=np.float64), mask
        self.shape: tuple[int, int] = tuple(int(n) for n in X.shape)  # type: ignore[assignment]
        self.n_rows, self.n_cols = self.shape

    def __str__(self) -> str:
        where = "dask" if self.lazy else "in-memory"
        return f"{where} {'sparse' if self.layout == 'csr' else 'dense'} matrix {self.n_rows} x {self.n_cols}"

    def nnz(self) -> int:
        """Stored entries of a sparse matrix (``Dataset.nnz``); of a dask array, which would have to be read to
        count them, rows x columns (a bound)."""
        return self.n_rows * self.n_cols if self.lazy else int(self.X.nnz)

    def split_names(self) -> list[str]:
        """An array carries no stored splits (a dataset store's ``split_names``)."""
        return []

    @functools.cached_property
    def kind(self) -> str:
        """The dataset kind: counts, or binary when every observed value is 0 or 1, else real."""
        if self.layout == "csr":
            return "counts"
        for rows in self._each_chunk():
            if not np.isin(rows.X if rows.mask is None else rows.X[rows.mask], (0.0, 1.0)).all():
                return "real"
        return "binary"

    def total(self) -> float:
        """Sum of all values (total tokens for a corpus; a dataset store's ``total``)."""
        return float(sum(np.sum(rows.data if isinstance(rows, CSRRows) else rows.X) for rows in self._each_chunk()))

    def _each_chunk(self) -> Iterator[CSRRows | DenseRows]:
        """The rows of every chunk of a dask array in turn, or all rows at once of an in-memory one."""
        chunk = self.X.chunks[0][0] if self.lazy else max(self.n_rows, 1)
        return (self.read_rows(r0, r1) for r0, r1 in row_ranges(self.n_rows, chunk))

    def read_rows(self, r0: int, r1: int) -> CSRRows | DenseRows:
        """Rows [r0, r1) as the kernels take them."""
        if self.lazy:  # computed here, whatever dask's default scheduler (a Client sets itself as that)
            X = self.X[r0:r1].compute(scheduler="sync")
            return block_rows(X, None if self.mask is None else self.mask[r0:r1].compute(scheduler="sync"), self.layout)
        return _rows_of(self.X[r0:r1], None if self.mask is None else self.mask[r0:r1], self.layout)

    def in_chunks(self, ranges: Sequence[tuple[int, int]]) -> tuple[Any, Any]:
        """A lazy ``X`` and mask (or None) of the rows ``ranges`` cover (consecutive), rechunked to one chunk per
        range and one along the columns: the graph a cluster computes those ranges' blocks from."""
        lo, hi, sizes = ranges[0][0], ranges[-1][1], tuple(r1 - r0 for r0, r1 in ranges)
        return tuple(None if a is None else a[lo:hi].rechunk((sizes, -1)) for a in (self.X, self.mask))


def _rows_of(X: Any, mask: np.ndarray | None, layout: str) -> CSRRows | DenseRows:
    if layout == "csr":
        return CSRRows(X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data, X.shape[1])
    return DenseRows(X, mask)


def block_rows(X: Any, mask: np.ndarray | None, layout: str) -> CSRRows | DenseRows:
    """One computed block of a dask array as the kernels take it, its values checked (``checked_values``)."""
    return _rows_of(*checked_values(X, mask, layout), layout)


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
    """Where a fit's rows are: ``url`` of a dataset store, or ``rows`` given as an array (exactly one)."""

    url: str | None = None
    rows: ArrayRows | None = None
    storage_options: str = "{}"  # JSON, so that a Source is hashable and cheap to send
    offset: int = 0  # array rows: the row of the whole matrix that ``rows`` starts at

    def open(self) -> Dataset | ArrayRows:
        """The dataset (opened once per process) or the array rows."""
        return self.rows if self.url is None else _open(self.url, self.storage_options)

    @property
    def lazy(self) -> bool:
        """Whether the rows are a dask array (read by the cluster from its own graph, ``Engine.source_chunks``)."""
        return self.rows is not None and self.rows.lazy

    def read_rows(self, r0: int, r1: int) -> CSRRows | DenseRows:
        """Rows [r0, r1) of the whole matrix."""
        return self.open().read_rows(r0 - self.offset, r1 - self.offset)

    def part(self, r0: int, r1: int) -> "Source":
        """What a task reading rows [r0, r1) is given: the store's Source, or for in-memory rows only those
        rows (so no task carries the whole matrix to a worker)."""
        if self.url is not None:
            return self
        return part_of(self.rows.read_rows(r0 - self.offset, r1 - self.offset), r0)

    def __str__(self) -> str:
        return self.url or str(self.rows)


def part_of(rows: CSRRows | DenseRows, offset: int) -> Source:
    """A Source holding only ``rows``, the rows of the whole matrix from ``offset`` on."""
    if isinstance(rows, CSRRows):
        return Source(rows=ArrayRows(rows.to_scipy()), offset=offset)
    return Source(rows=ArrayRows(rows.X, rows.mask), offset=offset)


_OPEN: dict[tuple[str, str], Dataset] = {}


def _open(url: str, storage_options: str) -> Dataset:
    """The dataset at ``url``, opened once per process (the ``OPENED_STORES`` last used are kept)."""
    key = (url, storage_options)
    if key not in _OPEN:
        options = json.loads(storage_options)
        _keep_open(key, Dataset(url, storage_options=options) if options else Dataset(url))
    return _OPEN[key]


def _keep_open(key: tuple[str, str], dataset: Dataset) -> None:
    _OPEN.pop(key, None)
    _OPEN[key] = dataset
    while len(_OPEN) > OPENED_STORES:
        _OPEN.pop(next(iter(_OPEN)))


def source_of(data: str | Dataset | ArrayRows | Source, storage_options: dict | None = None) -> Source:
    """A Source for a store path or URL, an opened dataset (kept open for the Source, not opened again),
    array rows, or a Source."""
    if isinstance(data, Source):
        return data
    if isinstance(data, ArrayRows):
        return Source(rows=data)
    if isinstance(data, Dataset):
        options = json.dumps(data.storage_options or {}, sort_keys=True)
        _keep_open((data.path, options), data)
        return Source(url=data.path, storage_options=options)
    # made absolute here, never on a worker (``data.urls.normalise``)
    return Source(url=normalise(data), storage_options=json.dumps(storage_options or {}, sort_keys=True))


def chunk_of_array(index: np.ndarray, X: Any, mask: np.ndarray | None = None) -> Any:
    """A task reading one chunk of a user's dask array (``Engine.source_chunks``): ``fn`` on the Source of
    the computed chunk. ``index`` holds (fn, layout, r0, r1, *extra)."""
    fn, layout, r0, r1, *extra = index[0]
    return fn(part_of(block_rows(X, mask, layout), r0), r0, r1, *extra)


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
    a ``dask.array`` of CSR chunks over the data (module docstring)."""
    n_cols = source.open().n_cols
    sizes = [len(kept_rows(r0, r1, held)) for r0, r1 in ranges]
    bounds = np.searchsorted(held, np.asarray(ranges, dtype=np.int64).reshape(-1, 2))
    extra = [(held[lo:hi],) for lo, hi in bounds]
    array = engine.source_chunks(read_count_chunk, source, ranges, extra, sizes, n_cols, _sparse_meta())
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
    ``dask.array``s over the data (module docstring)."""
    n_cols = source.open().n_cols
    sizes = [r1 - r0 for r0, r1 in ranges]
    x = engine.source_chunks(read_dense_chunk, source, ranges, [()] * len(ranges), sizes, n_cols, np.empty((0, 0)))
    seen = engine.source_chunks(read_seen_chunk, source, ranges, [(split, exclude)] * len(ranges), sizes, n_cols,
                          np.empty((0, 0), dtype=bool))
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


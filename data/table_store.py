"""Writing a named real table (rows of numbers, NaN where a cell is missing) into a masked dense store:
the part every table format shares (CSV/TSV, Parquet, h5ad).

A table is read in batches of rows, possibly more than once (column statistics of the preprocessing
need a first pass, ``data.table_prep``); each batch is preprocessed and written as it comes, so memory
holds one batch and the row names. ``--transpose`` spills the table once to a scratch file on disk beside
the store being written, after the preprocessing, and reads it back a slab of columns at a time; so the
preprocessing acts on the rows and columns of the file.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np

from buffet.data.errors import InputError
from buffet.data.store import DenseWriter, StoreWriter, write_strings
from buffet.data.table_prep import Plan, Preprocessing

SLAB_BYTES = 1 << 26  # bytes of a slab of columns read back from a transposed table's scratch file


@dataclass(frozen=True)
class RowBatch:
    """Consecutive rows of a table: ``values`` (rows x columns, float64, NaN = missing) and their names."""

    values: np.ndarray
    names: list[str] | None


class Table(Protocol):
    """A table that can be read in row batches, from the start, as often as needed."""

    path: str
    columns: list[str] | None  # names of the value columns (None: the table has none)

    def batches(self) -> Iterator[RowBatch]:
        """The rows in file order."""


@dataclass(frozen=True)
class WrittenTable:
    """What ``write_table`` stored: the shape and the names of the rows and columns kept."""

    shape: tuple[int, int]
    row_names: list[str] | None
    col_names: list[str] | None
    plan: Plan


class ScratchTable:
    """The transpose of a table spilled to a scratch file: its rows are the table's columns."""

    def __init__(self, path: str, values: np.ndarray, row_names: list[str] | None, col_names: list[str] | None):
        """``values`` is the original table (rows x columns, a memory map); rows of this table are its columns."""
        self.path, self.values, self.names, self.columns = path, values, row_names, col_names

    def batches(self) -> Iterator[RowBatch]:
        """Slabs of the original columns, each read back whole and transposed."""
        n_rows, n_cols = self.values.shape
        step = max(1, SLAB_BYTES // (8 * max(1, n_rows)))
        for c0 in range(0, n_cols, step):
            names = self.names[c0:c0 + step] if self.names is not None else None
            yield RowBatch(np.array(self.values[:, c0:c0 + step].T), names)


@contextlib.contextmanager
def transposed(table: Table, scratch_dir: str | None) -> Iterator[ScratchTable]:
    """The transpose of ``table``, through a scratch file in ``scratch_dir`` removed on leaving."""
    width = len(table.columns) if table.columns is not None else None
    with tempfile.TemporaryFile(dir=scratch_dir) as fh:
        names: list[str] | None = []
        n_rows = 0
        for batch in table.batches():
            width = batch.values.shape[1]
            fh.write(np.ascontiguousarray(batch.values, dtype=np.float64).tobytes())
            n_rows += len(batch.values)
            if batch.names is None:
                names = None
            elif names is not None:
                names.extend(batch.names)
        fh.flush()
        values = np.memmap(fh, dtype=np.float64, mode="r", shape=(n_rows, width or 0))
        try:
            yield ScratchTable(table.path, values, table.columns, names or None)
        finally:
            del values


class PreparedTable:
    """A table with the preprocessing applied batch by batch (rows the filters drop are left out)."""

    def __init__(self, table: Table, prep: Preprocessing):
        """Plan the preprocessing of ``table`` (a first pass when it needs column statistics)."""
        self.table, self.prep = table, prep
        self.path, self.columns = table.path, table.columns
        self.plan = prep.plan(table.batches, table.path)

    def batches(self) -> Iterator[RowBatch]:
        """The kept rows, preprocessed; none kept at all is an error naming the filters."""
        self.plan.rows_in = self.plan.rows_kept = 0
        for batch in self.table.batches():
            values, keep = self.prep.apply(batch.values, self.plan)
            yield RowBatch(values, None if batch.names is None else [n for n, k in zip(batch.names, keep) if k])
        if self.plan.rows_kept == 0:
            raise InputError(f"{self.path}: no row passes {self.prep.filter_options()}; lower the threshold")


def write_table(w: StoreWriter, table: Table, rows_per_chunk: int, transpose: bool = False,
                prep: Preprocessing | None = None) -> WrittenTable:
    """Write ``table``, preprocessed by ``prep`` (on the rows and columns of the file) and then transposed if
    asked, as ``X`` and ``mask`` (False where a cell is missing, stored as 0), and its row and column names
    as ``row_labels`` and ``col_labels``."""
    assert w.group is not None
    prepared = PreparedTable(table, prep or Preprocessing())
    with contextlib.ExitStack() as stack:
        source: Table = stack.enter_context(transposed(prepared, w.scratch_dir)) if transpose else prepared
        writer: DenseWriter | None = None
        names: list[str] | None = []
        for batch in source.batches():
            writer = writer or DenseWriter(w.group, batch.values.shape[1], rows_per_chunk, with_mask=True)
            observed = ~np.isnan(batch.values)
            writer.add_rows(np.where(observed, batch.values, 0.0), observed)
            if batch.names is None:
                names = None
            elif names is not None:
                names.extend(batch.names)
        assert writer is not None  # every table format refuses a table without rows
        shape = writer.finish()
        if names is not None:
            write_strings(w.group, "row_labels", names)
        if source.columns is not None:
            write_strings(w.group, "col_labels", source.columns)
        return WrittenTable(shape, names, source.columns, prepared.plan)

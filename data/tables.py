"""Ingest of named real tables: CSV/TSV (plain or gzip) and Parquet files with a header row of column
names, row names in a column, and numbers in the other cells (an expression matrix, most tabular data).

The table is stored as ``real`` data in the ``dense`` layout with a mask (False where a cell is missing:
empty, ``NA``, ``NaN`` or a value named by ``missing``), its row and column names as ``row_labels`` and
``col_labels``. Files are read in batches of rows and written as they come (``data.table_store``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import Dataset, StoreWriter
from buffet.data.table_columns import ChosenColumns, ColumnChoice, UniqueNames, choose_columns
from buffet.data.table_prep import Preprocessing
from buffet.data.table_store import RowBatch, write_table
from buffet.data.textblocks import PathLike, at, open_bytes, show

MISSING = ("", "NA", "NaN", "nan")  # cells that are missing values in every table
DELIMITERS = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".txt": "\t"}
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "space": " "}
BATCH_CELLS = 1 << 20  # cells parsed per batch of rows
PICK = "pick the value columns with --columns or --drop-columns"


def table_delimiter(path: PathLike, delimiter: str | None) -> str:
    """The delimiter given (a character, or tab/comma/semicolon/space), else the one the file's extension
    names (``.csv``; ``.tsv``, ``.tab``, ``.txt`` for tabs; a ``.gz`` after it is ignored)."""
    if delimiter is not None:
        delimiter = DELIMITER_NAMES.get(delimiter, delimiter)
        if len(delimiter) != 1:
            raise InputError(f"--delimiter must be one character (or tab, comma, semicolon, space), got {delimiter!r}")
        return delimiter
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    if suffixes and suffixes[-1] in DELIMITERS:
        return DELIMITERS[suffixes[-1]]
    raise InputError(f"{path}: cannot tell the delimiter from the file name (.csv, .tsv, .txt, .gz after them); "
                     "give it with --delimiter")


def _is_number(cell: str, missing: Sequence[str]) -> bool:
    """Whether a cell reads as a number or a missing value."""
    if cell.strip() in missing:
        return True
    try:
        float(cell)
    except ValueError:
        return False
    return True


class CsvTable:
    """A delimited text table, read from the start on every call of ``batches``."""

    def __init__(self, path: PathLike, delimiter: str, choice: ColumnChoice, missing: Sequence[str]):
        """Read the header and the first row to choose the columns."""
        self.path, self.delimiter, self.missing = str(path), delimiter, tuple(missing)
        with self._rows() as rows:
            first = next(rows, None)
            if first is None:
                raise InputError(at(path, None, "the table is empty (no header row of column names)"))
            self.header = first[1]
            row = next(rows, None)
        if row is None:
            raise InputError(at(path, None, "the table has a header but no rows"))
        if len(row[1]) == len(self.header) + 1:  # R's write.table: the row names' column has no header
            self.header = ["", *self.header]
        self.chosen: ChosenColumns = choose_columns(self.header, choice, not _is_number(row[1][0], self.missing),
                                                    path)
        self.columns = [self.header[i] for i in self.chosen.values]

    @property
    def row_names_column(self) -> str | None:
        """The name of the column holding the row names, if any."""
        return None if self.chosen.names is None else self.header[self.chosen.names]

    def _rows(self) -> "_CsvRows":
        """(line number, fields) of every non-blank line, header included."""
        return _CsvRows(self.path, self.delimiter)

    def batches(self) -> Iterator[RowBatch]:
        """The rows after the header, ``BATCH_CELLS`` cells at a time, checked and parsed."""
        batch_rows = max(1, BATCH_CELLS // len(self.header))
        seen = UniqueNames(self.path) if self.chosen.names is not None else None
        with self._rows() as rows:
            next(rows)
            batch: list[list[str]] = []
            lines: list[int] = []
            for line, fields in rows:
                if len(fields) != len(self.header):
                    raise InputError(at(self.path, line, f"{len(fields)} fields, but the header has "
                                                         f"{len(self.header)}; every row needs one cell per column"))
                batch.append(fields)
                lines.append(line)
                if len(batch) == batch_rows:
                    yield self._parse(batch, lines, seen)
                    batch, lines = [], []
            if batch:
                yield self._parse(batch, lines, seen)

    def _parse(self, rows: list[list[str]], lines: list[int], seen: UniqueNames | None) -> RowBatch:
        """One batch: the value cells as numbers (NaN where missing) and the row names."""
        pick = self.chosen.values  # before making the array: its width is that of the longest cell it holds
        cells = np.array([[row[i] for i in pick] for row in rows], dtype=np.str_).reshape(len(rows), len(pick))
        values = parse_cells(cells, self.missing, lambda r, c: at(self.path, lines[r],
                                                                    f"column {self.chosen.values[c] + 1} "
                                                                    f"({self.columns[c]!r})"))
        if seen is None:
            return RowBatch(values, None)
        names = [row[self.chosen.names].strip() for row in rows]
        seen.add(names, lines)
        return RowBatch(values, names)


class _CsvRows:
    """The non-blank lines of a delimited text file as fields, with their line numbers (a context manager)."""

    def __init__(self, path: str, delimiter: str):
        self.path, self.delimiter = path, delimiter

    def __enter__(self) -> Iterator[tuple[int, list[str]]]:
        self.text = io.TextIOWrapper(open_bytes(self.path), encoding="utf-8", newline="")
        return self._lines()

    def __exit__(self, *exc: object) -> None:
        self.text.close()

    def _lines(self) -> Iterator[tuple[int, list[str]]]:
        reader = csv.reader(self.text, delimiter=self.delimiter, skipinitialspace=self.delimiter != " ")
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError:
                raise InputError(at(self.path, reader.line_num + 1, "not valid UTF-8 text")) from None
            except csv.Error as exc:
                raise InputError(at(self.path, reader.line_num, f"cannot read the line ({exc})")) from None
            except (OSError, EOFError) as exc:
                raise InputError(at(self.path, reader.line_num + 1, f"cannot read the file ({exc})")) from None
            if any(f.strip() for f in fields):
                yield reader.line_num, fields


def parse_cells(cells: np.ndarray, missing: Sequence[str], where) -> np.ndarray:
    """Text cells (rows x columns) as float64, NaN where a cell is missing (one of ``missing``, or a number
    equal to a numeric one of them); ``where(row, column)`` names a cell in an error: a cell that is not a
    number, or infinite."""
    stripped = np.char.strip(cells)
    absent = np.isin(stripped, list(missing))
    text = np.where(absent, "nan", stripped)
    try:
        values = text.astype(np.float64)
    except ValueError:
        r, c = next((r, c) for r, c in np.ndindex(text.shape) if not _is_number(text[r, c], ()))
        raise InputError(f"{where(r, c)}: {show(str(cells[r, c]))} is not a number; {PICK}, or name a missing-value "
                         "marker with --missing") from None
    for marker in missing:
        if _is_number(marker, ()) and marker.strip():
            absent |= values == float(marker)
    values[absent] = np.nan
    infinite = np.isinf(values)
    if infinite.any():
        r, c = np.argwhere(infinite)[0]
        raise InputError(f"{where(r, c)}: {show(str(cells[r, c]))} is not a finite number")
    return values


class ParquetTable:
    """A Parquet file: a column of row names (text) and numeric value columns, read by row groups."""

    def __init__(self, path: PathLike, choice: ColumnChoice, missing: Sequence[str]):
        """Read the schema to choose the columns; a value column that is not numeric is an error."""
        pa, pq = _pyarrow()
        self.path = str(path)
        try:
            self.file = pq.ParquetFile(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(at(path, None, f"cannot read as Parquet ({exc})")) from None
        schema = self.file.schema_arrow
        self.header = list(schema.names)
        if not self.header:
            raise InputError(at(path, None, "the table is empty (no columns)"))
        if self.file.metadata.num_rows == 0:
            raise InputError(at(path, None, "the table has columns but no rows"))
        numeric = [_numeric_type(pa, schema.field(i).type) for i in range(len(self.header))]
        self.chosen = choose_columns(self.header, choice, not numeric[0], path)
        for i in self.chosen.values:
            if not numeric[i]:
                raise InputError(f"{path}: column {i + 1} ({self.header[i]!r}) holds {schema.field(i).type} "
                                 f"values, not numbers; {PICK}")
        self.columns = [self.header[i] for i in self.chosen.values]
        self.sentinels = [float(m) for m in missing if m.strip() and _is_number(m, ())]

    @property
    def row_names_column(self) -> str | None:
        """The name of the column holding the row names, if any."""
        return None if self.chosen.names is None else self.header[self.chosen.names]

    def batches(self) -> Iterator[RowBatch]:
        """The rows, ``BATCH_CELLS`` cells at a time."""
        pa, _ = _pyarrow()
        names_at = self.chosen.names
        wanted = ([] if names_at is None else [self.header[names_at]]) + self.columns
        seen = UniqueNames(self.path, "row") if names_at is not None else None
        first = 1
        for batch in self.file.iter_batches(batch_size=max(1, BATCH_CELLS // len(wanted)), columns=wanted):
            values = np.column_stack([batch.column(i).cast(pa.float64()).to_numpy(zero_copy_only=False)
                                      for i in range(names_at is not None, len(wanted))]).astype(np.float64)
            for sentinel in self.sentinels:
                values[values == sentinel] = np.nan
            rows = range(first, first + batch.num_rows)
            infinite = np.isinf(values)
            if infinite.any():
                r, c = np.argwhere(infinite)[0]
                raise InputError(f"{self.path}, row {rows[r]}, column {self.chosen.values[c] + 1} "
                                 f"({self.columns[c]!r}): {values[r, c]} is not a finite number")
            names = None
            if seen is not None:
                names = [str(n).strip() if n is not None else "" for n in batch.column(0).to_pylist()]
                seen.add(names, rows)
            first += batch.num_rows
            yield RowBatch(values, names)


def _pyarrow():
    """pyarrow and its Parquet module, or an error saying how to install them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet needs the package pyarrow: pip install 'buffet[tables]'") from None
    return pa, pq


def _numeric_type(pa, kind) -> bool:
    """Whether a Parquet column's type holds numbers."""
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind) \
        or pa.types.is_boolean(kind)


def is_parquet(path: PathLike) -> bool:
    """Whether a file is Parquet (it starts with the magic bytes ``PAR1``)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError as exc:
        raise InputError(at(path, None, f"cannot open ({exc.strerror or exc})")) from exc


def ingest_table(path: PathLike, out: PathLike, row_names: str | None = None, columns: Sequence[str] | None = None,
                 drop_columns: Sequence[str] | None = None, missing: Sequence[str] | None = None,
                 delimiter: str | None = None, transpose: bool = False, floor: float | None = None,
                 ceiling: float | None = None, min_fold: float | None = None, min_range: float | None = None,
                 log: str | None = None, center: str | None = None, scale: str | None = None,
                 rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
                 holdout: float | None = None, seed: int = 0, storage_options: dict | None = None) -> Dataset:
    """Ingest a table with a header row of column names (CSV/TSV, plain or gzip, or Parquet, told apart by
    its content) into a masked dense ``real`` dataset at ``out``.

    Row names come from the first column when its cells are not numbers, or from the column ``row_names``
    (``none``: no row names); the other columns, narrowed by ``columns`` and ``drop_columns`` (names or glob
    patterns), hold the values. ``missing`` adds missing-value markers to empty, ``NA`` and ``NaN`` cells.
    The preprocessing options (``data.table_prep``) are applied to the file's rows and columns in the order
    floor, ceiling, min_fold, min_range, log, center, scale and recorded in the provenance; ``transpose``
    then stores the file's columns as rows. Errors name the file, line and column: a cell that is not a number, a ragged row, a repeated
    row or column name, an empty table. ``holdout`` stores a ``heldout`` split of observed entries.
    """
    check_options(rows_per_chunk, holdout)
    prep = Preprocessing.from_options(floor=floor, ceiling=ceiling, min_fold=min_fold, min_range=min_range,
                                      log=log, center=center, scale=scale)
    choice = ColumnChoice(row_names, columns, drop_columns)
    markers = MISSING + tuple(missing or ())
    if is_parquet(path):
        table: CsvTable | ParquetTable = ParquetTable(path, choice, markers)
        facts = {"file_format": "parquet"}
    else:
        sep = table_delimiter(path, delimiter)
        table = CsvTable(path, sep, choice, markers)
        facts = {"file_format": "text", "delimiter": sep}
    with StoreWriter(out, overwrite, storage_options) as w:
        written = write_table(w, table, rows_per_chunk, transpose, prep)
        prov = provenance("table", [path], **facts, row_names=table.row_names_column,
                          value_columns=len(table.columns), missing=list(missing or ()), transposed=transpose,
                          preprocessing=prep.record(written.plan))
        finish_store(w, "dense", "real", written.shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)

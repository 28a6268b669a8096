"""Checks on parsed entries and their assembly into matrices (ingest).

Entries are parallel arrays (row, column, value) with the input line of each, so every check
can name the line at fault: ids out of range, values a data kind cannot take, duplicates,
and header counts that disagree with the file.
"""

from __future__ import annotations

from typing import IO, Callable, Iterator

import numpy as np

from buffet.data.errors import InputError
from buffet.data.store import CSRWriter, first_invalid
from buffet.data.textblocks import PathLike, at

MAX_INDEX = (1 << 31) - 1  # stored column indices are int32
Describe = Callable[[int, int], str]  # (row, column), 0-based -> words naming the entry


def check_dimension(value: int, name: str, path: PathLike, line: int) -> None:
    """A matrix dimension from a header must be at least 1 and fit the stored indices."""
    if not 1 <= value <= MAX_INDEX:
        raise InputError(at(path, line, f"{name} = {value}; it must be between 1 and {MAX_INDEX}"))


def check_range(ids: np.ndarray, lo: int, hi: int, lines: np.ndarray, path: PathLike, name: str,
                context: str = "") -> None:
    """Every id must lie in ``lo..hi``; otherwise an error naming the first line at fault."""
    if ids.size == 0 or (lo <= ids.min() and ids.max() <= hi):
        return
    k = int(np.argmax((ids < lo) | (ids > hi)))
    raise InputError(at(path, int(lines[k]), f"{name} {int(ids[k])} is out of range {lo}..{hi}{context}"))


def check_kind_values(kind: str, values: np.ndarray, lines: np.ndarray, path: PathLike,
                      observed: np.ndarray | None = None) -> None:
    """Values (one row per line) must suit ``kind``; entries not ``observed`` are ignored."""
    if len(lines) == 0:
        return
    values = values.reshape(len(lines), -1)
    found = first_invalid(kind, values if observed is None else np.where(observed, values, 0.0))
    if found is not None:
        k, reason = found
        line, column = divmod(k, values.shape[1])
        where = f"column {column + 1}: " if values.shape[1] > 1 else ""
        raise InputError(at(path, int(lines[line]), where + reason))


def check_unique_cells(rows: np.ndarray, cols: np.ndarray, n_cols: int, lines: np.ndarray,
                       path: PathLike, describe: Describe) -> np.ndarray:
    """The stable order sorting entries by (row, column); a repeated cell is an error naming
    the line where it repeats and the line where it first appeared."""
    keys = rows.astype(np.int64) * max(1, n_cols) + cols
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    dup = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if dup.size:
        i = dup[np.argmin(lines[order[dup + 1]])]
        later, first = order[i + 1], order[i]
        raise InputError(at(path, int(lines[later]), f"duplicate {describe(int(rows[later]), int(cols[later]))} "
                                                     f"(already on line {int(lines[first])})"))
    return order


def dense_from_cells(shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray, values: np.ndarray,
                     lines: np.ndarray, path: PathLike, describe: Describe) -> np.ndarray:
    """A dense matrix holding the given cells (zero elsewhere); duplicates are errors."""
    check_unique_cells(rows, cols, shape[1], lines, path, describe)
    X = np.zeros(shape, dtype=np.float64)
    X[rows, cols] = values
    return X


class EntryCount:
    """Checks that a file holds exactly the number of entries its header announced."""

    def __init__(self, expected: int, path: PathLike, header_line: int, name: str):
        """``expected`` entries, announced as ``name`` on ``header_line`` of ``path``."""
        self.expected, self.path, self.header_line, self.name = expected, path, header_line, name
        self.seen = 0

    def add(self, lines: np.ndarray) -> None:
        """Count the entries on ``lines``; one past the announced number is an error naming its line."""
        if self.seen + len(lines) > self.expected:
            extra = int(lines[self.expected - self.seen])
            raise InputError(at(self.path, extra, f"more entries than the {self.name} = {self.expected} "
                                                  f"announced on line {self.header_line}"))
        self.seen += len(lines)

    def finish(self, last_line: int) -> None:
        """At the end of the file: fewer entries than announced is an error."""
        if self.seen < self.expected:
            raise InputError(at(self.path, None, f"the file ends (line {last_line}) after {self.seen} entries, "
                                                 f"but line {self.header_line} announced {self.name} = "
                                                 f"{self.expected}"))


class CSRRowStream:
    """Feeds entries whose rows never decrease (the caller checks) into a ``CSRWriter`` as
    complete rows. The last row seen is held back until a later row, or ``finish``, shows it
    is complete, so a row may span any number of input blocks."""

    def __init__(self, writer: CSRWriter, path: PathLike, describe: Describe):
        """Rows go to ``writer``; ``describe`` names an entry in messages about duplicates."""
        self.writer, self.path, self.describe = writer, path, describe
        empty = np.zeros(0, dtype=np.int64)
        self.held = (empty, empty, np.zeros(0, dtype=np.float64), empty)
        self.next_row = 0

    def add(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray, lines: np.ndarray) -> None:
        """Entries (0-based rows and columns) in row order, with their line numbers."""
        if rows.size == 0:
            return
        block = (rows, cols, values, lines)
        last = int(rows[-1])
        if self.held[0].size and int(self.held[0][0]) == last:  # the held row goes on to the end of the block
            self.held = tuple(np.concatenate((h, a)) for h, a in zip(self.held, block))
            return
        if self.held[0].size:  # the held row, with its entries at the start of the block, is complete
            joined = int(np.searchsorted(rows, self.held[0][0], side="right"))
            self._write([np.concatenate((h, a[:joined])) for h, a in zip(self.held, block)], int(self.held[0][0]) + 1)
            block = tuple(a[joined:] for a in block)
        cut = int(np.searchsorted(block[0], last))  # the block's last row is held back: the next may go on with it
        self._write([a[:cut] for a in block], last)
        self.held = tuple(a[cut:] for a in block)

    def finish(self, n_rows: int) -> tuple[int, int]:
        """Write the held row and empty rows up to ``n_rows``; return the matrix shape."""
        self._write(list(self.held), n_rows)
        return self.writer.finish()

    def _write(self, parts: list[np.ndarray], end_row: int) -> None:
        """Write rows ``next_row .. end_row - 1`` (rows without entries are empty)."""
        rows, cols, values, lines = parts
        if end_row <= self.next_row:
            return
        if rows.size and not _strictly_increasing(rows, cols):
            n_cols = self.writer.n_cols or int(cols.max()) + 1
            order = check_unique_cells(rows, cols, n_cols, lines, self.path, self.describe)
            rows, cols, values = rows[order], cols[order], values[order]
        counts = np.bincount(rows - self.next_row, minlength=end_row - self.next_row)
        where = at(self.path, int(lines[0]) if lines.size else None, f"rows {self.next_row + 1}..{end_row}")
        self.writer.add_rows(counts, cols, values, where)
        self.next_row = end_row


def _strictly_increasing(rows: np.ndarray, cols: np.ndarray) -> bool:
    """True when entries are sorted by row and, within a row, by strictly increasing column."""
    same_row = rows[1:] == rows[:-1]
    return bool(((rows[1:] > rows[:-1]) | (same_row & (cols[1:] > cols[:-1]))).all())


ENTRY = np.dtype([("row", np.int64), ("col", np.int64), ("value", np.float64), ("line", np.int64)])
MAX_BUCKETS = 1024  # row buckets a spill is read back in; bounds the bookkeeping per input block


class RowBuckets:
    """Entries of a file that lists them in any order, assembled one group of rows at a time
    (ingest streams and never holds the whole file).

    Each input block is sorted by row bucket (``bucket_rows`` consecutive rows) and appended to a
    scratch file as one run; ``buckets`` then reads every run's slice of a bucket back, from the
    first bucket to the last. Memory holds one input block or one bucket. Within a bucket the
    entries keep their input order, so checks that name "the first line" still do.
    """

    def __init__(self, scratch: IO[bytes], bucket_rows: int):
        """Runs go to the open binary file ``scratch``; buckets span ``bucket_rows`` rows."""
        self.scratch, self.bucket_rows = scratch, max(1, int(bucket_rows))
        self.runs: list[tuple[int, np.ndarray]] = []  # (byte offset of the run, entries per bucket)
        self.end = 0

    @staticmethod
    def bucket_rows_for(n_rows: int, rows_per_chunk: int) -> int:
        """Rows per bucket: a store's row chunk, or more when that would make over ``MAX_BUCKETS`` buckets."""
        return max(rows_per_chunk, -(-n_rows // MAX_BUCKETS))

    def add(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray, lines: np.ndarray) -> None:
        """Spill one block of entries (0-based rows and columns, with their line numbers)."""
        if rows.size == 0:
            return
        bucket = rows // self.bucket_rows
        order = np.argsort(bucket, kind="stable")
        run = np.empty(rows.size, dtype=ENTRY)
        for name, column in zip(ENTRY.names, (rows, cols, values, lines)):
            run[name] = column[order]
        self.scratch.seek(self.end)
        run.tofile(self.scratch)
        self.runs.append((self.end, np.bincount(bucket)))
        self.end += run.nbytes

    def buckets(self, n_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, entries) of every bucket covering rows 0..n_rows - 1, in row order; the
        entries are an ``ENTRY`` array in input order (empty for a bucket without entries)."""
        starts = [offset + ENTRY.itemsize * (np.cumsum(counts) - counts) for offset, counts in self.runs]
        for b in range(-(-n_rows // self.bucket_rows)):
            parts = []
            for (_, counts), start in zip(self.runs, starts):
                if b < counts.size and counts[b]:
                    self.scratch.seek(int(start[b]))
                    parts.append(np.fromfile(self.scratch, dtype=ENTRY, count=int(counts[b])))
            yield b * self.bucket_rows, np.concatenate(parts) if parts else np.empty(0, dtype=ENTRY)

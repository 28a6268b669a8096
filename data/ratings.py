"""Ratings ingest: long-form ``user,item,rating`` files and dense user x item tables.

Both are stored as ``real`` data in the ``dense`` layout with a mask (True = rated), the
layout the collaborative-filtering protocol (paper 000, Sec. 4.2) holds entries out of.
"""

from __future__ import annotations

import csv
import tempfile
from array import array
from typing import Iterator

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.entries import RowBuckets, check_kind_values, dense_from_cells
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import Dataset, DenseWriter, StoreWriter, write_strings
from buffet.data.textblocks import (DEFAULT_BLOCK_BYTES, Block, PathLike, RecordSpec, TextSource, at,
                                    parse_float, parse_records, split_fields)

DELIMITERS = ("\t", ",", ";")  # tried in this order; otherwise runs of whitespace


def ingest_ratings(path: PathLike, out: PathLike, rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK,
                   overwrite: bool = False, holdout: float | None = None, seed: int = 0,
                   storage_options: dict | None = None) -> Dataset:
    """Ingest long-form ratings ``user,item,rating`` (CSV, TSV, ``;`` or whitespace separated,
    told apart by the first line; an optional header line; extra columns such as a timestamp
    are ignored) into a masked dense ``real`` dataset at ``out``.

    User and item ids are arbitrary strings numbered in order of first appearance and stored
    as ``row_labels`` and ``col_labels``. Errors name file and line: malformed lines, ratings
    that are not finite numbers, a repeated (user, item) pair, an empty file. ``holdout``
    stores a ``heldout`` split of rated entries (``test_mask``). Since a user's ratings may be
    anywhere in the file, they are spilled by user bucket to a scratch file and the matrix is
    written one bucket of users at a time (``entries.RowBuckets``); memory holds the id tables.
    ``out`` may be a URL (``data.urls``); ``storage_options`` go to its filesystem.
    """
    check_options(rows_per_chunk, holdout)
    with StoreWriter(out, overwrite, storage_options) as w, TextSource(path) as src, \
            tempfile.TemporaryFile(dir=w.scratch_dir) as scratch:
        table = _RatingList(path, RowBuckets(scratch, rows_per_chunk))
        rating_rows = _rating_rows(src)
        header = table.add_first(next(rating_rows, None))
        for line, fields in rating_rows:
            table.add(fields, line)
        shape = table.write(DenseWriter(w.group, len(table.items), rows_per_chunk, with_mask=True))
        write_strings(w.group, "row_labels", list(table.users))
        write_strings(w.group, "col_labels", list(table.items))
        prov = provenance("ratings", [path], header=header, ratings=table.count, lines=src.line)
        finish_store(w, "dense", "real", shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)


def _rating_rows(src: TextSource) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank line; the delimiter is chosen from the first."""
    delimiter: str | None = None
    while (raw := src.readline()) is not None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(at(src.path, src.line, "not valid UTF-8 text")) from None
        if not text.strip():
            continue
        if delimiter is None:
            delimiter = next((d for d in DELIMITERS if d in text), " ")
        fields = text.split() if delimiter == " " else next(csv.reader([text], delimiter=delimiter))
        yield src.line, [f.strip() for f in fields]


class _RatingList:
    """Ratings spilled by user bucket (``RowBuckets``), with user and item ids numbered in order of
    appearance; lines are parsed one at a time and spilled in batches of ``BATCH`` ratings."""

    BATCH = 1 << 16

    def __init__(self, path: PathLike, buckets: RowBuckets):
        """An empty list of ratings from ``path``, spilled into ``buckets``."""
        self.path, self.buckets = path, buckets
        self.users: dict[str, int] = {}
        self.items: dict[str, int] = {}
        self.count = 0
        self._batch()

    def _batch(self) -> None:
        """Start an empty batch of parsed ratings."""
        self.rows, self.cols, self.lines, self.values = array("q"), array("q"), array("q"), array("d")

    def add_first(self, first: tuple[int, list[str]] | None) -> list[str] | None:
        """Take the first line: a header (returned) if its rating field is not a number, else a rating."""
        if first is None:
            raise InputError(at(self.path, None, "no ratings (the file is empty)"))
        line, fields = first
        if len(fields) >= 3:
            try:
                float(fields[2])
            except ValueError:
                return fields
        self.add(fields, line)
        return None

    def add(self, fields: list[str], line: int) -> None:
        """Append one rating line; a full batch is checked and spilled."""
        if len(fields) < 3 or not fields[0] or not fields[1]:
            raise InputError(at(self.path, line, f"expected user, item, rating; found {fields!r}"))
        self.values.append(parse_float(fields[2], "rating", self.path, line))
        self.rows.append(self.users.setdefault(fields[0], len(self.users)))
        self.cols.append(self.items.setdefault(fields[1], len(self.items)))
        self.lines.append(line)
        if len(self.lines) >= self.BATCH:
            self._spill()

    def _spill(self) -> None:
        """Check the batch's ratings and move them to the buckets."""
        rows, cols, lines, values = (np.frombuffer(a, dtype=a.typecode)
                                     for a in (self.rows, self.cols, self.lines, self.values))
        check_kind_values("real", values, lines, self.path)
        self.buckets.add(rows, cols, values, lines)
        self.count += len(lines)
        self._batch()

    def write(self, writer: DenseWriter) -> tuple[int, int]:
        """Write the user x item matrix (0 where unrated) and its mask one bucket of users at a time,
        refusing a repeated (user, item) pair; returns the shape."""
        self._spill()
        if not self.count:
            raise InputError(at(self.path, None, "no ratings (the file holds only a header)"))
        users, items = list(self.users), list(self.items)
        for r0, entries in self.buckets.buckets(len(users)):
            shape = (min(r0 + self.buckets.bucket_rows, len(users)) - r0, len(items))
            rows = entries["row"] - r0
            X = dense_from_cells(shape, rows, entries["col"], entries["value"], entries["line"], self.path,
                                 lambda r, c: f"rating for user {users[r + r0]!r} and item {items[c]!r}")
            mask = np.zeros(shape, dtype=bool)
            mask[rows, entries["col"]] = True
            writer.add_rows(X, mask)
        return writer.finish()


def ingest_dense_ratings(path: PathLike, out: PathLike, sentinel: float = 99.0, first_column_count: bool = False,
                         rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
                         holdout: float | None = None, seed: int = 0,
                         block_bytes: int = DEFAULT_BLOCK_BYTES,
                         storage_options: dict | None = None) -> Dataset:
    """Ingest a dense user x item table (the Jester layout: one user per line, numbers separated
    by whitespace or commas) into a masked dense ``real`` dataset at ``out``.

    Entries equal to ``sentinel`` (NaN allowed) are unrated: mask False, stored as 0. With
    ``first_column_count`` the first column is the number of rated items of the row; it is
    checked and dropped. Rows are streamed in blocks. Errors name file and line: rows of
    differing length, non-numbers, NaN/inf that is not the sentinel, a wrong count column, an
    empty file. ``holdout`` stores a ``heldout`` split of rated entries (``test_mask``).
    ``out`` may be a URL (``data.urls``); ``storage_options`` go to its filesystem.
    """
    check_options(rows_per_chunk, holdout, block_bytes)
    with StoreWriter(out, overwrite, storage_options) as w, TextSource(path) as src:
        writer: DenseWriter | None = None
        spec: RecordSpec | None = None
        for block in src.blocks(block_bytes):
            spec = spec or _table_spec(block, first_column_count, path)
            if spec is None:
                continue
            writer = writer or DenseWriter(w.group, spec.width - first_column_count, rows_per_chunk, with_mask=True)
            X, mask = _table_rows(block, spec, sentinel, first_column_count, path)
            writer.add_rows(X, mask)
        if writer is None:
            raise InputError(at(path, None, "no rows (the file is empty)"))
        shape = writer.finish()
        prov = provenance("dense-ratings", [path], sentinel=sentinel, first_column_count=first_column_count,
                          lines=src.line)
        finish_store(w, "dense", "real", shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)


def _table_spec(block: Block, first_column_count: bool, path: PathLike) -> RecordSpec | None:
    """Width and delimiter of the table, from its first non-blank line (None if the block is blank)."""
    text = block.data.lstrip()
    if not text:
        return None
    first = text[:text.find(b"\n")]
    delimiter = b"," if b"," in first else None
    width = len(split_fields(first, delimiter))
    if first_column_count and width < 2:
        line = block.first_line + block.data[:len(block.data) - len(text)].count(b"\n")
        raise InputError(at(path, line, "first_column_count needs a count column and at least one rating column"))
    return RecordSpec((), ("rating",) * width, delimiter)


def _table_rows(block: Block, spec: RecordSpec, sentinel: float, first_column_count: bool,
                path: PathLike) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a block (unrated entries zeroed) and their mask, after checking them."""
    rec = parse_records(block, spec, path)
    table = rec.values[:, 1:] if first_column_count else rec.values
    observed = ~np.isnan(table) if np.isnan(sentinel) else table != sentinel
    if first_column_count:
        wrong = rec.values[:, 0] != observed.sum(axis=1)
        if wrong.any():
            k = int(np.argmax(wrong))
            raise InputError(at(path, int(rec.lines[k]), f"the first column says {rec.values[k, 0]:g} rated items "
                                                         f"but the row has {int(observed[k].sum())} values other "
                                                         f"than the sentinel {sentinel:g}"))
    check_kind_values("real", table, rec.lines, path, observed)
    return np.where(observed, table, 0.0), observed

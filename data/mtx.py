"""Matrix Market ingest: ``.mtx`` files, coordinate and array formats, general symmetry.

Rows are the first index. The field sets the default kind: ``pattern`` -> binary, ``integer``
-> counts, ``real`` -> real. Counts are stored in the ``csr`` layout, other kinds dense (an
unlisted coordinate entry is a zero, as Matrix Market defines it, not a missing value).
The text is parsed and checked block by block; since coordinate files may list entries in any
order, they are spilled by row bucket to a scratch file and assembled one bucket at a time
(``entries.RowBuckets``), so memory never holds the whole file.
"""

from __future__ import annotations

import tempfile

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.entries import (ENTRY, CSRRowStream, EntryCount, RowBuckets, check_dimension, check_kind_values,
                                 check_range, dense_from_cells)
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import CSRWriter, Dataset, DenseWriter, StoreWriter, check_kind
from buffet.data.textblocks import (DEFAULT_BLOCK_BYTES, PathLike, RecordSpec, Records, TextSource, at,
                                    read_int_line, record_blocks, show)

FIELD_KINDS = {"pattern": "binary", "integer": "counts", "real": "real", "double": "real"}
BANNER = "%%matrixmarket matrix FORMAT FIELD general"


def ingest_mtx(path: PathLike, out: PathLike, kind: str | None = None,
               rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
               holdout: float | None = None, seed: int = 0,
               block_bytes: int = DEFAULT_BLOCK_BYTES,
               storage_options: dict | None = None) -> Dataset:
    """Ingest a Matrix Market file into a dataset at ``out``.

    ``kind`` (real, binary, counts) defaults from the field. Errors name file and line: a bad
    banner or size line, entry counts that differ from the size line, indices out of range,
    repeated coordinates, values the kind cannot take (NaN/inf, negative or fractional counts,
    non-0/1 binary values), malformed lines, an empty file. ``holdout`` stores a ``heldout``
    split: whole rows for counts, entries otherwise.
    ``out`` may be a URL (``data.urls``); ``storage_options`` go to its filesystem.
    """
    check_options(rows_per_chunk, holdout, block_bytes)
    with StoreWriter(out, overwrite, storage_options) as w, TextSource(path) as src, \
            tempfile.TemporaryFile(dir=w.scratch_dir) as scratch:
        layout_name, field = _read_banner(src)
        kind = kind or FIELD_KINDS[field]
        check_kind(kind)
        coordinate = layout_name == "coordinate"
        names = ("rows", "columns", "entries") if coordinate else ("rows", "columns")
        size, size_line = read_int_line(src, names, comment=b"%")
        n_rows, n_cols = size[0], size[1]
        check_dimension(n_rows, "rows", path, size_line)
        check_dimension(n_cols, "columns", path, size_line)
        spec = RecordSpec(("row", "column") if coordinate else (), () if field == "pattern" else ("value",))
        count = EntryCount(size[2] if coordinate else n_rows * n_cols, path, size_line,
                           "entries" if coordinate else "rows x columns")
        buckets = RowBuckets(scratch, RowBuckets.bucket_rows_for(n_rows, rows_per_chunk))
        for rec in record_blocks(src, spec, block_bytes):
            first = count.seen
            count.add(rec.lines)
            rows, cols = _positions(rec, coordinate, n_rows, n_cols, size_line, path, first)
            values = rec.values[:, 0] if rec.values.shape[1] else np.ones(len(rec))
            check_kind_values(kind, values, rec.lines, path)
            buckets.add(rows, cols, values, rec.lines)
        count.finish(src.line)
        if kind == "counts":
            shape, layout = _write_csr(w, buckets, n_rows, n_cols, rows_per_chunk, kind, path), "csr"
        else:
            shape, layout = _write_dense(w, buckets, n_rows, n_cols, rows_per_chunk, path), "dense"
        prov = provenance("mtx", [path], mtx_format=layout_name, field=field, lines=src.line)
        finish_store(w, layout, kind, shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)


def _write_csr(w: StoreWriter, buckets: RowBuckets, n_rows: int, n_cols: int, rows_per_chunk: int, kind: str,
               path: PathLike) -> tuple[int, int]:
    """The spilled entries as CSR rows, one row bucket at a time; repeated cells are errors."""
    stream = CSRRowStream(CSRWriter(w.group, n_cols, rows_per_chunk, kind, str(path)), path, _describe)
    for _, entries in buckets.buckets(n_rows):
        entries = entries[np.argsort(entries["row"], kind="stable")]
        stream.add(*(entries[name] for name in ENTRY.names))
    return stream.finish(n_rows)


def _write_dense(w: StoreWriter, buckets: RowBuckets, n_rows: int, n_cols: int, rows_per_chunk: int,
                 path: PathLike) -> tuple[int, int]:
    """The spilled entries as dense row blocks (zero where no entry is listed); repeated cells are errors."""
    writer = DenseWriter(w.group, n_cols, rows_per_chunk, with_mask=False)
    for r0, entries in buckets.buckets(n_rows):
        r1 = min(r0 + buckets.bucket_rows, n_rows)
        writer.add_rows(dense_from_cells((r1 - r0, n_cols), entries["row"] - r0, entries["col"], entries["value"],
                                         entries["line"], path, lambda r, c: _describe(r + r0, c)), None)
    return writer.finish()


def _read_banner(src: TextSource) -> tuple[str, str]:
    """The format (coordinate, array) and field of the ``%%MatrixMarket`` first line."""
    line = src.readline()
    if line is None:
        raise InputError(at(src.path, None, f"the file is empty (expected a first line '{BANNER}')"))
    words = line.decode("utf-8", errors="replace").lower().split()
    if len(words) != 5 or words[0] != "%%matrixmarket" or words[1] != "matrix":
        raise InputError(at(src.path, 1, f"not a Matrix Market banner: {show(line)} (expected '{BANNER}')"))
    layout_name, field, symmetry = words[2:]
    if layout_name not in ("coordinate", "array"):
        raise InputError(at(src.path, 1, f"unknown format {layout_name!r}; expected coordinate or array"))
    if field not in FIELD_KINDS:
        raise InputError(at(src.path, 1, f"field {field!r} is not supported; expected integer, real or pattern"))
    if symmetry != "general":
        raise InputError(at(src.path, 1, f"symmetry {symmetry!r} is not supported; only general matrices "
                                         "(every entry listed) are"))
    if field == "pattern" and layout_name == "array":
        raise InputError(at(src.path, 1, "the array format cannot have the pattern field"))
    return layout_name, field


def _describe(row: int, col: int) -> str:
    """An entry named by its 1-based coordinates, as the file gives them."""
    return f"entry ({row + 1}, {col + 1})"


def _positions(rec: Records, coordinate: bool, n_rows: int, n_cols: int, size_line: int,
               path: PathLike, first: int) -> tuple[np.ndarray, np.ndarray]:
    """0-based (row, column) of every entry: given (1-based) for coordinate files, column-major
    order for array files, whose records are entries ``first``, ``first + 1``, ... of the file."""
    if not coordinate:
        k = first + np.arange(len(rec), dtype=np.int64)
        return k % max(1, n_rows), k // max(1, n_rows)
    context = f" (line {size_line} gives the size {n_rows} x {n_cols})"
    check_range(rec.ids[:, 0], 1, n_rows, rec.lines, path, "row index", context)
    check_range(rec.ids[:, 1], 1, n_cols, rec.lines, path, "column index", context)
    return rec.ids[:, 0] - 1, rec.ids[:, 1] - 1

"""Role-mining pair ingest: ``user permission`` per line, 1-based, whitespace
separated (the HP Labs files that ship in ``data/datasets/rolemining/``, ``bundled.rolemining_path``).

Stored as a dense ``binary`` matrix without a mask: every listed pair is a 1, every other
pair a 0. The matrix is users x permissions, or permissions x users with ``transpose`` (the
orientation of paper 000, Sec. 4.3); its size is the largest id in each column. Pairs are
parsed block by block and assembled one row bucket at a time (``entries.RowBuckets``).
"""

from __future__ import annotations

import tempfile

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.entries import MAX_INDEX, RowBuckets, check_range, dense_from_cells
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import Dataset, DenseWriter, StoreWriter
from buffet.data.textblocks import DEFAULT_BLOCK_BYTES, PathLike, RecordSpec, TextSource, at, record_blocks

PAIR_RECORD = RecordSpec(("user", "permission"), ())


def ingest_pairs(path: PathLike, out: PathLike, transpose: bool = False,
                 rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
                 holdout: float | None = None, seed: int = 0,
                 block_bytes: int = DEFAULT_BLOCK_BYTES,
                 storage_options: dict | None = None) -> Dataset:
    """Ingest a user-permission pair file into a dense ``binary`` dataset at ``out``.

    Errors name file and line: malformed lines, ids below 1, a repeated pair, an empty file.
    ``holdout`` stores a ``heldout`` split of entries (``test_mask``, a fraction of all entries,
    ones and zeros alike, as in the role-mining protocol of paper 000, Sec. 4.3).
    ``out`` may be a URL (``data.urls``); ``storage_options`` go to its filesystem.
    """
    check_options(rows_per_chunk, holdout, block_bytes)
    row_axis = 1 if transpose else 0
    with StoreWriter(out, overwrite, storage_options) as w, TextSource(path) as src, \
            tempfile.TemporaryFile(dir=w.scratch_dir) as scratch:
        buckets = RowBuckets(scratch, rows_per_chunk)
        shape, pairs = np.zeros(2, dtype=np.int64), 0
        for rec in record_blocks(src, PAIR_RECORD, block_bytes):
            for k, name in enumerate(PAIR_RECORD.id_names):
                check_range(rec.ids[:, k], 1, MAX_INDEX, rec.lines, path, f"{name} id", " (ids are 1-based)")
            ids = rec.ids[:, [row_axis, 1 - row_axis]] - 1
            if len(rec):
                shape = np.maximum(shape, ids.max(axis=0) + 1)
            buckets.add(ids[:, 0], ids[:, 1], np.ones(len(rec)), rec.lines)
            pairs += len(rec)
        if pairs == 0:
            raise InputError(at(path, None, "no user permission pairs (the file is empty)"))
        writer = DenseWriter(w.group, int(shape[1]), rows_per_chunk, with_mask=False)
        for r0, entries in buckets.buckets(int(shape[0])):
            r1 = min(r0 + buckets.bucket_rows, int(shape[0]))
            writer.add_rows(dense_from_cells((r1 - r0, int(shape[1])), entries["row"] - r0, entries["col"],
                                             entries["value"], entries["line"], path,
                                             lambda r, c: _describe(r + r0, c, transpose)), None)
        prov = provenance("pairs", [path], pairs=pairs, lines=src.line,
                          orientation="permissions x users" if transpose else "users x permissions")
        finish_store(w, "dense", "binary", writer.finish(), rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)


def _describe(row: int, col: int, transpose: bool) -> str:
    """A pair named by its 1-based ids, as the file gives them, from its 0-based (row, column)."""
    user, permission = (col, row) if transpose else (row, col)
    return f"pair (user {user + 1}, permission {permission + 1})"

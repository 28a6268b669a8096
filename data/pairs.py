"""Role-mining pair ingest (SPEC 1, SPEC 4): ``user permission`` per line, 1-based, whitespace
separated (the HP Labs files in ``datasets/rolemining/``).

Stored as a dense ``binary`` matrix without a mask: every listed pair is a 1, every other
pair a 0. The matrix is users x permissions, or permissions x users with ``transpose`` (the
orientation of paper 000, section 4.3); its size is the largest id in each column.
"""

from __future__ import annotations

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.entries import MAX_INDEX, check_range, dense_from_cells
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import Dataset, StoreWriter, write_dense
from buffet.data.textblocks import (DEFAULT_BLOCK_BYTES, PathLike, RecordSpec, TextSource, at, concat_records,
                                    parse_records)

PAIR_RECORD = RecordSpec(("user", "permission"), ())


def ingest_pairs(path: PathLike, out: PathLike, transpose: bool = False,
                 rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
                 holdout: float | None = None, seed: int = 0,
                 block_bytes: int = DEFAULT_BLOCK_BYTES) -> Dataset:
    """Ingest a user-permission pair file into a dense ``binary`` dataset at ``out`` (SPEC 1).

    Errors name file and line: malformed lines, ids below 1, a repeated pair, an empty file.
    ``holdout`` stores a ``heldout`` split of entries (``test_mask``, a fraction of all entries,
    ones and zeros alike, as in the role-mining protocol of SPEC 4).
    """
    check_options(rows_per_chunk, holdout, block_bytes)
    with StoreWriter(out, overwrite=overwrite) as w, TextSource(path) as src:
        rec = concat_records([parse_records(b, PAIR_RECORD, path) for b in src.blocks(block_bytes)], PAIR_RECORD)
        if len(rec) == 0:
            raise InputError(at(path, None, "no user permission pairs (the file is empty)"))
        for k, name in enumerate(PAIR_RECORD.id_names):
            check_range(rec.ids[:, k], 1, MAX_INDEX, rec.lines, path, f"{name} id", " (ids are 1-based)")
        users, perms = rec.ids[:, 0] - 1, rec.ids[:, 1] - 1
        shape = (int(users.max()) + 1, int(perms.max()) + 1)
        X = dense_from_cells(shape, users, perms, np.ones(len(rec)), rec.lines, path,
                             lambda u, p: f"pair (user {u + 1}, permission {p + 1})")
        if transpose:
            X = np.ascontiguousarray(X.T)
        write_dense(w.group, X, None, rows_per_chunk)
        prov = provenance("pairs", [path], pairs=len(rec), lines=src.line,
                          orientation="permissions x users" if transpose else "users x permissions")
        finish_store(w, "dense", "binary", X.shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out)

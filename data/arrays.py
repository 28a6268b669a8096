"""Ingest of in-memory NumPy and SciPy arrays (the Python API path)."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from buffet.data.errors import InputError
from buffet.data.store import CSRWriter, Dataset, StoreWriter, check_kind, check_values, write_dense, write_strings

DEFAULT_ROWS_PER_CHUNK = 4096


def from_array(X, path: str | os.PathLike, kind: str, mask: np.ndarray | None = None,
               rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, vocab: Sequence[str] | None = None,
               row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
               provenance: dict | None = None, overwrite: bool = False,
               storage_options: dict | None = None) -> Dataset:
    """Store a dense array (with optional mask) or a SciPy sparse matrix as a dataset.

    Sparse input is stored in the ``csr`` layout; dense input in the ``dense`` layout.
    Values are checked against ``kind``: NaN only where ``mask`` is False.
    ``path`` may be a URL (``data.urls``); ``storage_options`` go to its filesystem.
    """
    check_kind(kind)
    if rows_per_chunk < 1:
        raise InputError(f"rows_per_chunk must be >= 1, got {rows_per_chunk}")
    provenance = {"source": "in-memory array", **(provenance or {})}
    with StoreWriter(path, overwrite, storage_options) as w:
        if sp.issparse(X):
            if mask is not None:
                raise InputError("a mask is only meaningful for dense input; sparse input stores its nonzeros")
            shape = _write_sparse(w, sp.csr_matrix(X), kind, rows_per_chunk)
            layout = "csr"
        else:
            shape = _write_dense_checked(w, np.asarray(X), mask, kind, rows_per_chunk)
            layout = "dense"
        _write_labels(w, shape, vocab, row_labels, col_labels)
        w.commit(layout, kind, shape, rows_per_chunk, provenance)
    return Dataset(path, storage_options)


def _write_sparse(w: StoreWriter, X: sp.csr_matrix, kind: str, rows_per_chunk: int) -> tuple[int, int]:
    X.sort_indices()
    writer = CSRWriter(w.group, X.shape[1], rows_per_chunk, kind, "array")
    for r0 in range(0, X.shape[0], rows_per_chunk):
        block = X[r0:r0 + rows_per_chunk]
        writer.add_rows(np.diff(block.indptr), block.indices, block.data, f"array rows {r0}..")
    return writer.finish()


def _write_dense_checked(w: StoreWriter, X: np.ndarray, mask: np.ndarray | None, kind: str,
                         rows_per_chunk: int) -> tuple[int, int]:
    if X.ndim != 2:
        raise InputError(f"X must be 2-D, got shape {X.shape}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.shape != X.shape:
            raise InputError(f"mask shape {mask.shape} differs from X shape {X.shape}")
        if mask.dtype != bool:
            raise InputError(f"mask must be boolean (True = observed), got dtype {mask.dtype}")
    X = X.astype(np.float64)
    check_values(kind, X, "array", observed=mask)
    if mask is not None:
        X = np.where(mask, X, 0.0)
    write_dense(w.group, X, mask, rows_per_chunk)
    return X.shape


def _write_labels(w: StoreWriter, shape: tuple[int, int], vocab, row_labels, col_labels) -> None:
    for name, values, n in (("vocab", vocab, shape[1]), ("row_labels", row_labels, shape[0]),
                            ("col_labels", col_labels, shape[1])):
        if values is None:
            continue
        if len(values) != n:
            raise InputError(f"{name} has {len(values)} entries but the matrix has {n}")
        write_strings(w.group, name, values)

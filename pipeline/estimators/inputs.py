"""What the estimators accept as data, turned into what the drivers read (SPEC 1).

``X`` may be a dataset store path (str or PathLike), a ``buffet.data.store.Dataset``, a NumPy
array (with an optional boolean ``mask``, True = observed), a SciPy sparse matrix, a pydata
``sparse`` array or a ``dask.array.Array``. A dask array is computed into memory
(``engine.dataset.in_memory``: the engine reads stores and in-memory rows; reading a user's dask
chunks directly is left for later). Count models get a CSR matrix of non-negative integers; dense
models get a float64 array and a mask, where a NaN in an unmasked array means a missing entry
(``mask`` False); sparse input to a dense model is densified (its zeros are observed values).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from buffet.data.errors import InputError
from buffet.data.store import Dataset, check_values
from buffet.pipeline.engine.dataset import MemoryRows, in_memory

COUNTS, DENSE = "counts", "dense"


@dataclass(frozen=True)
class Data:
    """Training data for a fit: a store path (read by the workers) or in-memory rows."""

    source: str | MemoryRows
    shape: tuple[int, int]


def _computed(X):
    """A dask array computed (``engine.dataset.in_memory``), a pydata ``sparse`` array as SciPy CSR; anything
    else unchanged."""
    X = in_memory(X)
    if type(X).__module__.split(".")[0] == "sparse" and hasattr(X, "tocsr"):
        X = X.tocsr()
    return X


def _store_path(X) -> str | None:
    if isinstance(X, Dataset):
        return X.path
    if isinstance(X, (str, os.PathLike)):
        return Dataset(X).path   # a missing or corrupt store fails here
    return None


def _two_d(shape: tuple[int, ...]) -> None:
    """Refuse anything but a matrix with a row and a column (messages in scikit-learn's words)."""
    if len(shape) != 2:
        raise InputError(f"X must be 2-D (rows x columns), got shape {shape}; Reshape your data, "
                         f"e.g. X[None, :] for a single row")
    for size, what in zip(shape, ("sample", "feature")):
        if size < 1:
            raise InputError(f"Found array with 0 {what}(s) (shape={shape}) while a minimum of 1 is required.")


def counts_matrix(X) -> sp.csr_matrix:
    """In-memory counts as CSR float64, refused unless non-negative integers (SPEC 1)."""
    X = _computed(X)
    m = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else sp.csr_matrix(_dense_array(X))
    _two_d(m.shape)
    check_values("counts", m.data, "X")
    return m


def _dense_array(X) -> np.ndarray:
    """Any array-like of real numbers as a float64 matrix (sparse input densified)."""
    X = _computed(X)
    arr = np.asarray(X.toarray() if sp.issparse(X) else X)
    if np.iscomplexobj(arr):
        raise InputError("Complex data not supported: X must hold real numbers")
    try:
        arr = arr.astype(np.float64)    # an object that is no number at all stays numpy's TypeError
    except ValueError:
        raise InputError(f"X must hold numbers, got dtype {arr.dtype}") from None
    _two_d(arr.shape)
    return arr


def dense_matrix(X, mask=None) -> tuple[np.ndarray, np.ndarray | None]:
    """In-memory dense data as (X float64 with unobserved entries 0, mask or None for all observed).

    Without a mask, NaN entries are the missing ones; with one, entries where it is False may hold
    anything and the observed entries must be finite (SPEC 1).
    """
    arr = _dense_array(X)
    if mask is None:
        missing = np.isnan(arr)
        observed = ~missing if missing.any() else None
    else:
        observed = np.asarray(_computed(mask))
        if observed.dtype != bool:
            raise InputError(f"mask must be boolean (True = observed), got dtype {observed.dtype}")
        if observed.shape != arr.shape:
            raise InputError(f"mask shape {observed.shape} differs from X shape {arr.shape}")
    check_values("real", arr, "X", observed)
    return (arr if observed is None else np.where(observed, arr, 0.0)), observed


def training_data(X, mask, kind: str) -> Data:
    """Data for a fit: a store path as it is (checked to have the layout the model reads), anything
    else in memory (``counts_matrix`` or ``dense_matrix``)."""
    path = _store_path(X)
    if path is not None:
        if mask is not None:
            raise InputError("mask is for in-memory arrays; a dataset store holds its own mask")
        ds = Dataset(path)
        layout = "csr" if kind == COUNTS else "dense"
        if ds.layout != layout:
            raise InputError(f"{path}: this model needs a store in the {layout} layout, this one is {ds.layout}")
        return Data(path, ds.shape)
    rows = memory_rows(X, mask, kind)
    return Data(rows, rows.shape)


def memory_rows(X, mask, kind: str) -> MemoryRows:
    """Any accepted ``X`` (a store is read whole) as in-memory rows of the model's kind."""
    path = _store_path(X)
    if path is not None:
        ds = Dataset(path)
        rows = ds.read_rows(0, ds.n_rows)
        X, mask = (rows.to_scipy(), None) if ds.layout == "csr" else (rows.X, rows.mask)
    if kind == COUNTS:
        if mask is not None:
            raise InputError("count models take no mask: a sparse matrix stores its nonzero counts")
        return MemoryRows(counts_matrix(X))
    return MemoryRows(*dense_matrix(X, mask))


def dense_rows(X, mask) -> tuple[np.ndarray, np.ndarray]:
    """New rows for a dense model: X and a full mask (all True when nothing is missing)."""
    rows = memory_rows(X, mask, DENSE)
    return rows.X, np.ones(rows.shape, bool) if rows.mask is None else rows.mask

"""What the estimators accept as data, recognised and checked once (``source_for``) into the
``engine.dataset.Source`` the drivers read.

``X`` may be a dataset store path (str or PathLike) or an opened ``buffet.data.store.Dataset``, a NumPy
array (with an optional boolean ``mask``, True = observed), a SciPy sparse matrix, a pydata ``sparse``
array or a ``dask.array.Array`` (its mask a NumPy or dask array). A store is opened once, here, and the
Source keeps it open. A dask array stays lazy: its shape and dtype are checked here, its values block by
block as the fit reads them (``engine.dataset.ArrayRows``), and it is rechunked to one chunk along the
columns. Count models read CSR matrices of non-negative integers; dense models float64 values and a mask,
where a NaN in an unmasked array means a missing entry (``mask`` False); sparse input to a dense model is
densified (its zeros are observed values).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import scipy.sparse as sp

from buffet.data.errors import InputError
from buffet.data.store import CSRRows, Dataset, DenseRows
from buffet.pipeline.engine.dataset import ArrayRows, Source, block_rows, checked_values, is_dask_array, source_of

COUNTS, DENSE = "counts", "dense"
LAYOUT = {COUNTS: "csr", DENSE: "dense"}


def source_for(X: Any, mask: Any, kind: str) -> Source:
    """The one gate of an estimator's data: any accepted ``X`` (module docstring) as the Source a model of
    ``kind`` (``COUNTS`` or ``DENSE``) reads, refused with a one-line ``InputError`` (scikit-learn's
    wording for the shape) when it cannot."""
    if isinstance(X, (str, os.PathLike, Dataset)):
        return _store(X, mask, kind)
    if kind == COUNTS and mask is not None:
        raise InputError("count models take no mask: a sparse matrix stores its nonzero counts")
    if is_dask_array(X):
        return source_of(_dask_rows(X, mask, LAYOUT[kind]))
    values = _matrix(X, kind)
    return source_of(ArrayRows(*checked_values(values, _mask(mask, values.shape), LAYOUT[kind]), LAYOUT[kind]))


def rows_of(X: Any, mask: Any, kind: str) -> CSRRows | DenseRows:
    """Every row of any accepted ``X``, in memory and checked (the new rows of ``transform`` and ``score``)."""
    source = source_for(X, mask, kind)
    data = source.open()
    rows = data.read_rows(0, data.n_rows)
    if source.url is None:
        return rows
    return block_rows(rows.to_scipy() if isinstance(rows, CSRRows) else rows.X, getattr(rows, "mask", None),
                      LAYOUT[kind])


def dense_rows(X: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
    """New rows for a dense model: X and a full mask (all True when nothing is missing)."""
    rows = rows_of(X, mask, DENSE)
    return rows.X, np.ones(rows.X.shape, bool) if rows.mask is None else rows.mask


def _store(location: str | os.PathLike | Dataset, mask: Any, kind: str) -> Source:
    """A store, opened once (a missing or corrupt one fails here), in the layout the model reads."""
    ds = location if isinstance(location, Dataset) else Dataset(location)
    if mask is not None:
        raise InputError("mask is for in-memory arrays; a dataset store holds its own mask")
    if ds.layout != LAYOUT[kind]:
        raise InputError(f"{ds.path}: this model needs a store in the {LAYOUT[kind]} layout, this one is {ds.layout}")
    return source_of(ds)


def _two_d(shape: tuple[int, ...]) -> None:
    """Refuse anything but a matrix with a row and a column (messages in scikit-learn's words)."""
    if len(shape) != 2:
        raise InputError(f"X must be 2-D (rows x columns), got shape {shape}; Reshape your data, "
                         f"e.g. X[None, :] for a single row")
    for size, what in zip(shape, ("sample", "feature")):
        if size < 1:
            raise InputError(f"Found array with 0 {what}(s) (shape={shape}) while a minimum of 1 is required.")


def _not_complex(dtype: np.dtype) -> None:
    if np.issubdtype(dtype, np.complexfloating):
        raise InputError("Complex data not supported: X must hold real numbers")


def _matrix(X: Any, kind: str) -> Any:
    """In-memory ``X`` as a SciPy sparse matrix (sparse input to a count model) or a float64 array, its shape
    and type checked."""
    pydata = sys.modules.get("sparse")
    if pydata is not None and isinstance(X, pydata.SparseArray):
        X = X.tocsr()
    if sp.issparse(X) and kind == COUNTS:
        _not_complex(X.dtype)
        _two_d(X.shape)
        return X
    arr = np.asarray(X.toarray() if sp.issparse(X) else X)
    _not_complex(arr.dtype)
    try:
        arr = arr.astype(np.float64)    # an object that is no number at all stays numpy's TypeError
    except ValueError:
        raise InputError(f"X must hold numbers, got dtype {arr.dtype}") from None
    _two_d(arr.shape)
    return arr


def _mask(mask: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """An in-memory boolean mask of ``shape``, or None."""
    if mask is None:
        return None
    observed = np.asarray(mask.compute() if is_dask_array(mask) else mask)
    _check_mask(observed.dtype, observed.shape, shape)
    return observed


def _check_mask(dtype: np.dtype, shape: tuple[int, ...], x_shape: tuple[int, ...]) -> None:
    if dtype != bool:
        raise InputError(f"mask must be boolean (True = observed), got dtype {dtype}")
    if tuple(shape) != tuple(x_shape):
        raise InputError(f"mask shape {tuple(shape)} differs from X shape {tuple(x_shape)}")


def _dask_rows(X: Any, mask: Any, layout: str) -> ArrayRows:
    """A dask array (and its mask) as lazy array rows, one chunk along the columns; only metadata is read."""
    import dask.array as da

    if any(np.isnan(size) for sizes in X.chunks for size in sizes):
        raise InputError("X is a dask array of unknown chunk sizes; call X.compute_chunk_sizes() first")
    _two_d(X.shape)
    _not_complex(X.dtype)
    if X.dtype.kind not in "biuf":
        raise InputError(f"X must hold numbers, got dtype {X.dtype}")
    X = X.rechunk({1: -1})
    if mask is not None:
        mask = mask if is_dask_array(mask) else np.asarray(mask)
        _check_mask(mask.dtype, mask.shape, X.shape)
        mask = mask.rechunk(X.chunks) if is_dask_array(mask) else da.from_array(mask, chunks=X.chunks)
    return ArrayRows(X, mask, layout)

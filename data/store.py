"""One dataset = one Zarr v3 group (SPEC 1): reading it back, and writing it atomically.

Layouts
-------
``csr``   sparse rows: 1-D arrays ``indptr`` (N+1), ``indices``, ``data`` and ``chunk_offsets``
          (the nnz offset of every stored row-chunk boundary, so one chunk is two slices).
``dense`` ``X`` (2-D, row chunks) and optionally ``mask`` (bool, True = observed).

Group attributes: ``buffet_format``, ``layout``, ``kind`` (real, binary, counts), ``shape``,
``rows_per_chunk``, ``provenance`` and ``splits`` (names). Optional string arrays ``vocab``,
``row_labels``, ``col_labels``. Splits live in ``splits/<name>/`` as index or mask arrays.

A new store is written into a hidden folder beside the target and renamed into place only
when complete, so an error never leaves a half-written store and never destroys an old one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp
import zarr

from buffet.data.errors import InputError, StoreError

FORMAT_VERSION = 1
KINDS = ("real", "binary", "counts")
LAYOUTS = ("csr", "dense")
NNZ_CHUNK = 1 << 17  # nnz per Zarr chunk: a 500-document block (~130k nnz) decompresses ~2 chunks, not 1M entries


@dataclass(frozen=True)
class CSRRows:
    """A run of rows of a sparse matrix: CSR arrays with ``indptr`` starting at 0."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    n_cols: int

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    def to_scipy(self) -> sp.csr_matrix:
        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=(self.n_rows, self.n_cols))

    def take(self, rows: np.ndarray) -> "CSRRows":
        """The given local rows, in the given order."""
        m = self.to_scipy()[rows]
        return CSRRows(m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data, self.n_cols)


@dataclass(frozen=True)
class DenseRows:
    """A run of rows of a dense matrix with its observation mask (None = all observed)."""

    X: np.ndarray
    mask: np.ndarray | None

    @property
    def n_rows(self) -> int:
        return self.X.shape[0]


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InputError(f"unknown data kind {kind!r}; expected one of {', '.join(KINDS)}")


def first_invalid(kind: str, values: np.ndarray) -> tuple[int, str] | None:
    """Position (in ``values.ravel()``) and reason of the first value a model of this kind
    cannot take, or None (SPEC 1 bad-input list). Ingest uses the position to name the line."""
    v = np.asarray(values, dtype=np.float64).ravel()
    checks = [(~np.isfinite(v), "NaN/inf value {!r} in an observed entry (give a mask to mark entries missing)")]
    if kind == "counts":
        checks += [(v < 0, "negative count {!r}; count models need counts >= 0"),
                   (v != np.round(v), "non-integer count {!r}; count models need integers")]
    elif kind == "binary":
        checks += [((v != 0) & (v != 1), "value {!r} is not 0 or 1; binary models need 0/1 data")]
    found = [(int(np.argmax(bad)), msg) for bad, msg in checks if bad.any()]
    if not found:
        return None
    k, msg = min(found, key=lambda f: f[0])
    return k, msg.format(float(v[k]))


def check_values(kind: str, values: np.ndarray, where: str, observed: np.ndarray | None = None) -> None:
    """Refuse values a model of this kind cannot take (SPEC 1 bad-input list).

    ``observed`` marks entries that count (None = all); unobserved entries may hold anything.
    """
    found = first_invalid(kind, values if observed is None else values[observed])
    if found is not None:
        raise InputError(f"{where}: {found[1]}")


def check_format(found: object, supported: int, where: str, what: str) -> None:
    """Refuse a ``what`` ("dataset", "run") at ``where`` whose format number is missing or other than
    ``supported``; a larger number means a newer buffet wrote it, and the message says to upgrade."""
    if found == supported:
        return
    if isinstance(found, int) and found > supported:
        raise StoreError(f"{where}: written by a newer buffet ({what} format {found}; this version reads "
                         f"format {supported}): upgrade buffet (pip install -U buffet)")
    raise StoreError(f"{where}: not a buffet {what} (no {what} format {supported} marker)")


class Dataset:
    """A dataset store opened for reading; validates its structure on open."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise StoreError(f"{self.path}: no such dataset store")
        try:
            self.group = zarr.open_group(str(self.path), mode="r")
            attrs = dict(self.group.attrs)
        except Exception as exc:  # zarr raises many types for unreadable folders
            raise StoreError(f"{self.path}: not a readable Zarr group ({exc})") from exc
        check_format(attrs.get("buffet_format"), FORMAT_VERSION, str(self.path), "dataset")
        self.attrs = attrs
        self.layout: str = attrs["layout"]
        self.kind: str = attrs["kind"]
        self.shape: tuple[int, int] = tuple(attrs["shape"])  # type: ignore[assignment]
        self.rows_per_chunk: int = int(attrs["rows_per_chunk"])
        self._arrays: dict[str, zarr.Array] = {}
        self._validate()

    def _array(self, name: str) -> zarr.Array:
        """The named array, opened once (opening reads its metadata from the store)."""
        if name not in self._arrays:
            try:
                self._arrays[name] = self.group[name]
            except KeyError:
                raise StoreError(f"{self.path}: array {name!r} is missing (partial or corrupt store)") from None
        return self._arrays[name]

    def _validate(self) -> None:
        n, d = self.shape
        if self.layout == "csr":
            indptr = self._array("indptr")
            nnz = self._array("indices").shape[0]
            if indptr.shape != (n + 1,) or self._array("data").shape[0] != nnz:
                raise StoreError(f"{self.path}: CSR arrays disagree with shape {self.shape}")
            if int(indptr[n]) != nnz:
                raise StoreError(f"{self.path}: indptr ends at {int(indptr[n])} but there are {nnz} entries")
        elif self.layout == "dense":
            if self._array("X").shape != (n, d):
                raise StoreError(f"{self.path}: X has shape {self._array('X').shape}, expected {self.shape}")
            if "mask" in self.group and self.group["mask"].shape != (n, d):
                raise StoreError(f"{self.path}: mask shape differs from X")
        else:
            raise StoreError(f"{self.path}: unknown layout {self.layout!r}")

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_cols(self) -> int:
        return self.shape[1]

    @property
    def has_mask(self) -> bool:
        return self.layout == "dense" and "mask" in self.group

    def strings(self, name: str) -> list[str] | None:
        """A stored string array (``vocab``, ``row_labels``, ``col_labels``) or None."""
        return [str(s) for s in self.group[name][:]] if name in self.group else None

    def read_rows(self, r0: int, r1: int) -> CSRRows | DenseRows:
        """Rows [r0, r1): two slices of the nnz arrays for CSR, one row slab for dense."""
        if self.layout == "csr":
            ptr = np.asarray(self._array("indptr")[r0:r1 + 1], dtype=np.int64)
            lo, hi = int(ptr[0]), int(ptr[-1])
            idx = np.asarray(self._array("indices")[lo:hi], dtype=np.int32)
            val = np.asarray(self._array("data")[lo:hi], dtype=np.float64)
            return CSRRows(ptr - lo, idx, val, self.n_cols)
        X = np.asarray(self._array("X")[r0:r1], dtype=np.float64)
        mask = np.asarray(self._array("mask")[r0:r1], dtype=bool) if self.has_mask else None
        return DenseRows(X, mask)

    def row_bounds(self, rows_per_chunk: int | None = None) -> list[tuple[int, int]]:
        """Row ranges of the chunks: the stored chunking, or a logical one for a fit."""
        step = rows_per_chunk or self.rows_per_chunk
        return [(r, min(r + step, self.n_rows)) for r in range(0, self.n_rows, step)]

    def total(self) -> float:
        """Sum of all stored values (total tokens for a corpus)."""
        if self.layout == "csr":
            data = self._array("data")
            return float(sum(np.sum(data[i:i + NNZ_CHUNK], dtype=np.float64)
                             for i in range(0, data.shape[0], NNZ_CHUNK)))
        return float(sum(np.nansum(self.read_rows(a, b).X) for a, b in self.row_bounds()))

    def nnz(self) -> int:
        if self.layout == "csr":
            return int(self._array("indices").shape[0])
        if self.has_mask:
            return int(sum(self.read_rows(a, b).mask.sum() for a, b in self.row_bounds()))
        return self.n_rows * self.n_cols

    def split_names(self) -> list[str]:
        return list(self.attrs.get("splits", []))

    def split(self, name: str) -> dict[str, np.ndarray]:
        """The arrays of a named split (``test_rows`` or ``test_mask``)."""
        if name not in self.split_names():
            raise StoreError(f"{self.path}: no split named {name!r} (have: {self.split_names() or 'none'})")
        g = self.group[f"splits/{name}"]
        return {k: np.asarray(g[k][:]) for k in g.array_keys()}

    def read_split_rows(self, name: str, key: str, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of a split's 2-D array (e.g. the ``test_mask`` of held-out entries)."""
        if name not in self.split_names() or key not in self.group[f"splits/{name}"]:
            raise StoreError(f"{self.path}: split {name!r} has no {key!r} array")
        return np.asarray(self.group[f"splits/{name}/{key}"][r0:r1])

    def describe(self) -> dict:
        """The facts ``buffet info`` prints."""
        n, d = self.shape
        out = {"path": str(self.path), "layout": self.layout, "kind": self.kind, "rows": n, "columns": d,
               "rows_per_chunk": self.rows_per_chunk, "chunks": len(self.row_bounds()),
               "stored_entries": self.nnz(), "masked": self.has_mask,
               "splits": {s: dict(self.group[f"splits/{s}"].attrs) for s in self.split_names()},
               "provenance": self.attrs.get("provenance", {})}
        if self.layout == "csr":
            out["total"] = self.total()
        for name in ("vocab", "row_labels", "col_labels"):
            if name in self.group:
                out[name] = f"{self.group[name].shape[0]} strings"
        return out


class StoreWriter:
    """Builds a new store in a hidden folder beside ``path``; ``commit`` moves it into place.

    Used as a context manager: on any exception the hidden folder is removed and whatever
    was at ``path`` before is untouched (SPEC 1: never a half-written store).
    """

    def __init__(self, path: str | os.PathLike, overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise InputError(f"{self.path} already exists (pass --overwrite to replace it)")
        self.tmp = self.path.parent / f".{self.path.name}.partial-{uuid.uuid4().hex[:8]}"
        self.group: zarr.Group | None = None

    def __enter__(self) -> "StoreWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.group = zarr.open_group(str(self.tmp), mode="w")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def commit(self, layout: str, kind: str, shape: tuple[int, int], rows_per_chunk: int,
               provenance: dict) -> Path:
        """Write the group attributes last, then swap the folder into place."""
        check_kind(kind)
        assert self.group is not None
        self.group.attrs.update({"buffet_format": FORMAT_VERSION, "layout": layout, "kind": kind,
                                 "shape": [int(shape[0]), int(shape[1])],
                                 "rows_per_chunk": int(rows_per_chunk), "provenance": provenance,
                                 "splits": list(self.group.attrs.get("splits", []))})
        replace_dir(self.tmp, self.path)
        return self.path


def replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an existing ``target`` is removed only after the move."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, target)


def write_strings(group: zarr.Group, name: str, values: Sequence[str]) -> None:
    arr = group.create_array(name, shape=(len(values),), dtype=str)
    if len(values):
        arr[:] = np.asarray(list(values), dtype=str)


class CSRWriter:
    """Appends complete rows to the CSR arrays of a store being written (streaming ingest)."""

    def __init__(self, group: zarr.Group, n_cols: int | None, rows_per_chunk: int, kind: str,
                 source: str):
        check_kind(kind)
        self.kind, self.source, self.rows_per_chunk = kind, source, rows_per_chunk
        self.n_cols = n_cols
        self.max_col = -1
        dtype = np.float64 if kind == "real" else np.float32
        self.indptr = group.create_array("indptr", shape=(0,), chunks=(NNZ_CHUNK,), dtype=np.int64)
        self.indices = group.create_array("indices", shape=(0,), chunks=(NNZ_CHUNK,), dtype=np.int32)
        self.data = group.create_array("data", shape=(0,), chunks=(NNZ_CHUNK,), dtype=dtype)
        self.group = group
        self.n_rows = 0
        self.nnz = 0
        self.indptr.append(np.zeros(1, dtype=np.int64))

    def add_rows(self, counts: np.ndarray, indices: np.ndarray, data: np.ndarray, where: str) -> None:
        """Append rows given their entry counts and the concatenated (column, value) pairs."""
        indices = np.asarray(indices, dtype=np.int64)
        data = np.asarray(data, dtype=np.float64)
        check_values(self.kind, data, where)
        if indices.size:
            limit = self.n_cols if self.n_cols is not None else np.iinfo(np.int64).max
            bad = (indices < 0) | (indices >= limit)
            if bad.any():
                raise InputError(f"{where}: column id {indices[bad][0] + 1} out of range 1..{self.n_cols}")
            self.max_col = max(self.max_col, int(indices.max()))
        keep = data != 0
        row_of = np.repeat(np.arange(len(counts)), counts)
        kept_counts = np.bincount(row_of[keep], minlength=len(counts))
        self.indices.append(indices[keep].astype(np.int32))
        self.data.append(data[keep])
        self.indptr.append(self.nnz + np.cumsum(kept_counts))
        self.nnz += int(kept_counts.sum())
        self.n_rows += len(counts)

    def finish(self) -> tuple[int, int]:
        """Write the chunk offsets; return the matrix shape."""
        n_cols = self.n_cols if self.n_cols is not None else self.max_col + 1
        bounds = np.arange(0, self.n_rows + 1, self.rows_per_chunk)
        if bounds[-1] != self.n_rows:
            bounds = np.append(bounds, self.n_rows)
        offsets = np.asarray(self.indptr[:][bounds], dtype=np.int64) if self.n_rows else np.zeros(1, np.int64)
        arr = self.group.create_array("chunk_offsets", shape=offsets.shape, dtype=np.int64)
        arr[:] = offsets
        return self.n_rows, n_cols


def write_dense(group: zarr.Group, X: np.ndarray, mask: np.ndarray | None, rows_per_chunk: int) -> None:
    """Write ``X`` (and ``mask``) with row chunks spanning all columns."""
    chunks = (max(1, min(rows_per_chunk, X.shape[0])), max(1, X.shape[1]))
    group.create_array("X", shape=X.shape, chunks=chunks, dtype=np.float64)[:] = X
    if mask is not None:
        group.create_array("mask", shape=X.shape, chunks=chunks, dtype=bool)[:] = mask


class DenseWriter:
    """Appends row blocks to ``X`` (and ``mask``) of a store being written (streaming ingest).

    Values are stored as given: the caller checks them and zeroes unobserved entries.
    """

    def __init__(self, group: zarr.Group, n_cols: int, rows_per_chunk: int, with_mask: bool):
        """Empty ``X`` (and ``mask``) arrays with row chunks spanning all columns."""
        chunks = (max(1, rows_per_chunk), max(1, n_cols))
        self.X = group.create_array("X", shape=(0, n_cols), chunks=chunks, dtype=np.float64)
        self.mask = (group.create_array("mask", shape=(0, n_cols), chunks=chunks, dtype=bool)
                     if with_mask else None)

    def add_rows(self, X: np.ndarray, mask: np.ndarray | None) -> None:
        """Append complete rows (and their mask rows)."""
        self.X.append(np.asarray(X, dtype=np.float64), axis=0)
        if self.mask is not None:
            self.mask.append(np.asarray(mask, dtype=bool), axis=0)

    def finish(self) -> tuple[int, int]:
        """The matrix shape."""
        return int(self.X.shape[0]), int(self.X.shape[1])

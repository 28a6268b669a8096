"""One dataset = one Zarr v3 group: reading it back, and writing it atomically.

Layouts
-------
``csr``   sparse rows: 1-D arrays ``indptr`` (N+1), ``indices``, ``data`` and ``chunk_offsets``
          (the nnz offset of every stored row-chunk boundary, so one chunk is two slices).
``dense`` ``X`` (2-D, row chunks) and optionally ``mask`` (bool, True = observed).

Group attributes: ``buffet_format``, ``layout``, ``kind`` (real, binary, counts), ``shape``,
``rows_per_chunk``, ``provenance`` and ``splits`` (names). Optional string arrays ``vocab``,
``row_labels``, ``col_labels``. Splits live in ``splits/<name>/`` as index or mask arrays. Every
array has its chunk records in ``chunk_records/<name>`` and every read is verified against them
(``data.chunks``): a lost or damaged chunk is an error, never zeros.

A store lives at a local path or at any URL fsspec reaches (``data.urls``). On disk a new store is
written into a hidden folder beside the target and renamed into place only when complete, so an
error never leaves a half-written store and never destroys an old one. An object store has no
rename: the store is written in place, marked partial from the start, and the group attributes
with ``buffet_format`` are written last, so a store whose upload stopped is refused on open.
Replacing a store on an object store (``overwrite``) removes the old one first: not atomic there.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp
import zarr

from buffet.data.chunks import RECORDS, CheckedArray, ChunkWriter, write_array
from buffet.data.errors import InputError, StoreError
from buffet.data.urls import exists, filesystem, is_url, normalise, remove, zarr_store

FORMAT_VERSION = 2  # 2: chunk records and checksummed chunks
PARTIAL = "buffet_partial"  # group attribute of a store whose ingest has not finished
SPLITS = "splits"  # group attribute: the names of the stored splits
TOTAL = "total"  # group attribute of a CSR store: the sum of its values, counted while it was written
STRING_CHUNK = 1 << 16  # strings per chunk of vocab and label arrays
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
    cannot take, or None. Ingest uses the position to name the line."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if _plainly_valid(kind, v):
        return None
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


def _plainly_valid(kind: str, v: np.ndarray) -> bool:
    """A cheap test that every value suits ``kind``; ``first_invalid`` searches for the first bad value only
    when it fails. A NaN makes min and max NaN, which every comparison below refuses."""
    if v.size == 0:
        return True
    low, high = v.min(), v.max()
    if kind == "counts":
        return bool(low >= 0 and high < np.inf and np.array_equal(np.rint(v), v))
    if kind == "binary":
        return bool(low >= 0 and high <= 1 and np.array_equal(np.rint(v), v))
    return bool(-np.inf < low and high < np.inf)


def check_values(kind: str, values: np.ndarray, where: str, observed: np.ndarray | None = None) -> None:
    """Refuse values a model of this kind cannot take.

    ``observed`` marks entries that count (None = all); unobserved entries may hold anything.
    """
    found = first_invalid(kind, values if observed is None else values[observed])
    if found is not None:
        raise InputError(f"{where}: {found[1]}")


def check_format(found: object, supported: int, where: str, what: str, redo: str) -> None:
    """Refuse a ``what`` ("dataset", "run") at ``where`` whose format number is missing or other than
    ``supported``: a larger number means a newer buffet wrote it (the message says to upgrade), a smaller
    one an older buffet (the message says ``redo``, what to do instead)."""
    if found == supported:
        return
    if isinstance(found, int) and found > supported:
        raise StoreError(f"{where}: written by a newer buffet ({what} format {found}; this version reads "
                         f"format {supported}): upgrade buffet (pip install -U buffet)")
    if isinstance(found, int) and found >= 1:
        raise StoreError(f"{where}: written by an older buffet ({what} format {found}; this version reads "
                         f"format {supported}): {redo}")
    raise StoreError(f"{where}: not a buffet {what} (no {what} format {supported} marker)")


READ_CHUNKS = 16  # chunks per read when a whole array is scanned (an object store fetches them in parallel)


class Dataset:
    """A dataset store (a local path or a URL) opened for reading; validates its structure on open and
    verifies every chunk it reads (``data.chunks``)."""

    def __init__(self, location: str | os.PathLike, storage_options: dict[str, Any] | None = None):
        """Open the store at ``location``; ``storage_options`` go to fsspec (default: ``urls.storage_options``)."""
        self.path = normalise(location)
        self.storage_options = storage_options
        self.fs, self.root = filesystem(self.path, storage_options)
        if not exists(self.path, storage_options):
            raise StoreError(f"{self.path}: no such dataset store")
        try:
            self.group = zarr.open_group(store=zarr_store(self.path, storage_options), mode="r")
            attrs = dict(self.group.attrs)
        except Exception as exc:  # zarr raises many types for unreadable folders
            raise StoreError(f"{self.path}: not a readable Zarr group ({exc})") from exc
        if attrs.get(PARTIAL):
            raise StoreError(f"{self.path}: partial store: the ingest that wrote it did not finish (an interrupted "
                             "upload or a failed ingest); re-run the ingest")
        check_format(attrs.get("buffet_format"), FORMAT_VERSION, self.path, "dataset",
                     "re-run the ingest with --overwrite to rewrite it in this version's format")
        self.attrs = attrs
        self.layout: str = attrs["layout"]
        self.kind: str = attrs["kind"]
        self.shape: tuple[int, int] = tuple(attrs["shape"])  # type: ignore[assignment]
        self.rows_per_chunk: int = int(attrs["rows_per_chunk"])
        self.has_mask = self.layout == "dense" and "mask" in self.group
        self._arrays: dict[str, CheckedArray] = {}
        self._validate()

    def _array(self, name: str) -> CheckedArray:
        """The named array with its chunk records, opened once (opening reads its metadata and records)."""
        if name not in self._arrays:
            try:
                array, records = self.group[name], self.group[f"{RECORDS}/{name}"]
            except KeyError:
                raise StoreError(f"{self.path}: array {name!r} or its chunk records are missing (partial or "
                                 "corrupt store); re-run the ingest") from None
            try:
                values = np.asarray(records[...])
            except (ValueError, RuntimeError):
                raise StoreError(f"{self.path}: the chunk records of array {name!r} are corrupted; "
                                 "re-run the ingest") from None
            self._arrays[name] = CheckedArray(self.path, name, array, values, self._present)
        return self._arrays[name]

    def _present(self, key: str) -> bool:
        """Whether the store holds an object under ``key`` (a chunk key)."""
        return self.fs.exists(f"{self.root}/{key}")

    def _validate(self) -> None:
        n, d = self.shape
        if self.layout == "csr":
            indptr = self._array("indptr")
            nnz = self._array("indices").shape[0]
            if indptr.shape != (n + 1,) or self._array("data").shape[0] != nnz:
                raise StoreError(f"{self.path}: CSR arrays disagree with shape {self.shape}")
            end = int(indptr.read(n, n + 1)[0])
            if end != nnz:
                raise StoreError(f"{self.path}: indptr ends at {end} but there are {nnz} entries")
        elif self.layout == "dense":
            if self._array("X").shape != (n, d):
                raise StoreError(f"{self.path}: X has shape {self._array('X').shape}, expected {self.shape}")
            if self.has_mask and self._array("mask").shape != (n, d):
                raise StoreError(f"{self.path}: mask shape differs from X")
        else:
            raise StoreError(f"{self.path}: unknown layout {self.layout!r}")

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_cols(self) -> int:
        return self.shape[1]

    def strings(self, name: str) -> list[str] | None:
        """A stored string array (``vocab``, ``row_labels``, ``col_labels``) or None."""
        return [str(s) for s in self._array(name).read()] if name in self.group else None

    def column_names(self) -> list[str] | None:
        """What the columns are called: the vocabulary of a corpus, else the column labels of a table, or None."""
        return self.strings("vocab") or self.strings("col_labels")

    def read_rows(self, r0: int, r1: int) -> CSRRows | DenseRows:
        """Rows [r0, r1): two slices of the nnz arrays for CSR, one row slab for dense."""
        if self.layout == "csr":
            ptr = self._array("indptr").read(r0, r1 + 1).astype(np.int64)
            lo, hi = int(ptr[0]), int(ptr[-1])
            idx = self._array("indices").read(lo, hi).astype(np.int32)
            val = self._array("data").read(lo, hi).astype(np.float64)
            return CSRRows(ptr - lo, idx, val, self.n_cols)
        X = self._array("X").read(r0, r1).astype(np.float64)
        mask = self._array("mask").read(r0, r1).astype(bool) if self.has_mask else None
        return DenseRows(X, mask)

    def row_bounds(self, rows_per_chunk: int | None = None) -> list[tuple[int, int]]:
        """Row ranges of the chunks: the stored chunking, or a logical one for a fit."""
        step = rows_per_chunk or self.rows_per_chunk
        return [(r, min(r + step, self.n_rows)) for r in range(0, self.n_rows, step)]

    def total(self) -> float:
        """Sum of all stored values (total tokens for a corpus): recorded by the ingest of a CSR store (so a
        fit does not read the whole store for it), else summed chunk by chunk."""
        if TOTAL in self.attrs:
            return float(self.attrs[TOTAL])
        if self.layout == "csr":
            data = self._array("data")
            step = data.chunk_rows * READ_CHUNKS
            return float(sum(np.sum(data.read(i, i + step), dtype=np.float64) for i in range(0, data.n_rows, step)))
        return float(sum(np.nansum(self.read_rows(a, b).X) for a, b in self.row_bounds()))

    def nnz(self) -> int:
        if self.layout == "csr":
            return int(self._array("indices").shape[0])
        if self.has_mask:
            return int(sum(self.read_rows(a, b).mask.sum() for a, b in self.row_bounds()))
        return self.n_rows * self.n_cols

    def split_names(self) -> list[str]:
        return list(self.attrs.get(SPLITS, []))

    def split(self, name: str) -> dict[str, np.ndarray]:
        """The arrays of a named split (``test_rows`` or ``test_mask``)."""
        if name not in self.split_names():
            raise StoreError(f"{self.path}: no split named {name!r} (have: {self.split_names() or 'none'})")
        keys = self.group[f"splits/{name}"].array_keys()
        return {k: self._array(f"splits/{name}/{k}").read() for k in keys}

    def read_split_rows(self, name: str, key: str, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of a split's 2-D array (e.g. the ``test_mask`` of held-out entries)."""
        if name not in self.split_names() or key not in self.group[f"splits/{name}"]:
            raise StoreError(f"{self.path}: split {name!r} has no {key!r} array")
        return self._array(f"splits/{name}/{key}").read(r0, r1)

    def verify(self) -> int:
        """Read every array of the store whole, checking every chunk against its record; the number of
        chunks checked. A missing or corrupted chunk is a ``StoreError`` naming it."""
        names = [name for name, node in self.group[RECORDS].members(max_depth=None) if isinstance(node, zarr.Array)]
        checked = 0
        for name in sorted(names):
            array = self._array(name)
            step = array.chunk_rows * READ_CHUNKS
            for start in range(0, array.n_rows, step):
                array.read(start, start + step)
            checked += array.n_chunks
        return checked

    def describe(self) -> dict:
        """The facts ``buffet info`` prints."""
        n, d = self.shape
        out = {"path": self.path, "layout": self.layout, "kind": self.kind, "rows": n, "columns": d,
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
    """Builds a new store at ``location``; ``commit`` makes it a complete store.

    Used as a context manager. On disk the store is built in a hidden folder beside ``location`` and
    moved into place by ``commit``; on any exception the hidden folder is removed and whatever was at
    ``location`` before is untouched (never a half-written store). On an object store it is
    written in place, marked partial until ``commit`` writes the group attributes; ``overwrite`` removes
    the old store first, and an exception removes what was written.
    """

    def __init__(self, location: str | os.PathLike, overwrite: bool = False,
                 storage_options: dict[str, Any] | None = None):
        self.path = normalise(location)
        self.storage_options = storage_options
        self.remote = is_url(self.path)
        if exists(self.path, storage_options) and not overwrite:
            raise InputError(f"{self.path} already exists (pass --overwrite to replace it)")
        self.overwrite = overwrite
        target = Path(self.path)
        self.tmp = None if self.remote else str(target.parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}")
        self.group: zarr.Group | None = None

    @property
    def scratch_dir(self) -> str | None:
        """A local folder for scratch files: the hidden folder of a store on disk, the system's temporary
        folder (None) for a store on a URL."""
        return self.tmp

    def __enter__(self) -> "StoreWriter":
        if self.remote:
            if self.overwrite:
                remove(self.path, self.storage_options)
            store = zarr_store(self.path, self.storage_options, read_only=False)
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            store = zarr_store(self.tmp, read_only=False)
        self.group = zarr.open_group(store=store, mode="w")
        self.group.attrs.put({PARTIAL: True})
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            return
        if self.remote:
            try:
                remove(self.path, self.storage_options)
            except OSError:
                pass  # the marker is missing, so what is left is refused on open
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def commit(self, layout: str, kind: str, shape: tuple[int, int], rows_per_chunk: int,
               provenance: dict) -> str:
        """Write the group attributes last (one write that also drops the partial mark), then, on disk,
        swap the folder into place."""
        check_kind(kind)
        assert self.group is not None
        written = {key: value for key, value in self.group.attrs.items() if key in (SPLITS, TOTAL)}
        self.group.attrs.put({"buffet_format": FORMAT_VERSION, "layout": layout, "kind": kind,
                              "shape": [int(shape[0]), int(shape[1])],
                              "rows_per_chunk": int(rows_per_chunk), "provenance": provenance,
                              SPLITS: [], **written})
        if not self.remote:
            replace_dir(Path(self.tmp), Path(self.path))
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
    """A string array (vocabulary, labels), chunked and recorded like every other array."""
    writer = ChunkWriter(group, name, (), str, STRING_CHUNK)
    writer.append(np.asarray(list(values), dtype=np.dtypes.StringDType()))
    writer.finish()


class CSRWriter:
    """Appends complete rows to the CSR arrays of a store being written (streaming ingest)."""

    def __init__(self, group: zarr.Group, n_cols: int | None, rows_per_chunk: int, kind: str,
                 source: str):
        check_kind(kind)
        self.kind, self.source, self.rows_per_chunk = kind, source, rows_per_chunk
        self.n_cols = n_cols
        self.max_col = -1
        dtype = np.float64 if kind == "real" else np.float32
        self.indptr = ChunkWriter(group, "indptr", (), np.int64, NNZ_CHUNK)
        self.indices = ChunkWriter(group, "indices", (), np.int32, NNZ_CHUNK)
        self.data = ChunkWriter(group, "data", (), dtype, NNZ_CHUNK)
        self.group = group
        self.n_rows = 0
        self.nnz = 0
        self.total = 0.0  # exact for counts (integer sums below 2**53), whatever the order of the rows
        self.offsets = [0]  # nnz at every row-chunk boundary so far (the future ``chunk_offsets``)
        self.indptr.append(np.zeros(1, dtype=np.int64))

    def add_rows(self, counts: np.ndarray, indices: np.ndarray, data: np.ndarray, where: str) -> None:
        """Append rows given their entry counts and the concatenated (column, value) pairs."""
        indices = np.asarray(indices, dtype=np.int64)
        data = np.asarray(data, dtype=np.float64)
        check_values(self.kind, data, where)
        if indices.size:
            limit = self.n_cols if self.n_cols is not None else np.iinfo(np.int64).max
            low, high = int(indices.min()), int(indices.max())
            if low < 0 or high >= limit:
                bad = indices[(indices < 0) | (indices >= limit)][0]
                raise InputError(f"{where}: column id {bad + 1} out of range 1..{self.n_cols}")
            self.max_col = max(self.max_col, high)
        keep = data != 0
        if not keep.all():  # explicit zeros are not stored
            row_of = np.repeat(np.arange(len(counts)), counts)
            counts, indices, data = np.bincount(row_of[keep], minlength=len(counts)), indices[keep], data[keep]
        ends = self.nnz + np.cumsum(counts)
        self.indices.append(indices.astype(np.int32))
        self.data.append(data)
        self.indptr.append(ends)
        first = self.n_rows + 1  # the row boundary that ends[0] is the offset of
        boundary = -(-first // self.rows_per_chunk) * self.rows_per_chunk
        self.offsets.extend(int(ends[b - first]) for b in range(boundary, self.n_rows + len(counts) + 1,
                                                                 self.rows_per_chunk))
        self.nnz += int(counts.sum())
        self.total += float(np.sum(data, dtype=np.float64))
        self.n_rows += len(counts)

    def finish(self) -> tuple[int, int]:
        """Write what the arrays hold and the chunk offsets; return the matrix shape."""
        n_cols = self.n_cols if self.n_cols is not None else self.max_col + 1
        for writer in (self.indptr, self.indices, self.data):
            writer.finish()
        if self.n_rows % self.rows_per_chunk:
            self.offsets.append(self.nnz)
        write_array(self.group, "chunk_offsets", np.asarray(self.offsets, dtype=np.int64), NNZ_CHUNK)
        self.group.attrs[TOTAL] = self.total
        return self.n_rows, n_cols


def write_dense(group: zarr.Group, X: np.ndarray, mask: np.ndarray | None, rows_per_chunk: int) -> None:
    """Write ``X`` (and ``mask``) with row chunks spanning all columns."""
    writer = DenseWriter(group, X.shape[1], max(1, min(rows_per_chunk, X.shape[0])), mask is not None)
    writer.add_rows(X, mask)
    writer.finish()


class DenseWriter:
    """Appends row blocks to ``X`` (and ``mask``) of a store being written (streaming ingest).

    Values are stored as given: the caller checks them and zeroes unobserved entries.
    """

    def __init__(self, group: zarr.Group, n_cols: int, rows_per_chunk: int, with_mask: bool):
        """Empty ``X`` (and ``mask``) arrays with row chunks spanning all columns."""
        self.n_cols = n_cols
        self.X = ChunkWriter(group, "X", (n_cols,), np.float64, rows_per_chunk)
        self.mask = ChunkWriter(group, "mask", (n_cols,), bool, rows_per_chunk) if with_mask else None

    def add_rows(self, X: np.ndarray, mask: np.ndarray | None) -> None:
        """Append complete rows (and their mask rows)."""
        self.X.append(X)
        if self.mask is not None:
            self.mask.append(mask)

    def finish(self) -> tuple[int, int]:
        """Write what is held; the matrix shape."""
        n_rows = self.X.finish()
        if self.mask is not None:
            self.mask.finish()
        return n_rows, self.n_cols

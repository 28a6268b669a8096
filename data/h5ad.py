"""Ingest of AnnData ``.h5ad`` files (the ``anndata`` package): ``X`` or a layer, with ``obs_names`` as the
row names and ``var_names`` as the column names.

The matrix is read from the file a batch of rows at a time (dense or sparse, CSR or CSC). Non-negative
integers (an integer dtype, or floats that all are whole numbers) are stored as ``counts`` in the ``csr``
layout, as the text count formats are, unless the kind is given or a preprocessing option turns them into
reals; anything else is stored as ``real`` in the masked ``dense`` layout (``data.table_store``), with NaN
cells missing.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.errors import InputError
from buffet.data.ingest_store import check_options, finish_store, provenance
from buffet.data.store import CSRWriter, Dataset, StoreWriter, check_kind, write_strings
from buffet.data.table_columns import UniqueNames
from buffet.data.table_prep import Preprocessing
from buffet.data.table_store import RowBatch, write_table
from buffet.data.textblocks import PathLike, at

BATCH_CELLS = 1 << 22  # cells of a dense batch of rows (a sparse batch holds fewer)
H5AD_KINDS = ("real", "counts")


def _anndata_io() -> Any:
    """anndata's element readers (``read_elem``, ``sparse_dataset``), or an error saying how to install it."""
    try:
        import anndata
    except ImportError:
        raise InputError("reading .h5ad files needs the package anndata: pip install 'buffet[tables]'") from None
    return getattr(anndata, "io", None) if hasattr(getattr(anndata, "io", None), "sparse_dataset") \
        else anndata.experimental


class H5adMatrix:
    """One matrix of an open ``.h5ad`` file (``X`` or a layer) with the obs and var names; a ``Table``."""

    def __init__(self, path: PathLike, handle: Any, layer: str | None):
        """The matrix ``layer`` (None: ``X``) of the open h5py file ``handle``."""
        io = _anndata_io()
        self.path = str(path)
        key = "X" if layer is None else f"layers/{layer}"
        if key not in handle:
            have = sorted(handle["layers"]) if "layers" in handle else []
            what = "no X matrix" if layer is None else f"no layer named {layer!r} (layers: {', '.join(have) or 'none'})"
            raise InputError(at(path, None, what))
        node = handle[key]
        self.encoding = str(node.attrs.get("encoding-type", "array"))
        self.matrix = io.sparse_dataset(node) if self.encoding in ("csr_matrix", "csc_matrix") else node
        self.row_names = [str(n) for n in io.read_elem(handle["obs"]).index]
        self.columns: list[str] | None = [str(n) for n in io.read_elem(handle["var"]).index]
        self.n_rows, self.n_cols = (int(n) for n in self.matrix.shape)
        if self.n_rows == 0 or self.n_cols == 0:
            raise InputError(at(path, None, f"the {key} matrix is empty ({self.n_rows} x {self.n_cols})"))
        self._check_names()
        self.dtype = np.dtype(self.matrix.dtype)

    def _check_names(self) -> None:
        """obs_names and var_names must be unique (row names repeat: ``UniqueNames``)."""
        UniqueNames(self.path, "row").add(self.row_names, range(1, self.n_rows + 1))
        seen: dict[str, int] = {}
        for i, name in enumerate(self.columns or []):
            if name in seen:
                raise InputError(f"{self.path}: var_names {seen[name] + 1} and {i + 1} are both {name!r}; column "
                                 "names must be unique (anndata's var_names_make_unique renames them)")
            seen[name] = i

    def row_blocks(self) -> Iterator[tuple[int, sp.csr_matrix | np.ndarray]]:
        """(first row, rows) of the matrix, a batch at a time: a CSR matrix for sparse data, else an array."""
        step = max(1, BATCH_CELLS // self.n_cols)
        for r0 in range(0, self.n_rows, step):
            block = self.matrix[r0:r0 + step]
            yield r0, sp.csr_matrix(block) if sp.issparse(block) else np.asarray(block)

    def batches(self) -> Iterator[RowBatch]:
        """The rows as dense float64 batches with their obs names."""
        for r0, block in self.row_blocks():
            values = block.toarray() if sp.issparse(block) else block
            yield RowBatch(np.asarray(values, dtype=np.float64), self.row_names[r0:r0 + len(values)])

    def holds_counts(self) -> bool:
        """Whether every value is a non-negative whole number (read through once for a float matrix)."""
        if self.dtype.kind == "u":
            return True
        if self.dtype.kind not in "if":
            raise InputError(at(self.path, None, f"the matrix holds {self.dtype} values, not numbers"))
        for _, block in self.row_blocks():
            values = block.data if sp.issparse(block) else block
            if not (np.all(np.isfinite(values)) and np.all(values >= 0) and np.all(values == np.round(values))):
                return False
        return True


def _write_counts(w: StoreWriter, matrix: H5adMatrix, rows_per_chunk: int) -> tuple[int, int]:
    """The matrix as counts in the CSR layout, with its names."""
    assert w.group is not None
    writer = CSRWriter(w.group, matrix.n_cols, rows_per_chunk, "counts", matrix.path)
    for r0, block in matrix.row_blocks():
        rows = block if sp.issparse(block) else sp.csr_matrix(block)
        rows.sort_indices()
        writer.add_rows(np.diff(rows.indptr), rows.indices, rows.data, f"{matrix.path}, rows {r0 + 1}..")
    shape = writer.finish()
    write_strings(w.group, "row_labels", matrix.row_names)
    write_strings(w.group, "col_labels", matrix.columns or [])
    return shape


def ingest_h5ad(path: PathLike, out: PathLike, layer: str | None = None, kind: str | None = None,
                floor: float | None = None, ceiling: float | None = None, min_fold: float | None = None,
                min_range: float | None = None, log: str | None = None, center: str | None = None,
                scale: str | None = None, rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK, overwrite: bool = False,
                holdout: float | None = None, seed: int = 0, storage_options: dict | None = None) -> Dataset:
    """Ingest the ``X`` matrix of an AnnData ``.h5ad`` file, or its layer ``layer``, into a dataset at ``out``,
    with ``obs_names`` as ``row_labels`` and ``var_names`` as ``col_labels``.

    ``kind`` (real or counts) defaults to counts when every value is a non-negative whole number and no
    preprocessing option is given, else real. The preprocessing options are those of ``ingest_table`` and
    make the data real. ``holdout`` stores a ``heldout`` split: whole rows for counts, entries otherwise.
    """
    check_options(rows_per_chunk, holdout)
    if kind is not None:
        check_kind(kind)
        if kind not in H5AD_KINDS:
            raise InputError(f"--kind for h5ad is one of {', '.join(H5AD_KINDS)}, got {kind!r}")
    prep = Preprocessing.from_options(floor=floor, ceiling=ceiling, min_fold=min_fold, min_range=min_range,
                                      log=log, center=center, scale=scale)
    if kind == "counts" and prep.steps():
        raise InputError("the preprocessing options make real values; they cannot be stored as --kind counts")
    _anndata_io()
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(at(path, None, f"cannot read as an .h5ad (HDF5) file ({exc})")) from None
    with handle, StoreWriter(out, overwrite, storage_options) as w:
        matrix = H5adMatrix(path, handle, layer)
        kind = kind or ("counts" if not prep.steps() and matrix.holds_counts() else "real")
        plan = None
        if kind == "counts":
            shape, layout = _write_counts(w, matrix, rows_per_chunk), "csr"
        else:
            written = write_table(w, matrix, rows_per_chunk, prep=prep)
            shape, layout, plan = written.shape, "dense", written.plan
        prov = provenance("h5ad", [path], matrix="X" if layer is None else f"layers/{layer}",
                          encoding=matrix.encoding, dtype=str(matrix.dtype), preprocessing=prep.record(plan))
        finish_store(w, layout, kind, shape, rows_per_chunk, prov, holdout, seed)
    return Dataset(out, storage_options)

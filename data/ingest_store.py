"""The output side of file ingest: option checks, provenance, the held-out split and
the atomic commit of the store being written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from buffet.data.errors import InputError
from buffet.data.splits import check_fraction, holdout_entries, holdout_rows, write_split
from buffet.data.store import StoreWriter
from buffet.data.textblocks import PathLike

HOLDOUT_SPLIT = "heldout"


def check_options(rows_per_chunk: int, holdout: float | None, block_bytes: int | None = None) -> None:
    """Refuse bad ingest options before any input is read."""
    if rows_per_chunk < 1:
        raise InputError(f"rows_per_chunk must be >= 1, got {rows_per_chunk}")
    if block_bytes is not None and block_bytes < 1:
        raise InputError(f"block_bytes must be >= 1, got {block_bytes}")
    if holdout is not None:
        check_fraction(holdout)


def provenance(fmt: str, paths: list[PathLike | None], **facts) -> dict:
    """Where a dataset came from: format, source files with their sizes, and format facts."""
    sources = [{"file": Path(p).name, "path": str(Path(p).resolve()), "bytes": Path(p).stat().st_size}
               for p in paths if p is not None]
    return {"format": fmt, "sources": sources, **facts}


def finish_store(w: StoreWriter, layout: str, kind: str, shape: tuple[int, int], rows_per_chunk: int,
                 prov: dict, holdout: float | None, seed: int) -> None:
    """Write the ``heldout`` split if asked (rows for ``csr`` data, observed entries for
    ``dense`` data), then commit: the store appears complete or not at all."""
    if holdout is not None:
        assert w.group is not None
        if layout == "csr":
            test = holdout_rows(shape[0], holdout, seed)
            arrays, unit, n_test = {"test_rows": test}, "rows", test.size
        else:
            observed = np.asarray(w.group["mask"][...]) if "mask" in w.group else np.ones(shape, dtype=bool)
            test = holdout_entries(observed, holdout, seed)
            arrays, unit, n_test = {"test_mask": test}, "entries", np.count_nonzero(test)
        write_split(w.group, HOLDOUT_SPLIT, arrays,
                    {"kind": unit, "fraction": holdout, "seed": seed, "n_test": int(n_test),
                     "created_by": "ingest"}, rows_per_chunk)
    w.commit(layout, kind, shape, rows_per_chunk, prov)

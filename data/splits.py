"""Named train/test splits stored with a dataset, as the held-out protocols need.

Two kinds: held-out rows (``test_rows``: whole documents, for document completion) and
held-out entries (``test_mask``: True where an observed entry is held out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zarr

from buffet.data.chunks import write_array
from buffet.data.errors import InputError, StoreError
from buffet.data.store import NNZ_CHUNK, SPLITS, Dataset
from buffet.data.urls import zarr_store


def holdout_rows(n_rows: int, fraction: float, seed: int) -> np.ndarray:
    """A sorted random subset of ``round(fraction * n_rows)`` row indices (at least one)."""
    check_fraction(fraction)
    n_test = max(1, int(round(fraction * n_rows)))
    if n_test >= n_rows:
        raise InputError(f"holdout fraction {fraction} leaves no training rows out of {n_rows}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E1]))
    return np.sort(rng.choice(n_rows, size=n_test, replace=False)).astype(np.int64)


def holdout_entries(observed: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask holding out ``fraction`` of the observed entries, uniformly at random."""
    check_fraction(fraction)
    flat = np.flatnonzero(observed)
    n_test = max(1, int(round(fraction * flat.size)))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xE17]))
    test = np.zeros(observed.size, dtype=bool)
    test[rng.choice(flat, size=n_test, replace=False)] = True
    return test.reshape(observed.shape)


def check_fraction(fraction: float) -> None:
    """Refuse a holdout fraction outside (0, 1)."""
    if not 0.0 < fraction < 1.0:
        raise InputError(f"holdout fraction must be in (0, 1), got {fraction}")


def add_split(ds: Dataset, name: str, arrays: dict[str, np.ndarray], description: dict) -> None:
    """Store a named split beside the data (the store must be writable)."""
    if name in ds.split_names():
        raise StoreError(f"{ds.path}: a split named {name!r} already exists")
    group = zarr.open_group(store=zarr_store(ds.path, ds.storage_options, read_only=False), mode="r+")
    write_split(group, name, arrays, description, ds.rows_per_chunk)


def write_split(group: zarr.Group, name: str, arrays: dict[str, np.ndarray], description: dict,
                rows_per_chunk: int) -> None:
    """Write a split's arrays into an open group (an existing store or one being ingested), chunked and
    recorded as the data are: masks in chunks of ``rows_per_chunk`` rows, row lists in ``NNZ_CHUNK``."""
    sub = group.require_group(f"splits/{name}")
    for key, arr in arrays.items():
        write_array(group, f"splits/{name}/{key}", arr, rows_per_chunk if arr.ndim == 2 else NNZ_CHUNK)
    sub.attrs.update(description)
    group.attrs[SPLITS] = list(group.attrs.get(SPLITS, [])) + [name]


_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijective scramble of 64-bit words (uint64 arithmetic wraps)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class EntrySample:
    """A pseudo-random part of a matrix's entries: entry (i, j) belongs when a hash of (``seed``, i, j),
    uniform on [0, 1), falls in [``low``, ``high``). Membership depends on the entry alone, so any block
    of rows computes its part without seeing the others and any chunking gives the same sample; samples
    of one seed with disjoint ranges are disjoint (the validation folds of ``fit --select validation``)."""

    seed: int
    low: float
    high: float

    def rows(self, r0: int, r1: int, n_cols: int) -> np.ndarray:
        """Membership of the entries of rows [r0, r1), a (r1 - r0) x n_cols boolean array."""
        uniform = entry_uniforms(self.seed, r0, r1, n_cols)
        return (uniform >= self.low) & (uniform < self.high)


def entry_uniforms(seed: int, r0: int, r1: int, n_cols: int) -> np.ndarray:
    """A hash of (``seed``, i, j), uniform on [0, 1), for the entries of rows [r0, r1) of a matrix with
    ``n_cols`` columns: a (r1 - r0) x n_cols float64 array that depends on the entry alone, so any block of
    rows computes its part without seeing the others (``seed`` in [0, 2^64))."""
    flat = (np.arange(r0, r1, dtype=np.uint64)[:, None] * np.uint64(n_cols)
            + np.arange(n_cols, dtype=np.uint64)[None, :])
    key = _mix64(np.array([seed], dtype=np.uint64))[0]
    return (_mix64(flat ^ key) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53

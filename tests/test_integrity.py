"""Nothing read is silently wrong: a chunk deleted or corrupted in any array of a dense or
a sparse store, on local disk or in a bucket of the local S3 API server, is a one-line StoreError naming the
store, the array and the chunk, whichever way the array is read."""

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

from buffet.data.arrays import from_array
from buffet.data.chunks import RECORDS, CheckedArray, ChunkWriter
from buffet.data.errors import StoreError
from buffet.data.splits import add_split, holdout_entries, holdout_rows
from buffet.data.store import Dataset
from buffet.data.urls import filesystem, zarr_store


def dense_store(where: str) -> Dataset:
    """A masked real matrix in chunks of 16 rows, with labels and held-out entries."""
    rng = np.random.default_rng(0)
    X, mask = rng.normal(size=(50, 8)), rng.random((50, 8)) < 0.9
    ds = from_array(X, where, "real", mask=mask, rows_per_chunk=16, row_labels=[f"u{i}" for i in range(50)],
                    col_labels=[f"item {j}" for j in range(8)])
    add_split(ds, "heldout", {"test_mask": holdout_entries(mask, 0.2, 0)}, {"kind": "entries"})
    return Dataset(where)


def sparse_store(where: str) -> Dataset:
    """A count matrix in the CSR layout with a vocabulary and held-out rows."""
    X = sp.random(60, 30, density=0.3, format="csr", random_state=1, data_rvs=lambda n: np.arange(1, n + 1) % 7 + 1)
    ds = from_array(X, where, "counts", rows_per_chunk=16, vocab=[f"w{j}" for j in range(30)])
    add_split(ds, "heldout", {"test_rows": holdout_rows(60, 0.1, 0)}, {"kind": "rows"})
    return Dataset(where)


def read_all_rows(ds: Dataset) -> None:
    ds.read_rows(0, ds.n_rows)


READS = {  # how the library reads each array; chunk_offsets is read only by ``Dataset.verify``
    "X": read_all_rows, "mask": read_all_rows, "indptr": read_all_rows, "indices": read_all_rows,
    "data": read_all_rows, "vocab": lambda ds: ds.strings("vocab"), "row_labels": lambda ds: ds.strings("row_labels"),
    "col_labels": lambda ds: ds.strings("col_labels"), "splits/heldout/test_mask": lambda ds: ds.split("heldout"),
    "splits/heldout/test_rows": lambda ds: ds.split("heldout"), "chunk_offsets": Dataset.verify,
}
ARRAYS = {"dense": ["X", "mask", "row_labels", "col_labels", "splits/heldout/test_mask"],
          "sparse": ["indptr", "indices", "data", "chunk_offsets", "vocab", "splits/heldout/test_rows"]}


def last_chunk(path: str, name: str) -> tuple[int, str]:
    """The index and object key of the last chunk of an array (a chunk other than 0 where there are several)."""
    array = zarr.open_group(store=zarr_store(path), mode="r")[name]
    chunk = -(-array.shape[0] // array.chunks[0]) - 1
    return chunk, f"{name}/{array.metadata.encode_chunk_key((chunk, *[0] * (array.ndim - 1)))}"


def flipped(data: bytes) -> bytes:
    """``data`` with one byte in its middle inverted."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


def expect_error(path: str, name: str, message: str) -> None:
    """Reading the array ``name`` the library's way fails with exactly ``message`` (one line)."""
    with pytest.raises(StoreError) as caught:
        READS[name](Dataset(path))
    assert str(caught.value) == message


@pytest.mark.parametrize("place", ["local", "s3"])
@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_a_deleted_or_corrupted_chunk_of_any_array_is_an_error_naming_it(tmp_path, request, layout, place):
    where = str(tmp_path / "store.zarr") if place == "local" else request.getfixturevalue("s3").url("store.zarr")
    ds = (dense_store if layout == "dense" else sparse_store)(where)
    fs, root = filesystem(ds.path)
    for name in ARRAYS[layout]:
        chunk, key = last_chunk(ds.path, name)
        original = fs.cat_file(f"{root}/{key}")
        fs.rm_file(f"{root}/{key}")
        expect_error(ds.path, name, f"{ds.path}: chunk {chunk} of array {name!r} is missing (partial upload or "
                                    "deleted object); re-run the ingest")
        fs.pipe_file(f"{root}/{key}", flipped(original))
        expect_error(ds.path, name, f"{ds.path}: chunk {chunk} of array {name!r} is corrupted (it fails its checksum "
                                    "or cannot be decoded); re-run the ingest")
        fs.pipe_file(f"{root}/{key}", original)
    assert Dataset(ds.path).verify() >= len(ARRAYS[layout])  # restored: every chunk verifies again


def test_lost_chunk_records_are_an_error(tmp_path):
    ds = dense_store(str(tmp_path / "store.zarr"))
    fs, root = filesystem(ds.path)
    fs.rm(f"{root}/{RECORDS}/X/c", recursive=True)
    with pytest.raises(StoreError, match="the chunk records of array 'X' do not match the array"):
        Dataset(ds.path)


def test_a_lost_chunk_that_held_only_fill_values_is_still_missing(tmp_path):
    """A chunk equal to the fill value reads the same when lost, but absence means loss: it is looked up."""
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    writer = ChunkWriter(group, "zeros", (3,), np.float64, 4)
    writer.append(np.zeros((10, 3)))
    assert writer.finish() == 10
    (tmp_path / "g.zarr" / "zeros" / "c" / "1" / "0").unlink()
    array = CheckedArray("g.zarr", "zeros", group["zeros"], np.asarray(group[f"{RECORDS}/zeros"][...]),
                         lambda key: (tmp_path / "g.zarr" / key).exists())
    assert not array.read(0, 4).any() and not array.read(8, 10).any()
    with pytest.raises(StoreError, match="chunk 1 of array 'zeros' is missing"):
        array.read(3, 5)


def test_writer_records_every_chunk_of_rows_appended_in_any_pieces(tmp_path):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    values = np.arange(230, dtype=np.int64)
    writer = ChunkWriter(group, "v", (), np.int64, 50)
    for piece in np.split(values, [7, 60, 61, 199]):
        writer.append(piece)
    writer.finish()
    records = np.asarray(group[f"{RECORDS}/v"][...])
    assert records[:, 0].tolist() == [50, 50, 50, 50, 30]
    array = CheckedArray("g.zarr", "v", group["v"], records, lambda key: True)
    assert np.array_equal(array.read(), values) and np.array_equal(array.read(45, 151), values[45:151])


def buffet(*args):
    return subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_a_fit_of_a_damaged_store_in_a_bucket_stops_with_one_line(tmp_path, s3, layout):
    ds = (dense_store if layout == "dense" else sparse_store)(s3.url("store.zarr"))
    name, command = ("X", ("imf", "--select", "none")) if layout == "dense" else ("data", ("bnmf",))
    chunk, key = last_chunk(ds.path, name)
    fs, root = filesystem(ds.path)
    fs.rm_file(f"{root}/{key}")
    proc = buffet("fit", *command, ds.path, "--out", tmp_path / "run", "--workers", 1, "--quiet")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"buffet: error: {ds.path}: chunk {chunk} of array {name!r} is missing (partial "
                                   "upload or deleted object); re-run the ingest")


def test_a_store_of_the_format_before_chunk_records_is_refused_with_what_to_do(tmp_path):
    ds = dense_store(str(tmp_path / "old.zarr"))
    zarr.open_group(ds.path, mode="r+").attrs["buffet_format"] = 1
    with pytest.raises(StoreError, match=r"written by an older buffet \(dataset format 1; this version reads "
                                         r"format 2\): re-run the ingest with --overwrite"):
        Dataset(ds.path)

"""Checked chunks: every chunk of a dataset store's arrays is recorded when written and verified when
read, so nothing read is silently wrong.

Writing: ``ChunkWriter`` appends rows (along the first axis) to a new array, writes each chunk once it
is complete (several complete chunks per write, which an object store receives in parallel), and
records, per chunk, how many entries it holds and the CRC-32 of its decoded entries. ``finish``
stores the records as the array ``chunk_records/<name>`` (chunks x [entries, crc32]): one small
array per data array, cheap to load. Chunks are encoded with Zarr's ``crc32c`` codec, so a damaged
object fails at decode, and are written even when they equal the fill value, so an absent chunk
was lost.

Reading: ``CheckedArray.read`` reads whole chunks and checks each one against its record. A missing
chunk decodes to the fill value and fails the checksum (where the record's checksum is that of
the fill value, the chunk's object is looked up instead); a damaged one fails at decode. Either is
a ``StoreError`` naming the store, the array and the chunk.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections import OrderedDict
from typing import Callable

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

from buffet.data.errors import StoreError

RECORDS = "chunk_records"
# Byte-shuffled zstd at level 1 (Blosc), then a checksum of the stored bytes. Against zarr's default (plain zstd,
# level 3) on a corpus's CSR arrays: written with about half the CPU, 19% smaller, read about as fast
# (benchmarks/store_codecs.py measures it). Stores written with other codecs read the same: each array names its codecs.
CODECS = (BloscCodec(cname="zstd", clevel=1, shuffle="shuffle"), Crc32cCodec())
WRITE_CONFIG = {"write_empty_chunks": True}
FLUSH_BYTES = 1 << 23  # a writer holds about this much before writing its complete chunks
RECORD_CHUNK = 1 << 16  # chunk records per chunk of a records array
CACHE_BYTES = 1 << 24  # verified chunks an array keeps for the next read
DECODE_ERRORS = (ValueError, RuntimeError)  # what zarr's codecs raise for bytes they cannot decode
REDO = "re-run the ingest"


def checksum(values: np.ndarray) -> int:
    """CRC-32 of a chunk's decoded entries: the little-endian bytes of numbers and booleans, the
    length-prefixed UTF-8 text of strings."""
    if values.dtype.kind in "TUO":
        return zlib.crc32("".join(f"{len(s)}:{s}" for s in values.ravel().tolist()).encode("utf-8"))
    flat = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).reshape(-1)
    return zlib.crc32(flat.view(np.uint8))


def create_array(root: zarr.Group, name: str, shape: tuple[int, ...], chunks: tuple[int, ...],
                 dtype: object) -> zarr.Array:
    """A new array of ``root`` encoded with the checksum codec, writing every chunk it is given."""
    return root.create_array(name, shape=shape, chunks=tuple(max(1, c) for c in chunks), dtype=dtype,
                             compressors=CODECS, config=WRITE_CONFIG)


class ChunkWriter:
    """Writes a new array of ``root`` (``name`` may be a path such as ``splits/heldout/test_rows``) by
    appending rows: chunks of ``chunk_rows`` rows spanning the other axes, each written whole once."""

    def __init__(self, root: zarr.Group, name: str, tail: tuple[int, ...], dtype: object, chunk_rows: int):
        """An empty array of rows shaped ``tail`` (``()`` for a 1-D array)."""
        self.root, self.name, self.tail = root, name, tuple(int(n) for n in tail)
        self.array = create_array(root, name, (0, *self.tail), (chunk_rows, *self.tail), dtype)
        self.chunk_rows = int(self.array.chunks[0])
        row_bytes = self.array.dtype.itemsize * math.prod(self.tail) if self.array.dtype.kind not in "TUO" else 64
        self.flush_rows = max(self.chunk_rows, FLUSH_BYTES // max(1, row_bytes))
        self.pending: list[np.ndarray] = []
        self.pending_rows = 0
        self.rows = 0
        self.records: list[tuple[int, int]] = []

    def append(self, values: object) -> None:
        """Append rows; complete chunks are written once about ``FLUSH_BYTES`` of them are held."""
        values = np.asarray(values, dtype=self.array.dtype)
        if values.shape[1:] != self.tail:
            raise ValueError(f"rows of shape {values.shape[1:]} appended to array {self.name!r} of rows {self.tail}")
        self.pending.append(values)
        self.pending_rows += len(values)
        if self.pending_rows >= self.flush_rows:
            self._flush(final=False)

    def finish(self) -> int:
        """Write what is held (the last chunk may be short) and the chunk records; the number of rows."""
        self._flush(final=True)
        records = np.array(self.records, dtype=np.int64).reshape(-1, 2)
        out = create_array(self.root, f"{RECORDS}/{self.name}", records.shape,
                           (min(len(records), RECORD_CHUNK), 2), np.int64)
        if len(records):
            out[:] = records
        return self.rows

    def _flush(self, final: bool) -> None:
        """Write the held rows that fill complete chunks (all of them if ``final``); keep the rest."""
        if not self.pending:
            return
        held = self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)
        n = len(held) if final else len(held) // self.chunk_rows * self.chunk_rows
        if n:
            self._write(held[:n])
        rest = held[n:]
        self.pending = [rest.copy()] if len(rest) else []
        self.pending_rows = len(rest)

    def _write(self, values: np.ndarray) -> None:
        """Write rows starting at a chunk boundary, growing the array to hold them; record their chunks."""
        start, stop = self.rows, self.rows + len(values)
        self.array.resize((stop, *self.tail))
        self.array[start:stop] = values
        for lo in range(0, len(values), self.chunk_rows):
            chunk = values[lo:lo + self.chunk_rows]
            self.records.append((chunk.size, checksum(chunk)))
        self.rows = stop


def write_array(root: zarr.Group, name: str, values: object, chunk_rows: int) -> None:
    """Write a whole array at once through a ``ChunkWriter`` (chunks of ``chunk_rows`` rows)."""
    values = np.asarray(values)
    writer = ChunkWriter(root, name, values.shape[1:], values.dtype, chunk_rows)
    writer.append(values)
    writer.finish()


class ChunkCache:
    """The verified chunks an array read last, up to ``limit`` bytes, safe to share between task threads.
    Neighbouring blocks of rows share chunks (a CSR block starts in the chunk where the one before ends,
    and one ``indptr`` chunk spans thousands of rows), so each is fetched and verified once."""

    def __init__(self, limit: int):
        self.limit, self.size = limit, 0
        self.held: OrderedDict[int, np.ndarray] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, c: int) -> np.ndarray | None:
        """Chunk ``c`` if held (callers copy what they hand on; held chunks are never changed)."""
        with self.lock:
            values = self.held.get(c)
            if values is not None:
                self.held.move_to_end(c)
            return values

    def put(self, c: int, values: np.ndarray) -> None:
        """Hold chunk ``c``, dropping the least recently used ones beyond the limit."""
        if values.nbytes > self.limit:
            return
        with self.lock:
            if c in self.held:
                return
            self.held[c] = values
            self.size += values.nbytes
            while self.size > self.limit:
                self.size -= self.held.popitem(last=False)[1].nbytes


class CheckedArray:
    """An array of a dataset store whose reads are verified chunk by chunk against its records."""

    def __init__(self, where: str, name: str, array: zarr.Array, records: np.ndarray,
                 present: Callable[[str], bool]):
        """``where`` names the store in messages; ``present(key)`` tells whether a store key has an object."""
        self.where, self.name, self.array, self.present = where, name, array, present
        self.n_rows, self.tail = int(array.shape[0]), tuple(array.shape[1:])
        self.chunk_rows = int(array.chunks[0])
        self.n_chunks = -(-self.n_rows // self.chunk_rows)
        entries = [min(self.chunk_rows, self.n_rows - c * self.chunk_rows) * math.prod(self.tail)
                   for c in range(self.n_chunks)]
        if any(c < n for c, n in zip(array.chunks[1:], self.tail)) or records.shape != (self.n_chunks, 2) \
                or not np.array_equal(records[:, 0], entries):
            raise StoreError(f"{where}: the chunk records of array {name!r} do not match the array (partial upload "
                             f"or damaged store); {REDO}")
        self.crc = records[:, 1]
        self._fill_crc: dict[tuple[int, ...], int] = {}
        self.cache = ChunkCache(CACHE_BYTES)
        self.fetching = threading.Lock()

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n_rows, *self.tail)

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) (a new array), from whole chunks: those not in the cache are fetched in one
        read and verified once (reads of this array by other threads wait)."""
        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        if stop <= start:
            return np.empty((0, *self.tail), dtype=self.array.dtype)
        first, last = start // self.chunk_rows, -(-stop // self.chunk_rows)
        with self.fetching:  # one read at a time, so a chunk that two task threads both need is fetched once
            chunks = {c: self.cache.get(c) for c in range(first, last)}
            missing = [c for c, values in chunks.items() if values is None]
            if missing:
                chunks.update(self._fetch(missing[0], missing[-1] + 1))
        values = chunks[first] if last == first + 1 else np.concatenate([chunks[c] for c in range(first, last)])
        lo = first * self.chunk_rows
        return values[start - lo:stop - lo].copy()

    def _fetch(self, first: int, last: int) -> dict[int, np.ndarray]:
        """Chunks ``first..last - 1``, read in one request of the store, verified and cached."""
        lo, hi = first * self.chunk_rows, min(last * self.chunk_rows, self.n_rows)
        try:
            values = self.array[lo:hi]
        except DECODE_ERRORS:
            self._raise_for_damaged(first, last)
            raise
        fetched = {}
        for c in range(first, last):
            chunk = values[c * self.chunk_rows - lo:(c + 1) * self.chunk_rows - lo]
            self._check(c, chunk)
            fetched[c] = chunk if last == first + 1 else chunk.copy()
            self.cache.put(c, fetched[c])
        return fetched

    def _check(self, c: int, values: np.ndarray) -> None:
        """Chunk ``c`` holds what was written: its checksum, and its object where the checksum cannot tell."""
        crc = checksum(values)
        if crc != self.crc[c]:
            raise self._error(c, "missing (partial upload or deleted object)" if not self._stored(c)
                              else "corrupted (its entries differ from the store's record)")
        if crc == self._fill_checksum(values.shape) and not self._stored(c):
            raise self._error(c, "missing (partial upload or deleted object)")

    def _raise_for_damaged(self, first: int, last: int) -> None:
        """Find the chunk among ``first..last - 1`` that fails to decode and raise its error."""
        for c in range(first, last):
            try:
                self.array[c * self.chunk_rows:(c + 1) * self.chunk_rows]
            except DECODE_ERRORS:
                raise self._error(c, "corrupted (it fails its checksum or cannot be decoded)") from None

    def _stored(self, c: int) -> bool:
        """Whether chunk ``c`` has an object in the store."""
        key = self.array.metadata.encode_chunk_key((c, *[0] * len(self.tail)))
        return self.present(f"{self.array.path}/{key}")

    def _fill_checksum(self, shape: tuple[int, ...]) -> int:
        """The checksum of a chunk of this shape that holds only the fill value (what a lost chunk reads as)."""
        if shape not in self._fill_crc:
            self._fill_crc[shape] = checksum(np.full(shape, self.array.fill_value, dtype=self.array.dtype))
        return self._fill_crc[shape]

    def _error(self, c: int, what: str) -> StoreError:
        return StoreError(f"{self.where}: chunk {c} of array {self.name!r} is {what}; {REDO}")

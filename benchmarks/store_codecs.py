"""The compression of dataset stores: each candidate codec on the CSR arrays of a real store, written to and read
back from memory, for the choice of ``data.chunks.CODECS``.

For every codec: seconds and CPU seconds to write the first ``--entries`` of ``indices`` (int32) and ``data``
(float32) in the store's chunk size, the same to read them back, and the bytes stored. Each codec is followed by
the CRC-32C checksum codec, as in the stores. The arrays read back are compared with the originals.

    python benchmarks/store_codecs.py STORE [--entries 20000000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import zarr
import zarr.storage
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record  # noqa: E402

from buffet.data.store import NNZ_CHUNK  # noqa: E402

CANDIDATES = {
    "zstd level 3 (zarr's default)": ZstdCodec(level=0),
    "zstd level 1": ZstdCodec(level=1),
    "blosc zstd 1, byte shuffle": BloscCodec(cname="zstd", clevel=1, shuffle="shuffle"),
    "blosc zstd 1, bit shuffle": BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"),
    "blosc lz4 5, byte shuffle": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    "none": None,
}


def clocks() -> tuple[float, float]:
    """Wall and process CPU seconds (CPU counts zarr's codec threads too)."""
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    """Wall and CPU seconds since ``start``."""
    wall, cpu = clocks()
    return wall - start[0], cpu - start[1]


def measure(name: str, codec: object, arrays: dict[str, np.ndarray]) -> dict:
    """Write ``arrays`` with ``codec`` (then the checksum) to a memory store, read them back, compare."""
    store = zarr.storage.MemoryStore()
    root = zarr.open_group(store, mode="w")
    compressors = (codec, Crc32cCodec()) if codec is not None else (Crc32cCodec(),)
    start = clocks()
    for key, values in arrays.items():
        out = root.create_array(key, shape=values.shape, chunks=(NNZ_CHUNK,), dtype=values.dtype,
                                compressors=compressors)
        out[:] = values
    write = since(start)
    start = clocks()
    back = {key: root[key][:] for key in arrays}
    read = since(start)
    for key, values in arrays.items():
        np.testing.assert_array_equal(back[key], values)
    stored = sum(len(value) for value in store._store_dict.values())
    return {"codec": name, "write_s": write[0], "write_cpu_s": write[1], "read_s": read[0], "read_cpu_s": read[1],
            "stored_mb": stored / 2**20, "raw_mb": sum(v.nbytes for v in arrays.values()) / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="a counts store (csr layout), e.g. one `buffet ingest uci` wrote")
    p.add_argument("--entries", type=int, default=20_000_000)
    p.add_argument("--repeat", type=int, default=2, help="rounds over all codecs, one after the other")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()
    group = zarr.open_group(args.store, mode="r")
    arrays = {key: np.asarray(group[key][:args.entries]) for key in ("indices", "data")}
    base = {"bench": "store_codecs", "machine": machine(), "store": args.store, "entries": len(arrays["indices"])}
    for round_ in range(1, args.repeat + 1):
        for name, codec in CANDIDATES.items():
            record(args.results, {**base, "round": round_, **measure(name, codec, arrays)})


if __name__ == "__main__":
    main()

"""Issue 3 scale benchmark: IMF on a masked 100k x 1000 linear-Gaussian matrix with K+ = 10.

Data (SPEC 3.1 model): Z ~ Bernoulli(0.3) (N x 10), A ~ N(0, 1) (10 x D), X = Z A + N(0, 0.25)
noise; ``--missing`` of the entries are missing (the mask) and 1% of the observed ones are held
out as the store's split. The store is written with ``buffet.data.arrays.from_array`` in row
chunks of ``--chunk-rows``; the fit runs as the ``buffet fit imf`` command in a subprocess on
the embedded LocalCluster (rows streamed as chunk tasks), with wall time and the peak resident
memory summed over its process tree (``common.run_measured``); ``buffet evaluate`` then gives
K+ and the held-out RMSE.

    python benchmarks/imf_masked_scale.py --workdir bench-data/imf-scale [--rows 100000] [--n-candidates 3]

One JSON line per stage is appended to benchmarks/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.splits import add_split, holdout_entries

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record, run_measured

BUFFET = str(Path(sys.executable).with_name("buffet"))
TRUE_K = 10
NOISE_VAR = 0.25


def write_masked_store(path: Path, rows: int, cols: int, missing: float, chunk_rows: int, seed: int) -> dict:
    """The module docstring's data as a dense store with a mask and a 1% held-out split."""
    rng = np.random.default_rng(seed)
    z = (rng.random((rows, TRUE_K)) < 0.3).astype(np.float64)
    a = rng.standard_normal((TRUE_K, cols))
    x = z @ a + np.sqrt(NOISE_VAR) * rng.standard_normal((rows, cols))
    mask = rng.random((rows, cols)) >= missing
    x[~mask] = np.nan
    ds = from_array(x, path, "real", mask=mask, rows_per_chunk=chunk_rows, overwrite=True)
    add_split(ds, "heldout", {"test_mask": holdout_entries(mask, 0.01, seed)}, {"kind": "entries"})
    return {"rows": rows, "cols": cols, "missing": missing, "observed": int(mask.sum())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("--missing", type=float, default=0.2)
    p.add_argument("--chunk-rows", type=int, default=5000)
    p.add_argument("--max-k", type=int, default=15)
    p.add_argument("--n-candidates", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delete", action="store_true", help="delete the store and the run when done")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store, run = work / f"masked{args.rows}x{args.cols}.zarr", work / f"masked{args.rows}x{args.cols}.run"
    base = {"bench": "imf_masked_scale", "machine": machine()}

    t0 = time.perf_counter()
    data = write_masked_store(store, args.rows, args.cols, args.missing, args.chunk_rows, args.seed)
    record(args.results, {**base, "stage": "write", **data, "seconds": time.perf_counter() - t0})

    res = run_measured([BUFFET, "fit", "imf", str(store), "--out", str(run), "--overwrite", "--max-k",
                        str(args.max_k), "--n-candidates", str(args.n_candidates), "--chunk-rows",
                        str(args.chunk_rows), "--workers", str(args.workers), "--quiet"])
    evaluation = json.loads(subprocess.run([BUFFET, "evaluate", str(run), "--json", "--workers", "1", "--quiet"],
                                           capture_output=True, text=True, check=True).stdout)
    record(args.results, {**base, "stage": "fit", **data, "max_k": args.max_k, "n_candidates": args.n_candidates,
                          "chunk_rows": args.chunk_rows, "workers": args.workers, "true_k": TRUE_K,
                          "seconds": res["seconds"], "peak_rss_mb": res["peak_rss_mb"],
                          "k_plus": evaluation["k_plus"], "heldout_rmse": evaluation.get("rmse"),
                          "noise_sd": float(np.sqrt(NOISE_VAR))})
    if args.delete:
        shutil.rmtree(store)
        shutil.rmtree(run)


if __name__ == "__main__":
    main()

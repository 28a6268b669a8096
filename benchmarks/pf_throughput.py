"""Particle-filter throughput, in particles x rows per second, on 1 and 2 workers.

The linear-Gaussian filter (``buffet fit pf-linear-gaussian``) on N rows of paper 001's four 6x6 images
(noise sd 0.5), P particles in 4 blocks, through the whole CLI on a LocalCluster of 1 or 2 worker
processes. Reports the command's wall time and the filter loop's own time (the run trace), and the
throughput P x N / loop seconds. Same seed, so every run gives the same posterior.

    python benchmarks/pf_throughput.py --rows 100 --particles 1000 --workers 1 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record, run_measured


def main() -> None:
    from buffet.data.arrays import from_array
    from buffet.data.ibp_synthetic import image_data
    from buffet.pipeline.engine.runstore import RunStore

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100)
    p.add_argument("--particles", type=int, default=1000)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--model", default="pf-linear-gaussian", choices=("pf-linear-gaussian",))
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "images.zarr")
        from_array(image_data(np.random.default_rng(0), n_rows=args.rows).X, store, "real")
        for workers in args.workers:
            run = str(Path(tmp) / f"run{workers}")
            cmd = [str(Path(sys.executable).with_name("buffet")), "fit", args.model, store, "--out", run,
                   "--particles", str(args.particles), "--blocks", "4", "--sigma-x", "0.5",
                   "--workers", str(workers), "--quiet"]
            measured = run_measured(cmd)
            loop = RunStore(run).read_checkpoint().state["trace"][-1]["seconds"]
            record(args.results, {"bench": "pf_throughput", "model": args.model, "rows": args.rows,
                                  "particles": args.particles, "workers": workers, "seconds": measured["seconds"],
                                  "loop_seconds": loop, "particle_rows_per_second": args.particles * args.rows / loop,
                                  "peak_rss_mb": measured["peak_rss_mb"], "command": measured["command"],
                                  "machine": machine()})


if __name__ == "__main__":
    main()

"""The Bayesian NMF local step against the size of its padded groups (``kernels.bnmf.GROUP_BYTES``), on one
thread and on several threads of one process, as the default thread workers run it.

    python benchmarks/local_step_groups.py STORE [--group-kib 4096 1536 ...] [--threads 1 2] [--docs 4000]

Topics: the q(beta) that ``profile_local_step.py`` caches next to STORE (20 SVI minibatches); the local
settings of a training step of ``buffet fit bnmf`` with its defaults (``BNMFConfig.local_settings``). The first ``--docs`` documents are cut into blocks of
``--block`` documents (an SVI step's block per worker thread); each block is one ``local_step`` call,
the blocks shared out over ``--threads`` threads with OpenBLAS held to one thread, as on the workers.
Prints, per group size and thread count, the best of ``--repeat`` rounds: wall seconds and CPU
milliseconds per document. The group size changes only the speed: each document's arithmetic does not
depend on the documents it is grouped with.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from buffet.data.store import Dataset
from buffet.kernels import bnmf
from buffet.pipeline.models.bnmf import BNMFConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_local_step import topics_for  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--group-kib", type=int, nargs="+", default=[4096, 1536])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--docs", type=int, default=4000)
    p.add_argument("--block", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    topics = np.load(topics_for(args.store))
    view = bnmf.TopicView.from_params(topics["g"], topics["h"])
    hyper = bnmf.Hyper.paper_defaults(*topics["g"].shape)
    settings = BNMFConfig(n_topics=topics["g"].shape[1]).local_settings()
    data = Dataset(args.store)
    blocks = [data.read_rows(lo, min(lo + args.block, args.docs)) for lo in range(0, args.docs, args.block)]

    def run(rows) -> None:
        bnmf.local_step(rows.indptr, rows.indices, rows.data, view, hyper, settings)

    with threadpool_limits(1):
        for kib in args.group_kib:
            bnmf.GROUP_BYTES = kib << 10
            for threads in args.threads:
                best_wall = best_cpu = float("inf")
                for _ in range(args.repeat):
                    wall, cpu = time.perf_counter(), time.process_time()
                    with ThreadPoolExecutor(threads) as pool:
                        list(pool.map(run, blocks))
                    best_wall = min(best_wall, time.perf_counter() - wall)
                    best_cpu = min(best_cpu, time.process_time() - cpu)
                print(json.dumps({"group_kib": kib, "threads": threads, "docs": args.docs, "block": args.block,
                                  "wall_seconds": round(best_wall, 3),
                                  "cpu_ms_per_doc": round(1000 * best_cpu / args.docs, 4)}), flush=True)


if __name__ == "__main__":
    main()

"""What an SVI step of Bayesian NMF costs outside the local steps, against the size of the corpus.

On a store of many tiny documents (e.g. 1.8M documents of ~3 tokens: 3,600 blocks of 500 rows) the local
steps cost almost nothing, so the wall time of a step is what the driver and the engine spend on it: building
the minibatch's graph, sending it, the round trip, the client's view and update. Prints the seconds to build
the driver and the mean milliseconds per step over ``--steps`` steps after ``--warm-up`` steps, on a fresh
thread LocalCluster of 2 workers (the CLI's default for Bayesian NMF).

    buffet generate --docs 1800000 --length 3 --seed 1 --out tiny.txt
    buffet ingest uci tiny.txt --out tiny.zarr --holdout 0.005
    python benchmarks/svi_step_overhead.py tiny.zarr [--steps 40] [--k 10]
"""

from __future__ import annotations

import argparse
import json
import time

from buffet.pipeline.engine.cluster import dask_client
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.executor_choice import engine_on
from buffet.pipeline.models.bnmf import BNMFConfig
from buffet.pipeline.reports.bnmf import make_driver


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warm-up", type=int, default=10)
    args = p.parse_args()
    config = BNMFConfig(n_topics=args.k, batch_size=1000, eval_every=0)
    with dask_client(2, dashboard=False, quiet=True, worker_kind="threads") as client:
        started = time.perf_counter()
        driver = make_driver(config, source_of(args.store), engine_on(client))
        driver.start()
        built = time.perf_counter() - started
        for step in range(args.warm_up):
            driver.step(step)
        started = time.perf_counter()
        for step in range(args.warm_up, args.warm_up + args.steps):
            driver.step(step)
        per_step = (time.perf_counter() - started) / args.steps
    print(json.dumps({"store": args.store, "driver_seconds": built, "ms_per_step": 1000 * per_step,
                      "steps": args.steps, "k": args.k}))


if __name__ == "__main__":
    main()

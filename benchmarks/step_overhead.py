"""What one engine step costs on a LocalCluster when the blocks hold almost nothing: the executor's own
overhead per step (graph building, submission, the scheduler round trip, bringing the result back).

A step is what a batch fit does every iteration: a local step over 2 blocks of per-block state with a shared
global, kept as the new state, and a reduction of the blocks' statistics brought to the client. The blocks
are 3-element arrays, so the arithmetic is nothing. Prints one JSON line per executor: the median, 10th and
90th percentile milliseconds per step over ``--steps`` steps after ``--warm-up`` steps, and the same for the
in-process executor and for the step written as plain Dask futures on the same cluster (``floor_times``).

    python benchmarks/step_overhead.py [--steps 300] [--warm-up 30]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone

import numpy as np

from buffet.pipeline.engine.cluster import dask_client
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.executor_choice import engine_on


def local_step(state: np.ndarray, shift: float) -> np.ndarray:
    return state + shift


def block_stats(state: np.ndarray) -> dict:
    return {"sum": state.sum(), "n": state.size}


def step_times(engine: Engine, steps: int, warm_up: int) -> list[float]:
    """Milliseconds of each of ``steps`` steps (after ``warm_up`` unmeasured ones)."""
    engine.keep("state", engine.from_values([np.zeros(3), np.ones(3)]))
    times = []
    for i in range(warm_up + steps):
        started = time.perf_counter()
        shift = engine.share(0.5)
        state = engine.keep("state", engine.map(local_step, engine.state("state"), shift))
        engine.reduce(engine.map(block_stats, state))
        if i >= warm_up:
            times.append(1000 * (time.perf_counter() - started))
    return times


def add_stats(a: dict, b: dict) -> dict:
    return {key: a[key] + b[key] for key in a}


def floor_times(client, steps: int, warm_up: int) -> list[float]:
    """The same step as plain futures, with no engine: each block's local step, its statistics, their sum
    brought back. What Dask itself costs for the step's chain of three dependent tasks, the floor an
    engine on it can approach."""
    state = client.scatter([np.zeros(3), np.ones(3)])
    times = []
    for i in range(warm_up + steps):
        started = time.perf_counter()
        state = client.map(local_step, state, [0.5] * len(state), pure=False)
        stats = client.map(block_stats, state, pure=False)
        client.submit(add_stats, *stats, pure=False).result()
        if i >= warm_up:
            times.append(1000 * (time.perf_counter() - started))
    return times


def summary(name: str, times: list[float]) -> dict:
    q10, q50, q90 = np.percentile(times, [10, 50, 90])
    return {"executor": name, "steps": len(times), "median_ms": round(float(q50), 2), "p10_ms": round(float(q10), 2),
            "p90_ms": round(float(q90), 2), "host": platform.node(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warm-up", type=int, default=30)
    args = p.parse_args()
    print(json.dumps(summary("process", step_times(engine_on(None), args.steps, args.warm_up))))
    for kind in ("processes", "threads"):
        with dask_client(2, dashboard=False, quiet=True, worker_kind=kind) as client:
            print(json.dumps(summary(f"LocalCluster of 2 {kind}",
                                     step_times(engine_on(client), args.steps, args.warm_up))), flush=True)
            print(json.dumps(summary(f"LocalCluster of 2 {kind}, plain futures (the floor)",
                                     floor_times(client, args.steps, args.warm_up))), flush=True)


if __name__ == "__main__":
    main()

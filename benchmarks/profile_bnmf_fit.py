"""Where the time of a Bayesian NMF fit goes, phase by phase, in one process.

Times, on the wall clock and in CPU seconds: the imports a `buffet fit bnmf` needs, the start of the
LocalCluster (thread workers, the CLI's default for bnmf), building the driver (store metadata, the
block graph), and then every SVI step split into the client's topic view, the workers' local steps
with the reduction of their statistics (the engine's round trip), and the client's global update.
With thread workers (the default), the workers' CPU is the process's CPU minus the client thread's.

    python benchmarks/profile_bnmf_fit.py STORE [--k 100] [--batch-size 1000] [--set name=value ...]
        [--worker-kind threads|processes] [--steps N] [--switch-interval S]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
C0 = time.process_time()
importlib.import_module("buffet.pipeline.cli")  # what the command imports before it starts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import setting  # noqa: E402

from buffet.pipeline.engine.cluster import dask_client  # noqa: E402
from buffet.pipeline.engine.dataset import source_of  # noqa: E402
from buffet.pipeline.engine.executor_choice import engine_on  # noqa: E402
from buffet.pipeline.models import bnmf as bnmf_model  # noqa: E402
from buffet.pipeline.models.bnmf import BNMFConfig  # noqa: E402
from buffet.pipeline.reports.bnmf import make_driver  # noqa: E402


class Clock:
    """Wall and client-thread CPU seconds spent inside wrapped calls, by name."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def wrap(self, owner: object, name: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            w, c = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
                self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c

        setattr(owner, name, timed)


def main() -> None:
    imports = (time.perf_counter() - T0, time.process_time() - C0)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--set", action="append", default=[], type=setting, metavar="NAME=VALUE",
                   help="any other BNMFConfig setting, e.g. --set kappa=0.7 (repeatable)")
    p.add_argument("--worker-kind", choices=["threads", "processes"], default="threads",
                   help="the LocalCluster's workers: 2 threads in this process (the CLI's default) or 2 processes")
    p.add_argument("--steps", type=int, default=None, help="time only the first N SVI steps (default: one pass)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="the interpreter's GIL switch interval in seconds (sys.setswitchinterval; default 0.005)")
    args = p.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    config = BNMFConfig(n_topics=args.k, batch_size=args.batch_size, eval_every=0, **dict(args.set))
    clock = Clock()
    for name in ("local_view", "stochastic_update"):
        clock.wrap(bnmf_model.BNMF, name)
    out = {"imports": imports}
    w, c = time.perf_counter(), time.process_time()
    with dask_client(2, dashboard=False, quiet=True, worker_kind=args.worker_kind) as client:
        out["cluster_start"] = (time.perf_counter() - w, time.process_time() - c)
        engine = engine_on(client)
        clock.wrap(engine, "reduce")
        w, c = time.perf_counter(), time.process_time()
        driver = make_driver(config, source_of(args.store), engine)
        driver.start()
        out["driver"] = (time.perf_counter() - w, time.process_time() - c)
        w, c, ct = time.perf_counter(), time.process_time(), time.thread_time()
        steps = driver.total_steps() if args.steps is None else min(args.steps, driver.total_steps())
        for step in range(steps):
            driver.step(step)
        loop_wall, loop_cpu, client_cpu = time.perf_counter() - w, time.process_time() - c, time.thread_time() - ct
        w = time.perf_counter()
    out["cluster_stop"] = (time.perf_counter() - w, None)
    out["loop"] = (loop_wall, loop_cpu)
    out["steps"] = steps
    out["worker_kind"] = args.worker_kind
    out["switch_interval"] = sys.getswitchinterval()
    out["loop_client_thread_cpu"] = client_cpu
    # worker processes spend CPU outside this process, where process_time does not see it
    out["loop_workers_cpu"] = loop_cpu - client_cpu if args.worker_kind == "threads" else None
    out["per_call"] = {name: {"wall": clock.wall[name], "client_cpu": clock.cpu[name]} for name in clock.wall}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

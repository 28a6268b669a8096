"""What worker processes cost a topic model, and what the engine's worker settings buy.

``malloc``: one correlated-NMF local step (the first --docs documents of a count store, at the globals after
the first SVI step, the training settings, one BLAS thread) timed in a fresh interpreter per setting of glibc's
malloc: none (a command's own process), Dask's nanny default (MALLOC_TRIM_THRESHOLD_=65536), the trim
threshold alone at 256 MiB (the engine's worker setting until 2026-11-27), and that with MALLOC_MMAP_THRESHOLD_
at 32 MiB (the engine's ``WORKER_MALLOC`` now). Any malloc setting in the environment pins glibc's mmap
threshold at 128 KiB, so every larger temporary array is mapped afresh and page-faults on first use.

``passes``: --passes SVI passes of a model, one after the other on one LocalCluster of 2 workers of each
--kinds (the first pass includes the workers' imports), documents/s of each pass and, on worker processes, how
many of its steps ran every block on one worker (Dask's task stream). Run it with another checkout's code first
on PYTHONPATH to compare engines.

    python benchmarks/worker_processes.py malloc --store S --rounds 3
    python benchmarks/worker_processes.py passes --store S --model cnmf --kinds processes threads --passes 3

``share``: what sharing a step's globals (``DaskEngine.share``) costs the client as the workers grow: on a
LocalCluster of --workers worker processes, --repeats shares of --megabytes of float64 (80 MB are the
globals of K 100 at V 100,000), each until every worker holds its copy; the client's CPU and wall seconds per
share, and the bytes the workers sent each other. Run it with another checkout's code first on PYTHONPATH to
compare engines.

    python benchmarks/worker_processes.py share --workers 8 --megabytes 80 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record

LONG_TASK = 0.05  # seconds: a block's local step takes longer, Dask's bookkeeping tasks do not
MALLOC_SETTINGS = {
    "none": {},
    "dask default": {"MALLOC_TRIM_THRESHOLD_": "65536"},
    "trim 256 MiB": {"MALLOC_TRIM_THRESHOLD_": str(256 << 20)},
    "trim 256 MiB, mmap 32 MiB": {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)},
}


def config(model: str, batch_size: int, passes: int):
    """The model's CLI defaults at K 100 (CNMF m 50), minibatch ``batch_size``, chunks for 2 workers."""
    from buffet.pipeline.models.bnmf import BNMFConfig
    from buffet.pipeline.models.cnmf import CNMFConfig

    common = {"n_topics": 100, "batch_size": batch_size, "passes": passes, "seed": 0, "chunk_rows": batch_size // 2}
    return CNMFConfig(**common, n_dims=50) if model == "cnmf" else BNMFConfig(**common)


def local_step_seconds(store: str, docs: int, repeats: int) -> list[float]:
    """CPU seconds of ``repeats`` correlated-NMF local steps on the first ``docs`` documents, at the globals
    after the first SVI step (this process, one BLAS thread)."""
    from buffet.data.store import Dataset
    from buffet.kernels import bnmf, cnmf
    from buffet.pipeline.engine.blas import single_threaded_blas
    from buffet.pipeline.engine.dataset import source_of
    from buffet.pipeline.engine.executor_choice import engine_on
    from buffet.pipeline.registry import spec_for

    with single_threaded_blas():
        driver = spec_for("cnmf").make_driver(config("cnmf", 1000, 1), source_of(store), engine_on(None))
        driver.eval_rows = None
        driver.start()
        driver.step(0)
        rows = Dataset(store).read_rows(0, docs).to_scipy().tocsr()
        view = bnmf.TopicView.from_params(driver.state.g, driver.state.h)
        seconds = []
        for _ in range(repeats):
            t0 = time.process_time()
            cnmf.local_step(rows.indptr, rows.indices, rows.data, view, driver.state.L, driver.config.local_settings())
            seconds.append(time.process_time() - t0)
    return seconds


def malloc(args: argparse.Namespace) -> None:
    """Each malloc setting in a fresh interpreter, the settings alternated ``--rounds`` times."""
    for round_ in range(args.rounds):
        for name, environ in MALLOC_SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
            out = subprocess.run([sys.executable, __file__, "local-step", "--store", args.store, "--docs",
                                  str(args.docs), "--repeats", str(args.repeats)],
                                 env={**env, **environ, "OPENBLAS_NUM_THREADS": "1"}, capture_output=True, text=True,
                                 check=True)
            seconds = [float(s) for s in out.stdout.split()]
            print(f"round {round_}, {name}: " + ", ".join(f"{s:.3f}" for s in seconds), flush=True)
            record(args.results, {"bench": "worker_processes", "stage": "malloc", "tag": args.tag, "store": args.store,
                                  "docs": args.docs, "round": round_, "setting": name, "environ": environ,
                                  "cpu_seconds": seconds, "machine": machine()})


def one_worker_steps(stream: list[dict], bounds: list[tuple[float, float]]) -> int:
    """How many steps (their wall-clock ``bounds``) had every task of LONG_TASK seconds or more on one worker, from
    Dask's task stream: the steps whose blocks ran one after another while the other workers idled."""
    count = 0
    for start, stop in bounds:
        workers = {task["worker"] for task in stream for part in task["startstops"]
                   if part["action"] == "compute" and part["stop"] - part["start"] >= LONG_TASK
                   and start <= part["start"] < stop}
        count += len(workers) == 1
    return count


def passes(args: argparse.Namespace) -> None:
    """``--passes`` passes of ``--model`` on a LocalCluster of each kind in ``--kinds``: documents/s of each pass
    and, on worker processes, how many of its steps ran all their blocks on one worker."""
    from distributed import get_task_stream

    from buffet.pipeline.engine.cluster import dask_client
    from buffet.pipeline.engine.dataset import source_of
    from buffet.pipeline.engine.executor_choice import engine_on
    from buffet.pipeline.registry import spec_for

    for kind in args.kinds:
        with dask_client(2, dashboard=False, quiet=True, worker_kind=kind) as client:
            rates, piled = [], []
            for _ in range(args.passes):
                driver = spec_for(args.model).make_driver(config(args.model, args.batch_size, 1), source_of(args.store),
                                                          engine_on(client))
                driver.eval_rows = None
                driver.start()
                bounds = []
                with get_task_stream(client) as stream:
                    t0 = time.perf_counter()
                    for step in range(driver.total_steps()):
                        began = time.time()
                        driver.step(step)
                        bounds.append((began, time.time()))
                    rates.append(driver.corpus.n_train / (time.perf_counter() - t0))
                piled.append(one_worker_steps(stream.data, bounds) if kind == "processes" else None)
        print(f"{args.model} on {kind}: " + ", ".join(f"{r:,.0f}" for r in rates) + " documents/s"
              + ("" if kind != "processes" else f"; steps with every block on one worker: {piled} of {len(bounds)}"),
              flush=True)
        record(args.results, {"bench": "worker_processes", "stage": "passes", "tag": args.tag, "store": args.store,
                              "model": args.model, "worker_kind": kind, "batch_size": args.batch_size,
                              "docs_per_second": rates, "one_worker_steps": piled, "steps": len(bounds),
                              "machine": machine()})


def share(args: argparse.Namespace) -> None:
    """``--repeats`` shares of ``--megabytes`` on ``--workers`` worker processes: client CPU and wall seconds."""
    import numpy as np
    from distributed import wait

    from buffet.pipeline.engine.cluster import dask_client
    from buffet.pipeline.engine.executor_choice import engine_on

    value = np.random.default_rng(0).random(args.megabytes * (1 << 20) // 8)
    with dask_client(args.workers, dashboard=False, quiet=True, worker_kind="processes") as client:
        engine = engine_on(client)
        wait(list(engine.share(np.zeros(1)).value))  # connections to every worker made
        cpu, wall, sent = [], [], []
        for _ in range(args.repeats):
            before = sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())
            c0, t0 = time.process_time(), time.perf_counter()
            copies = engine.share(value).value
            wait(list(copies))
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
            sent.append(sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())
                        - before)
            del copies
    print(f"share of {args.megabytes} MB on {args.workers} workers: client CPU s "
          + ", ".join(f"{c:.3f}" for c in cpu) + "; wall s " + ", ".join(f"{w:.3f}" for w in wall)
          + f"; sent between workers {np.mean(sent) / 2**20:.0f} MB a share", flush=True)
    record(args.results, {"bench": "worker_processes", "stage": "share", "tag": args.tag, "workers": args.workers,
                          "megabytes": args.megabytes, "client_cpu_seconds": cpu, "wall_seconds": wall,
                          "bytes_between_workers": sent, "machine": machine()})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("malloc", "passes", "share", "local-step"))
    p.add_argument("--store", help="malloc, passes: a count store with a 'heldout' split (cnmf_vs_bnmf.py's)")
    p.add_argument("--docs", type=int, default=500, help="malloc: documents of the local step")
    p.add_argument("--repeats", type=int, default=3, help="malloc: local steps per interpreter; share: shares timed")
    p.add_argument("--rounds", type=int, default=2, help="malloc: alternations of the settings")
    p.add_argument("--model", choices=("cnmf", "bnmf"), default="cnmf")
    p.add_argument("--kinds", nargs="+", choices=("threads", "processes"), default=["processes", "threads"])
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--workers", type=int, default=8, help="share: worker processes")
    p.add_argument("--megabytes", type=int, default=80, help="share: size of the shared value")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    p.add_argument("--tag", default="")
    args = p.parse_args()
    if args.what == "local-step":  # the malloc stage's child process: CPU seconds on stdout
        print(" ".join(f"{s:.4f}" for s in local_step_seconds(args.store, args.docs, args.repeats)))
    else:
        if args.store is None and args.what != "share":
            p.error(f"{args.what} needs --store")
        {"malloc": malloc, "passes": passes, "share": share}[args.what](args)


if __name__ == "__main__":
    main()

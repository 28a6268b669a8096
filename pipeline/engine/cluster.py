"""Connecting to Dask: an embedded LocalCluster by default, or an existing scheduler (SPEC 2)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import distributed
    import threadpoolctl

from buffet.data.errors import UserError
from buffet.data.urls import storage_options
from buffet.pipeline.engine.messages import logger

# Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, so every freed temporary above 64 KiB
# goes back to the system and page-faults on its next use; block kernels allocate such arrays
# per task, which measured 10-20% slower (benchmarks/README.md). 256 MiB keeps them mapped.
WORKER_MALLOC_TRIM_THRESHOLD = str(256 << 20)

# How the embedded LocalCluster runs block tasks: "processes" are single-threaded worker
# processes (right for kernels that hold the GIL in Python loops: the samplers, the particle
# filters); "threads" are threads of this process (right for kernels that spend their time in
# NumPy calls, which release the GIL: globals are then shared, not serialised to every worker).
WORKER_KINDS = ("processes", "threads")
DASHBOARD_ADDRESS = "127.0.0.1:0"  # this machine only, a free port: no one else reaches the cluster's dashboard


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, dashboard: bool = True,
                quiet: bool = False, worker_kind: str = "processes") -> Iterator["distributed.Client"]:
    """A ``distributed.Client``: on ``scheduler`` if given (or configured: ``configured_scheduler``; reaching it
    may take Dask's ``distributed.comm.timeouts.connect``, 30 s unless set otherwise), else
    on a new LocalCluster with ``workers`` single-threaded worker processes or, with
    ``worker_kind="threads"``, one worker of ``workers`` threads inside this process (default: one per
    core). Prints the dashboard address so a user can watch the tasks. The workers get this process's
    storage options (``data.urls``)."""
    import dask
    from distributed import Client

    if worker_kind not in WORKER_KINDS:
        raise UserError(f"worker kind must be one of {', '.join(WORKER_KINDS)}, got {worker_kind!r}")
    scheduler = scheduler or configured_scheduler()
    with contextlib.ExitStack() as stack:
        if scheduler:
            try:
                client = Client(scheduler, timeout=dask.config.get("distributed.comm.timeouts.connect"))
            except OSError as exc:
                raise UserError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        else:
            if workers is not None and workers < 1:
                raise UserError(f"--workers must be >= 1, got {workers}")
            if worker_kind == "threads":
                stack.enter_context(single_threaded_blas())
            cluster = stack.enter_context(local_cluster(workers, worker_kind, dashboard))
            client = Client(cluster)
        stack.callback(client.close)
        if storage_options():
            from buffet.pipeline.engine.worker_setup import StorageOptions

            client.register_plugin(StorageOptions(storage_options()))
        if not quiet and client.dashboard_link:
            logger("cluster").info("Dask dashboard: %s", client.dashboard_link)
        yield client


def configured_scheduler() -> str | None:
    """The scheduler the environment names, as Dask itself reads it: Dask's ``scheduler-address``
    setting, which the DASK_SCHEDULER_ADDRESS environment variable sets."""
    import dask

    return dask.config.get("scheduler-address", None) or os.environ.get("DASK_SCHEDULER_ADDRESS") or None


def local_cluster(workers: int | None, worker_kind: str, dashboard: bool) -> "distributed.LocalCluster":
    """The embedded LocalCluster: ``workers`` worker processes of one thread, or one in-process
    worker of ``workers`` threads (``worker_kind``); ``None`` means one per core."""
    import dask
    from distributed import LocalCluster

    # A failed task reaches the client, which reports it in one line (its traceback with --debug); the
    # workers' own "Compute Failed" log of it would print that traceback on every failure.
    common = {"dashboard_address": DASHBOARD_ADDRESS if dashboard else None, "silence_logs": logging.CRITICAL}
    if worker_kind == "threads":
        return LocalCluster(n_workers=1, threads_per_worker=workers or os.cpu_count() or 1, processes=False,
                            **common)
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_":
                          WORKER_MALLOC_TRIM_THRESHOLD}):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                            preload=["buffet.pipeline.engine.worker_setup"], **common)


@functools.lru_cache(maxsize=1)
def blas_controller() -> "threadpoolctl.ThreadpoolController":
    """This process's BLAS thread pools, inspected once (``threadpool_limits`` re-inspects them at every call)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def single_threaded_blas() -> contextlib.AbstractContextManager:
    """BLAS limited to one thread in this process while task threads run, as Dask's nannies do for
    worker processes (OMP/OPENBLAS/MKL_NUM_THREADS=1): two task threads each calling a BLAS that
    starts threads of its own would oversubscribe the cores."""
    return blas_controller().limit(limits=1, user_api="blas")

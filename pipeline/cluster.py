"""Connecting to Dask: an embedded LocalCluster by default, or an existing scheduler (SPEC 2)."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import distributed

from buffet.data.errors import UserError

# Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, so every freed temporary above 64 KiB
# goes back to the system and page-faults on its next use; block kernels allocate such arrays
# per task, which measured 10-20% slower (benchmarks/README.md). 256 MiB keeps them mapped.
WORKER_MALLOC_TRIM_THRESHOLD = str(256 << 20)


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None,
                dashboard: bool = True, quiet: bool = False) -> Iterator["distributed.Client"]:
    """A ``distributed.Client``: on ``scheduler`` if given, else on a new LocalCluster with
    ``workers`` single-threaded worker processes (default: one per core). Prints the
    dashboard address so a user can watch the tasks."""
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            client = Client(scheduler, timeout="10s")
        except OSError as exc:
            raise UserError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        cluster = None
    else:
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be >= 1, got {workers}")
        import dask

        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_":
                              WORKER_MALLOC_TRIM_THRESHOLD}):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=":0" if dashboard else None,
                                   silence_logs=logging.ERROR)
        client = Client(cluster)
    try:
        if not quiet and client.dashboard_link:
            print(f"Dask dashboard: {client.dashboard_link}", file=sys.stderr)
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

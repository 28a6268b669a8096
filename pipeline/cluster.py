"""Connecting to Dask: an embedded LocalCluster by default, or an existing scheduler (SPEC 2)."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

from buffet.data.errors import UserError


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

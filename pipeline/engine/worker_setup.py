"""Set-up run inside the processes of a Dask cluster.

``dask_setup`` runs in every worker process of the embedded LocalCluster (a Dask worker preload).
Ctrl-C in a terminal sends SIGINT to the whole foreground process group, worker processes included.
The command (the client) handles it: it marks the run interrupted and closes the cluster. Workers
ignore it, so they do not print their own ``KeyboardInterrupt`` tracebacks while the cluster closes.

``StorageOptions`` gives the workers of any cluster the storage options the command was given
(``--storage-options``, ``data.urls``): workers started elsewhere do not inherit them.

``PromptScheduler`` and ``cluster.prompt_messages`` shorten the time Dask's message streams wait to batch
messages to ``MESSAGE_INTERVAL`` (Dask's own: 10 ms from the client, 5 ms from the scheduler to a worker; 2 ms
back, as here). A fit makes a round trip or two per step with a handful of tasks each, so those waits were
most of a small step: a trivial task's round trip on a LocalCluster took 10.5 ms, and 3 ms with them
shortened (docs/performance.md, "Start-up and small fits").
"""

from __future__ import annotations

import signal
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from buffet.data.urls import set_default_storage_options

MESSAGE_INTERVAL = 0.002  # seconds a Dask message stream waits to batch messages (a worker's own wait)


def dask_setup(worker: object) -> None:
    """Dask's preload hook: leave SIGINT to the client process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class StorageOptions(WorkerPlugin):
    """Makes the client's storage options the default of every worker, present and future."""

    name = "buffet-storage-options"

    def __init__(self, options: dict[str, Any]):
        self.options = options

    def setup(self, worker: object) -> None:
        set_default_storage_options(self.options)


def prompt(stream: object) -> None:
    """Make a Dask ``BatchedSend`` stream wait ``MESSAGE_INTERVAL`` to batch messages (a stream of another
    make, in a Dask version without the attribute, is left as it is)."""
    if hasattr(stream, "interval"):
        stream.interval = MESSAGE_INTERVAL


class PromptScheduler(SchedulerPlugin):
    """The scheduler of this process's LocalCluster sends its messages promptly to every worker that joins
    later (module docstring; ``cluster.prompt_messages`` sees to the present ones)."""

    name = "buffet-prompt-messages"

    def add_worker(self, scheduler: object, worker: str) -> None:
        prompt(getattr(scheduler, "stream_comms", {}).get(worker))

"""Set-up run inside worker processes.

``dask_setup`` runs in every worker process of the embedded LocalCluster (a Dask worker preload).
Ctrl-C in a terminal sends SIGINT to the whole foreground process group, worker processes included.
The command (the client) handles it: it marks the run interrupted and closes the cluster. Workers
ignore it, so they do not print their own ``KeyboardInterrupt`` tracebacks while the cluster closes.

``StorageOptions`` gives the workers of any cluster the storage options the command was given
(``--storage-options``, ``data.urls``): workers started elsewhere do not inherit them.
"""

from __future__ import annotations

import signal
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from buffet.data.urls import set_default_storage_options


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

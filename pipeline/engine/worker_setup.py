"""Set-up run inside every worker process of the embedded LocalCluster (a Dask worker preload).

Ctrl-C in a terminal sends SIGINT to the whole foreground process group, worker processes included.
The command (the client) handles it: it marks the run interrupted and closes the cluster. Workers
ignore it, so they do not print their own ``KeyboardInterrupt`` tracebacks while the cluster closes.
"""

from __future__ import annotations

import signal


def dask_setup(worker: object) -> None:
    """Dask's preload hook: leave SIGINT to the client process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

"""A Dask cluster started by hand, as a user would on a cluster of machines: `dask scheduler` and `dask
worker` processes, each in a folder of its own, on 127.0.0.1; workers can be killed and added ("remote"
clusters and worker-loss tests use real processes, never mocks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence


class HandStartedCluster:
    """A scheduler and workers as separate processes started in their own folders under ``root``."""

    def __init__(self, root: Path, env: dict | None = None, worker_options: Sequence[str] = ()):
        """``env``: the processes' whole environment (default: this process's); ``worker_options``: more
        options of every `dask worker` command (e.g. ``--preload``)."""
        self.root = root
        self.env = dict(os.environ if env is None else env)
        self.worker_options = list(worker_options)
        self.workers: list[subprocess.Popen] = []
        folder = root / "scheduler"
        folder.mkdir(parents=True)
        self.scheduler_file = folder / "scheduler.json"
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(self.scheduler_file)],
            cwd=folder, env=self.env, stdout=subprocess.DEVNULL, stderr=open(folder / "log.txt", "w"),
            start_new_session=True)
        self.address = self._wait_for_address()

    def _wait_for_address(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.scheduler_file.exists():
                try:
                    return json.loads(self.scheduler_file.read_text())["address"]
                except (ValueError, KeyError):
                    pass
            assert self.scheduler.poll() is None, (self.root / "scheduler" / "log.txt").read_text()
            time.sleep(0.1)
        raise TimeoutError("the scheduler wrote no address")

    def add_worker(self, nthreads: int = 1, nanny: bool = False) -> subprocess.Popen:
        """One more `dask worker` process in a folder of its own. Without a nanny a killed worker stays
        dead; with one (``nanny=True``, the returned process is the nanny) a new worker process replaces it."""
        folder = self.root / f"worker-{len(self.workers)}"
        folder.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", str(nthreads),
             "--nanny" if nanny else "--no-nanny", "--no-dashboard", "--name", folder.name,
             "--local-directory", str(folder), *self.worker_options],
            cwd=folder, env=self.env, stdout=subprocess.DEVNULL, stderr=open(folder / "log.txt", "w"),
            start_new_session=True)
        self.workers.append(proc)
        return proc

    def wait_for_workers(self, n: int, timeout: float = 60.0) -> None:
        from distributed import Client

        with Client(self.address, timeout="20s") as client:
            client.wait_for_workers(n, timeout=timeout)

    def kill_worker_process(self, nanny: subprocess.Popen) -> None:
        """SIGKILL the worker process that ``nanny`` runs (the nanny starts a new one)."""
        import psutil

        children = psutil.Process(nanny.pid).children()
        assert children, "the nanny runs no worker process"
        for child in children:
            child.send_signal(signal.SIGKILL)

    def kill_worker(self, worker: subprocess.Popen) -> None:
        """SIGKILL ``worker`` and everything it started (it does not come back)."""
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()

    def close_workers(self) -> None:
        """Kill every worker started so far."""
        for proc in self.workers:
            if proc.poll() is None:
                self.kill_worker(proc)

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

"""A gate that holds a fit at a step the test chooses, so that the test can kill workers while the fit is
still running however fast it is, with no hook in buffet itself.

The gate is a JSON file naming a run folder and a step. Workers started with this file as their
``--preload`` (``dask_setup``) run every task only when the gate is open: while the run has a checkpoint
of that step or a later one, a task waits in its worker thread before it starts (the worker itself
stays responsive, it heartbeats and can be killed). The fit's client writes the checkpoint of step N
after the step's last task and before it submits step N + 1, so a gate at N lets the fit write that
checkpoint and then holds it inside step N + 1 until the test moves the gate on or removes it."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from distributed.threadpoolexecutor import ThreadPoolExecutor

GATE_VARIABLE = "BUFFET_TEST_STEP_GATE"  # the workers' environment variable naming the gate file
POLL_SECONDS = 0.02  # how often a held task looks at the gate again


class StepGate:
    """The test's side: the gate file ``path`` (the workers find it in ``GATE_VARIABLE``)."""

    def __init__(self, path: Path):
        self.path = path

    def hold_at(self, run: Path, step: int) -> None:
        """Hold the fit of ``run`` once it has the checkpoint of ``step`` (written whole: a worker never reads
        half a file)."""
        part = self.path.with_suffix(".part")
        part.write_text(json.dumps({"run": str(run), "step": step}))
        os.replace(part, self.path)

    def open(self) -> None:
        """Let every task run."""
        self.path.unlink(missing_ok=True)


def checkpoint_step(run: Path | str) -> int:
    """The step of the run's newest checkpoint, or -1 before the first."""
    from buffet.pipeline.engine.runstore import RunStore

    try:
        step = RunStore(run).newest_step()
    except Exception:  # the run folder is not written yet
        return -1
    return -1 if step is None else step


def closed(path: Path) -> bool:
    """Whether the gate file at ``path`` holds tasks now."""
    try:
        gate = json.loads(path.read_text())
    except FileNotFoundError:
        return False
    return checkpoint_step(gate["run"]) >= gate["step"]


class GatedThreadPoolExecutor(ThreadPoolExecutor):
    """Dask's worker thread pool whose tasks first wait for the gate at ``gate`` to open. (The name keeps
    "ThreadPoolExecutor": the worker runs tasks of such executors as it runs those of its own.)"""

    def __init__(self, gate: Path, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.gate = gate

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        return super().submit(self._when_open, fn, *args, **kwargs)

    def _when_open(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        while closed(self.gate):
            time.sleep(POLL_SECONDS)
        return fn(*args, **kwargs)


def dask_setup(worker: Any) -> None:
    """The preload: the worker's default thread pool (no task has run yet) replaced by a gated one."""
    old = worker.executors["default"]
    worker.executors["default"] = GatedThreadPoolExecutor(Path(os.environ[GATE_VARIABLE]), old._max_workers,
                                                          thread_name_prefix=old._thread_name_prefix)
    old.shutdown(wait=False)

"""The engine's outer loop, shared by every model (SPEC 2).

A model driver owns its math and its blocks; this loop owns what is common: stepping,
recording the trace, progress, periodic atomic checkpoints, interruption and completion.
"""

from __future__ import annotations

from typing import Protocol

from buffet.pipeline.engine.progress import Progress
from buffet.pipeline.engine.runstore import RunStore


class Driver(Protocol):
    """What a model supplies to the loop."""

    label: str

    def total_steps(self) -> int | None: ...
    def step(self, step: int) -> dict: ...
    def finished(self, step: int, trace: list[dict]) -> bool: ...
    def save(self, run: RunStore, step: int, trace: list[dict]) -> None: ...


def run_loop(driver: Driver, run: RunStore | None, trace: list[dict], start_step: int = 0,
             checkpoint_every: int = 10, stop_after: int | None = None, quiet: bool = False) -> int:
    """Step ``driver`` until it is finished (or ``stop_after`` steps were done in total).

    Returns the number of steps done. With a run store, a checkpoint is written every
    ``checkpoint_every`` steps and at the end, and the run's status is kept current.
    """
    progress = Progress(driver.label, driver.total_steps(), quiet)
    try:
        return _steps(driver, run, trace, start_step, checkpoint_every, stop_after, progress)
    except BaseException:
        if run is not None:  # Ctrl-C, a lost cluster, a full disk: the last checkpoint stays the resume point
            run.set_status("interrupted")
        raise


def _steps(driver: Driver, run: RunStore | None, trace: list[dict], start_step: int, checkpoint_every: int,
           stop_after: int | None, progress: Progress) -> int:
    """The loop of ``run_loop``: step, record, checkpoint; returns the number of steps done."""
    step = start_step
    while not driver.finished(step, trace):
        record = driver.step(step)
        step += 1
        trace.append(record)
        progress.update(step, record)
        done = driver.finished(step, trace)
        stopping = stop_after is not None and step >= stop_after and not done
        if run is not None and (done or stopping or step % checkpoint_every == 0):
            driver.save(run, step, trace)
        if stopping:
            if run is not None:
                run.set_status("interrupted")
            return step
    if run is not None:
        if step == start_step:
            driver.save(run, step, trace)
        run.set_status("finished")
    return step

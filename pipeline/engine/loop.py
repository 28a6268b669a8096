"""The engine's outer loop, shared by every model: stepping, the trace, progress, checkpoints,
interruption, completion, and recovery from lost workers.

A driver supplies its model's step and the client-side values a checkpoint must hold
(``global_arrays``/``set_globals``); its per-block state lives in the engine's named states. This loop
owns the rest:

* the trace: every record gets ``step`` (1-based) and ``seconds``, cumulative across resumes;
* checkpoints every ``checkpoint_every`` steps and at the end: the driver's globals and every named
  state, each block written by the worker that holds it (``engine.checkpoints``); without a run folder
  the same checkpoint is kept in this process, so recovery works for in-memory fits on a cluster too;
* recovery: a step that fails because workers were lost (``ClusterFailure``) waits for a worker
  (``ClusterLostError`` after the engine's ``worker_timeout``), then is tried again from the values at
  its start when the named states survived, else from the last checkpoint, replaying the steps since.
  Seeds depend only on the step and the block, so the replayed steps give the same numbers.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any, Protocol

from buffet.pipeline.engine import checkpoints
from buffet.pipeline.engine.engine import BlockSet, ClusterFailure, Engine
from buffet.pipeline.engine.messages import ClusterLostError, StopRequest, logger
from buffet.pipeline.engine.position import Position
from buffet.pipeline.engine.progress import Progress
from buffet.pipeline.engine.runstore import RunStore

log = logger("recovery")
MAX_FAILURES = 5  # failed attempts at one step (counted over replays too) before the fit gives up


class Driver(Protocol):
    """What a model supplies to the loop (``engine.loop`` docstring)."""

    label: str
    engine: Engine

    def start(self) -> None: ...
    def step(self, step: int) -> dict: ...
    def total_steps(self) -> int | None: ...
    def finished(self, step: int, trace: list[dict]) -> bool: ...
    def global_arrays(self) -> dict[str, Any]: ...
    def set_globals(self, arrays: dict[str, Any]) -> None: ...
    def recovery_values(self) -> Any: ...
    def recover(self, values: Any) -> None: ...


@dataclass
class Snapshot:
    """The values at the start of a step: enough to try it again when the named states survived."""

    step: int
    trace_length: int
    globals: Any  # the driver's ``recovery_values``
    states: dict[str, BlockSet]


def run_loop(driver: Driver, run: RunStore | None, position: Position, checkpoint_every: int = 10,
             stop_after: int | None = None, quiet: bool = False) -> Position:
    """Step ``driver`` from ``position`` until it is finished (or ``stop_after`` steps were done in total).

    With a run store, a checkpoint is written every ``checkpoint_every`` steps and at the end, and the
    run's status is kept current (``interrupted`` after Ctrl-C or a lost cluster). Returns where the fit
    ended."""
    progress = Progress(driver.label, driver.total_steps(), quiet)
    try:
        return _steps(driver, run, position, checkpoint_every, stop_after, progress)
    except BaseException:
        if run is not None:
            run.set_status("interrupted")
        raise


def _steps(driver: Driver, run: RunStore | None, position: Position, checkpoint_every: int,
           stop_after: int | None, progress: Progress) -> Position:
    started = time.perf_counter() - position.seconds
    saved = checkpoints.Saved(run, driver.engine)
    if position.step == 0 or run is None:
        saved.write(driver, position.step, position.trace, 0.0 if position.step == 0 else position.seconds)
    step, trace, failures = position.step, position.trace, collections.Counter()
    while not driver.finished(step, trace):
        StopRequest.check()
        snapshot = driver.engine.recovery_point(
            lambda: Snapshot(step, len(trace), driver.recovery_values(), dict(driver.engine.states)))
        try:
            record = driver.step(step)
            step += 1
            record = {"step": step, **record, "seconds": time.perf_counter() - started}
            trace.append(record)
            progress.update(step, record)
            done = driver.finished(step, trace)
            stopping = stop_after is not None and step >= stop_after and not done
            if done or stopping or step % checkpoint_every == 0:  # a checkpoint the lost workers cut short:
                saved.write(driver, step, trace, record["seconds"])  # the step is tried again with it
        except ClusterFailure as exc:
            failures[snapshot.step] += 1
            if failures[snapshot.step] > MAX_FAILURES:
                raise ClusterLostError(f"step {snapshot.step + 1} failed {MAX_FAILURES} times as the cluster lost "
                                       "workers") from exc
            step, trace = _recover(driver, saved, snapshot, trace, exc)
            continue
        if stopping:
            if run is not None:
                run.set_status("interrupted")
            return Position(step, trace, record["seconds"])
    if run is not None:
        if step == position.step:
            saved.write(driver, step, trace, position.seconds)
        run.set_status("finished")
    return Position(step, trace, trace[-1]["seconds"] if trace else position.seconds)


def _recover(driver: Driver, saved: "checkpoints.Saved", snapshot: Snapshot, trace: list[dict],
             exc: ClusterFailure) -> tuple[int, list[dict]]:
    """Back to a state the failed step can be tried from (module docstring): (step, trace). The clock
    runs on, so ``seconds`` counts the time lost too."""
    engine = driver.engine
    engine.await_workers()
    if engine.alive(list(snapshot.states.values())):
        log.warning("step %d lost workers (%s); trying it again", snapshot.step + 1, _short(exc))
        driver.recover(snapshot.globals)
        engine.states = dict(snapshot.states)
        return snapshot.step, trace[:snapshot.trace_length]
    position = saved.restore(driver)
    log.warning("step %d lost workers and block states (%s); replaying from the checkpoint of step %d",
                snapshot.step + 1, _short(exc), position.step)
    return position.step, position.trace


def _short(exc: BaseException) -> str:
    """The first line of an error's message."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

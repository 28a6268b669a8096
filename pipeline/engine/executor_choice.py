"""Which executor runs a command: in this process, or on a Dask cluster.

The rule, for a command that names no cluster (no ``--scheduler``, no ``DASK_SCHEDULER_ADDRESS``, no
``--cluster kube``, no ``--workers`` or ``--worker-kind``, and ``--executor auto``, the default): the job runs
in this process when its data hold at most the model's ``process_entries`` stored entries (nonzeros of a
count store, rows x columns of a dense one), and on the embedded LocalCluster otherwise. A step of the Dask
executor costs a scheduler round trip and a task graph however little the blocks hold, which for small
data is the whole run; in this process the same step costs only its arithmetic, on one core. The crossover
per model is measured by ``benchmarks/small_fits.py``. ``--executor process`` or ``cluster`` overrides it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

from buffet.data.errors import UserError
from buffet.pipeline.engine.blas import single_threaded_blas
from buffet.pipeline.engine.dask_executor import DaskEngine
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.process_executor import ProcessEngine

EXECUTORS = ("auto", "process", "cluster")
PROCESS_ENTRIES = 2_000_000  # stored entries up to which a model runs in this process unless it says otherwise


@dataclass(frozen=True)
class Choice:
    """The executor chosen (``process`` or ``cluster``) and why, in words for the progress line."""

    executor: str
    reason: str


def choose(requested: str, cluster_named: str | None, entries: Callable[[], int | None], limit: int) -> Choice:
    """The executor of a command (module docstring): ``requested`` is ``--executor``; ``cluster_named`` the
    option that names a cluster, if any; ``entries()`` the stored entries of the job's data (None when it has
    none to measure); ``limit`` the model's ``process_entries``."""
    if requested not in EXECUTORS:
        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {requested!r}")
    if requested == "process" and cluster_named:
        raise UserError(f"--executor process runs in this process, and {cluster_named} names a cluster: "
                        f"give only one of them")
    if requested != "auto":
        return Choice(requested, f"--executor {requested}")
    if cluster_named:
        return Choice("cluster", f"{cluster_named} names a cluster")
    size = entries()
    if size is None:
        return Choice("cluster", "the size of the data is not known in advance")
    if size <= limit:
        return Choice("process", f"{size:,} stored entries <= {limit:,}: a small job")
    return Choice("cluster", f"{size:,} stored entries > {limit:,}: a large job")


def stored_entries(dataset: Any) -> int:
    """The entries a fit reads: a count store's nonzeros, a dense store's rows x columns (its mask is not
    read for this), in-memory rows likewise."""
    return dataset.nnz() if dataset.layout == "csr" else dataset.n_rows * dataset.n_cols


@contextlib.contextmanager
def chosen_engine(choice: Choice, cluster: Callable[[], ContextManager[Any]], worker_timeout: float = 300.0,
                  announce: Callable[[str], None] = lambda where: None) -> Iterator[Engine]:
    """The engine ``choice`` names, for the time of a ``with`` block: this process's (its job processes ended
    after it), or one on the client ``cluster()`` gives. ``announce(where)`` is told once the engine is
    ready. Block arithmetic and the driver's own run on a one-thread BLAS, so both give the same numbers."""
    with single_threaded_blas():
        if choice.executor == "process":
            announce("this process")
            engine = ProcessEngine(worker_timeout)
            try:
                yield engine
            finally:
                engine.close()
            return
        with cluster() as client:
            announce("Dask cluster")
            yield DaskEngine(client, worker_timeout)


def engine_on(client: Any, worker_timeout: float = 300.0) -> Engine:
    """The Dask executor on ``client``'s cluster, or this process's when ``client`` is None."""
    return ProcessEngine(worker_timeout) if client is None else DaskEngine(client, worker_timeout)

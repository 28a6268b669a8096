"""The in-process executor: every engine operation runs at once, in this process, on plain values.

It is the executor of small fits (``engine.executor_choice``), of the estimators on in-memory data and of
the experiments. Block tasks run under a one-thread BLAS (``engine.blas``), as the workers of a cluster do,
so the numbers are those of ``engine.dask_executor`` to the last digit. Nothing here can lose a worker, so
the fit loop keeps no recovery point. Independent whole jobs (``batch``: the validation fits of a model's
settings) run side by side on the machine's cores.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import threading
import weakref
from typing import Any, Callable, Sequence, TypeVar

from buffet.pipeline.engine.blas import single_threaded_blas
from buffet.pipeline.engine.engine import BlockSet, Engine, Shared, add_stats, check_lengths, tree_reduce

T = TypeVar("T")
_PINNED = contextlib.ExitStack()  # what a job process holds for its whole life (``_job_process``)


def _blocks(work: Callable[[], T]) -> T:
    """Block tasks, under the workers' one-thread BLAS."""
    with single_threaded_blas():
        return work()


def _job_process() -> None:
    """How a job process starts: Ctrl-C and SIGTERM are left to the command that started it, which ends the
    pool, and BLAS runs on one thread for good (a started-afresh process does not inherit this process's limit,
    and without it the jobs' numbers would differ from the same fits here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _PINNED.enter_context(single_threaded_blas())


def job_pool(processes: int) -> Any:
    """A pool of ``processes`` job processes (``ProcessEngine.batch``). They are forked (they start at once
    with this process's modules and data) when this process runs one thread, and started afresh otherwise
    (forking a process with other threads, such as a run's lease heartbeat, a store's I/O thread or a user's
    Dask client, can leave a lock held in the child)."""
    method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() \
        else "spawn"
    return multiprocessing.get_context(method).Pool(processes, initializer=_job_process)


def run_jobs(pool: Any, fn: Callable[..., T], args: Sequence[tuple]) -> list[T]:
    """``[fn(*a) for a in args]`` on ``pool``, results in the order of ``args``. If this process is
    interrupted or a job fails, the pool is ended before the error goes on."""
    try:
        return pool.map(_star, [(fn, a) for a in args], chunksize=1)
    except BaseException:
        pool.terminate()
        pool.join()
        raise


def _star(job: tuple[Callable, tuple]) -> Any:
    fn, args = job
    return fn(*args)


class ProcessEngine(Engine):
    """The engine contract (``engine.engine``) in this process."""

    kind = "process"

    def __init__(self, worker_timeout: float = 300.0):
        super().__init__(worker_timeout)
        self._pool: Any = None
        self._closing: weakref.finalize | None = None

    def from_values(self, values: Sequence[Any]) -> BlockSet:
        return BlockSet(len(values), values=list(values))

    def generate(self, fn: Callable, args: Sequence[tuple]) -> BlockSet:
        return BlockSet(len(args), values=_blocks(lambda: [fn(*a) for a in args]))

    def source_chunks(self, fn: Callable, source: Any, ranges: Sequence[tuple[int, int]], extra: Sequence[tuple],
                      sizes: Sequence[int], n_cols: int, meta: Any) -> list:
        """The list of chunks, read at once (a user's dask array range by range, by ``Source.part``)."""
        return _blocks(lambda: [fn(source.part(r0, r1), r0, r1, *e) for (r0, r1), e in zip(ranges, extra)])

    def from_array(self, array: list) -> BlockSet:
        return BlockSet(len(array), values=array)

    def share(self, value: Any) -> Shared:
        return Shared(value)

    def map(self, fn: Callable, *args: Any) -> BlockSet:
        n = check_lengths(args)
        columns = [a.values if isinstance(a, BlockSet) else itertools.repeat(a.value if isinstance(a, Shared) else a)
                   for a in args]
        return BlockSet(n, values=_blocks(lambda: [fn(*row) for row in zip(*columns)]))

    def select(self, blockset: BlockSet, indices: Sequence[int]) -> BlockSet:
        return BlockSet(len(indices), values=[blockset.values[int(i)] for i in indices])

    def regroup(self, fn: Callable, blockset: BlockSet, groups: Sequence[Sequence[int]],
                args: Sequence[tuple] | None = None) -> BlockSet:
        args = args or [()] * len(groups)
        return BlockSet(len(groups), values=_blocks(lambda: [fn(*(blockset.values[i] for i in g), *a)
                                                              for g, a in zip(groups, args)]))

    def reduce(self, blockset: BlockSet, combine: Callable = add_stats) -> Any:
        return _blocks(lambda: tree_reduce(blockset.values, combine))

    def collect(self, blockset: BlockSet) -> list:
        return list(blockset.values)

    def hold(self, blockset: BlockSet) -> BlockSet:
        return blockset

    def batch(self, fn: Callable[..., T], args: Sequence[tuple]) -> list[T]:
        """On every core of this machine, in job processes started at the first batch and kept for the next
        (``job_pool``; ended by ``close``), or here, one after another, when there is one core or one job."""
        cores = os.cpu_count() or 1
        if len(args) < 2 or cores < 2:
            return [fn(*a) for a in args]
        if self._pool is None:
            self._pool = job_pool(cores)
            self._closing = weakref.finalize(self, self._pool.terminate)
        try:
            return run_jobs(self._pool, fn, args)
        except BaseException:
            self._pool = None
            raise

    def close(self) -> None:
        """End the job processes, if any were started."""
        if self._pool is not None:
            self._closing.detach()
            self._pool.close()
            self._pool.join()
            self._pool = None

    def rebase(self, name: str, source: Callable[[], BlockSet]) -> None:
        """The values are already computed: nothing to forget."""

    def recovery_point(self, make: Callable[[], T]) -> T | None:
        return None

    def await_workers(self) -> None:
        """This process is the worker."""

    def alive(self, blocksets: Sequence[BlockSet]) -> bool:
        return True

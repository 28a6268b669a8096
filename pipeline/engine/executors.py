"""Where block tasks run: in this process, or on a Dask cluster (SPEC 2).

Both executors offer the same four operations, so a model driver is written once:
``submit`` a block task, ``broadcast`` globals to every worker, ``tree_reduce`` statistics
in a fixed pairing order (the result depends on the blocks, never on the workers), and
``gather`` results to the client.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence


class Executor(Protocol):
    n_workers: int

    def submit(self, fn: Callable, *args: Any) -> Any: ...
    def broadcast(self, value: Any) -> Any: ...
    def gather(self, futures: Any) -> Any: ...
    def release(self, futures: Any) -> None: ...


def pick(result: tuple, index: int) -> Any:
    """Item ``index`` of a task's tuple result (a task of its own on a cluster)."""
    return result[index]


def add_stats(left: dict, right: dict) -> dict:
    """Elementwise sum of two statistics dicts with the same keys."""
    return {key: left[key] + right[key] for key in left}


def tree_reduce(executor: Executor, items: Sequence[Any], combine: Callable = add_stats) -> Any:
    """Combine ``items`` pairwise, level by level, in block order (deterministic order)."""
    level = list(items)
    if not level:
        raise ValueError("nothing to reduce")
    while len(level) > 1:
        nxt = [executor.submit(combine, level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


class SyncExecutor:
    """Runs every task at once in this process: for small in-memory fits and for tests."""

    n_workers = 1

    def submit(self, fn: Callable, *args: Any) -> Any:
        return fn(*args)

    def broadcast(self, value: Any) -> Any:
        return value

    def gather(self, futures: Any) -> Any:
        return futures

    def release(self, futures: Any) -> None:
        return None


class DaskExecutor:
    """Runs tasks on a ``distributed.Client``; futures stay on the workers until gathered."""

    def __init__(self, client):
        self.client = client

    @property
    def n_workers(self) -> int:
        return max(1, len(self.client.scheduler_info(n_workers=-1)["workers"]))

    def submit(self, fn: Callable, *args: Any) -> Any:
        return self.client.submit(fn, *args, pure=False)

    def broadcast(self, value: Any) -> Any:
        """One future for ``value`` on every worker (a dict is kept whole, not split by key)."""
        [future] = self.client.scatter([value], broadcast=True, hash=False)
        return future

    def gather(self, futures: Any) -> Any:
        return self.client.gather(futures)

    def release(self, futures: Any) -> None:
        items = futures if isinstance(futures, (list, tuple)) else [futures]
        for f in items:
            if hasattr(f, "release"):
                f.release()

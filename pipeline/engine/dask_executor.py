"""The Dask executor: engine operations as tasks on a Dask cluster, over the store's chunks.

A BlockSet is a 1-D ``dask.array`` of dtype object with one value per chunk; ``map`` is
``dask.array.blockwise`` over those arrays (the data arrays are ``dask.array``s over the store's chunks,
``engine.dataset``), ``reduce`` is ``dask.array.reduction`` with ``split_every=2`` (pairs (0, 1), (2, 3), ...
level by level, whatever the workers: ``engine.engine.tree_reduce``'s order). Operations are lazy and are
sent to the scheduler together at the next ``reduce`` or ``collect``: every BlockSet made since then that is
still referenced is persisted in the same call, so a step costs one submission and nothing is computed
twice. Block tasks run on workers whose BLAS has one thread, so the numbers are those of
``engine.process_executor``.

Lost workers surface as ``ClusterFailure``, which the fit loop recovers from; no worker at all for
``worker_timeout`` seconds is a ``ClusterLostError``.
"""

from __future__ import annotations

import copy
import itertools
import time
import uuid
import weakref
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from buffet.pipeline.engine.dataset import chunk_of_array
from buffet.pipeline.engine.engine import (BlockSet, ClusterFailure, Engine, Shared, add_stats, check_lengths,
                                           tree_reduce)
from buffet.pipeline.engine.messages import ClusterLostError, is_cluster_failure

T = TypeVar("T")
POLL_SECONDS = 0.25  # how often a wait for results looks at the number of workers
GATHER_GRACE_SECONDS = 30.0  # bringing finished results back may take this long beyond worker_timeout


def _wrap(value: Any) -> np.ndarray:
    """One value as the one-element object array a chunk of a BlockSet holds."""
    out = np.empty(1, dtype=object)
    out[0] = value
    return out


def _unwrap(arg: Any) -> Any:
    return arg[0] if isinstance(arg, np.ndarray) and arg.dtype == object and arg.shape == (1,) else arg


def _apply(fn: Callable, *args: Any) -> np.ndarray:
    """A blockwise task: ``fn`` on the block values (unwrapped) and the shared values."""
    return _wrap(fn(*(_unwrap(a) for a in args)))


def _apply_many(fn: Callable, *blocks: np.ndarray) -> np.ndarray:
    """A regroup task: ``fn`` on several blocks' values."""
    return _wrap(fn(*(_unwrap(b) for b in blocks)))


def _fresh_copy(value: T) -> T:
    """A copy task of ``DaskEngine.share``: the value in fresh memory of the worker that ran it. A value fetched
    from another worker may sit at any offset of the message that brought it, and NumPy's reductions and
    BLAS round by alignment, so the step's numbers would depend on which worker sent which copy; arrays
    allocated afresh are laid out as in a process of its own."""
    return copy.deepcopy(value)


def _call_with(fn: Callable, args: Any) -> Any:
    """``fn(*args)`` for the per-block argument tuples of ``generate`` and ``source_chunks``."""
    return fn(*_unwrap(args))


def _objects(items: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding ``items`` as they are (tuples are not unpacked into a second axis)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def _reduce_chunk(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    return x


def _reducer(combine: Callable) -> Callable:
    """The combine/aggregate function of ``dask.array.reduction``: the values of a group of consecutive
    blocks combined in order."""
    def reduce_group(parts: Any, axis: Any = None, keepdims: bool = False) -> np.ndarray:
        items = parts if isinstance(parts, list) else [parts]
        return _wrap(tree_reduce([_unwrap(p) for p in items], combine))
    return reduce_group


class DaskEngine(Engine):
    """The engine contract (``engine.engine``) on the cluster of ``client``, a ``distributed.Client``."""

    kind = "cluster"

    def __init__(self, client: Any, worker_timeout: float = 300.0):
        super().__init__(worker_timeout)
        self.client = client
        self._pending: weakref.WeakSet[BlockSet] = weakref.WeakSet()
        self._hold: weakref.WeakSet[BlockSet] = weakref.WeakSet()
        self._names = (f"{tag}-{i}" for i in itertools.count() for tag in [uuid.uuid4().hex[:8]])

    @property
    def n_workers(self) -> int:
        return len(self._workers())

    def _workers(self) -> list[str]:
        """The addresses of the cluster's workers, as the client last heard them."""
        return list(self.client.scheduler_info(n_workers=-1)["workers"])

    # ----- making BlockSets -----
    def from_values(self, values: Sequence[Any]) -> BlockSet:
        import dask.array as da

        return self._new(da.from_array(_objects(values), chunks=1, name=f"values-{next(self._names)}"), len(values))

    def generate(self, fn: Callable, args: Sequence[tuple]) -> BlockSet:
        import dask.array as da

        index = da.from_array(_objects(args), chunks=1, name=f"args-{next(self._names)}")
        return self._new(da.blockwise(_apply, "i", _call_with, None, fn, None, index, "i", dtype=object,
                                      meta=np.empty((0,), object),
                                      name=f"{getattr(fn, '__name__', 'generate')}-{next(self._names)}"), len(args))

    def source_chunks(self, fn: Callable, source: Any, ranges: Sequence[tuple[int, int]], extra: Sequence[tuple],
                      sizes: Sequence[int], n_cols: int, meta: Any) -> Any:
        """A 2-D ``dask.array`` of the chunks: read by the workers from a store, or, for a user's dask array,
        computed by them from the array's own graph (``dataset.ArrayRows.in_chunks``)."""
        import dask.array as da

        if source.lazy:
            rows = source.rows
            X, mask = rows.in_chunks(ranges)
            index = _objects([(fn, rows.layout, r0, r1, *e) for (r0, r1), e in zip(ranges, extra)])
            arrays = [da.from_array(index, chunks=1), "i", X, "ij"] + ([] if mask is None else [mask, "ij"])
            return da.blockwise(chunk_of_array, "ij", *arrays, adjust_chunks={"i": tuple(sizes), "j": (n_cols,)},
                                align_arrays=False, concatenate=True, dtype=meta.dtype, meta=meta,
                                name=f"{getattr(fn, '__name__', 'source')}-{next(self._names)}")
        args = [(source.part(r0, r1), r0, r1, *e) for (r0, r1), e in zip(ranges, extra)]
        index = da.from_array(_objects(args), chunks=1, name=f"args-{next(self._names)}")
        return da.blockwise(_call_with, "ij", fn, None, index, "i", new_axes={"j": n_cols},
                            adjust_chunks={"i": tuple(sizes)}, dtype=meta.dtype, meta=meta,
                            name=f"{getattr(fn, '__name__', 'source')}-{next(self._names)}")

    def from_array(self, array: Any) -> BlockSet:
        """The row chunks of a 2-D ``dask.array`` (``source_chunks``), one value per chunk."""
        blocks = array.map_blocks(_wrap, drop_axis=1, chunks=((1,) * array.numblocks[0],), dtype=object,
                                  meta=np.empty((0,), object), name=f"rows-{next(self._names)}")
        return self._new(blocks, array.numblocks[0], lazy=True)

    # ----- operations -----
    def share(self, value: Any) -> Shared:
        """A copy on each worker, and ``map`` gives block i copy i modulo their number. Dask runs a task only
        on a worker that holds one of its inputs; with the value on one worker, every block of a step ran there
        in turn while the others idled (docs/performance.md, "Start-up and small fits"). The client sends the
        value once; with two workers or more, a small task pinned (loosely) to each worker makes that worker
        fetch a copy from a peer (``_fresh_copy``), so the client's upload does not grow with the workers (a
        client far from its cluster sends a step's globals once, not once per worker).

        Not Dask's broadcast: it copies with the scheduler's ``replicate``, which retries without end to copy
        to a worker that died meanwhile, and fits that lost a worker hung; a copy task whose worker died runs
        on another. A worker that joins later fetches a copy when a task needs it; a lost copy is a lost
        worker's, and the step is tried again. With no worker to send it to for ``worker_timeout`` seconds, a
        ``ClusterLostError``: Dask's scatter waits that long for a running worker (its ``timeout`` bounds only
        that wait) and then fails with a bare TimeoutError."""
        try:  # a one-item list: scatter would send a list's or a dict's items as separate values
            [sent] = self._call(self.client.scatter, [value], hash=False, timeout=self.worker_timeout)
        except TimeoutError:
            if self.n_workers == 0:
                raise ClusterLostError(f"no Dask worker for {self.worker_timeout:g} s") from None
            raise
        workers = self._workers()
        if len(workers) < 2:
            return Shared((sent,))
        return Shared(tuple(self.client.submit(_fresh_copy, sent, workers=[worker], allow_other_workers=True,
                                               pure=False) for worker in workers))

    def map(self, fn: Callable, *args: Any) -> BlockSet:
        import dask.array as da

        n = check_lengths(args)
        spec: list[Any] = []
        for a in args:
            if isinstance(a, BlockSet):
                spec += [a.array, "i"]
            else:
                spec += [self._per_block(a, n), "i"] if isinstance(a, Shared) else [a, None]
        sets = [a for a in args if isinstance(a, BlockSet)]
        lazy = all(a.lazy for a in sets) and not any(isinstance(a, Shared) for a in args)
        return self._new(da.blockwise(_apply, "i", fn, None, *spec, dtype=object, meta=np.empty((0,), object),
                                      name=f"{getattr(fn, '__name__', 'map')}-{next(self._names)}"), n, lazy)

    @staticmethod
    def _per_block(shared: Shared, n: int) -> Any:
        """``shared``'s copies as a dask array of ``n`` one-element blocks, block i the copy i modulo their number."""
        import dask
        import dask.array as da

        copies = shared.value
        return da.concatenate([da.from_delayed(dask.delayed(_wrap, pure=True)(copies[i % len(copies)]), shape=(1,),
                                               dtype=object, meta=np.empty((0,), object)) for i in range(n)])

    def select(self, blockset: BlockSet, indices: Sequence[int]) -> BlockSet:
        indices = [int(i) for i in indices]
        return self._new(blockset.array.blocks[indices], len(indices), blockset.lazy)

    def regroup(self, fn: Callable, blockset: BlockSet, groups: Sequence[Sequence[int]],
                args: Sequence[tuple] | None = None) -> BlockSet:
        import dask
        import dask.array as da

        args = args or [()] * len(groups)
        parts = blockset.array.to_delayed(optimize_graph=False).ravel()  # optimising would rename persisted keys
        built = [da.from_delayed(dask.delayed(_apply_many, pure=False)(fn, *(parts[i] for i in group), *extra),
                                 shape=(1,), dtype=object, meta=np.empty((0,), object))
                 for group, extra in zip(groups, args)]
        return self._new(da.concatenate(built), len(groups))

    def reduce(self, blockset: BlockSet, combine: Callable = add_stats) -> Any:
        import dask.array as da

        reducer = _reducer(combine)
        total = da.reduction(blockset.array, _reduce_chunk, reducer, combine=reducer, split_every=2,
                             concatenate=False, dtype=object, meta=np.empty((0,), object),
                             name=f"reduce-{next(self._names)}")
        return _unwrap(self._compute(total, consumed=blockset))

    def collect(self, blockset: BlockSet) -> list:
        return [_unwrap(v) for v in self._compute(blockset.array, consumed=blockset)]

    # ----- named and held state -----
    def hold(self, blockset: BlockSet) -> BlockSet:
        """Persisted on the workers from the next submission on."""
        if not blockset.persisted:
            self._hold.add(blockset)
        return blockset

    def rebase(self, name: str, source: Callable[[], BlockSet]) -> None:
        """The state is replaced by ``source()``, so the scheduler keeps no record of the steps before and a
        block lost later is read back and recomputed from there."""
        self.states[name] = source()

    # ----- independent jobs -----
    def batch(self, fn: Callable[..., T], args: Sequence[tuple]) -> list[T]:
        """One task per job, spread over the workers by the scheduler; a job on a lost worker is run again."""
        futures = self._call(self.client.map, _call_with, [fn] * len(args), list(args), pure=False)
        self._wait(futures)
        return self._gather(futures)

    # ----- recovery -----
    def recovery_point(self, make: Callable[[], T]) -> T | None:
        return make()

    def await_workers(self) -> None:
        deadline = time.monotonic() + self.worker_timeout
        while self.n_workers == 0:
            if time.monotonic() > deadline:
                raise ClusterLostError(f"no Dask worker for {self.worker_timeout:g} s")
            time.sleep(POLL_SECONDS)

    def alive(self, blocksets: Sequence[BlockSet]) -> bool:
        from distributed import futures_of

        return all(f.status == "finished" for b in blocksets if b.persisted for f in futures_of(b.array)) and \
            all(b.persisted for b in blocksets)

    # ----- submitting -----
    def _new(self, array: Any, n: int, lazy: bool = False) -> BlockSet:
        blockset = BlockSet(n, array=array, lazy=lazy)
        if not lazy:
            self._pending.add(blockset)
        return blockset

    def _persist_pending(self, extra: Sequence[Any] = (), consumed: BlockSet | None = None) -> list[Any]:
        """Persist every pending BlockSet still referenced, the named states and what is to be held, together
        with ``extra`` collections, in one submission; returns the persisted ``extra``. The BlockSet
        ``consumed`` (what ``extra`` reduces or collects) is left out unless it is a named state or held: it is
        computed inside ``extra`` (and fused with it), not kept."""
        kept = list(self.states.values()) + list(self._hold)
        waiting = [b for b in self._pending if b is not consumed] + kept
        pending = list({id(b): b for b in waiting if not b.persisted}.values())
        collections = [b.array for b in pending] + list(extra)
        if not collections:
            return []
        persisted = self._call(self.client.persist, collections)
        for b, array in zip(pending, persisted):
            b.array, b.persisted = array, True
        self._pending, self._hold = weakref.WeakSet(), weakref.WeakSet()
        return persisted[len(pending):]

    def _compute(self, array: Any, consumed: BlockSet) -> np.ndarray:
        """Persist what is pending with ``array``, wait for ``array``'s blocks, and bring them here."""
        from distributed import futures_of

        [done] = self._persist_pending([array], consumed)
        futures = futures_of(done)
        self._wait(futures)
        return np.concatenate(self._gather(futures))

    def _gather(self, futures: list) -> list:
        """The results of finished ``futures``, brought here. If the worker holding one is lost meanwhile,
        Dask computes it again, which never ends when an input of it is gone too (a shared value's copy
        lives on that worker only): after ``worker_timeout`` + ``GATHER_GRACE_SECONDS`` that is a ``ClusterFailure``,
        and the loop tries the step again from its start."""
        limit = self.worker_timeout + GATHER_GRACE_SECONDS
        try:
            return self._call(self.client.sync, self.client._gather, futures, callback_timeout=limit)
        except TimeoutError:
            raise ClusterFailure(f"results not brought back in {limit:g} s after a worker was lost") from None

    def _wait(self, futures: list) -> None:
        """Wait for ``futures``; a lost worker is a ``ClusterFailure``; no worker at all for
        ``worker_timeout`` seconds is a ``ClusterLostError`` (never a hang)."""
        from distributed import wait

        alone_since = None
        while True:
            try:
                self._call(wait, futures, timeout=POLL_SECONDS)
                return
            except TimeoutError:
                if self.n_workers > 0:
                    alone_since = None
                    continue
                alone_since = alone_since or time.monotonic()
                if time.monotonic() - alone_since > self.worker_timeout:
                    raise ClusterLostError(f"no Dask worker for {self.worker_timeout:g} s") from None

    def _call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn`` with the errors of lost workers or a lost scheduler turned into ``ClusterFailure``."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if is_cluster_failure(exc):
                raise ClusterFailure(f"{type(exc).__name__}: {exc}") from exc
            raise

"""The engine: block collections, local steps over them, reductions, and named per-block state (SPEC 2).

A model driver sees only this class. Its data and its per-block state are ``BlockSet``s: ordered
collections with one value per block (a row block of the data, its q(theta) or q(z) rows, a block of
particles, a chain, a panel). ``map`` runs a local step over blocks, ``reduce`` tree-reduces statistics
in a fixed block order, ``share`` sends a large global once, ``regroup`` moves values between blocks
(particle resampling, row panels to column panels), and ``keep`` holds named state that the fit loop
checkpoints and restores generically.

Two backends run the same driver code:

* on a Dask cluster (``client``): a BlockSet is a 1-D ``dask.array`` of dtype object with one value per
  chunk; ``map`` is ``dask.array.blockwise`` over those arrays (the data arrays are ``dask.array``s over
  the store's chunks, ``engine.dataset``), ``reduce`` is ``dask.array.reduction`` with ``split_every=2``
  (pairs (0, 1), (2, 3), ... level by level, whatever the workers). Operations are lazy and are sent to
  the scheduler together at the next ``reduce`` or ``collect``: every BlockSet made since then that is
  still referenced is persisted in the same call, so a step costs one submission and nothing is computed
  twice;
* in this process (no client): the same operations run at once on plain values. It is the engine of the
  in-memory fits (estimators, experiments, tests) and gives the same numbers.

Lost workers surface as ``ClusterFailure`` (the fit loop's recovery, ``engine.loop``); when no worker
is left for ``worker_timeout`` seconds a ``ClusterLostError`` ends the fit with one line.
"""

from __future__ import annotations

import itertools
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from buffet.pipeline.engine.blas import single_threaded_blas
from buffet.pipeline.engine.messages import ClusterLostError, is_cluster_failure, logger

log = logger("engine")
POLL_SECONDS = 1.0  # how often a wait for results looks at the number of workers
GATHER_GRACE_SECONDS = 30.0  # bringing finished results back may take this long beyond worker_timeout


class ClusterFailure(Exception):
    """A step could not finish because workers (and what they held) were lost; the fit loop recovers."""


def add_stats(left: dict, right: dict) -> dict:
    """Elementwise sum of two statistics dicts with the same keys."""
    return {key: left[key] + right[key] for key in left}


@dataclass(eq=False)
class BlockSet:
    """An ordered collection of per-block values (module docstring): ``values`` in this process, or
    ``array``, a 1-D dask array of dtype object with one value per chunk."""

    n: int
    values: list | None = None
    array: Any = None
    persisted: bool = False
    lazy: bool = False  # a view of the data (reads): computed where used, persisted only when kept

    def __len__(self) -> int:
        return self.n


@dataclass(eq=False)
class Shared:
    """A value many tasks read (globals such as the topics): itself in this process, or a future."""

    value: Any


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


def _pick(result: Any, index: int) -> Any:
    return result[index]


def _here(work: Callable[[], Any]) -> Any:
    """Block tasks run in this process (the engine without a cluster), under the workers' one-thread BLAS
    (``engine.blas``), so they give the numbers a cluster gives."""
    with single_threaded_blas():
        return work()


def _tree(values: Sequence[Any], combine: Callable) -> Any:
    """Pairwise combination level by level in block order: (0, 1), (2, 3), ...; an odd last value goes up
    unchanged. ``dask.array.reduction`` with ``split_every=2`` pairs the same way."""
    level = list(values)
    if not level:
        raise ValueError("nothing to reduce")
    while len(level) > 1:
        nxt = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _reduce_chunk(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    return x


def _reducer(combine: Callable) -> Callable:
    """The combine/aggregate function of ``dask.array.reduction``: the values of a group of consecutive
    blocks combined in order."""
    def reduce_group(parts: Any, axis: Any = None, keepdims: bool = False) -> np.ndarray:
        items = parts if isinstance(parts, list) else [parts]
        return _wrap(_tree([_unwrap(p) for p in items], combine))
    return reduce_group


class Engine:
    """Runs a driver's block operations (module docstring). ``client``: a ``distributed.Client``, or None
    for this process."""

    def __init__(self, client: Any = None, worker_timeout: float = 300.0):
        self.client = client
        self.worker_timeout = worker_timeout
        self.states: dict[str, BlockSet] = {}
        self._pending: weakref.WeakSet[BlockSet] = weakref.WeakSet()
        self._hold: weakref.WeakSet[BlockSet] = weakref.WeakSet()
        self._indices: dict[int, BlockSet] = {}
        self._names = (f"{tag}-{i}" for i in itertools.count() for tag in [uuid.uuid4().hex[:8]])

    @property
    def local(self) -> bool:
        return self.client is None

    @property
    def n_workers(self) -> int:
        if self.local:
            return 1
        return len(self.client.scheduler_info(n_workers=-1)["workers"])

    # ----- making BlockSets -----
    def from_values(self, values: Sequence[Any]) -> BlockSet:
        """A BlockSet of values held here (small ones: starting states, per-block arguments, a checkpoint
        kept in this process). On a cluster they travel inside the graph, so a lost block is sent again."""
        if self.local:
            return BlockSet(len(values), values=list(values))
        import dask.array as da

        return self._new(da.from_array(_objects(values), chunks=1, name=f"values-{next(self._names)}"), len(values))

    def generate(self, fn: Callable, args: Sequence[tuple]) -> BlockSet:
        """Block i is ``fn(*args[i])``, computed where the block will live (a source: reading data or a
        checkpoint, starting states). ``args`` are small values."""
        if self.local:
            return BlockSet(len(args), values=_here(lambda: [fn(*a) for a in args]))
        import dask.array as da

        index = da.from_array(_objects(args), chunks=1, name=f"args-{next(self._names)}")
        return self._new(da.blockwise(_apply, "i", _call_with, None, fn, None, index, "i", dtype=object,
                                      meta=np.empty((0,), object),
                                      name=f"{getattr(fn, '__name__', 'generate')}-{next(self._names)}"), len(args))

    def indices(self, n: int) -> BlockSet:
        """A BlockSet whose block i is the number i (for local steps that need their block's position); made
        once per ``n`` and held on the workers (a lost block is made again from its lineage)."""
        if n not in self._indices:
            self._indices[n] = self.hold(self.generate(int, [(i,) for i in range(n)]))
        return self._indices[n]

    def source_array(self, fn: Callable, args: Sequence[tuple], sizes: Sequence[int], n_cols: int, meta: Any) -> Any:
        """A 2-D ``dask.array`` whose row chunk i (``sizes[i]`` rows, ``n_cols`` columns) is ``fn(*args[i])``
        (the data of a store, chunk by chunk: ``engine.dataset``); in this process, the list of chunks."""
        if self.local:
            return _here(lambda: [fn(*a) for a in args])
        import dask.array as da

        index = da.from_array(_objects(args), chunks=1, name=f"args-{next(self._names)}")
        return da.blockwise(_call_with, "ij", fn, None, index, "i", new_axes={"j": n_cols},
                            adjust_chunks={"i": tuple(sizes)}, dtype=meta.dtype, meta=meta,
                            name=f"{getattr(fn, '__name__', 'source')}-{next(self._names)}")

    def from_array(self, array: Any) -> BlockSet:
        """The row blocks of a 2-D ``dask.array`` (one value per chunk along the rows) as a BlockSet; in
        this process, ``array`` is a list of block values already."""
        if self.local:
            return BlockSet(len(array), values=list(array))
        blocks = array.map_blocks(_wrap, drop_axis=1, chunks=((1,) * array.numblocks[0],), dtype=object,
                                  meta=np.empty((0,), object), name=f"rows-{next(self._names)}")
        return self._new(blocks, array.numblocks[0], lazy=True)

    # ----- operations -----
    def share(self, value: Any) -> Shared:
        """``value`` for many tasks: sent once to one worker, fetched by the others as needed (no
        broadcast, so nothing is replicated to a worker that is gone). With no worker to send it to for
        ``worker_timeout`` seconds, a ``ClusterLostError``: Dask's scatter waits that long for a running
        worker (its ``timeout`` bounds only that wait) and then fails with a bare TimeoutError."""
        if self.local:
            return Shared(value)
        try:  # wrapped in a list: scatter would send a dict's or a list's items as separate futures
            return Shared(self._call(self.client.scatter, [value], hash=False, timeout=self.worker_timeout)[0])
        except TimeoutError:
            if self.n_workers == 0:
                raise ClusterLostError(f"no Dask worker for {self.worker_timeout:g} s") from None
            raise

    def map(self, fn: Callable, *args: Any) -> BlockSet:
        """Block i of the result is ``fn(*values)``: the i-th value of every BlockSet argument, the value of
        every Shared argument, and any other argument as it is (small constants)."""
        sets = [a for a in args if isinstance(a, BlockSet)]
        if not sets:
            raise ValueError("map needs at least one BlockSet")
        n = sets[0].n
        if any(s.n != n for s in sets):
            raise ValueError(f"BlockSets of different lengths: {[s.n for s in sets]}")
        if self.local:
            columns = [a.values if isinstance(a, BlockSet) else itertools.repeat(a.value if isinstance(a, Shared)
                                                                                    else a) for a in args]
            return BlockSet(n, values=_here(lambda: [fn(*row) for row in zip(*columns)]))
        import dask.array as da

        spec: list[Any] = []
        for a in args:
            if isinstance(a, BlockSet):
                spec += [a.array, "i"]
            else:
                spec += [a.value if isinstance(a, Shared) else a, None]
        lazy = all(a.lazy for a in sets) and not any(isinstance(a, Shared) for a in args)
        return self._new(da.blockwise(_apply, "i", fn, None, *spec, dtype=object, meta=np.empty((0,), object),
                                      name=f"{getattr(fn, '__name__', 'map')}-{next(self._names)}"), n, lazy)

    def split(self, blockset: BlockSet, parts: int) -> tuple[BlockSet, ...]:
        """A BlockSet of tuples as ``parts`` BlockSets, one per position."""
        return tuple(self.map(_pick, blockset, i) for i in range(parts))

    def select(self, blockset: BlockSet, indices: Sequence[int]) -> BlockSet:
        """The blocks at ``indices``, in that order (e.g. the blocks of one minibatch)."""
        indices = [int(i) for i in indices]
        if self.local:
            return BlockSet(len(indices), values=[blockset.values[i] for i in indices])
        return self._new(blockset.array.blocks[indices], len(indices), blockset.lazy)

    def regroup(self, fn: Callable, blockset: BlockSet, groups: Sequence[Sequence[int]],
                args: Sequence[tuple] | None = None) -> BlockSet:
        """Block j of the result is ``fn(*[blockset[i] for i in groups[j]], *args[j])`` (values moving between
        blocks; ``args`` are small per-group values such as the group's own bounds)."""
        args = args or [()] * len(groups)
        if self.local:
            return BlockSet(len(groups), values=_here(lambda: [fn(*(blockset.values[i] for i in g), *a)
                                                               for g, a in zip(groups, args)]))
        import dask
        import dask.array as da

        parts = blockset.array.to_delayed(optimize_graph=False).ravel()  # optimising would rename persisted keys
        built = [da.from_delayed(dask.delayed(_apply_many, pure=False)(fn, *(parts[i] for i in group), *extra),
                                 shape=(1,), dtype=object, meta=np.empty((0,), object))
                 for group, extra in zip(groups, args)]
        return self._new(da.concatenate(built), len(groups))

    def reduce(self, blockset: BlockSet, combine: Callable = add_stats) -> Any:
        """The blocks' values combined pairwise in block order (``_tree``), brought here."""
        if self.local:
            return _here(lambda: _tree(blockset.values, combine))
        import dask.array as da

        reducer = _reducer(combine)
        total = da.reduction(blockset.array, _reduce_chunk, reducer, combine=reducer, split_every=2,
                             concatenate=False, dtype=object, meta=np.empty((0,), object),
                             name=f"reduce-{next(self._names)}")
        return _unwrap(self._compute(total, consumed=blockset))

    def collect(self, blockset: BlockSet) -> list:
        """Every block's value, in block order, brought here."""
        if self.local:
            return list(blockset.values)
        return [_unwrap(v) for v in self._compute(blockset.array, consumed=blockset)]

    # ----- named state -----
    def keep(self, name: str, blockset: BlockSet) -> BlockSet:
        """Hold ``blockset`` as the named per-block state ``name`` (persisted on the workers; checkpointed)."""
        self.states[name] = blockset
        return blockset

    def hold(self, blockset: BlockSet) -> BlockSet:
        """Keep ``blockset`` (data the driver reuses every step, e.g. a batch fit's documents) on the workers
        from the next submission on. Unlike a named state it is not checkpointed: a lost block is read or
        computed again from its lineage."""
        if not self.local and not blockset.persisted:
            self._hold.add(blockset)
        return blockset

    def state(self, name: str) -> BlockSet:
        return self.states[name]

    def drop(self, name: str) -> None:
        self.states.pop(name, None)

    def read_ahead(self, blockset: BlockSet) -> BlockSet:
        """Have ``blockset`` (e.g. the next minibatch's data) computed with the next submission, so it is
        ready when used."""
        return self.hold(blockset)

    # ----- running on the cluster -----
    def _new(self, array: Any, n: int, lazy: bool = False) -> BlockSet:
        blockset = BlockSet(n, array=array, lazy=lazy)
        if not lazy:
            self._pending.add(blockset)
        return blockset

    def _persist_pending(self, extra: Sequence[Any] = (), consumed: BlockSet | None = None) -> list[Any]:
        """Persist every pending BlockSet still referenced, the named states and what is to be read ahead,
        together with ``extra`` collections, in one submission; returns the persisted ``extra``. The
        BlockSet ``consumed`` (what ``extra`` reduces or collects) is left out unless it is a named state
        or to be read ahead: it is computed inside ``extra`` (and fused with it), not kept."""
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
        Dask computes it again, which never ends when an input of it is gone too (a shared value lives on
        one worker only): after ``worker_timeout`` + ``GATHER_GRACE_SECONDS`` that is a ``ClusterFailure``,
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

    def await_workers(self) -> None:
        """Return once the cluster has a worker; ``ClusterLostError`` after ``worker_timeout`` seconds."""
        if self.local:
            return
        deadline = time.monotonic() + self.worker_timeout
        while self.n_workers == 0:
            if time.monotonic() > deadline:
                raise ClusterLostError(f"no Dask worker for {self.worker_timeout:g} s")
            time.sleep(POLL_SECONDS)

    def _call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn`` with the errors of lost workers or a lost scheduler turned into ``ClusterFailure``."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if is_cluster_failure(exc):
                raise ClusterFailure(f"{type(exc).__name__}: {exc}") from exc
            raise

    def alive(self, blocksets: Sequence[BlockSet]) -> bool:
        """Whether every block of ``blocksets`` is still held by the cluster (in memory somewhere)."""
        if self.local:
            return True
        from distributed import futures_of

        return all(f.status == "finished" for b in blocksets if b.persisted for f in futures_of(b.array)) and \
            all(b.persisted for b in blocksets)


def _call_with(fn: Callable, args: Any) -> Any:
    """``fn(*args)`` for the per-block argument tuples of ``generate`` and ``source_array``."""
    return fn(*_unwrap(args))


def _objects(items: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding ``items`` as they are (tuples are not unpacked into a second axis)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out

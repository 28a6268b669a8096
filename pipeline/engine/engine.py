"""The engine contract: block collections, local steps over them, reductions, and named per-block state.

A model driver sees only this contract. Its data and its per-block state are ``BlockSet``s: ordered
collections with one value per block (a row block of the data, its q(theta) or q(z) rows, a block of
particles, a chain, a panel). ``map`` runs a local step over blocks, ``reduce`` combines statistics pairwise
in a fixed block order (``tree_reduce``), ``share`` hands a large global to many tasks, ``regroup`` moves
values between blocks (particle resampling, row panels to column panels), and ``keep`` holds named state that
the fit loop checkpoints and restores generically.

Two executors implement it with the same numbers, bit for bit:

* ``engine.process_executor.ProcessEngine`` runs every operation at once in this process: the executor of
  small fits, where a cluster's per-step cost would be the whole run;
* ``engine.dask_executor.DaskEngine`` runs them as tasks on a Dask cluster, over the store's chunks.

``engine.executor_choice`` picks one for a command. Lost workers surface as ``ClusterFailure`` (the fit loop's
recovery, ``engine.loop``); when no worker is left for ``worker_timeout`` seconds a ``ClusterLostError`` ends
the fit with one line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")


class ClusterFailure(Exception):
    """A step could not finish because workers (and what they held) were lost; the fit loop recovers."""


def add_stats(left: dict, right: dict) -> dict:
    """Elementwise sum of two statistics dicts with the same keys."""
    return {key: left[key] + right[key] for key in left}


def tree_reduce(values: Sequence[Any], combine: Callable) -> Any:
    """Pairwise combination level by level in block order: (0, 1), (2, 3), ...; an odd last value goes up
    unchanged. Both executors reduce in exactly this order, so sums agree to the last digit."""
    level = list(values)
    if not level:
        raise ValueError("nothing to reduce")
    while len(level) > 1:
        nxt = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


@dataclass(eq=False)
class BlockSet:
    """An ordered collection of ``n`` per-block values. ``values`` holds them in this process
    (``ProcessEngine``); ``array`` is a 1-D dask array of dtype object with one value per chunk
    (``DaskEngine``), ``persisted`` once it was submitted, ``lazy`` when it is a view of the data (reads),
    computed where used and persisted only when kept."""

    n: int
    values: list | None = None
    array: Any = None
    persisted: bool = False
    lazy: bool = False

    def __len__(self) -> int:
        return self.n


@dataclass(eq=False)
class Shared:
    """A value many tasks read (globals such as the topics): the value itself, or futures holding copies of it."""

    value: Any


def check_lengths(args: Sequence[Any]) -> int:
    """The common length of the BlockSets among a ``map``'s arguments; at least one is required."""
    sets = [a for a in args if isinstance(a, BlockSet)]
    if not sets:
        raise ValueError("map needs at least one BlockSet")
    if any(s.n != sets[0].n for s in sets):
        raise ValueError(f"BlockSets of different lengths: {[s.n for s in sets]}")
    return sets[0].n


def pick(result: Any, index: int) -> Any:
    """Item ``index`` of a block value that is a tuple (``Engine.split``)."""
    return result[index]


class Engine(ABC):
    """What an executor does for a driver (module docstring). ``kind`` names the executor for progress lines;
    ``worker_timeout`` bounds the wait for a worker when a cluster has none."""

    kind: str = ""

    def __init__(self, worker_timeout: float = 300.0):
        self.worker_timeout = worker_timeout
        self.states: dict[str, BlockSet] = {}
        self._indices: dict[int, BlockSet] = {}

    # ----- making BlockSets -----
    @abstractmethod
    def from_values(self, values: Sequence[Any]) -> BlockSet:
        """A BlockSet of values held here (small ones: starting states, per-block arguments, a checkpoint
        kept in this process). On a cluster they travel inside the graph, so a lost block is sent again."""

    @abstractmethod
    def generate(self, fn: Callable, args: Sequence[tuple]) -> BlockSet:
        """Block i is ``fn(*args[i])``, computed where the block will live (a source: reading data or a
        checkpoint, starting states). ``args`` are small values."""

    @abstractmethod
    def source_chunks(self, fn: Callable, source: Any, ranges: Sequence[tuple[int, int]], extra: Sequence[tuple],
                      sizes: Sequence[int], n_cols: int, meta: Any) -> Any:
        """The data of a ``dataset.Source``, chunk by chunk: row chunk i (``sizes[i]`` rows, ``n_cols`` columns,
        like ``meta``) is ``fn(part, r0, r1, *extra[i])`` for the row range ``ranges[i]``, where ``part`` is the
        Source a task reads (``Source.part``); ``from_array`` turns the result into a BlockSet of its chunks."""

    @abstractmethod
    def from_array(self, array: Any) -> BlockSet:
        """The row chunks of what ``source_chunks`` made as a BlockSet."""

    def indices(self, n: int) -> BlockSet:
        """A BlockSet whose block i is the number i (for local steps that need their block's position); made
        once per ``n`` and held (a lost block is made again from its lineage)."""
        if n not in self._indices:
            self._indices[n] = self.hold(self.generate(int, [(i,) for i in range(n)]))
        return self._indices[n]

    # ----- operations -----
    @abstractmethod
    def share(self, value: Any) -> Shared:
        """``value`` for many tasks, sent once."""

    @abstractmethod
    def map(self, fn: Callable, *args: Any) -> BlockSet:
        """Block i of the result is ``fn(*values)``: the i-th value of every BlockSet argument, the value of
        every Shared argument, and any other argument as it is (small constants)."""

    def split(self, blockset: BlockSet, parts: int) -> tuple[BlockSet, ...]:
        """A BlockSet of tuples as ``parts`` BlockSets, one per position."""
        return tuple(self.map(pick, blockset, i) for i in range(parts))

    @abstractmethod
    def select(self, blockset: BlockSet, indices: Sequence[int]) -> BlockSet:
        """The blocks at ``indices``, in that order (e.g. the blocks of one minibatch)."""

    @abstractmethod
    def regroup(self, fn: Callable, blockset: BlockSet, groups: Sequence[Sequence[int]],
                args: Sequence[tuple] | None = None) -> BlockSet:
        """Block j of the result is ``fn(*[blockset[i] for i in groups[j]], *args[j])`` (values moving between
        blocks; ``args`` are small per-group values such as the group's own bounds)."""

    @abstractmethod
    def reduce(self, blockset: BlockSet, combine: Callable = add_stats) -> Any:
        """The blocks' values combined pairwise in block order (``tree_reduce``), brought here."""

    @abstractmethod
    def collect(self, blockset: BlockSet) -> list:
        """Every block's value, in block order, brought here."""

    # ----- named and held state -----
    def keep(self, name: str, blockset: BlockSet) -> BlockSet:
        """Hold ``blockset`` as the named per-block state ``name`` (checkpointed by the fit loop)."""
        self.states[name] = blockset
        return blockset

    def state(self, name: str) -> BlockSet:
        return self.states[name]

    def drop(self, name: str) -> None:
        self.states.pop(name, None)

    @abstractmethod
    def hold(self, blockset: BlockSet) -> BlockSet:
        """Keep ``blockset`` (data the driver reuses every step, e.g. a batch fit's documents) where it was
        computed. Unlike a named state it is not checkpointed: a lost block is read or computed again."""

    def read_ahead(self, blockset: BlockSet) -> BlockSet:
        """Have ``blockset`` (e.g. the next minibatch's data) ready when it is used."""
        return self.hold(blockset)

    @abstractmethod
    def rebase(self, name: str, source: Callable[[], BlockSet]) -> None:
        """From now on the named state ``name`` starts from ``source()`` (its checkpoint, written or kept):
        an executor that remembers how each block was computed forgets the steps before it."""

    # ----- independent jobs -----
    @abstractmethod
    def batch(self, fn: Callable[..., T], args: Sequence[tuple]) -> list[T]:
        """``[fn(*a) for a in args]`` for independent jobs, each a whole computation of its own (such as one
        validation fit on a ``ProcessEngine``), run side by side where the executor can: on the cores of this
        machine, or as tasks of the cluster. ``fn`` and ``args`` must pickle."""

    def close(self) -> None:
        """Let go of what the executor started for itself (the process executor's job processes)."""

    # ----- recovery -----
    @abstractmethod
    def recovery_point(self, make: Callable[[], T]) -> T | None:
        """What the fit loop needs to try a step again if workers are lost during it: ``make()`` on an
        executor whose steps can lose workers, None on one whose steps cannot."""

    @abstractmethod
    def await_workers(self) -> None:
        """Return once there is a worker; ``ClusterLostError`` after ``worker_timeout`` seconds."""

    @abstractmethod
    def alive(self, blocksets: Sequence[BlockSet]) -> bool:
        """Whether every block of ``blocksets`` is still held (after a lost worker)."""

"""The engine: block operations give the same values in this process and on a
cluster, statistics are reduced in a fixed pairing order, named states are checkpointed generically, and
a fit survives lost workers with the same numbers (or stops with one line when no worker is left)."""

import dataclasses
import os
import signal
import time
from typing import Callable

import numpy as np
import pytest

from buffet.pipeline.engine import codec
from buffet.pipeline.engine.engine import Engine, tree_reduce
from buffet.pipeline.engine.executor_choice import engine_on
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.engine.messages import ClusterLostError, StopRequest, Terminated, is_cluster_failure
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.seeds import stream
from worker_loss import LOST_CLUSTER_MARGIN


def bracket(a: str, b: str) -> str:
    """A combine that records the pairing: reduction order is visible in the result."""
    return f"({a}+{b})"


def add_block(x: np.ndarray, y: np.ndarray, c: float) -> np.ndarray:
    return x + y * c


def take(values: tuple, index: int) -> object:
    return values[index]


def concat(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate(parts)


@pytest.fixture(params=["local", "cluster"])
def engine(request, clients):
    return ProcessEngine() if request.param == "local" else engine_on(clients[2])


def test_block_operations_agree_in_process_and_on_a_cluster(engine):
    xs = engine.from_values([np.arange(3.0) + i for i in range(5)])
    ys = engine.generate(lambda i: np.full(3, float(i)), [(i,) for i in range(5)])
    shared = engine.share(2.0)
    sums = engine.map(add_block, xs, ys, shared)
    assert [list(v) for v in engine.collect(sums)] == [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(5)]
    pairs = engine.map(lambda x: (x.sum(), x.max()), sums)
    first, second = engine.split(pairs, 2)
    assert engine.collect(second) == [3 * i + 2 for i in range(5)]
    picked = engine.select(sums, [4, 1])
    assert [float(v[0]) for v in engine.collect(picked)] == [12.0, 3.0]
    regrouped = engine.regroup(concat, sums, [[0, 1], [4], [2, 3]])
    assert [len(v) for v in engine.collect(regrouped)] == [6, 3, 6]
    names = engine.generate(str, [(f"b{i}",) for i in range(7)])
    assert engine.reduce(names, bracket) == "(((b0+b1)+(b2+b3))+((b4+b5)+b6))"
    assert engine.collect(engine.indices(4)) == [0, 1, 2, 3]


def test_tree_pairs_neighbours_level_by_level():
    assert tree_reduce(["a", "b", "c", "d", "e"], bracket) == "(((a+b)+(c+d))+e)"


@dataclasses.dataclass(frozen=True)
class Foreign:
    a: np.ndarray


def test_codec_round_trips_block_values_and_refuses_classes_outside_buffet():
    from buffet.data.store import CSRRows

    rows = CSRRows(np.array([0, 2]), np.array([1, 3], np.int32), np.array([1.0, 2.0]), 5)
    value = {"x": np.arange(4), "t": (1, 2.5, "s", None, float("nan")), "rows": [rows, np.int64(3)]}
    back = codec.from_arrays(codec.to_arrays(value))
    np.testing.assert_array_equal(back["x"], value["x"])
    assert back["t"][:4] == (1, 2.5, "s", None) and np.isnan(back["t"][4])
    assert isinstance(back["rows"][0], CSRRows) and back["rows"][0].n_cols == 5 and back["rows"][1] == 3
    np.testing.assert_array_equal(back["rows"][0].data, rows.data)
    with pytest.raises(TypeError, match="not a buffet class"):
        codec.from_arrays(codec.to_arrays(Foreign(np.eye(2))))


def test_codec_decodes_only_the_fields_asked_for_and_reads_no_other_array():
    """``from_arrays(..., fields=...)`` of a flattened dict gives those entries and asks the arrays' mapping
    for theirs only (a checkpoint read lazily then loads nothing else)."""
    flat = codec.to_arrays({"g": np.arange(3.0), "h": np.ones(3), "lazy": {"E": np.eye(3)}, "n": 4})
    asked = []

    class Recording(dict):
        def __getitem__(self, key):
            asked.append(key)
            return super().__getitem__(key)

    back = codec.from_arrays(Recording(flat), fields=("g", "h"))
    assert sorted(back) == ["g", "h"]
    np.testing.assert_array_equal(back["g"], np.arange(3.0))
    assert sorted(asked) == sorted([codec.STRUCTURE, "v.g", "v.h"])


# ----- a toy model whose blocks keep state between steps -----

def toy_local(state: np.ndarray, block: int, step: int, scale: float, die: str) -> tuple:
    """A random walk per block, its statistic the block's sum. With ``die`` naming a folder, the worker that
    runs a block whose file ``die/<block>`` exists removes it and kills itself: workers lost at a known
    step, each block's task once."""
    if die and os.path.exists(f"{die}/{block}"):
        os.remove(f"{die}/{block}")
        os._exit(1)
    new = state + scale * stream(7, "toy", step, block).standard_normal(state.shape)
    return new, {"sum": new.sum()}


@dataclasses.dataclass
class ToyDriver:
    """Named state "walk" per block; a global (``scale``) updated from the reduced statistics."""

    engine: Engine
    n_blocks: int = 4
    steps: int = 12
    die_at: int = -1
    die_file: str = ""
    scale: float = 1.0
    label: str = "toy"

    def start(self) -> None:
        self.engine.keep("walk", self.engine.generate(np.zeros, [(5,)] * self.n_blocks))

    def step(self, step: int) -> dict:
        die = self.die_file if step == self.die_at else ""
        results = self.engine.map(toy_local, self.engine.state("walk"), self.engine.indices(self.n_blocks), step,
                                  self.engine.share(self.scale), die)
        walk, stats = self.engine.split(results, 2)
        self.engine.keep("walk", walk)
        total = self.engine.reduce(stats)["sum"]
        self.scale = 1.0 / (1.0 + abs(total) / 100.0)
        return {"total": total}

    def total_steps(self) -> int:
        return self.steps

    def finished(self, step: int, trace: list) -> bool:
        return step >= self.steps

    def global_arrays(self) -> dict:
        return {"scale": self.scale}

    def set_globals(self, arrays: dict) -> None:
        self.scale = float(arrays["scale"])

    def recovery_values(self) -> dict:
        return self.global_arrays()

    def recover(self, values: dict) -> None:
        self.set_globals(values)


class SignalledInDel:
    """Sends this process ``sig`` from its ``__del__``: the handler's exception is then raised inside a
    ``__del__``, where Python reports it as ignored and goes on (as when a Dask future is released)."""

    def __init__(self, sig: int):
        self.sig = sig

    def __del__(self) -> None:
        os.kill(os.getpid(), self.sig)
        time.sleep(0.5)  # the handler runs here, within the __del__


@dataclasses.dataclass
class SignalledDriver(ToyDriver):
    """A toy fit that receives ``sig`` during its step 3, inside a ``__del__``."""

    sig: int = signal.SIGTERM

    def step(self, step: int) -> dict:
        if step == 2:
            SignalledInDel(self.sig)  # dropped at once
        return super().step(step)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed exception
@pytest.mark.parametrize("sig, stopped_by", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_whose_exception_a_del_method_swallowed_still_stops_the_fit(tmp_path, sig, stopped_by):
    driver = SignalledDriver(ProcessEngine(), sig=sig)
    driver.start()
    run = RunStore.create(tmp_path / "run", "toy", None, {})
    handlers = {s: signal.signal(s, StopRequest.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(stopped_by) as stopped:
            run_loop(driver, run, Position(), checkpoint_every=3, quiet=True)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        StopRequest.forget()
    assert type(stopped.value) is stopped_by and run.status == "interrupted" and run.newest_step() == 3


@pytest.fixture(scope="module")
def process_cluster():
    """A client of its own 2-worker LocalCluster of processes (a test kills one of its workers; the nanny
    starts another)."""
    from distributed import Client

    from buffet.pipeline.engine.cluster import local_cluster

    with local_cluster(2, "processes", dashboard=False) as cluster, Client(cluster) as client:
        yield client


def walk(engine: Engine, run: RunStore | None = None, **options) -> tuple[list[float], list]:
    driver = ToyDriver(engine, **options)
    driver.start()
    trace = run_loop(driver, run, Position(), checkpoint_every=3, quiet=True).trace
    return [r["total"] for r in trace], engine.collect(engine.state("walk"))


def sent_between_workers(client) -> int:
    """Bytes the workers of ``client``'s cluster have sent each other so far."""
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())


def test_a_shared_value_has_a_copy_on_every_worker_sent_once_by_the_client(clients):
    """So that Dask may run a step's blocks on any worker, not only on the one that holds the globals, and so
    that the client's upload does not grow with the workers: the other copies go from worker to worker
    (``DaskEngine.share``)."""
    from distributed import wait

    client, value = clients[2], np.arange(1_000_000.0)  # 8 MB
    before = sent_between_workers(client)
    copies = engine_on(client).share(value).value
    wait(list(copies))
    holders = client.who_has(list(copies))
    assert set().union(*(holders[c.key] for c in copies)) == set(client.scheduler_info()["workers"])
    assert sent_between_workers(client) - before >= value.nbytes  # the second worker's copy came from the first


def test_a_value_scattered_to_a_worker_that_left_is_a_cluster_failure():
    """Dask's scheduler answers a scatter whose worker retired meanwhile with a KeyError naming the worker's
    address (seen on SLURM jobs replaced by --worker-lifetime): the step is tried again, as for any lost
    worker. A KeyError of anything else is not a lost worker."""
    assert is_cluster_failure(KeyError("tls://192.0.2.2:44597")) and is_cluster_failure(KeyError("tcp://127.0.0.1:1"))
    assert not any(is_cluster_failure(KeyError(key)) for key in ("theta", "s3://bucket/run", 3))


def test_the_loop_adds_step_and_cumulative_seconds_and_resumes_exactly(tmp_path):
    totals, blocks = walk(ProcessEngine())
    run = RunStore.create(tmp_path / "run", "toy", None, {})
    driver = ToyDriver(ProcessEngine())
    driver.start()
    first = run_loop(driver, run, Position(), checkpoint_every=3, stop_after=7, quiet=True)
    assert [r["step"] for r in first.trace] == list(range(1, 8)) and run.status == "interrupted"
    from buffet.pipeline.engine.checkpoints import Saved

    engine = ProcessEngine()
    resumed = ToyDriver(engine)
    position = Saved(run, engine).restore(resumed)
    assert position.step == 7 and position.seconds == first.trace[-1]["seconds"]
    end = run_loop(resumed, run, position, checkpoint_every=3, quiet=True)
    assert [r["total"] for r in end.trace] == totals
    assert all(b > a for a, b in zip([r["seconds"] for r in end.trace], [r["seconds"] for r in end.trace][1:]))
    for a, b in zip(engine.collect(engine.state("walk")), blocks):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dying", [[0], [0, 1, 2, 3]])
def test_workers_lost_mid_fit_cost_time_not_results(tmp_path, caplog, process_cluster, dying):
    """One worker killed (the cluster recomputes what it held, or the step is tried again), or every
    worker killed at once (the shared values of the steps since the last checkpoint are gone with them,
    so the fit replays from the checkpoint): the same numbers as an undisturbed fit."""
    expected, blocks = walk(ProcessEngine())
    flags = tmp_path / "die"
    flags.mkdir()
    for block in dying:
        (flags / str(block)).write_text("once")
    with caplog.at_level("WARNING", logger="buffet"):
        totals, got = walk(engine_on(process_cluster), RunStore.create(tmp_path / "run", "toy", None, {}), die_at=7,
                           die_file=str(flags))
    assert not any(flags.iterdir())  # every chosen block's task killed its worker
    assert totals == expected
    for a, b in zip(got, blocks):
        np.testing.assert_array_equal(a, b)
    if len(dying) == 4:
        assert any("replaying from the checkpoint of step 6" in r.getMessage() for r in caplog.records)


@pytest.fixture
def workerless():
    """An engine (``worker_timeout`` 1 s) on a cluster that has no worker."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        yield engine_on(client, worker_timeout=1.0)


def lost_in_time(call: Callable[[], object]) -> None:
    """``call`` ends in a lost cluster's ``ClusterLostError`` within the engine's ``worker_timeout`` (1 s) plus
    ``LOST_CLUSTER_MARGIN`` (tests/worker_loss.py says why that margin): a bound on the wait, so that an
    engine that waits longer than it was told, or hangs, fails."""
    started = time.monotonic()
    with pytest.raises(ClusterLostError, match="no Dask worker for 1 s"):
        call()
    waited = time.monotonic() - started
    assert waited < 1.0 + LOST_CLUSTER_MARGIN, f"the lost cluster was reported after {waited:.1f} s"


def test_no_worker_left_stops_within_the_timeout(workerless):
    """A fit, and the results of blocks already sent to the scheduler, with no worker to run them."""
    lost_in_time(lambda: walk(workerless))
    lost_in_time(lambda: workerless.collect(workerless.from_values([1, 2])))


def test_sharing_a_value_with_no_worker_left_is_a_lost_cluster(workerless):
    """``share`` with every worker gone ends as the step's other calls do (no bare TimeoutError from Dask's
    scatter, which the command could only report as an unknown failure)."""
    lost_in_time(lambda: workerless.share(np.arange(3)))


def _blas_threads(_: object) -> int:
    from threadpoolctl import threadpool_info

    return max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)


def test_block_tasks_in_this_process_use_one_blas_thread_like_the_workers():
    """A multi-threaded BLAS sums long dot products in another order, so in-process blocks would differ in
    the last digit from the same blocks on workers (which run BLAS on one thread)."""
    from threadpoolctl import threadpool_limits

    engine = ProcessEngine()
    blocks = engine.from_values([0, 1])
    with threadpool_limits(limits=2, user_api="blas"):  # this process's BLAS on two threads
        assert _blas_threads(None) == 2
        assert engine.collect(engine.map(_blas_threads, blocks)) == [1, 1]
        assert engine.reduce(engine.map(lambda b: {"n": _blas_threads(b)}, blocks)) == {"n": 2}

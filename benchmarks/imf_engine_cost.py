"""What buffet's engine costs an IMF or INMF alternation, against the same updates as a
plain NumPy loop in one process.

One alternation at a fixed K (``pipeline.models.imf.IMFDriver.step``) is: the column
posteriors from the summed statistics (``model.column_update``, on the client), the row step of every row
chunk (``pipeline.models.imf.row_task``: ``kernels.imf.row_step`` with the pairwise exchanges, returning the
chunk's new q(z) and its statistics), the statistics summed, the pruning test and the evidence
(``model.evidence``). ``plain_alternation`` calls those same functions on in-memory chunks in a Python
loop: no Dask, no engine, no checkpoints. ``plain_start`` mirrors ``IMFDriver.start(nu)``, so both begin from
one q(z) and the column posteriors it implies.

Subcommands (results: one JSON line each, printed and appended to benchmarks/results.jsonl):

* ``check``: on a small masked store (``imf_masked_scale.write_masked_store``, default 2000 x 100) run
  ``--steps`` alternations at ``--k`` features from one random q(z) in the plain loop (one chunk, and the
  engine's chunks) and in the driver (in-process engine, and a LocalCluster of 2 worker processes);
  report the largest relative difference of the evidence over the steps and of the final q(z);
* ``compare``: on the 100k x 1000 store of ``imf_masked_scale.py`` (written unless it exists), ``--rounds``
  rounds, each timing ``--steps`` alternations of the plain loop (one chunk or the engine's chunks;
  default BLAS threads or one) and of the driver on the LocalCluster ``buffet fit imf|inmf`` starts
  (2 single-threaded worker processes), for each model: wall and CPU seconds, load average, foreign load;
* ``profile``: where an engine step goes (the client's pieces timed around the driver's engine calls,
  the workers' task time by kind from Dask's task stream) against the plain loop's pieces;
* ``kernel-steps``: the row step's cost along the alternations on a few chunks (``kernel_steps``: subnormal
  products of q(z), page faults under the workers' malloc setting); run it with an older install's Python
  to compare kernels (the record names the kernels it ran).

    python benchmarks/imf_engine_cost.py check --workdir /work/bench/imf
    python benchmarks/imf_engine_cost.py compare --workdir /work/bench/imf --models imf,inmf
    python benchmarks/imf_engine_cost.py profile --workdir /work/bench/imf --models imf,inmf
    MALLOC_TRIM_THRESHOLD_=268435456 python benchmarks/imf_engine_cost.py kernel-steps --workdir /work/bench/imf
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from buffet.data.store import DenseRows
from buffet.kernels import imf
from buffet.pipeline.engine.blas import single_threaded_blas
from buffet.pipeline.engine.cluster import dask_client
from buffet.pipeline.engine.dataset import read_dense_chunk, read_seen_chunk, row_ranges, source_of
from buffet.pipeline.engine.engine import Engine, add_stats
from buffet.pipeline.engine.executor_choice import engine_on
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.models.imf import IMFConfig, IMFDriver, INMFConfig, empty_nu_task, row_task, stats_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ForeignLoad, PeakMemory, machine, record
from imf_masked_scale import SPLIT, write_masked_store

CONFIGS = {"imf": IMFConfig, "inmf": INMFConfig}
WORKERS = 2  # the LocalCluster of ``buffet fit imf --workers 2`` (worker processes, one thread each)
Chunks = list[DenseRows]
NuChunks = list[np.ndarray]


def fixed_k_config(model: str, k: int, chunk_rows: int) -> IMFConfig:
    """The driver's settings for alternations at a fixed K: growth never starts (tol 0: the evidence would
    have to repeat exactly; max_iter out of reach) and nothing is chosen on validation."""
    return CONFIGS[model](max_k=k, chunk_rows=chunk_rows, tol=0.0, max_iter=10**9, select="none")


def load_chunks(store: Path, chunk_rows: int, n_rows: int | None = None) -> Chunks:
    """The training rows of ``store`` (its first ``n_rows``, default all) as the engine's blocks hold them
    (``engine.dataset.dense_blocks``): X and the entries training sees (observed, not in the ``heldout``
    split), per chunk of ``chunk_rows``."""
    source = source_of(str(store))
    return [DenseRows(read_dense_chunk(source, r0, r1), read_seen_chunk(source, r0, r1, SPLIT, None))
            for r0, r1 in row_ranges(n_rows or source.open().n_rows, chunk_rows)]


def one_chunk(chunks: Chunks) -> Chunks:
    """The whole matrix as one chunk."""
    return [DenseRows(np.concatenate([c.X for c in chunks]), np.concatenate([c.mask for c in chunks]))]


def split_rows(nu: np.ndarray, chunks: Chunks) -> NuChunks:
    """q(z) (N x K) cut into the row chunks of ``chunks``."""
    bounds = np.cumsum([c.X.shape[0] for c in chunks])[:-1]
    return np.split(nu, bounds)


def random_nu(n_rows: int, k: int, seed: int) -> np.ndarray:
    """A starting q(z): every nu_ik 0.9 or 0.1, on with probability 0.3 (the planted features' usage)."""
    return np.where(np.random.default_rng(seed).random((n_rows, k)) < 0.3, 0.9, 0.1)


def summed_stats(chunks: Chunks, nu: NuChunks) -> dict:
    """The statistics of q(z) summed over the chunks (``kernels.imf.chunk_stats``)."""
    return functools.reduce(add_stats, [stats_task(c, n) for c, n in zip(chunks, nu)])


@dataclass
class PlainState:
    """The plain loop's state: q(z) per chunk, the column posteriors and the summed statistics."""

    nu: NuChunks
    post: dict
    stats: dict


def plain_start(config: IMFConfig, chunks: Chunks, nu0: np.ndarray) -> PlainState:
    """``IMFDriver.start(nu0)`` in plain NumPy: the K+ = 0 column posteriors, then K0 features added to
    them, and the statistics of ``nu0``."""
    model, hyper = config.model(), config.hyper()
    post = model.initial_post(summed_stats(chunks, [empty_nu_task(c) for c in chunks]), hyper)
    for _ in range(nu0.shape[1]):
        post = model.add_feature(post, hyper)
    nu = split_rows(nu0, chunks)
    return PlainState(nu, post, summed_stats(chunks, nu))


Timer = Callable[[str, Callable], Callable]  # (name of a piece, function) -> the function, timed or not


def untimed(name: str, fn: Callable) -> Callable:
    """The ``Timer`` that times nothing."""
    return fn


def plain_alternation(config: IMFConfig, chunks: Chunks, state: PlainState, timed: Timer = untimed) -> float:
    """One alternation of ``IMFDriver.step`` at a fixed K in plain NumPy (paper 000,
    Algorithm 1): column update, row step of every chunk, statistics summed, evidence. Updates ``state``
    and returns L(q; K). Refuses to prune (the comparison is at a fixed K). ``timed`` wraps each piece
    (``StepClock.wrap`` for the profile)."""
    model, hyper = config.model(), config.hyper()
    state.post = timed("column update (client)", model.column_update)(state.stats, hyper, state.post)
    results = [timed("row_task (all chunks)", row_task)(c, n, state.post) for c, n in zip(chunks, state.nu)]
    state.nu = [nu for nu, _ in results]
    state.stats = timed("sum of statistics", functools.reduce)(add_stats, [s for _, s in results])
    if not imf.keep_features(state.stats["sum_nu"], config.prune_below).all():
        raise RuntimeError("a feature fell below the pruning threshold: the fixed-K comparison does not hold")
    return timed("evidence (client)", model.evidence)(state.stats, state.post, hyper)


def engine_alternation(driver: IMFDriver) -> float:
    """One ``IMFDriver.step``; refuses a step that converged or pruned (the comparison is at the fixed K of
    ``fixed_k_config``)."""
    k = driver.config.max_k
    rec = driver.step(0)
    if "converged_k" in rec or rec["k_plus"] != k:
        raise RuntimeError(f"the driver left the fixed K = {k}: {rec}")
    return rec["evidence"]


@contextlib.contextmanager
def cluster() -> Iterator[Any]:
    """The LocalCluster ``buffet fit imf --workers 2`` starts (2 single-threaded worker processes)."""
    with dask_client(WORKERS, dashboard=False, quiet=True) as client:
        yield client


@contextlib.contextmanager
def blas_threads(threads: int | None) -> Iterator[None]:
    """BLAS as the process has it (None: OpenBLAS's default, one thread per core) or on one thread."""
    with single_threaded_blas() if threads == 1 else contextlib.nullcontext():
        yield


def load_now() -> dict:
    """The load averages (1, 5, 15 min) as ``uptime`` prints them."""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()]}


def timed_steps(step: Callable[[], float], steps: int, tree: PeakMemory | None) -> dict:
    """``steps`` calls of ``step``: wall seconds of each, the evidence after each, CPU seconds of this process
    (or of the process tree ``tree`` samples: a LocalCluster's workers) and the foreign load."""
    if tree is not None:
        tree.reset_cpu()
    cpu0 = time.process_time()
    walls, evidence = [], []
    with ForeignLoad() as foreign:
        for _ in range(steps):
            t0 = time.perf_counter()
            evidence.append(step())
            walls.append(time.perf_counter() - t0)
    cpu = tree.own_cpu_seconds() if tree is not None else time.process_time() - cpu0
    return {"seconds": sum(walls), "cpu_seconds": cpu, "seconds_per_step": sum(walls) / steps,
            "median_step_seconds": float(np.median(walls)), "step_seconds": [round(w, 4) for w in walls],
            "foreign_load_cores": foreign.cores(cpu), "evidence": evidence}


def plain_run(config: IMFConfig, chunks: Chunks, nu0: np.ndarray, steps: int,
              threads: int | None) -> tuple[dict, PlainState]:
    """``steps`` plain alternations from ``nu0`` (the start is not timed)."""
    with blas_threads(threads):
        state = plain_start(config, chunks, nu0)
        result = timed_steps(lambda: plain_alternation(config, chunks, state), steps, None)
    return result, state


def engine_run(driver: IMFDriver, nu0: np.ndarray, steps: int, tree: PeakMemory | None) -> dict:
    """``steps`` driver steps from ``nu0`` (``IMFDriver.start``, not timed, also loads the data on first use)."""
    t0 = time.perf_counter()
    driver.start(nu0)
    return {"start_seconds": time.perf_counter() - t0, **timed_steps(lambda: engine_alternation(driver), steps, tree)}


def relative_gap(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|."""
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b)))


# ----- check -----

def check(args: argparse.Namespace, base: dict) -> None:
    """The plain loop against the driver on a small store (module docstring)."""
    store = Path(args.workdir) / f"check{args.rows}x{args.cols}.zarr"
    write_masked_store(store, args.rows, args.cols, args.missing, args.chunk_rows, args.seed)
    chunks = load_chunks(store, args.chunk_rows)
    nu0 = random_nu(args.rows, args.k, args.seed)
    for model in args.models.split(","):
        config = fixed_k_config(model, args.k, args.chunk_rows)
        runs = {}
        for name, data in (("plain, one chunk", one_chunk(chunks)), ("plain, engine's chunks", chunks)):
            result, state = plain_run(config, data, nu0, args.steps, None)
            runs[name] = (np.array(result["evidence"]), np.concatenate(state.nu))
        runs["engine, in process"] = driver_values(config, store, nu0, args.steps, ProcessEngine())
        with dask_client(WORKERS, dashboard=False, quiet=True) as client:
            runs[f"engine, {WORKERS} worker processes"] = driver_values(config, store, nu0, args.steps, engine_on(client))
        ref_l, ref_nu = runs["engine, in process"]
        gaps = {name: {"evidence": relative_gap(l, ref_l), "nu": float(np.max(np.abs(nu - ref_nu)))}
                for name, (l, nu) in runs.items()}
        record(args.results, {**base, "stage": "check", "model": model, "rows": args.rows, "cols": args.cols,
                              "k": args.k, "steps": args.steps, "chunk_rows": args.chunk_rows,
                              "evidence_first_last": [float(ref_l[0]), float(ref_l[-1])],
                              "against_engine_in_process": gaps})


def driver_values(config: IMFConfig, store: Path, nu0: np.ndarray, steps: int,
                  engine: Engine) -> tuple[np.ndarray, np.ndarray]:
    """The evidence after each of ``steps`` driver steps from ``nu0``, and the final q(z)."""
    driver = IMFDriver(config, source_of(str(store)), engine)
    driver.start(nu0)
    return np.array([engine_alternation(driver) for _ in range(steps)]), driver.expected_z()


# ----- compare -----

def scale_store(args: argparse.Namespace, base: dict) -> Path:
    """The store of ``imf_masked_scale.py`` at its default size, written unless it is there."""
    store = Path(args.workdir) / f"masked{args.rows}x{args.cols}.zarr"
    if not store.exists():
        t0 = time.perf_counter()
        data = write_masked_store(store, args.rows, args.cols, args.missing, args.chunk_rows, args.seed)
        record(args.results, {**base, "stage": "write", **data, "seconds": time.perf_counter() - t0})
    return store


PLAIN_VARIANTS = (("one chunk", True, None), ("one chunk", True, 1), ("engine's chunks", False, None),
                  ("engine's chunks", False, 1))


def compare(args: argparse.Namespace, base: dict) -> None:
    """Plain loop and engine, alternated within each round (module docstring)."""
    store = scale_store(args, base)
    chunks = load_chunks(store, args.chunk_rows)
    whole = one_chunk(chunks)
    nu0 = random_nu(args.rows, args.k, args.seed)
    common = {**base, "stage": "compare", "rows": args.rows, "cols": args.cols, "k": args.k, "steps": args.steps,
              "chunk_rows": args.chunk_rows}
    with PeakMemory() as tree, cluster() as client:
        engine = engine_on(client)
        drivers = {m: IMFDriver(fixed_k_config(m, args.k, args.chunk_rows), source_of(str(store)), engine)
                   for m in args.models.split(",")}
        for round_ in range(args.rounds):
            for model, driver in drivers.items():
                for label, merged, threads in PLAIN_VARIANTS:
                    before = load_now()
                    result, _ = plain_run(driver.config, whole if merged else chunks, nu0, args.steps, threads)
                    record(args.results, {**common, "round": round_, "model": model, "system": "plain",
                                          "chunks": label, "blas_threads": threads or "default", **before,
                                          **summary(result)})
                before = load_now()
                result = engine_run(driver, nu0, args.steps, tree)
                record(args.results, {**common, "round": round_, "model": model, "system": "engine",
                                      "workers": WORKERS, **before, **summary(result)})


def summary(result: dict) -> dict:
    """A timed run without its per-step evidence, with the last evidence."""
    return {**{k: v for k, v in result.items() if k != "evidence"}, "last_evidence": result["evidence"][-1]}


# ----- profile -----

class StepClock:
    """Wall seconds of named pieces of the client's work during driver steps: the driver's model functions
    and the engine calls it makes are wrapped on the instances (nothing in the library changes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[name] += time.perf_counter() - t0
        return timed

    def attach(self, driver: IMFDriver) -> None:
        model = driver.model
        driver.model = type(model)(**{**model.__dict__,
                                      "column_update": self.wrap("column update (client)", model.column_update),
                                      "evidence": self.wrap("evidence (client)", model.evidence)})
        engine = driver.engine
        for method, name in (("share", "share q(A) (scatter)"), ("map", "graph building (map, split)"),
                             ("reduce", "reduce: submit, workers' round trip, gather")):
            setattr(engine, method, self.wrap(name, getattr(engine, method)))


def task_kind(key: Any) -> str:
    """The function name in a Dask task key (``row_task-ab12cd34-5``, ``('reduce-...', 0)``)."""
    name = key[0] if isinstance(key, tuple) else key
    name = str(name)
    return name.split("-")[0] if not name.startswith("reduce-") else "reduce (tree level)"


def task_stream_totals(stream: list[dict]) -> dict:
    """Seconds of the workers' task stream by action (compute per task kind, transfer, ...) and task counts."""
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for task in stream:
        kind = task_kind(task["key"])
        counts[kind] += 1
        for part in task["startstops"]:
            label = f"compute {kind}" if part["action"] == "compute" else part["action"]
            seconds[label] += part["stop"] - part["start"]
    return {"seconds": {k: round(v, 3) for k, v in sorted(seconds.items())}, "tasks": dict(counts)}


def plain_pieces(config: IMFConfig, chunks: Chunks, nu0: np.ndarray, steps: int) -> dict:
    """Wall seconds of the plain loop's pieces over ``steps`` alternations on one BLAS thread: column update,
    row steps (the kernel split into row terms, sweeps and statistics), the sum, the evidence."""
    clock = StepClock()
    with single_threaded_blas():
        state = plain_start(config, chunks, nu0)
        for _ in range(steps):
            plain_alternation(config, chunks, state, clock.wrap)
        kernel = kernel_split(chunks[0], state.nu[0], state.post)
    return {"seconds": {k: round(v / steps, 4) for k, v in clock.seconds.items()},
            "one_chunk_kernel_ms": kernel}


def kernel_split(chunk: DenseRows, nu: np.ndarray, post: dict, repeats: int = 5) -> dict:
    """CPU milliseconds (one BLAS thread) of ``kernels.imf.row_step``'s parts on one chunk: row terms, the
    exchange move, the sweep, the chunk statistics (the best of ``repeats``)."""
    b, g = imf.row_terms(chunk.X, chunk.mask, post)
    log_pi, log_1mpi = imf.beta_log_means(post["t1"], post["t2"])
    eta_x, _ = imf.gamma_means(post["ax"], post["bx"])
    parts = {"row_terms": lambda: imf.row_terms(chunk.X, chunk.mask, post),
             "swap_rows": lambda: imf.swap_rows(nu, b, g, log_pi - log_1mpi, eta_x),
             "sweep_rows": lambda: imf.sweep_rows(nu, b, g, log_pi - log_1mpi, eta_x),
             "chunk_stats": lambda: imf.chunk_stats(chunk.X, chunk.mask, nu),
             "row_step (all)": lambda: imf.row_step(chunk.X, chunk.mask, nu, post, swaps=True)}
    return {name: round(cpu_ms(fn, repeats), 1) for name, fn in parts.items()}


def kernel_steps(args: argparse.Namespace, base: dict) -> None:
    """The row step's cost on the first ``--probe-rows`` rows along ``--steps`` plain alternations from the
    random start (one BLAS thread): CPU ms per chunk of ``row_task`` and ``chunk_stats``, minor page faults
    per ``row_task``, the fraction of the products nu_ir nu_ik that are subnormal, the smallest nu_ik
    (``kernels.imf.LOGIT_BOUND`` keeps it at 1.5e-150 or above) and the evidence after the step. Run it with
    the workers' MALLOC_TRIM_THRESHOLD_ in the environment to see what that setting costs a row step."""
    store = scale_store(args, base)
    chunks = load_chunks(store, args.chunk_rows, args.probe_rows)
    model = args.models.split(",")[0]
    config = fixed_k_config(model, args.k, args.chunk_rows)
    common = {**base, "stage": "kernel_steps", "model": model, "k": args.k, "rows": args.probe_rows,
              "chunk_rows": args.chunk_rows, "malloc_env": malloc_env(), "kernels": str(Path(imf.__file__).parent)}
    with single_threaded_blas():
        state = plain_start(config, chunks, random_nu(args.probe_rows, args.k, args.seed))
        for step in range(1, args.steps + 1):
            evidence = plain_alternation(config, chunks, state)
            record(args.results, {**common, "step": step, **load_now(), **row_step_costs(chunks, state),
                                  "evidence": evidence})


def row_step_costs(chunks: Chunks, state: PlainState) -> dict:
    """``kernel_steps``'s figures at the current state (one BLAS thread)."""
    import resource

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    row_ms = cpu_ms(lambda: [row_task(c, n, state.post) for c, n in zip(chunks, state.nu)]) / len(chunks)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (3 * len(chunks))
    c, nu = chunks[0], state.nu[0]
    outer = nu[:, :, None] * nu[:, None, :]
    return {"row_task_cpu_ms": round(row_ms, 1), "row_task_minor_faults": round(faults),
            "chunk_stats_cpu_ms": round(cpu_ms(lambda: imf.chunk_stats(c.X, c.mask, nu)), 1),
            "subnormal_products": float(np.mean((outer > 0) & (outer < np.finfo(float).tiny))),
            "smallest_nu": float(nu[nu > 0].min())}


def cpu_ms(fn: Callable[[], Any], repeats: int = 3) -> float:
    """CPU milliseconds of ``fn`` (all threads of this process), the best of ``repeats``."""
    best = np.inf
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return 1000 * best


def malloc_env() -> dict:
    """The glibc malloc settings in this process's environment."""
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


def profile(args: argparse.Namespace, base: dict) -> None:
    """Where an engine step's time goes, against the plain loop's pieces (module docstring)."""
    from distributed import get_task_stream

    store = scale_store(args, base)
    chunks = load_chunks(store, args.chunk_rows)
    nu0 = random_nu(args.rows, args.k, args.seed)
    common = {**base, "stage": "profile", "rows": args.rows, "cols": args.cols, "k": args.k, "steps": args.steps,
              "chunk_rows": args.chunk_rows}
    with cluster() as client:
        for model in args.models.split(","):
            config = fixed_k_config(model, args.k, args.chunk_rows)
            before = load_now()
            plain = plain_pieces(config, chunks, nu0, args.steps)
            driver = IMFDriver(config, source_of(str(store)), engine_on(client))
            driver.start(nu0)
            clock = StepClock()
            clock.attach(driver)
            with get_task_stream(client) as stream:
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    engine_alternation(driver)
                wall = time.perf_counter() - t0
            workers = task_stream_totals(stream.data)
            record(args.results, {**common, "model": model, "workers": WORKERS, **before,
                                  "engine_seconds_per_step": wall / args.steps,
                                  "engine_client_seconds_per_step": {k: round(v / args.steps, 4)
                                                                     for k, v in clock.seconds.items()},
                                  "engine_worker_seconds_per_step": {k: round(v / args.steps, 4)
                                                                     for k, v in workers["seconds"].items()},
                                  "engine_tasks_per_step": {k: v / args.steps for k, v in workers["tasks"].items()},
                                  "plain_seconds_per_step": plain["seconds"],
                                  "plain_one_chunk_kernel_ms": plain["one_chunk_kernel_ms"]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("check", "compare", "profile", "kernel-steps"))
    p.add_argument("--workdir", required=True)
    p.add_argument("--rows", type=int, default=None, help="default: 2000 (check), 100000 (compare, profile)")
    p.add_argument("--cols", type=int, default=None, help="default: 100 (check), 1000 (compare, profile)")
    p.add_argument("--chunk-rows", type=int, default=None, help="default: 500 (check), 5000 (compare, profile)")
    p.add_argument("--missing", type=float, default=0.2)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--steps", type=int, default=None, help="alternations (default: 30 check, 10 compare, 5 profile)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--models", default="imf,inmf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe-rows", type=int, default=20_000, help="kernel-steps: rows of the store it runs on")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()
    small = args.what == "check"
    defaults = {"rows": (2000, 100_000), "cols": (100, 1000), "chunk_rows": (500, 5000)}
    for name, (check_value, scale_value) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, check_value if small else scale_value)
    if args.steps is None:
        args.steps = {"check": 30, "compare": 10, "profile": 5, "kernel-steps": 6}[args.what]
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    base = {"bench": "imf_engine_cost", "machine": machine()}
    {"check": check, "compare": compare, "profile": profile, "kernel-steps": kernel_steps}[args.what](args, base)


if __name__ == "__main__":
    main()

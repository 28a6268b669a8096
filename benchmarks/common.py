"""Shared pieces of the benchmarks: loading a stored corpus, the held-out document-completion
protocol used for every system, peak-memory sampling of this process and of a command's
process tree (``run_measured``).

Nothing here is part of the ``buffet`` package; the benchmarks import it by path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Self

import numpy as np
import psutil
import scipy.sparse as sp
from buffet.data.store import Dataset

THIRDS_SEED = 12345


def load_corpus(store: str) -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray]:
    """(training rows, held-out rows, held-out row ids) of a counts store with a
    ``heldout`` split, as in-memory CSR matrices (for the systems that need them)."""
    ds = Dataset(store)
    X = ds.read_rows(0, ds.n_rows).to_scipy().tocsr()
    held = np.asarray(ds.split("heldout")["test_rows"], dtype=np.int64)
    train = np.setdiff1d(np.arange(ds.n_rows), held)
    return X[train], X[held], held


def thirds(X_test: sp.csr_matrix, seed: int = THIRDS_SEED) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The one token split every system is scored on: each token of each held-out document
    goes to one of three folds (``buffet.kernels.bnmf.split_thirds``); folds 0 and 1 are
    observed, fold 2 is predicted. Returns (observed counts, held-out counts), same sparsity."""
    from buffet.kernels.bnmf import split_thirds

    folds = split_thirds(X_test.data, np.random.default_rng(seed)).astype(np.float64)
    shape = X_test.shape
    obs = sp.csr_matrix((folds[:, 0] + folds[:, 1], X_test.indices, X_test.indptr), shape=shape)
    held = sp.csr_matrix((folds[:, 2], X_test.indices, X_test.indptr), shape=shape)
    return obs, held


def mixture_loglik(theta: np.ndarray, topics: np.ndarray, held: sp.csr_matrix) -> float:
    """Per-word log likelihood of ``held`` under p(w|d) = sum_k theta_dk topics_kw, with theta
    rows and topic rows normalised to sum to one."""
    theta = theta / theta.sum(axis=1, keepdims=True)
    topics = topics / topics.sum(axis=1, keepdims=True)
    held = held.tocoo()
    keep = held.data > 0
    r, c, n = held.row[keep], held.col[keep], held.data[keep]
    p = np.einsum("nk,nk->n", theta[r], topics[:, c].T)
    return float(n @ np.log(p) / n.sum())


def drop_empty(obs: sp.csr_matrix, held: sp.csr_matrix) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Keep the documents that have observed tokens (all NYT-shaped ones do)."""
    keep = np.diff(obs.indptr) > 0
    return obs[keep], held[keep]


class PeakMemory:
    """Samples the resident memory of this process and all its descendants (Dask workers,
    joblib/loky or multiprocessing workers) every ``interval`` seconds; ``peak`` is the
    largest sum seen (bytes)."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cpu: dict[int, float] = {}

    def _sample(self) -> int:
        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
                c = p.cpu_times()
                self._cpu[p.pid] = c.user + c.system
            except psutil.Error:
                pass
        return total

    def reset_cpu(self) -> None:
        """Start counting CPU seconds of the process tree from now."""
        self._sample()
        self._cpu0 = dict(self._cpu)

    def own_cpu_seconds(self) -> float:
        """CPU seconds used by this process tree since ``reset_cpu`` (processes that ended
        in between count as last sampled)."""
        self._sample()
        base = getattr(self, "_cpu0", {})
        return sum(v - base.get(pid, 0.0) for pid, v in self._cpu.items())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def reset(self) -> None:
        self.peak = self._sample()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


class ForeignLoad:
    """How busy the machine was with other people's work while a benchmark ran: system-wide
    busy CPU seconds minus those of our own process tree (``PeakMemory`` tracks them), per
    second of wall time. 0 = a quiet machine; 1 = another process took a whole core."""

    def __enter__(self) -> Self:
        self.t0, self.busy0 = time.perf_counter(), self._busy()
        return self

    @staticmethod
    def _busy() -> float:
        c = psutil.cpu_times()
        return c.user + c.nice + c.system + getattr(c, "irq", 0) + getattr(c, "softirq", 0) + getattr(c, "steal", 0)

    def __exit__(self, *exc) -> None:
        self.wall, self.busy = time.perf_counter() - self.t0, self._busy() - self.busy0

    def cores(self, own_cpu: float) -> float:
        return max(0.0, (self.busy - own_cpu) / self.wall)


def wait_quiet(limit: float = 0.25, max_wait: float = 180.0) -> float:
    """Wait (up to ``max_wait`` s) until the machine's CPU use over 3 s is below ``limit``
    cores (the benchmark host is shared); returns the last busy fraction measured."""
    t0 = time.perf_counter()
    while True:
        busy = psutil.cpu_percent(interval=3.0) / 100 * psutil.cpu_count()
        if busy < limit or time.perf_counter() - t0 > max_wait:
            return busy
        time.sleep(2.0)


def machine() -> dict:
    return {"cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "ram_gb": round(psutil.virtual_memory().total / 2**30, 1)}


def record(path: str | None, result: dict) -> None:
    """Print a result as one JSON line and append it to ``path``."""
    result = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), **result}
    line = json.dumps(result)
    print(line, flush=True)
    if path:
        with Path(path).open("a") as out:
            out.write(line + "\n")


def run_measured(cmd: list[str], interval: float = 0.1, time_limit: float | None = None,
                 check: bool = True) -> dict:
    """Run ``cmd``; return wall seconds, CPU seconds and the peak summed RSS of its process tree (the CPU of
    every process of the tree that was waited for, e.g. ingest's reading process), its exit status, and
    whether it was stopped at ``time_limit``: after that many seconds it is sent SIGTERM, which a
    ``buffet fit`` answers by checkpointing and exiting with status 143. With ``check`` any other
    non-zero status ends the benchmark with the command's output."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    root = psutil.Process(proc.pid)
    peak, stopped = 0, False
    while proc.poll() is None:
        total = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
        if time_limit is not None and not stopped and time.perf_counter() - t0 > time_limit:
            proc.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(interval)
    reader.join()
    out = "".join(output)
    seconds = time.perf_counter() - t0
    if check and proc.returncode != 0 and not (stopped and proc.returncode == 143):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    return {"seconds": seconds, "cpu_seconds": _children_cpu() - cpu0, "peak_rss_mb": peak / 2**20,
            "command": " ".join(cmd), "returncode": proc.returncode, "stopped_at_time_limit": stopped,
            "output_tail": out[-400:]}


def _children_cpu() -> float:
    """User and system CPU seconds of this process's finished children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_svi_pass(make_driver, config, store: str, workers: int, worker_kind: str) -> tuple[object, list[dict], dict]:
    """One fit of a topic-model driver (``make_driver(config, source, engine)``, e.g. a report module's) on a
    fresh LocalCluster, its held-out scoring switched off; the clock covers the steps only. Returns the
    driver, its trace and the pass's wall seconds, own CPU seconds, foreign load and peak memory."""
    from buffet.pipeline.engine.cluster import dask_client
    from buffet.pipeline.engine.dataset import source_of
    from buffet.pipeline.engine.executor_choice import engine_on

    with PeakMemory() as mem:
        with dask_client(workers, dashboard=False, quiet=True, worker_kind=worker_kind) as client:
            driver = make_driver(config, source_of(store), engine_on(client))
            driver.eval_rows = None  # held-out scoring happens afterwards, outside the timed pass
            driver.start()
            mem.reset_cpu()
            with ForeignLoad() as load:
                t0 = time.perf_counter()
                trace = [driver.step(s) for s in range(driver.total_steps())]
                seconds = time.perf_counter() - t0
                own = mem.own_cpu_seconds()
    return driver, trace, {"seconds": seconds, "cpu_seconds": own, "foreign_load_cores": load.cores(own),
                           "peak_rss_mb": mem.peak / 2**20}


def setting(text: str) -> tuple[str, float | int | str]:
    """A ``NAME=VALUE`` model setting (``--set``), the value read as an int, a float or else a string."""
    name, _, value = text.partition("=")
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    return name, value


def panel_commands(description: str, members: list[str],
                   seeds: list[int]) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line every panel script shares: ``scores --out FILE [--members ...] [--seeds ...]`` scores
    panel members into a JSON-lines file, ``table RESULTS`` prints the tables of such a file. Returns the parser
    and the two subcommands' parsers, for a script's own options."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    scores = sub.add_parser("scores")
    scores.add_argument("--out", type=Path, required=True)
    scores.add_argument("--members", nargs="+", default=members)
    scores.add_argument("--seeds", nargs="+", type=int, default=seeds)
    show = sub.add_parser("table")
    show.add_argument("results", type=Path)
    return parser, scores, show


def run_rule_panel(description: str, members: dict, seeds: list[int], rules: list[str],
                   report: Callable[[list[dict]], str], run_member: Callable[..., None]) -> None:
    """The ``main`` of a panel script that fits rules on members (``panel_commands`` with ``--rules``): ``scores``
    calls ``run_member(member, seeds, rules, out)`` for every member named, ``table`` prints ``report`` of the
    records of a results file."""
    parser, run, _ = panel_commands(description, list(members), seeds)
    run.add_argument("--rules", nargs="+", default=rules, choices=rules)
    args = parser.parse_args()
    if args.command == "table":
        print(report([json.loads(line) for line in args.results.read_text().splitlines()]))
        return
    for name in args.members:
        run_member(members[name], args.seeds, args.rules, args.out)


def topic_npmi(top_words: np.ndarray, docs: sp.csr_matrix) -> np.ndarray:
    """Coherence of each topic (row of ``top_words``, word ids): the mean over its pairs of words of the
    normalised pointwise mutual information NPMI(i, j) = log(p_ij / (p_i p_j)) / -log p_ij, where p_i is the
    share of the documents of ``docs`` that hold word i and p_ij the share that hold both. A pair no document
    holds together counts -1 (the limit as p_ij -> 0); a pair every document holds counts 1."""
    present = (docs > 0).astype(np.float64).tocsc()
    n_docs = docs.shape[0]
    out = np.empty(len(top_words))
    for t, words in enumerate(np.asarray(top_words)):
        cols = present[:, words]
        p = np.asarray(cols.sum(axis=0)).ravel() / n_docs
        joint = (cols.T @ cols).toarray() / n_docs
        i, j = np.triu_indices(len(words), k=1)
        pij = joint[i, j]
        with np.errstate(divide="ignore", invalid="ignore"):
            npmi = np.log(pij / (p[i] * p[j])) / -np.log(pij)
        npmi[pij == 0] = -1.0
        npmi[pij == 1] = 1.0
        out[t] = npmi.mean()
    return out

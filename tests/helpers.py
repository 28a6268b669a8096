"""Helpers shared by several test modules: the command line in a fresh interpreter or in this process, a free
local port, CSV tables, run checkpoints compared entry by entry, a run's restored driver, a correlated NMF
corpus drawn from the correlated NMF model, the estimators' small settings, and an array that dask may read only a chunk at a time."""

from __future__ import annotations

import csv
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp

from buffet.pipeline.cli import main
from buffet.pipeline.engine import codec
from buffet.pipeline.engine.checkpoints import Saved
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import config_from, restored, run_source
from buffet.pipeline.estimators import (IMF, INMF, BayesianNMF, BinaryMF, CorrelatedNMF, LinearGaussianGibbs,
                                        LinearGaussianParticleFilter, NoisyORGibbs, NoisyORParticleFilter)
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.registry import spec_for

CLI = [sys.executable, "-m", "buffet.pipeline.cli"]


def buffet(*args: object, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``buffet ARGS`` as a user would (in ``env``, else this environment); with ``check`` a non-zero exit
    fails the test with its stderr."""
    proc = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"buffet {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


def ctrl_c_as_in_a_terminal() -> None:
    """``preexec_fn`` for a child that the test will interrupt: SIGINT back to its default action. A
    non-interactive shell starts background jobs (``cmd &``) with SIGINT ignored, the children inherit
    that, and Python then installs no KeyboardInterrupt handler, so without this a suite started in the
    background would see its Ctrl-C tests run to the end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def unused_port() -> int:
    """A local TCP port that nothing listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def buffet_side_by_side(commands: list[tuple]) -> list[subprocess.CompletedProcess]:
    """``buffet(*args, check=False)`` for every argument tuple, the interpreters running at the same time."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: buffet(*args, check=False), commands))


def run_main(capsys: pytest.CaptureFixture[str], *args: object) -> str:
    """``buffet ARGS`` through the command line's ``main`` in this process (no interpreter start-up): it must
    succeed; returns what it printed on stdout."""
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert status == 0, err
    return out


def exported(capsys: pytest.CaptureFixture[str], run: object, path: object) -> dict[str, np.ndarray]:
    """``buffet export RUN --out PATH`` (in this process), loaded."""
    run_main(capsys, "export", run, "--out", path)
    with np.load(path) as arrays:
        return dict(arrays)


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header line (what the reproductions write), as dicts."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def checkpoint(run: RunStore) -> tuple[dict, list[dict]]:
    """Everything a run's newest checkpoint holds as flat arrays (the driver's globals and every block of
    every named state, ``engine.codec``), read back through ``checkpoints.Saved`` in this process, and its
    trace without the wall-clock times."""
    engine, spec = ProcessEngine(), spec_for(run.model)
    driver = spec.make_driver(config_from(spec, run.params), run_source(run), engine)
    position = Saved(RunStore(run.path), engine).restore(driver)
    values = {"globals": driver.global_arrays(), **{name: engine.collect(blocks) for name, blocks in engine.states.items()}}
    return codec.to_arrays(values), [{k: v for k, v in r.items() if k != "seconds"} for r in position.trace]


def restored_driver(run: RunStore, states: tuple[str, ...] = ()) -> object:
    """A run's driver at its newest checkpoint, in this process, with the named block ``states`` read back."""
    return restored(RunStore(run.path), ProcessEngine(), states)[0]


def assert_same(a: tuple[dict, list[dict]], b: tuple[dict, list[dict]]) -> None:
    """Two ``checkpoint`` results hold the same trace and the same arrays, bit for bit."""
    (arrays_a, trace_a), (arrays_b, trace_b) = a, b
    assert trace_a == trace_b, [(x, y) for x, y in zip(trace_a, trace_b) if x != y]
    assert sorted(arrays_a) == sorted(arrays_b)
    for key in arrays_a:
        np.testing.assert_array_equal(arrays_a[key], arrays_b[key], err_msg=key)


def cnmf_corpus(n_docs: int, n_words: int, L: np.ndarray, rng: np.random.Generator,
                length: float = 40) -> tuple[sp.csr_matrix, np.ndarray]:
    """X_dv ~ Poisson(sum_k beta_vk exp(alpha_d + l_k . u_d)) with u_d ~ N(0, I) and alpha_d set so a
    document has about ``length`` tokens; returns X and the normalised true topics (V x K)."""
    beta = rng.gamma(0.1, 1.0, size=(n_words, L.shape[0]))
    beta /= beta.sum(axis=0)
    z = rng.normal(size=(n_docs, L.shape[1])) @ L.T
    w = length * np.exp(z - logsumexp(z, axis=1, keepdims=True))
    return sp.csr_matrix(rng.poisson(w @ beta.T).astype(np.float64)), beta


# Small, fast settings per estimator, and the kind of data each reads (test_estimators*.py).
FAST = {
    "BayesianNMF": (lambda: BayesianNMF(3, batch_size=100, passes=2, chunk_rows=60, eval_every=1000), "counts"),
    "CorrelatedNMF": (lambda: CorrelatedNMF(3, n_dims=2, batch_size=100, passes=2, chunk_rows=60, eval_every=1000,
                                            max_steps=20), "counts"),
    "IMF": (lambda: IMF(max_k=3, chunk_rows=10, tol=1e-4, n_candidates=1), "real"),
    "INMF": (lambda: INMF(max_k=3, chunk_rows=10, tol=1e-4, n_candidates=1), "real"),
    "BinaryMF": (lambda: BinaryMF(sweeps=10, burn_in=5, panel_rows=8, panel_cols=16), "real"),
    "LinearGaussianParticleFilter": (lambda: LinearGaussianParticleFilter(particles=40, blocks=2, sigma_x=0.5, moves=2,
                                                                          feature_moves=0), "real"),
    "NoisyORParticleFilter": (lambda: NoisyORParticleFilter(particles=40, blocks=2, alpha=3.0), "binary"),
    "LinearGaussianGibbs": (lambda: LinearGaussianGibbs(sweeps=8, chains=2, split_merge_moves=1), "real"),
    "NoisyORGibbs": (lambda: NoisyORGibbs(sweeps=8, chains=2), "binary"),
}


class RowReads:
    """An array that dask reads chunk by chunk (``da.from_array``): it refuses a read of more than ``rows`` rows,
    so nothing can compute the whole array at once, and counts its reads."""

    def __init__(self, values, rows: int):
        self.values, self.rows, self.reads = values, rows, 0
        self.shape, self.dtype, self.ndim = values.shape, values.dtype, values.ndim

    def __getitem__(self, key):
        part = self.values[key]
        assert part.shape[0] <= self.rows, f"{part.shape[0]} rows read at once"
        self.reads += 1
        return part

"""A lost worker costs time, not results, and a cluster with no worker left ends the command with one line
and a resumable run (issue #11 item 5), on a cluster started by hand (`dask scheduler` and `dask worker`
processes in their own folders)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.splits import add_split, holdout_rows
from buffet.data.synthetic import bnmf_corpus
from buffet.pipeline.engine.runstore import RunStore
from processes import HandStartedCluster

FIT = ("--mode", "batch", "--max-iter", "40", "--tol", "0", "--checkpoint-every", "2", "--k", "4",
       "--chunk-rows", "60", "--eval-every", "1000", "--quiet")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    corpus = bnmf_corpus(600, 150, 4, np.random.default_rng(11), tokens_per_doc=80)
    path = tmp_path_factory.mktemp("loss") / "corpus.zarr"
    ds = from_array(corpus.X, path, "counts", rows_per_chunk=100)
    add_split(ds, "heldout", {"test_rows": holdout_rows(ds.n_rows, 0.1, 0)}, {"kind": "rows"})
    return path


def start(*args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_to_end(*args: object) -> None:
    proc = subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def checkpoint_step(run: Path) -> int:
    """The step of the run's newest readable checkpoint, or -1."""
    try:
        return RunStore(run).read_checkpoint().step
    except Exception:
        return -1


def wait_for_step(run: Path, proc: subprocess.Popen, step: int) -> None:
    deadline = time.monotonic() + 120
    while checkpoint_step(run) < step:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def exported(run: Path, out: Path) -> dict:
    run_to_end("export", run, "--out", out)
    return dict(np.load(out))


@pytest.fixture(scope="module")
def undisturbed(store, tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("whole") / "run"
    run_to_end("fit", "bnmf", store, "--out", run, "--workers", 2, "--worker-kind", "processes", *FIT)
    return exported(run, run.parent / "whole.npz")


def same_fit(a: dict, b: dict) -> None:
    for key in ("g", "h", "trace_elbo", "trace_step"):
        np.testing.assert_array_equal(a[key], b[key])


def test_a_worker_killed_for_good_costs_time_not_results(tmp_path, store, undisturbed):
    cluster = HandStartedCluster(tmp_path / "cluster")
    try:
        for _ in range(2):
            cluster.add_worker()
        cluster.wait_for_workers(2)
        run = tmp_path / "run"
        proc = start("fit", "bnmf", store, "--out", run, "--scheduler", cluster.address, *FIT)
        wait_for_step(run, proc, 2)
        cluster.kill_worker(0)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        same_fit(exported(run, tmp_path / "k.npz"), undisturbed)
    finally:
        cluster.close()


def test_no_worker_left_ends_with_one_line_and_resume_finishes_the_same(tmp_path, store, undisturbed):
    cluster = HandStartedCluster(tmp_path / "cluster")
    try:
        cluster.add_worker()
        cluster.wait_for_workers(1)
        run = tmp_path / "run"
        proc = start("fit", "bnmf", store, "--out", run, "--scheduler", cluster.address, "--worker-timeout", 3, *FIT)
        wait_for_step(run, proc, 2)
        cluster.kill_worker(0)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=120)
        assert time.monotonic() - killed < 3 + 30  # the timeout, plus start-up of the wait and the exit
        assert proc.returncode == 1 and "Traceback" not in err, err
        line = err.strip().splitlines()[-1]
        step = checkpoint_step(run)
        assert "no Dask worker for 3 s" in line and f"checkpointed at step {step}" in line and "buffet resume" in line
        cluster.add_worker()
        cluster.wait_for_workers(1)
        run_to_end("resume", run, "--scheduler", cluster.address, "--quiet")
        assert json.loads((run / "run.json").read_text())["status"] == "finished"
        same_fit(exported(run, tmp_path / "r.npz"), undisturbed)
    finally:
        cluster.close()

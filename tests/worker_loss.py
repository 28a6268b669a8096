"""The worker-loss scenario of test_worker_loss.py and test_worker_loss_samplers.py: a lost worker costs
time, not results, for every model family, and a cluster with no worker left ends the command with one
line and a resumable run, on clusters started by hand (`dask scheduler` and `dask worker` processes in
folders of their own, ``processes.HandStartedCluster``).

Each family fits a small store through the CLI on three workers and loses them in three ways: one
worker's process is killed after the checkpoint of step 2 (its nanny starts a new one), another worker
is killed for good after the checkpoint of step 4, and every worker is killed after the checkpoint of
step 6; ``buffet resume`` on a new worker then finishes the run. It must end with exactly the undisturbed
fit's final checkpoint (every global and every block of every named state) and trace.

The workers hold the fit at each of those checkpoints (``step_gate``: a gate at step N lets no task
start once the checkpoint of step N is written, so the fit waits inside step N + 1) until the workers
have been killed and the test moves the gate on; a fit however short is never over before its workers
are killed.

With every worker gone the command must stop with its one line within ``--worker-timeout`` (``TIMEOUT``)
plus ``LOST_CLUSTER_MARGIN`` seconds of the kill. The margin bounds a wait, it is not a speed
requirement: it covers the scheduler seeing the killed workers' connections close, the engine noticing
that it has had no worker for ``TIMEOUT`` seconds (it looks at the number of workers four times a
second), and the command marking the run interrupted, closing its client and exiting. From the kill to
the exit took 1.1 to 2.1 s (``TIMEOUT`` included) for the eleven families on 2 cores under a load
average of about 14; 15 s leaves room for a slower or busier machine and still fails a command that
waits much longer than it was told to, or hangs. When the kill cuts a transfer short (the scheduler sending a
shared value to a worker that has just died), that transfer fails only after Dask's connect timeout, which
these clusters set to ``CONNECT_SECONDS``; the margin adds it.

The undisturbed fit is computed in this process in a thread while the command runs (the test only waits
then), and is finished before ``buffet resume`` starts. The scheduler is shared by the tests of a module; each test starts and kills its own workers
(tests/conftest.py: ``hand_scheduler``, ``hand_cluster``, ``gate``, ``loss_stores``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from buffet.data.arrays import from_array
from buffet.data.bmf_data import bars_data
from buffet.data.ibp_synthetic import image_data, noisy_or_data
from buffet.data.splits import add_split, holdout_entries, holdout_rows
from buffet.data.synthetic import bnmf_corpus
from buffet.pipeline.cli import build_parser, config_from_args, main
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.reports.ibp import add_true_z
from helpers import assert_same, checkpoint
from conftest import CONNECT_TIMEOUT
from processes import HandStartedCluster
from step_gate import StepGate, checkpoint_step

TIMEOUT = 1  # --worker-timeout of the runs that lose every worker, in seconds
CONNECT_SECONDS = 5  # Dask's connect timeout on the hand-started clusters (conftest.CONNECT_TIMEOUT)
LOST_CLUSTER_MARGIN = CONNECT_SECONDS + 15  # seconds the command may take beyond TIMEOUT to stop (module docstring)

# model -> (store, fit options). Every fit checkpoints every 2 steps and has 8 steps or more (the gate holds
# it inside step 7; ``buffet resume`` runs the rest).
FAMILIES = {
    "bnmf": ("corpus", ["--mode", "batch", "--max-iter", 10, "--tol", 0, "--k", 4, "--chunk-rows", 100,
                        "--eval-every", 1000]),
    "cnmf": ("corpus", ["--mode", "batch", "--max-iter", 10, "--tol", 0, "--k", 3, "--n-dims", 2,
                        "--chunk-rows", 150, "--eval-every", 1000]),
    "imf": ("images", ["--max-k", 1, "--tol", 1e-4, "--max-iter", 2, "--select", "none", "--chunk-rows", 4]),
    "inmf": ("images", ["--max-k", 1, "--tol", 1e-4, "--max-iter", 2, "--select", "none", "--chunk-rows", 4]),
    "pf-linear-gaussian": ("images", ["--particles", 60, "--sigma-x", 0.5, "--sigma-a", 1.0, "--alpha", 1.0]),
    "gibbs-linear-gaussian": ("images", ["--sweeps", 10, "--sigma-x", 0.5, "--sigma-a", 1.0, "--alpha", 1.0]),
    "bmf": ("bars", ["--sweeps", 10, "--burn-in", 4, "--panel-rows", 16, "--select", "none"]),
    "vfmf": ("images", ["--truncation", 3, "--restarts", 2, "--max-iter", 5, "--tol", 1e-12, "--chunk-rows", 4]),
    "tvimf": ("images", ["--truncation", 3, "--restarts", 2, "--max-iter", 5, "--tol", 1e-12, "--chunk-rows", 4]),
    "pf-noisy-or": ("binary", ["--particles", 30, "--blocks", 3, "--alpha", 2.0]),
    "gibbs-noisy-or": ("binary", ["--sweeps", 10, "--chains", 3, "--alpha", 2.0]),
}


def write_stores(folder: Path) -> dict[str, Path]:
    """A count corpus (300 documents), 12 rows of the four-image data with their true Z, 48 bars images and
    12 rows of noisy-OR data (60 columns)."""
    corpus = bnmf_corpus(300, 60, 4, np.random.default_rng(11), tokens_per_doc=60)
    ds = from_array(corpus.X, folder / "corpus.zarr", "counts", rows_per_chunk=100)
    add_split(ds, "heldout", {"test_rows": holdout_rows(ds.n_rows, 0.1, 0)}, {"kind": "rows"})
    images = image_data(np.random.default_rng(0), n_rows=12)
    from_array(images.X, folder / "images.zarr", "real", rows_per_chunk=4)
    add_true_z(folder / "images.zarr", images.Z)
    bars = bars_data(48, np.random.default_rng(0), alpha=2.0)
    ds = from_array(bars.X, folder / "bars.zarr", "real", rows_per_chunk=16)
    add_split(ds, "heldout", {"test_mask": holdout_entries(np.ones(bars.X.shape, bool), 0.1, 0)}, {"kind": "entries"})
    binary = noisy_or_data(np.random.default_rng(1), n_rows=12, n_features=3, n_cols=60)
    from_array(binary.X.astype(float), folder / "binary.zarr", "binary", rows_per_chunk=4)
    return {name: folder / f"{name}.zarr" for name in ("corpus", "images", "bars", "binary")}


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)]


def start(*args: object) -> subprocess.Popen:
    return subprocess.Popen(cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **CONNECT_TIMEOUT})


def wait_for_step(run: Path, proc: subprocess.Popen, step: int) -> None:
    """Until the run has a checkpoint of ``step`` or later; the fit must still be running then."""
    deadline = time.monotonic() + 120
    while checkpoint_step(run) < step:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within 120 s"
        time.sleep(0.05)
    assert proc.poll() is None, "the fit ended before its workers could be killed"


def final_state(run: Path) -> tuple[dict, list[dict]]:
    """The run's last checkpoint and trace (``helpers.checkpoint``); the run must have finished."""
    store = RunStore(run)
    assert store.status == "finished", store.status
    return checkpoint(store)


def reference(tmp_path: Path, fit: list) -> tuple[dict, list[dict]]:
    """The undisturbed fit: the same command's config fitted in this process (``ProcessEngine()``), which gives
    the numbers of any cluster bit for bit (the determinism tests of each model)."""
    args = build_parser().parse_args([*map(str, fit), "--out", str(tmp_path / "undisturbed")])
    run = fit_run(args.model, source_of(args.store), args.out, config_from_args(args), ProcessEngine(), quiet=True)
    return final_state(run.path)


def lost_workers_scenario(tmp_path: Path, stores: dict[str, Path], cluster: HandStartedCluster, gate: StepGate,
                          model: str) -> None:
    """The fit of the module docstring for ``model``, with its assertions."""
    store, options = FAMILIES[model]
    fit = ["fit", model, stores[store], "--seed", 3, "--checkpoint-every", 2, "--quiet", *options]
    restarted, gone = cluster.add_worker(nanny=True), cluster.add_worker()
    cluster.add_worker()  # a third, never killed before the end: the fit always has a worker until then
    cluster.wait_for_workers(3)
    run = tmp_path / "run"
    gate.hold_at(run, 2)
    with ThreadPoolExecutor(1) as undisturbed:  # the undisturbed fit, while the command runs (module docstring)
        expected = undisturbed.submit(reference, tmp_path, fit)
        proc = start(*fit, "--out", run, "--scheduler", cluster.address, "--worker-timeout", TIMEOUT)
        wait_for_step(run, proc, 2)
        cluster.kill_worker_process(restarted)  # the nanny starts a new worker process
        gate.hold_at(run, 4)
        wait_for_step(run, proc, 4)
        cluster.kill_worker(gone)  # no nanny: this worker is gone for good
        gate.hold_at(run, 6)
        wait_for_step(run, proc, 6)
        killed = time.monotonic()
        cluster.close_workers()  # every worker gone: the command must stop, not wait
        _, err = proc.communicate(timeout=120)
        waited = time.monotonic() - killed
        assert proc.returncode == 1 and "Traceback" not in err, err
        line = err.strip().splitlines()[-1]
        assert f"no Dask worker for {TIMEOUT} s" in line, line
        assert "checkpointed at step 6" in line and f"buffet resume {run}" in line, line
        assert checkpoint_step(run) == 6
        assert waited < TIMEOUT + LOST_CLUSTER_MARGIN, f"the command ended {waited:.1f} s after its last worker died"
    expected = expected.result()
    gate.open()
    cluster.add_worker()
    cluster.wait_for_workers(1)
    # in this process (the command line's ``main``): what is tested here is the resumed run, not a new interpreter
    assert main(["resume", str(run), "--scheduler", cluster.address, "--quiet"]) == 0
    assert_same(final_state(run), expected)

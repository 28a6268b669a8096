"""Failures a user meets end with one line and exit status 1 (130 for Ctrl-C), never a traceback unless
--debug; messages go through the ``buffet`` logger."""

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from buffet.data.arrays import from_array
from buffet.data.errors import StoreError
from buffet.data.splits import add_split, holdout_rows
from buffet.data.synthetic import bnmf_corpus
from buffet.pipeline import cli
from buffet.pipeline.engine.lease import read_holder
from buffet.pipeline.engine.runstore import RunStore
from helpers import buffet, ctrl_c_as_in_a_terminal, unused_port

# An SVI fit of this many passes runs far longer than the few checkpoints a test waits for (a batch fit at
# --tol 0 ends once the ELBO stops changing, which on a small corpus it does).
LONG_FIT = ("--passes", "1000000", "--batch-size", "100", "--checkpoint-every", "1", "--k", "4",
            "--eval-every", "100000")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    corpus = bnmf_corpus(600, 120, 4, np.random.default_rng(3), tokens_per_doc=60)
    path = tmp_path_factory.mktemp("errors") / "corpus.zarr"
    ds = from_array(corpus.X, path, "counts", rows_per_chunk=100)
    add_split(ds, "heldout", {"test_rows": holdout_rows(ds.n_rows, 0.1, 0)}, {"kind": "rows"})
    return path


def start(*args: object) -> subprocess.Popen:
    """``buffet ARGS`` in its own process group, as a terminal would run it."""
    return subprocess.Popen([sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=ctrl_c_as_in_a_terminal)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def checkpointed(run: Path) -> bool:
    """Whether the run exists and has committed a checkpoint (``RunStore.newest_step``)."""
    try:
        return RunStore(run).newest_step() is not None
    except StoreError:  # no run.json yet
        return False


def wait_for_checkpoint(run: Path, proc: subprocess.Popen) -> None:
    """Until the run has written its first checkpoint (the fit is then running its loop)."""
    deadline = time.monotonic() + 120
    while not checkpointed(run):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)


def one_line(err: str, *fragments: str) -> str:
    """The last stderr line, checked to be buffet's one line ("buffet: error: ...", or "buffet: interrupted; ..."
    for Ctrl-C and "buffet: stopped by SIGTERM ..." for SIGTERM) naming ``fragments``, with no traceback."""
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(("buffet: error: ", "buffet: interrupted", "buffet: stopped by SIGTERM")), err
    for fragment in fragments:
        assert fragment in last, last
    return last


def test_bad_store_and_bad_argument(tmp_path: Path, store: Path) -> None:
    for args, fragment in (((tmp_path / "missing.zarr",), "no such dataset store"),
                           ((store, "--k", 0), "n_topics must be >= 1")):
        proc = buffet("fit", "bnmf", *args, "--out", tmp_path / "run", "--workers", 1, check=False)
        code, err = proc.returncode, proc.stderr
        assert code == 1
        one_line(err, fragment)
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_store_from_a_newer_version(tmp_path: Path, store: Path) -> None:
    newer = tmp_path / "newer.zarr"
    from_array(np.ones((3, 2)), newer, "counts")
    zarr.open_group(str(newer), mode="r+").attrs["buffet_format"] = 99
    proc = buffet("info", newer, check=False)
    assert proc.returncode == 1
    one_line(proc.stderr, "newer buffet", "upgrade")


def test_unreachable_scheduler(tmp_path: Path, store: Path) -> None:
    port = unused_port()
    # Dask's own connect timeout setting bounds the wait (30 s unless set)
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    proc = buffet("fit", "bnmf", store, "--out", tmp_path / "run", "--scheduler", f"tcp://127.0.0.1:{port}",
                  check=False, env=env)
    assert proc.returncode == 1
    one_line(proc.stderr, "cannot reach the Dask scheduler", f"127.0.0.1:{port}")


def test_ctrl_c_marks_the_run_interrupted_and_says_how_to_resume(tmp_path: Path, store: Path) -> None:
    run = tmp_path / "run"
    proc = start("fit", "bnmf", store, "--out", run, "--workers", 2, "--worker-kind", "processes", *LONG_FIT)
    wait_for_checkpoint(run, proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    code, err = finish(proc)
    assert code == 130
    one_line(err, "interrupted", f"buffet resume {run}")
    assert RunStore(run).status == "interrupted"


# ``buffet ARGS`` (argv[1:]) in this process, with a garbage-collector callback (as distributed's GC diagnosis
# installs one) that sends the process Ctrl-C from inside the 200th collection: the handler's exception is raised
# where Python cannot pass it on.
CTRL_C_IN_A_GC_CALLBACK = """
import gc, os, signal, sys
from buffet.pipeline import cli
collections = []
def callback(phase, info):
    collections.append(phase)
    if len(collections) == 400:
        os.kill(os.getpid(), signal.SIGINT)
gc.callbacks.append(callback)
gc.set_threshold(50)
sys.exit(cli.main(sys.argv[1:]))
"""


def test_ctrl_c_raised_inside_a_garbage_collector_callback_stops_without_a_traceback(tmp_path: Path,
                                                                                       store: Path) -> None:
    args = ("fit", "bnmf", store, "--out", tmp_path / "run", "--executor", "process", *LONG_FIT)
    proc = subprocess.run([sys.executable, "-c", CTRL_C_IN_A_GC_CALLBACK, *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
    one_line(proc.stderr, "interrupted")


# A process that holds a run's lease (folder argv[2]) and whose clean-up after a stop signal never ends (it
# catches the exception and waits), with the command's handlers and a grace of 0.5 s; "SECOND" (argv[1]) sends
# it a second signal, Ctrl-C, from the clean-up.
STUCK = """
import os, signal, sys, time
from buffet.pipeline.engine import messages
from buffet.pipeline.engine.lease import Lease
messages.STOP_GRACE_SECONDS = 0.5
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, messages.StopRequest.on_signal)
Lease(sys.argv[2]).acquire()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
except KeyboardInterrupt:
    if sys.argv[1] == "SECOND":
        os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
"""


@pytest.mark.parametrize("second, status, why", [("ONE", 143, "it had not stopped 0.5 s after the signal"),
                                                 ("SECOND", 130, "a second signal came while it was stopping")])
def test_a_stopped_command_whose_clean_up_sticks_still_ends_and_releases_its_run(tmp_path: Path, second: str,
                                                                                   status: int, why: str) -> None:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUCK, second, str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == status and time.monotonic() - started < 25, proc.stderr
    one_line(proc.stderr, f"ended at once, as {why}", "its checkpoints are kept", "buffet resume")
    assert read_holder(str(tmp_path / "run")) is None


def test_full_disk_is_one_line_and_debug_shows_the_traceback(tmp_path: Path, store: Path, monkeypatch,
                                                              capsys) -> None:
    def no_space(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "globals.npz"))

    monkeypatch.setattr(RunStore, "save_checkpoint", no_space)
    args = ["fit", "bnmf", str(store), "--out", str(tmp_path / "run"), "--k", "3", "--batch-size", "500",
            "--workers", "1", "--worker-kind", "threads", "--quiet"]
    assert cli.main(args) == 1
    line = one_line(capsys.readouterr().err, "no space left", "globals.npz", "buffet resume")
    assert "free some space" in line
    assert RunStore(tmp_path / "run").status == "interrupted"
    with pytest.raises(OSError):
        cli.main(["--debug", *args[:3], "--out", str(tmp_path / "run2"), *args[5:]])


def test_progress_goes_through_the_buffet_logger(caplog) -> None:
    from buffet.pipeline.engine.progress import Progress

    with caplog.at_level(logging.INFO, logger="buffet"):
        Progress("bnmf", 10).update(3, {"elbo": -1.5})
    assert [r.name for r in caplog.records] == ["buffet.progress"]
    assert "[bnmf] step 3/10  elbo=-1.5" in caplog.records[0].getMessage()

"""One writer per run: a fit or resume holds a lease on its run folder (``engine.lease``). A second command
on a held run is refused with one line naming the holder; a killed holder's lease is taken over once it
expired; ``--force`` takes a live one over, and the former holder then stops writing. Every command here is
a real ``buffet`` process, on a local folder or on the local S3 API server."""

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.errors import StoreError, UserError
from buffet.data.synthetic import bnmf_corpus
from buffet.data.urls import normalise
from buffet.pipeline.engine.lease import LIFETIME_VARIABLE, Holder, Lease, read_holder
from buffet.pipeline.engine.runstore import RunStore
from helpers import CLI, buffet, ctrl_c_as_in_a_terminal

# An SVI fit of a million passes, checkpointing every step, never ends by itself within a test (a batch fit at
# --tol 0 does: the ELBO of a small corpus stops changing at all): every command that runs it is ended by a signal.
ENDLESS = ("--passes", "1000000", "--batch-size", "100", "--checkpoint-every", "1", "--k", "3",
           "--eval-every", "100000", "--workers", "1", "--quiet")
WAIT = 120.0  # seconds: the most a test waits for a process to reach a state


@pytest.fixture(scope="module")
def corpus():
    return bnmf_corpus(200, 60, 3, np.random.default_rng(5), tokens_per_doc=40).X


@pytest.fixture(scope="module")
def store(tmp_path_factory, corpus) -> str:
    path = tmp_path_factory.mktemp("lease") / "corpus.zarr"
    return from_array(corpus, path, "counts", rows_per_chunk=100).path


def start(log: Path, *args: object, lifetime: float | None = None) -> subprocess.Popen:
    """``buffet ARGS`` in its own process group, stderr to ``log``; ``lifetime`` sets its lease's."""
    env = dict(os.environ)
    if lifetime is not None:
        env[LIFETIME_VARIABLE] = str(lifetime)
    with open(log, "w") as err:
        return subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.DEVNULL, stderr=err, env=env,
                                start_new_session=True, preexec_fn=ctrl_c_as_in_a_terminal)


def newest_step(run: str) -> int | None:
    try:
        return RunStore(run).newest_step()
    except StoreError:  # no run.json yet
        return None


def wait_until_writing(run: str, proc: subprocess.Popen, log: Path, after_step: int = 0) -> int:
    """Until ``proc`` holds the run's lease and has committed a checkpoint past ``after_step``; returns its step."""
    deadline = time.monotonic() + WAIT
    while True:
        assert proc.poll() is None, log.read_text()
        holder, step = read_holder(normalise(run)), newest_step(run)
        if holder is not None and holder.pid == proc.pid and step is not None and step > after_step:
            return step
        assert time.monotonic() < deadline, f"{run}: not written by pid {proc.pid} within {WAIT:.0f} s"
        time.sleep(0.05)


def stop(proc: subprocess.Popen, sig: int) -> int:
    """Send ``sig`` to the process group of ``proc``; its exit status."""
    os.killpg(proc.pid, sig)
    return proc.wait(timeout=WAIT)


def takeover_line(log: Path) -> str:
    """The warning line a command that took a run over printed (Dask may print notes of its own as well)."""
    lines = [line for line in log.read_text().splitlines() if "taking the run over from" in line]
    assert len(lines) == 1, log.read_text()
    return lines[0]


def refusal(proc: subprocess.CompletedProcess, holder_pid: int) -> str:
    """The one stderr line of a refused command, checked to name the holder and how to take over."""
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("buffet: error: ") and "is in use by another buffet command" in line, line
    assert f"pid {holder_pid} on host {socket.gethostname()}" in line and "last heartbeat" in line, line
    assert "s ago" in line and "--force" in line, line
    return line


def held_run_is_refused_then_released(store: str, run: str, logs: Path, sig: int, *second: tuple) -> None:
    """A fit holds ``run``; ``buffet resume`` and the ``second`` commands are refused naming it; ``sig``
    (Ctrl-C or SIGTERM) ends the fit, which releases the run."""
    owner = start(logs / "fit.txt", "fit", "bnmf", store, "--out", run, *ENDLESS)
    try:
        step = wait_until_writing(run, owner, logs / "fit.txt")
        for args in [("resume", run, "--workers", 1), *second]:
            refusal(buffet(*args, check=False), owner.pid)
        assert RunStore(run).newest_step() >= step and owner.poll() is None  # the refused commands changed nothing
        assert stop(owner, sig) == (130 if sig == signal.SIGINT else 143)
    finally:
        if owner.poll() is None:
            stop(owner, signal.SIGKILL)
    assert read_holder(normalise(run)) is None, "the stopped fit left its lease behind"


def test_a_running_fit_refuses_a_second_writer_on_a_local_folder(tmp_path, store):
    run = str(tmp_path / "run")
    held_run_is_refused_then_released(store, run, tmp_path, signal.SIGINT,
                                      ("fit", "bnmf", store, "--out", run, "--overwrite", *ENDLESS))


def test_a_running_fit_refuses_a_second_writer_on_s3(tmp_path, s3, corpus):
    store = from_array(corpus, s3.url("corpus.zarr"), "counts", rows_per_chunk=100).path
    held_run_is_refused_then_released(store, s3.url("run"), tmp_path, signal.SIGTERM)


def test_a_killed_fits_run_is_taken_over_once_its_lease_expired(tmp_path, store):
    run, lifetime = str(tmp_path / "run"), 8.0
    owner = start(tmp_path / "fit.txt", "fit", "bnmf", store, "--out", run, *ENDLESS, lifetime=lifetime)
    try:
        step = wait_until_writing(run, owner, tmp_path / "fit.txt")
    finally:
        stop(owner, signal.SIGKILL)
    held = read_holder(run)
    assert held is not None and held.pid == owner.pid  # a killed process releases nothing
    refused = start(tmp_path / "refused.txt", "resume", run, *ENDLESS[-3:])
    try:
        while refused.poll() is None:
            taken = read_holder(run)
            assert taken is None or taken.pid != refused.pid, "the resume started after the lease expired: too slow"
            time.sleep(0.05)
    finally:
        if refused.poll() is None:
            stop(refused, signal.SIGKILL)
    refusal(subprocess.CompletedProcess(refused.args, refused.returncode, None,
                                        (tmp_path / "refused.txt").read_text()), owner.pid)

    time.sleep(max(0.0, held.expires - time.time()) + 0.2)
    resumed = start(tmp_path / "resume.txt", "resume", run, *ENDLESS[-3:])
    try:
        wait_until_writing(run, resumed, tmp_path / "resume.txt", after_step=step)
        assert stop(resumed, signal.SIGTERM) == 143
    finally:
        if resumed.poll() is None:
            stop(resumed, signal.SIGKILL)
    warning = takeover_line(tmp_path / "resume.txt")
    assert f"from pid {owner.pid}" in warning and "its lease expired" in warning, warning


def test_force_takes_a_live_run_over_and_the_former_holder_stops(tmp_path, store):
    run = str(tmp_path / "run")
    owner = start(tmp_path / "fit.txt", "fit", "bnmf", store, "--out", run, *ENDLESS)
    forced = None
    try:
        step = wait_until_writing(run, owner, tmp_path / "fit.txt")
        forced = start(tmp_path / "resume.txt", "resume", run, "--force", *ENDLESS[-3:])
        assert owner.wait(timeout=WAIT) == 1  # its next commit reads the lease back, finds the new holder, refuses
        wait_until_writing(run, forced, tmp_path / "resume.txt", after_step=step)
        assert stop(forced, signal.SIGTERM) == 143
    finally:
        for proc in (owner, forced):
            if proc is not None and proc.poll() is None:
                stop(proc, signal.SIGKILL)
    last = (tmp_path / "fit.txt").read_text().strip().splitlines()[-1]
    assert last.startswith("buffet: error: ") and "another buffet command took the run over" in last, last
    assert f"pid {forced.pid}" in last and "Traceback" not in (tmp_path / "fit.txt").read_text()
    warning = takeover_line(tmp_path / "resume.txt")
    assert f"from pid {owner.pid}" in warning and "as --force asks" in warning, warning
    assert read_holder(run) is None


def test_of_commands_taking_a_run_at_once_one_wins(tmp_path):
    """Several leases on one folder taken at the same moment: the read-back after writing leaves exactly one
    holder, and the others are refused naming it."""
    leases = [Lease(str(tmp_path / "run")) for _ in range(3)]
    start_together = threading.Barrier(len(leases))
    outcomes: dict[int, Exception | None] = {}

    def take(i: int) -> None:
        start_together.wait()
        try:
            leases[i].acquire()
            outcomes[i] = None
        except UserError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, exc in outcomes.items() if exc is None]
    assert len(winners) == 1, outcomes
    holder: Holder = read_holder(leases[0].path)
    assert holder.holder == leases[winners[0]].id
    assert all("is in use by another buffet command" in str(exc) for exc in outcomes.values() if exc is not None)
    for lease in leases:
        lease.release()
    assert read_holder(leases[0].path) is None

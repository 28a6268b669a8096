"""deploy/slurm on a real SLURM: Bayesian NMF fits through start_cluster.py hold
exactly the numbers of the same fit in this process while workers retire and are replaced (--worker-lifetime)
and while a worker job is cancelled (compared at the checkpoint where Ctrl-C stopped them); a fit through the
sbatch wrapper, stopped by the walltime signal and continued by `buffet resume`, ends with them; the clusters
use TLS with credentials of their own, which every other client lacks.

The tests marked ``slurm`` need ``sbatch`` on PATH and a controller that answers (deploy/slurm/local-slurm.sh
up brings up a single-node SLURM); they are skipped otherwise, or fail with BUFFET_REQUIRE_SLURM=1, which
`local-slurm.sh run` in the README's test command sets. The TLS test without SLURM runs everywhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from buffet.pipeline.cli import build_parser, config_from_args
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run
from buffet.pipeline.engine.runstore import RunStore
from helpers import assert_same, buffet, checkpoint, ctrl_c_as_in_a_terminal
from slurm_setup import (REQUIRE_SLURM, SBATCH_WRAPPER, SLURM_DIR, START_CLUSTER, cluster_tls, deploy_module,
                         job_environment, queued_jobs, slurm_missing, slurm_required, wait_until_gone, write_corpus)
from worker_loss import checkpoint_step, cli, final_state, reference, wait_for_step

# The fit of every test: batch Bayesian NMF, checkpoints every 2 steps; each test sets --max-iter.
# batch VB to a tolerance of 0 runs until the ELBO stops changing in its last digit: with K = 8 over a thousand
# iterations on this corpus (with K = 4, 344: a fit on a quick cluster then ended before its workers retired)
FIT = ["--seed", 3, "--checkpoint-every", 2, "--quiet", "--mode", "batch", "--tol", 0, "--k", 8, "--chunk-rows", 100,
       "--eval-every", 1000]
JOB_SHAPE = ["--cores", 1, "--memory", "1GB", "--walltime", "00:10:00"]  # each worker job: one core
TLS_VARIABLES = "DASK_DISTRIBUTED__COMM__"

slurm = pytest.mark.slurm


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("slurm-store"))


@pytest.fixture(scope="module")
def slurm_up() -> None:
    reason = slurm_missing()
    if reason and slurm_required():
        pytest.fail(f"{reason}; {REQUIRE_SLURM}=1 requires SLURM", pytrace=False)
    if reason:
        pytest.skip(reason)


def fit_args(corpus: Path, steps: int) -> list:
    return ["fit", "bnmf", corpus, *FIT, "--max-iter", steps]


def start_cluster(tmp_path: Path, *options: object) -> list[str]:
    """start_cluster.py with ``options``, its credentials and job logs under ``tmp_path``."""
    return [sys.executable, str(START_CLUSTER), *map(str, JOB_SHAPE), "--credentials-dir", str(tmp_path / "tls"),
            "--log-directory", str(tmp_path / "logs"), *map(str, options)]


def without_credentials() -> dict[str, str]:
    """This environment without any Dask comm setting (TLS files, encryption)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(TLS_VARIABLES)}


def connects(address: str, env: dict[str, str]) -> bool:
    """Whether a ``distributed.Client`` in a fresh interpreter with ``env`` reaches ``address`` and runs a task."""
    code = ("import sys; from distributed import Client; c = Client(sys.argv[1], timeout='10s'); "
            "assert c.submit(sum, [1, 2]).result() == 3; c.close()")
    return subprocess.run([sys.executable, "-c", code, address], env=env, capture_output=True, timeout=120).returncode == 0


def test_cluster_credentials_admit_only_their_holders(tmp_path: Path) -> None:
    """A scheduler and worker started with cluster_tls credentials: `buffet fit --scheduler` connects with the
    credentials in Dask's configuration variables, and is refused (one line) without them or with another
    cluster's."""
    from distributed import LocalCluster

    tls = cluster_tls()
    credentials, other = tls.make_credentials(tmp_path / "tls"), tls.make_credentials(tmp_path / "tls")
    assert credentials.folder.stat().st_mode & 0o777 == 0o700
    assert {f.stat().st_mode & 0o777 for f in credentials.folder.iterdir()} == {0o600}
    corpus = write_corpus(tmp_path)
    plain = {**without_credentials(), "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tls://",
                      security=credentials.security(), dashboard_address="127.0.0.1:0") as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        for name, env in [("plain", plain), ("other", {**plain, **other.client_environment()})]:
            refused = buffet(*fit_args(corpus, 2), "--out", tmp_path / name, "--scheduler", cluster.scheduler_address,
                             check=False, env=env)
            assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            if name == "plain":
                assert "takes TLS connections only" in refused.stderr, refused.stderr
        buffet(*fit_args(corpus, 2), "--out", tmp_path / "admitted", "--scheduler", cluster.scheduler_address,
               env={**plain, **credentials.client_environment()})
    assert RunStore(tmp_path / "admitted").status == "finished"
    credentials.remove()
    assert not credentials.folder.exists()


def stopped_reference(tmp_path: Path, fit: list, step: int) -> tuple[dict, list[dict]]:
    """The checkpoint of step ``step`` of the same fit in this process (``ProcessEngine()``), stopped there."""
    args = build_parser().parse_args([*map(str, fit), "--out", str(tmp_path / "undisturbed")])
    run = fit_run(args.model, source_of(args.store), args.out, config_from_args(args), ProcessEngine(), stop_after=step,
                  quiet=True)
    return checkpoint(run)


def site_job_script(tmp_path: Path, model: str) -> str:
    """The worker job script start_cluster.py would submit for ``buffet fit MODEL`` with the example
    jobqueue.yaml as the site's settings, its interface overridden by an option (ib0 is not here)."""
    import dask
    import yaml
    from dask_jobqueue import SLURMCluster

    start_cluster = deploy_module("start_cluster")
    site = yaml.safe_load((SLURM_DIR / "jobqueue.yaml").read_text())["jobqueue"]["slurm"]
    opts, command = start_cluster.parse(["--interface", "lo", "--worker-lifetime", "600", "--", "buffet", "fit", model,
                                         "store", "--out", "run"])
    credentials = cluster_tls().make_credentials(tmp_path / model)
    with dask.config.set({f"jobqueue.slurm.{key}": value for key, value in site.items()}):
        processes = start_cluster.processes_per_job(start_cluster.command_model(command), site["cores"], None)
        with SLURMCluster(**start_cluster.cluster_options(opts, site["cores"], processes, credentials)) as cluster:
            return cluster.job_script()


def test_the_slurm_script_threads_the_models_the_cli_threads() -> None:
    """start_cluster.py (which does not import buffet) names the same models as the CLI's worker kinds."""
    from buffet.pipeline.registry import models

    threaded = {name for name, spec in models().items() if spec.worker_kind == "threads"}
    assert set(deploy_module("start_cluster").THREADED_MODELS) == threaded


def test_job_script_follows_jobqueue_yaml_and_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example jobqueue.yaml reaches the job script (account, partition, extra directive, prologue, spill
    folder, the log folder under the user's home) with start_cluster.py's lifetime and TLS files; bnmf gets one
    worker of 8 threads per 8-core job, the particle filter 8 single-threaded workers."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    topic, sampler = site_job_script(tmp_path, "bnmf"), site_job_script(tmp_path, "pf-linear-gaussian")
    assert (tmp_path / "home" / "dask-logs").is_dir()
    assert f"#SBATCH -e {tmp_path / 'home' / 'dask-logs'}/" in topic, topic
    for script in (topic, sampler):
        for line in ["#SBATCH -A my-project", "#SBATCH -p compute", "#SBATCH --qos=normal",
                     "source ~/venvs/buffet/bin/activate", "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON",
                     "--local-directory $TMPDIR", "--lifetime 600.0s --lifetime-stagger 60.0s", "--tls-ca-file",
                     "--tls-key", "--interface lo"]:
            assert line in script, (line, script)
    assert "--nthreads 8" in topic and "--nworkers" not in topic, topic
    assert "--nthreads 1" in sampler and "--nworkers 8" in sampler, sampler


def wait_while_running(proc: subprocess.Popen, done: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
    """Until ``done()``; the command must still be running meanwhile."""
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.5)


def retired_workers(logs: Path) -> int:
    """How many worker jobs have logged that their lifetime ended."""
    return sum("worker-lifetime-reached" in log.read_text() for log in logs.glob("*.err"))


def interrupt_and_compare(proc: subprocess.Popen, tmp_path: Path, fit: list) -> None:
    """Once the fit has gone two more steps, Ctrl-C start_cluster.py: the run must be interrupted with the
    resume line, hold exactly the in-process fit's numbers at its last checkpoint, and its cluster's
    credentials must be gone."""
    run = tmp_path / "run"
    wait_for_step(run, proc, checkpoint_step(run) + 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130 and "buffet: interrupted" in err and f"buffet resume {run}" in err, err
    store = RunStore(run)
    assert store.status == "interrupted"
    assert_same(checkpoint(store), stopped_reference(tmp_path, fit, store.newest_step()))
    assert not any((tmp_path / "tls").iterdir())


def start_long_fit(tmp_path: Path, corpus: Path, *options: object) -> tuple[subprocess.Popen, list]:
    """start_cluster.py with ``options`` running a fit too long to end (the tests interrupt it), and the fit's
    arguments. A fit of fixed length would see more or fewer worker changes with the machine's speed."""
    fit = fit_args(corpus, 100_000)
    proc = subprocess.Popen([*start_cluster(tmp_path, *options), "--", *cli(*fit, "--out", tmp_path / "run")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=job_environment(),
                            preexec_fn=ctrl_c_as_in_a_terminal)
    return proc, fit


@slurm
def test_worker_lifetime_replaces_jobs_with_the_same_numbers(slurm_up: None, tmp_path: Path, corpus: Path) -> None:
    """Workers that live 20 s on two one-core jobs: the fit goes on while its jobs are replaced (three workers
    retired, then two more steps) and holds exactly the in-process fit's numbers."""
    proc, fit = start_long_fit(tmp_path, corpus, "--jobs", 2, "--worker-lifetime", 20)
    try:
        wait_while_running(proc, lambda: retired_workers(tmp_path / "logs") >= 3, "third retired worker")
        interrupt_and_compare(proc, tmp_path, fit)
    finally:
        proc.kill()


@slurm
def test_cancelled_worker_job_costs_time_not_results(slurm_up: None, tmp_path: Path, corpus: Path) -> None:
    """`scancel` of one of two worker jobs mid-fit: a new job replaces it, the fit goes on and holds exactly the
    in-process fit's numbers."""
    proc, fit = start_long_fit(tmp_path, corpus, "--jobs", 2)
    try:
        wait_for_step(tmp_path / "run", proc, 4)
        first = queued_jobs("dask-worker")
        subprocess.run(["scancel", first[0]], check=True, timeout=30)
        wait_while_running(proc, lambda: bool(set(queued_jobs("dask-worker")) - set(first)), "replacement job")
        interrupt_and_compare(proc, tmp_path, fit)
    finally:
        proc.kill()


@slurm
def test_start_cluster_refuses_clients_without_credentials(slurm_up: None, tmp_path: Path) -> None:
    """A cluster that start_cluster.py started admits a client with its credentials and refuses one without;
    Ctrl-C ends it with one line, its jobs cancelled and its credentials deleted."""
    hold = "import sys, time; print(sys.argv[-1], flush=True); time.sleep(600)"  # prints the scheduler address
    proc = subprocess.Popen([*start_cluster(tmp_path, "--jobs", 1), "--", sys.executable, "-c", hold],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_environment(),
                            preexec_fn=ctrl_c_as_in_a_terminal)
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("tls://"), proc.stderr.read() if proc.poll() is not None else address
        (folder,) = (tmp_path / "tls").iterdir()
        jobs = queued_jobs("dask-worker")
        assert not connects(address, without_credentials())
        assert connects(address, {**without_credentials(), **cluster_tls().Credentials(folder).client_environment()})
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.strip().splitlines()[-1].startswith("start_cluster: interrupted"), err
    assert not folder.exists()
    for job in jobs:
        wait_until_gone(job)


def wait_for_checkpoint(run: Path, job: str, step: int, timeout: float = 300.0) -> None:
    """Until the run has a checkpoint of ``step`` or later, job ``job`` still queued."""
    deadline = time.monotonic() + timeout
    while checkpoint_step(run) < step:
        assert job in queued_jobs("buffet"), f"job {job} ended before step {step}"
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within {timeout:g} s"
        time.sleep(0.2)


@slurm
def test_sbatch_wrapper_stops_at_the_walltime_signal_and_resumes(slurm_up: None, tmp_path: Path,
                                                                 corpus: Path) -> None:
    """A fit inside one allocation (buffet.sbatch): SIGINT to the batch script, as `--signal=B:INT@120` sends
    before the walltime, leaves an interrupted run with a checkpoint and the resume line; `sbatch buffet.sbatch
    buffet resume RUN` then ends it with the in-process fit's numbers."""
    fit = fit_args(corpus, 60)  # long enough to be seen at step 4, short enough to resume to its end
    run = tmp_path / "run"
    env = {**job_environment(), "BUFFET_SLURM_DIR": str(SLURM_DIR), "BUFFET_TLS_DIR": str(tmp_path / "tls")}
    sbatch = ["sbatch", "--chdir", str(tmp_path), "--time", "10", str(SBATCH_WRAPPER)]
    job = subprocess.run([*sbatch[:1], "--parsable", *sbatch[1:], *cli(*fit, "--out", run)], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    try:
        wait_for_checkpoint(run, job, 4)
        subprocess.run(["scancel", "--signal=INT", "--batch", job], check=True, timeout=30)
        wait_until_gone(job)
    finally:
        subprocess.run(["scancel", job], timeout=30)
    output = (tmp_path / f"buffet-{job}.out").read_text()
    assert "buffet: interrupted" in output and f"buffet resume {run}" in output, output
    assert RunStore(run).status == "interrupted" and checkpoint_step(run) >= 4
    resumed = subprocess.run([*sbatch[:1], "--wait", *sbatch[1:], *cli("resume", run, "--quiet")], env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert_same(final_state(run), reference(tmp_path, fit))
    assert not any((tmp_path / "tls").iterdir())

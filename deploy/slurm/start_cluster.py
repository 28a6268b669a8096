"""Start a Dask cluster of SLURM jobs (dask-jobqueue), run one buffet command on it, release it.

    python deploy/slurm/start_cluster.py [OPTIONS] -- buffet fit bnmf STORE --out RUN ...

The buffet command gets ``--scheduler <address>`` appended and TLS credentials made for this cluster alone
(``cluster_tls.py``) through Dask's configuration variables; the worker jobs get the same credentials, so
nobody else can connect. Options left out come from dask-jobqueue's ``jobqueue.slurm`` settings
(``~/.config/dask/jobqueue.yaml``; see ``jobqueue.yaml`` next to this script). The worker shape follows the
model of the command: one worker of several threads per job (``--processes`` workers if given) for Bayesian
NMF (``bnmf``), one single-threaded worker per core for the others.

With ``--worker-lifetime`` every worker retires after about that many seconds (dask's ``--lifetime`` with a
stagger of a tenth of it), its job ends, and a new job replaces it, as does any job that ends otherwise
(``scancel``, a node failure); buffet recomputes what a lost worker held. Exit status: the buffet command's,
130 after Ctrl-C, 1 with one line when the cluster cannot be started.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cluster_tls import Credentials, make_credentials

if TYPE_CHECKING:
    from dask_jobqueue import SLURMCluster

THREADED_MODELS = ("bnmf",)  # models whose block tasks are large NumPy calls that release the GIL: threads suit them
# The environment the nanny gives each worker (a Dask config value, parsed as a literal): glibc keeps freed memory
# mapped and serves arrays up to 32 MiB from the heap instead of mapping each afresh (see WORKER_MALLOC in
# pipeline/engine/cluster.py), and BLAS runs one thread per task thread.
NANNY_ENVIRON = ('{"MALLOC_TRIM_THRESHOLD_": "268435456", "MALLOC_MMAP_THRESHOLD_": "33554432", '
                 '"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}')
KEEP_INTERVAL = 5.0  # seconds between checks that every job is there (replacing those that ended)
LOST_JOB_TIMEOUT = "5s"  # how long a vanished worker's job is kept before it counts as gone and is replaced
CLOSE_TIMEOUT = 60  # seconds to cancel the jobs and stop the scheduler
INTERRUPT_TIMEOUT = 120  # seconds the buffet command gets to write its checkpoint after Ctrl-C


class StartError(Exception):
    """A cluster that cannot be started or used; its message is the one line the user sees."""


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options before ``--`` and the buffet command after it."""
    parser = argparse.ArgumentParser(
        prog="start_cluster.py", usage="%(prog)s [options] -- buffet COMMAND ...",
        description="Run one buffet command on a Dask cluster of SLURM jobs with TLS. Options left out "
                    "come from the jobqueue.slurm settings (jobqueue.yaml).")
    parser.add_argument("--jobs", type=int, default=2, help="SLURM jobs to keep running (default: %(default)s)")
    parser.add_argument("--cores", type=int, default=None, help="cores per job")
    parser.add_argument("--memory", default=None, help="memory per job, e.g. 32GB")
    parser.add_argument("--processes", type=int, default=None,
                        help="worker processes per job for bnmf and cnmf, which share the job's cores as "
                             "threads (default 1); the other models always run one single-threaded worker per core")
    parser.add_argument("--walltime", default=None, help="job time limit, e.g. 04:00:00")
    parser.add_argument("--queue", default=None, help="partition")
    parser.add_argument("--account", default=None, help="account to charge")
    parser.add_argument("--interface", default=None,
                        help="network interface of the scheduler and workers, e.g. ib0")
    parser.add_argument("--local-directory", default=None,
                        help="workers' spill folder: a node-local disk such as $TMPDIR, not NFS")
    parser.add_argument("--log-directory", default=None, help="folder for the jobs' output files")
    parser.add_argument("--job-extra-directive", action="append", default=None, metavar="DIRECTIVE",
                        help="extra #SBATCH line, e.g. --qos=long (repeatable)")
    parser.add_argument("--worker-lifetime", type=float, default=None, metavar="SECONDS",
                        help="retire each worker after this many seconds, give or take a tenth, and replace its "
                             "job; keep 1.1 times it below the walltime")
    parser.add_argument("--credentials-dir", type=Path, default=Path("~/.buffet/tls"),
                        help="folder on the shared file system under which the cluster's TLS credentials get "
                             "a private folder, deleted when the cluster ends (default: %(default)s)")
    parser.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                        help="how long to wait for the first worker (default: %(default)s)")
    split = argv.index("--") if "--" in argv else len(argv)
    opts, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        parser.error("give the buffet command after --")
    return opts, command


def command_model(command: list[str]) -> str | None:
    """The model the buffet command fits: the word after ``fit``, or the run's model for the commands
    that take a run folder (``resume RUN``, ``evaluate RUN``); None if it cannot be told."""
    words = [w for w in command[1:] if not w.startswith("-")]
    if len(words) < 2:
        return None
    if words[0] == "fit":
        return words[1]
    from buffet.pipeline.engine.runstore import RunStore

    try:
        return RunStore(words[1]).model
    except Exception:  # not a run folder: the command itself will say so
        return None


def processes_per_job(model: str | None, cores: int, processes: int | None) -> int:
    """Worker processes per job: ``processes`` (default 1) threaded workers for Bayesian NMF, else one
    single-threaded worker per core."""
    if model in THREADED_MODELS:
        return processes or 1
    return cores


def cluster_options(opts: argparse.Namespace, cores: int, processes: int, credentials: Credentials) -> dict:
    """SLURMCluster's arguments: the options given (the rest come from jobqueue.yaml), the worker shape,
    the lifetime and TLS; jobqueue.yaml's worker arguments and job script lines are kept, these added. A
    leading ``~`` of the jobs' log folder is the user's home here (dask-jobqueue would make a folder named
    ``~`` where the command runs, and sbatch would not expand it either)."""
    import dask

    logs = opts.log_directory or dask.config.get("jobqueue.slurm.log-directory", None)
    given = {"memory": opts.memory, "walltime": opts.walltime, "queue": opts.queue, "account": opts.account,
             "interface": opts.interface, "local_directory": opts.local_directory,
             "log_directory": None if logs is None else os.path.expanduser(logs),
             "job_extra_directives": opts.job_extra_directive}
    kwargs = {name: value for name, value in given.items() if value is not None}
    worker_args = list(dask.config.get("jobqueue.slurm.worker-extra-args", None) or [])
    if opts.worker_lifetime is not None:
        worker_args += ["--lifetime", f"{opts.worker_lifetime}s", "--lifetime-stagger", f"{opts.worker_lifetime / 10}s"]
    prologue = list(dask.config.get("jobqueue.slurm.job-script-prologue", None) or [])  # the site's lines first
    prologue.append(f"export DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON='{NANNY_ENVIRON}'")
    return {**kwargs, "cores": cores, "processes": processes, "worker_extra_args": worker_args,
            "security": credentials.security(), "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
            "job_script_prologue": prologue}


def start(opts: argparse.Namespace, command: list[str], credentials: Credentials) -> "SLURMCluster":
    """The cluster, its jobs submitted; waits up to ``--wait`` seconds for the first worker."""
    import dask
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    if shutil.which(command[0]) is None:
        raise StartError(f"no command {command[0]!r} here: activate buffet's environment")
    cores = opts.cores or dask.config.get("jobqueue.slurm.cores", None)
    if not cores:
        raise StartError("give --cores or set jobqueue.slurm.cores in jobqueue.yaml")
    processes = processes_per_job(command_model(command), cores, opts.processes)
    dask.config.set({"distributed.deploy.lost-worker-timeout": LOST_JOB_TIMEOUT})
    try:
        cluster = SLURMCluster(**cluster_options(opts, cores, processes, credentials))
    except (RuntimeError, ValueError, OSError) as exc:
        raise StartError(f"cannot start the cluster: {str(exc).strip().splitlines()[0]}") from None
    try:
        cluster.scale(jobs=opts.jobs)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=opts.wait)
    except BaseException as exc:  # Ctrl-C too: the jobs are cancelled before it goes on
        cluster.close(timeout=CLOSE_TIMEOUT)
        if isinstance(exc, TimeoutError):
            raise StartError(f"no worker joined within {opts.wait:g} s: see squeue and the jobs' output "
                             "files (--log-directory)") from None
        if isinstance(exc, Exception):
            raise StartError(f"cannot start the cluster: {str(exc).strip().splitlines()[0]}") from None
        raise
    print(f"start_cluster: {opts.jobs} jobs of {processes} worker(s); scheduler {cluster.scheduler_address}, "
          f"dashboard http://127.0.0.1:{cluster.scheduler.http_server.port}/status on this machine only",
          file=sys.stderr)
    return cluster


def run_command(command: list[str], cluster: "SLURMCluster", jobs: int, env: dict[str, str]) -> int:
    """Run the buffet command on the cluster, keeping ``jobs`` jobs running (a job that ended is replaced);
    its exit status. If this process stops first (Ctrl-C, a failure), the command gets SIGINT and time to
    write its checkpoint, and is killed if it takes longer."""
    # its own process group: a terminal's Ctrl-C reaches it once, through this process
    proc = subprocess.Popen([*command, "--scheduler", cluster.scheduler_address], env=env, start_new_session=True)
    try:
        while True:
            try:
                return proc.wait(timeout=KEEP_INTERVAL)
            except subprocess.TimeoutExpired:
                cluster.scale(jobs=jobs)  # re-submits the jobs whose workers are gone
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=INTERRUPT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise


def keep_ctrl_c() -> None:
    """Import dask-jobqueue without its SIGINT handler (it makes Ctrl-C a quiet ``sys.exit``): Ctrl-C stays
    Python's KeyboardInterrupt, so the buffet command is interrupted and the user told."""
    handler = signal.getsignal(signal.SIGINT)
    import dask_jobqueue  # noqa: F401  (sets the handler on import)

    signal.signal(signal.SIGINT, handler)


def main(argv: list[str]) -> int:
    opts, command = parse(argv)
    keep_ctrl_c()
    credentials = None
    cluster = None
    try:
        credentials = make_credentials(opts.credentials_dir.expanduser())
        cluster = start(opts, command, credentials)
        return run_command(command, cluster, opts.jobs, {**os.environ, **credentials.client_environment()})
    except (StartError, OSError) as exc:  # OSError: e.g. the credentials folder cannot be written
        print(f"start_cluster: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("start_cluster: interrupted; the cluster's jobs are cancelled", file=sys.stderr)
        return 130
    except subprocess.TimeoutExpired:
        print(f"start_cluster: the buffet command did not stop within {INTERRUPT_TIMEOUT} s of SIGINT and was "
              "killed; the cluster's jobs are cancelled", file=sys.stderr)
        return 130
    finally:
        if cluster is not None:
            cluster.close(timeout=CLOSE_TIMEOUT)
        if credentials is not None:
            credentials.remove()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Start a Dask cluster on SLURM with dask-jobqueue, run one buffet command on it, release it.

Usage: python start_cluster.py [--jobs N --cores C --memory M --walltime T --queue Q] -- buffet ARGS...
The buffet command gets ``--scheduler <address>`` appended.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

# The environment the nanny gives each worker (a Dask config value, parsed as a literal).
NANNY_ENVIRON = '{"MALLOC_TRIM_THRESHOLD_": 268435456, "OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1}'


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: start_cluster.py [options] -- buffet ARGS...", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cores", type=int, default=8, help="cores per job (one worker process each)")
    parser.add_argument("--memory", default="32GB", help="memory per job")
    parser.add_argument("--walltime", default="04:00:00")
    parser.add_argument("--queue", default=None)
    opts = parser.parse_args(argv[:split])
    command = argv[split + 1:]

    from dask_jobqueue import SLURMCluster
    from distributed import Client

    cluster = SLURMCluster(cores=opts.cores, processes=opts.cores, memory=opts.memory,
                           walltime=opts.walltime, queue=opts.queue,
                           job_script_prologue=[
                               "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1",
                               # workers keep freed memory mapped (see pipeline/engine/cluster.py)
                               "export DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON='" + NANNY_ENVIRON + "'"])
    cluster.scale(jobs=opts.jobs)
    with Client(cluster) as client:
        client.wait_for_workers(opts.jobs * opts.cores)
        print(f"cluster ready: {cluster.scheduler_address}, dashboard {client.dashboard_link}", file=sys.stderr)
        result = subprocess.run([*command, "--scheduler", cluster.scheduler_address])
    cluster.close()
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

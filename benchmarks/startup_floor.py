"""What a Bayesian NMF command cannot start faster than: the libraries it needs, imported in a fresh interpreter,
and buffet's thread LocalCluster once they are imported.

    python benchmarks/startup_floor.py [--runs 3] [--store STORE]

Each run is a fresh interpreter (``sys.executable``) that imports NumPy, scipy.sparse, scipy.special, Zarr,
dask.array and distributed (the design card's libraries, each of which a fit uses), then starts and stops
``buffet.pipeline.engine.cluster.dask_client`` with 2 thread workers, with and without the dashboard. Also
times a bare interpreter and the whole ``buffet fit bnmf --help`` (the command's own imports, parser and
exit). With ``--store``, also runs ``buffet fit bnmf STORE`` (one pass, K = 100, minibatch 1000, 2 thread
workers) and splits its time by its progress lines, which count from the start of the fit loop: before the
first step (start-up), the loop, and after the last step line (final checkpoint, topics, exit). Prints one
JSON line per run, seconds on the wall clock.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import sys
import time
from pathlib import Path

CHILD = r'''
import json, time
t0 = time.perf_counter()
import numpy, scipy.sparse, scipy.special, zarr, dask.array, distributed
t1 = time.perf_counter()
from buffet.pipeline.engine.cluster import dask_client
t2 = time.perf_counter()
with dask_client(2, dashboard=True, quiet=True, worker_kind="threads"):
    t3 = time.perf_counter()
t4 = time.perf_counter()
with dask_client(2, dashboard=False, quiet=True, worker_kind="threads"):
    t5 = time.perf_counter()
print(json.dumps({"libraries_import": t1 - t0, "cluster_start_with_dashboard": t3 - t2, "cluster_stop": t4 - t3,
                  "cluster_start_without_dashboard": t5 - t4}))
'''


def wall(cmd: list[str]) -> float:
    """Seconds from starting ``cmd`` to its exit."""
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def fit_phases(buffet: str, store: str) -> dict:
    """Start-up, loop and wind-down of one ``buffet fit bnmf`` by the arrival of its progress lines, which end
    with the seconds since the loop started (0.1 s resolution)."""
    run = Path(tempfile.mkdtemp()) / "run"
    cmd = [buffet, "fit", "bnmf", store, "--out", str(run), "--k", "100", "--batch-size", "1000", "--passes", "1",
           "--workers", "2", "--eval-every", "0"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    steps = []
    for line in proc.stdout:
        match = re.search(r"\] step \d+.*\s([\d.]+)s$", line.rstrip())
        if match:
            steps.append((time.perf_counter() - t0, float(match.group(1))))
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode})")
    end = time.perf_counter() - t0
    shutil.rmtree(run.parent)
    (first_at, first_clock), (last_at, last_clock) = steps[0], steps[-1]
    return {"fit_whole": round(end, 3), "fit_before_loop": round(first_at - first_clock, 3),
            "fit_loop": round(last_clock, 3), "fit_after_last_step": round(end - last_at, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--store", help="also time the phases of `buffet fit bnmf STORE`")
    args = p.parse_args()
    buffet = str(Path(sys.executable).with_name("buffet"))
    for run in range(args.runs):
        child = json.loads(subprocess.run([sys.executable, "-c", CHILD], check=True, capture_output=True,
                                          text=True).stdout)
        print(json.dumps({"run": run, **{k: round(v, 3) for k, v in child.items()},
                          "bare_interpreter": round(wall([sys.executable, "-c", "pass"]), 3),
                          "fit_bnmf_help": round(wall([buffet, "fit", "bnmf", "--help"]), 3),
                          **(fit_phases(buffet, args.store) if args.store else {})}), flush=True)


if __name__ == "__main__":
    main()

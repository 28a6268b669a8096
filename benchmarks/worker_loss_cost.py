"""What a lost worker costs: one Bayesian NMF SVI pass over a generated corpus
on an embedded LocalCluster of two worker processes, undisturbed and with one worker process killed
(SIGKILL) half-way through the pass. The nanny starts a new worker process, the engine recomputes what
was lost, and the fit must end with the same topics. Each fit is one whole ``buffet fit`` command
(start-up included), timed from the outside; the two exports are compared array by array.

    python benchmarks/worker_loss_cost.py --docs 200000 --workdir bench-data/loss

Results are appended to benchmarks/results.jsonl.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record, run_measured

BUFFET = str(Path(sys.executable).with_name("buffet"))
PROGRESS = re.compile(r"\] step (\d+)/(\d+)")


def worker_processes(parent: psutil.Process) -> list[psutil.Process]:
    """The Dask worker processes under a ``buffet`` command: spawned processes that start none of their own
    (a nanny, where there is one, is the parent of its worker)."""
    found = []
    for proc in parent.children(recursive=True):
        try:
            if "spawn_main" in " ".join(proc.cmdline()) and not proc.children():
                found.append(proc)
        except psutil.Error:
            pass
    return found


def fit_killing_one_worker(command: list[str], at_fraction: float) -> tuple[float, int]:
    """Run ``command`` (a fit printing one progress line per step on stderr), SIGKILL one worker
    process when the progress passes ``at_fraction`` of the steps; (wall seconds, step of the kill)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed_at, tail = 0, []
    for line in proc.stderr:
        tail = (tail + [line])[-20:]
        match = PROGRESS.search(line)
        if match and not killed_at and int(match.group(1)) >= at_fraction * int(match.group(2)):
            workers = worker_processes(psutil.Process(proc.pid))
            if workers:
                os.kill(workers[0].pid, signal.SIGKILL)
                killed_at = int(match.group(1))
    if proc.wait():
        raise SystemExit("the disturbed fit failed:\n" + "".join(tail))
    return time.perf_counter() - start, killed_at


def same_export(run_a: Path, run_b: Path, work: Path) -> bool:
    """Whether the two runs export identical arrays."""
    arrays = []
    for run in (run_a, run_b):
        out = work / f"{run.name}.npz"
        subprocess.run([BUFFET, "export", str(run), "--out", str(out)], check=True, capture_output=True)
        arrays.append(np.load(out))
    a, b = arrays
    return set(a.files) == set(b.files) and all(
        np.array_equal(a[k], b[k], equal_nan=True) for k in a.files if k != "trace_seconds")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=200000)
    p.add_argument("--workdir", required=True)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--at", type=float, default=0.5, help="kill a worker after this fraction of the steps")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    docword, store = work / f"docs{args.docs}.txt", work / f"docs{args.docs}.zarr"
    if not store.exists():
        subprocess.run([BUFFET, "generate", "--docs", str(args.docs), "--topics", str(args.k), "--seed",
                        str(args.seed), "--out", str(docword)], check=True, capture_output=True)
        subprocess.run([BUFFET, "ingest", "uci", str(docword), "--out", str(store), "--holdout", "0.005"],
                       check=True, capture_output=True)
    fit = ["fit", "bnmf", str(store), "--mode", "svi", "--passes", "1", "--k", str(args.k), "--batch-size",
           str(args.batch_size), "--workers", "2", "--worker-kind", "processes", "--eval-every", "1000000",
           "--overwrite"]
    whole, disturbed = work / "undisturbed", work / "disturbed"
    base = {"bench": "worker_loss_cost", "docs": args.docs, "k": args.k, "machine": machine()}
    undisturbed = run_measured([BUFFET, *fit, "--out", str(whole), "--quiet"])
    seconds, step = fit_killing_one_worker([BUFFET, *fit, "--out", str(disturbed)], args.at)
    same = same_export(whole, disturbed, work)
    ratio = seconds / undisturbed["seconds"]
    record(args.results, {**base, "undisturbed_s": round(undisturbed["seconds"], 1),
                          "disturbed_s": round(seconds, 1), "killed_at_step": step, "ratio": round(ratio, 3),
                          "same_numbers": same})
    print(f"undisturbed {undisturbed['seconds']:.1f} s, one worker killed at step {step}: {seconds:.1f} s "
          f"({ratio:.2f}x); same numbers: {same}")


if __name__ == "__main__":
    main()

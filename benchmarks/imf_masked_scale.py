"""Scale benchmark: IMF (and INMF) on a masked 100k x 1000 linear-Gaussian matrix with K+ = 10.

Data (IMF's model): Z ~ Bernoulli(0.3) (N x 10), A ~ N(0, 1) (10 x D), or with ``--nonnegative``
|N(0, 1)| (the truncated Gaussian of INMF's prior), X = Z A + N(0, 0.25) noise; each entry
is missing with probability ``--missing`` (the mask) and each observed entry is held out with
probability 1% (the store's ``heldout`` split of entries, which ``buffet evaluate`` scores). A is
drawn once; the rows are drawn, checked and appended one chunk of ``--chunk-rows`` at a time with the
store's streaming writers (``StoreWriter`` + ``DenseWriter``, as the text ingests use), so writing
never holds more than one chunk of the matrix.

Each model runs as the ``buffet fit imf|inmf`` command in a subprocess on the embedded LocalCluster
(rows streamed as chunk tasks): wall time, peak resident memory summed over the command's process
tree (``common.run_measured``) and the foreign load (``common.ForeignLoad``: other processes' CPU
use while it ran, in cores; the fit's own CPU time is that of its reaped process tree). Unless
``--no-wait``, each fit first waits up to 3 minutes for the shared machine to be quiet
(``common.wait_quiet``). The run's trace gives the steps and the mean seconds per step at each
K+; ``buffet evaluate`` gives the learned K+ and the held-out RMSE. ``--stop-after N`` ends a fit
after N steps and ``--time-limit S`` after S seconds (SIGTERM, which the command answers by
checkpointing): a partial run, recorded with the status ``buffet evaluate`` gives it. A fit that
fails is recorded too, with its exit status and the end of its output.

    python benchmarks/imf_masked_scale.py --workdir bench-data/imf-scale [--models imf,inmf] [--nonnegative] [--delete]

One JSON line per stage (write, then one fit per model) is printed and appended to
benchmarks/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from buffet.data.chunks import ChunkWriter
from buffet.data.store import DenseWriter, StoreWriter, check_values
from buffet.pipeline.engine.runstore import RunStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ForeignLoad, PeakMemory, machine, record, run_measured, wait_quiet

BUFFET = str(Path(sys.executable).with_name("buffet"))
TRUE_K = 10
FEATURE_PROB = 0.3
NOISE_VAR = 0.25
HOLDOUT = 0.01
SPLIT = "heldout"


def write_masked_store(path: Path, rows: int, cols: int, missing: float, chunk_rows: int, seed: int,
                       nonnegative: bool = False) -> dict:
    """The module docstring's data as a dense store with a mask and a ``heldout`` split of entries,
    written chunk by chunk; returns its size and the number of observed and held-out entries."""
    seeds = np.random.SeedSequence(seed).spawn(1 + -(-rows // chunk_rows))
    a = np.random.default_rng(seeds[0]).standard_normal((TRUE_K, cols))
    if nonnegative:
        a = np.abs(a)
    observed = held = 0
    with StoreWriter(path, overwrite=True) as w:
        data = DenseWriter(w.group, cols, chunk_rows, with_mask=True)
        test = ChunkWriter(w.group, f"splits/{SPLIT}/test_mask", (cols,), bool, chunk_rows)
        for i, r0 in enumerate(range(0, rows, chunk_rows)):
            rng = np.random.default_rng(seeds[1 + i])
            n = min(chunk_rows, rows - r0)
            z = (rng.random((n, TRUE_K)) < FEATURE_PROB).astype(np.float64)
            x = z @ a + np.sqrt(NOISE_VAR) * rng.standard_normal((n, cols))
            mask = rng.random((n, cols)) >= missing
            check_values("real", x, f"rows {r0}..", observed=mask)
            data.add_rows(np.where(mask, x, 0.0), mask)
            held_out = mask & (rng.random((n, cols)) < HOLDOUT)
            test.append(held_out)
            observed, held = observed + int(mask.sum()), held + int(held_out.sum())
        test.finish()
        w.group[f"splits/{SPLIT}"].attrs.update({"kind": "entries", "fraction": HOLDOUT})
        w.group.attrs["splits"] = [SPLIT]
        w.commit("dense", "real", data.finish(), chunk_rows,
                 {"source": "benchmarks/imf_masked_scale.py", "seed": seed, "true_k": TRUE_K,
                  "noise_var": NOISE_VAR, "missing": missing, "nonnegative": nonnegative})
    return {"rows": rows, "cols": cols, "missing": missing, "nonnegative": nonnegative, "observed": observed,
            "heldout_entries": held}


def children_cpu_seconds() -> float:
    """CPU seconds of this process's finished and reaped descendants (a fit's CLI process and,
    through it, its Dask workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trace_summary(run: Path) -> dict:
    """Steps, K+ reached and mean seconds per step at each K+ from the run's last checkpoint trace."""
    trace = RunStore(run).read_checkpoint().state["trace"]
    seconds: dict[int, list[float]] = defaultdict(list)
    previous = 0.0
    for rec in trace:
        seconds[rec["k_plus"]].append(rec["seconds"] - previous)
        previous = rec["seconds"]
    if not trace:  # stopped before its first step
        return {"steps": 0}
    return {"steps": len(trace), "driver_seconds": previous, "max_k_plus_tried": max(seconds),
            "steps_per_k": {k: len(v) for k, v in sorted(seconds.items())},
            "seconds_per_step_by_k": {k: round(float(np.mean(v)), 3) for k, v in sorted(seconds.items())}}


def fit(model: str, store: Path, run: Path, args: argparse.Namespace) -> dict:
    """Run ``buffet fit MODEL`` measured, then ``buffet evaluate`` on the run (or on its last checkpoint
    when the fit was stopped at ``--time-limit``); a fit that fails is described by its exit status and
    output instead."""
    cmd = [BUFFET, "fit", model, str(store), "--out", str(run), "--overwrite", "--max-k", str(args.max_k),
           "--n-candidates", str(args.n_candidates), "--chunk-rows", str(args.chunk_rows),
           "--workers", str(args.workers), "--select", args.select, "--quiet"]
    if args.stop_after:
        cmd += ["--stop-after", str(args.stop_after)]
    busy_before = None if args.no_wait else wait_quiet()
    cpu0 = children_cpu_seconds()
    with ForeignLoad() as load:
        res = run_measured(cmd, time_limit=args.time_limit, check=False)
    own_cpu = children_cpu_seconds() - cpu0
    measured = {"model": model, "seconds": res["seconds"], "peak_rss_mb": res["peak_rss_mb"],
                "own_cpu_seconds": own_cpu, "busy_before_cores": busy_before,
                "foreign_load_cores": load.cores(own_cpu), "command": res["command"], "returncode": res["returncode"],
                "stopped_at_time_limit": res["stopped_at_time_limit"]}
    if res["returncode"] != 0 and not res["stopped_at_time_limit"]:
        return {**measured, "status": "failed", "output_tail": res["output_tail"]}
    evaluation = json.loads(subprocess.run([BUFFET, "evaluate", str(run), "--json", "--workers", "1", "--quiet"],
                                           capture_output=True, text=True, check=True).stdout)
    return {**measured, "status": evaluation["status"], "k_plus": evaluation["k_plus"],
            "evidence": evaluation["evidence"], "heldout_rmse": evaluation.get("rmse"), **trace_summary(run)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("--missing", type=float, default=0.2)
    p.add_argument("--chunk-rows", type=int, default=5000)
    p.add_argument("--models", default="imf", help="comma-separated subset of imf,inmf")
    p.add_argument("--max-k", type=int, default=15)
    p.add_argument("--n-candidates", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--select", default="none",
                   help="the fit's --select: 'none' fits the given settings; 'auto' first "
                        "chooses the cap on K+ and offsets on validation entries (24 fits on this store)")
    p.add_argument("--stop-after", type=int, default=None, help="end each fit after this many steps")
    p.add_argument("--time-limit", type=float, default=None,
                   help="stop each fit after this many seconds (it checkpoints; recorded as a partial run)")
    p.add_argument("--nonnegative", action="store_true", help="plant a nonnegative A, |N(0, 1)| (INMF's prior)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-wait", action="store_true", help="start each fit without waiting for a quiet machine")
    p.add_argument("--delete", action="store_true", help="delete the store and the runs when done")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    name = f"masked{args.rows}x{args.cols}" + ("nn" if args.nonnegative else "")
    store = work / f"{name}.zarr"
    base = {"bench": "imf_masked_scale", "machine": machine()}

    t0 = time.perf_counter()
    with PeakMemory() as mem:
        data = write_masked_store(store, args.rows, args.cols, args.missing, args.chunk_rows, args.seed,
                                  args.nonnegative)
    record(args.results, {**base, "stage": "write", **data, "chunk_rows": args.chunk_rows,
                          "seconds": time.perf_counter() - t0, "peak_rss_mb": mem.peak / 2**20})

    settings = {"max_k": args.max_k, "n_candidates": args.n_candidates, "select": args.select,
                "chunk_rows": args.chunk_rows, "workers": args.workers, "stop_after": args.stop_after,
                "time_limit": args.time_limit, "true_k": TRUE_K, "noise_sd": float(np.sqrt(NOISE_VAR))}
    for model in args.models.split(","):
        run = work / f"{name}.{model}.run"
        record(args.results, {**base, "stage": "fit", **data, **settings, **fit(model, store, run, args)})
        if args.delete:
            shutil.rmtree(run)
    if args.delete:
        shutil.rmtree(store)


if __name__ == "__main__":
    main()

"""Scale benchmark of Bayesian NMF: generate a NYT-shaped UCI docword file, ingest it with
``buffet ingest uci`` and stream it through one SVI pass with ``buffet fit bnmf``, recording
wall time and peak memory of each stage. Each stage runs as its own ``buffet`` command in a
subprocess; peak memory is the largest sum of resident memory over that command's process
tree (CLI process, Dask nannies and workers), sampled every 100 ms with psutil.

    python benchmarks/bnmf_scale.py --docs 200000  --workdir bench-data/scale
    python benchmarks/bnmf_scale.py --docs 1800000 --workdir bench-data/scale --delete

``--delete`` removes the docword file after ingest and the store and run after the fit
(multi-GB). Results are appended to benchmarks/results.jsonl.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record, run_measured

from buffet.pipeline.engine.runstore import RunStore

BUFFET = str(Path(sys.executable).with_name("buffet"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk-rows", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=10 ** 9,
                   help="score held-out documents every this many steps; the default scores once, after the last "
                        "step (the pass's time then counts one scoring of 1000 documents)")
    p.add_argument("--holdout", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--docword", default=None, help="use this existing docword file instead of generating one")
    p.add_argument("--stages", default="generate,ingest,fit", help="comma-separated subset of generate,ingest,fit")
    p.add_argument("--delete", action="store_true", help="delete docword file, store and run when done")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    name = f"nyt{args.docs}"
    docword = Path(args.docword) if args.docword else work / f"{name}.txt"
    store, run = work / f"{name}.zarr", work / f"{name}.run"
    base = {"bench": "bnmf_scale", "docs": args.docs, "machine": machine()}

    stages = set(args.stages.split(","))
    if "generate" in stages and not docword.exists():
        res = run_measured([BUFFET, "generate", "--docs", str(args.docs), "--topics", str(args.k),
                            "--seed", str(args.seed), "--out", str(docword)])
        record(args.results, {**base, "stage": "generate", **res})
    if "ingest" in stages:
        res = run_measured([BUFFET, "ingest", "uci", str(docword), "--out", str(store), "--holdout",
                            str(args.holdout), "--overwrite"])
        res["docword_bytes"] = docword.stat().st_size
        res.pop("output_tail")
        record(args.results, {**base, "stage": "ingest", **res})
        if args.delete:
            docword.unlink()
    if "fit" not in stages:
        return

    res = run_measured([BUFFET, "fit", "bnmf", str(store), "--out", str(run), "--overwrite", "--k", str(args.k),
                        "--batch-size", str(args.batch_size), "--passes", "1", "--workers", str(args.workers),
                        "--chunk-rows", str(args.chunk_rows), "--eval-every", str(args.eval_every), "--quiet"])
    trace = RunStore(run).read_checkpoint().state["trace"]
    last = trace[-1]
    res.update({"steps": len(trace), "docs_seen": last["docs_seen"], "driver_seconds": last["seconds"],
                "docs_per_second_driver": last["docs_seen"] / last["seconds"],
                "heldout_ll": last.get("heldout_ll"), "output_tail": res["output_tail"][-200:]})
    record(args.results, {**base, "stage": "fit", **res})
    if args.delete:
        shutil.rmtree(store)
        shutil.rmtree(run)


if __name__ == "__main__":
    main()

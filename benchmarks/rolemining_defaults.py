"""`buffet fit imf|inmf` with its defaults on the role-mining data, as a user runs it.

For each data set and split seed: `buffet ingest pairs FILE --transpose --holdout 0.2 --seed S`, then
`buffet fit MODEL STORE --out RUN` with no other option (the default `--select auto` chooses offsets and
the cap on K+ on validation folds of the training entries), then `buffet evaluate RUN --json`. Prints one
line per fit and the mean held-out AUC per data set and model, and appends the records to
benchmarks/results.jsonl.

    python benchmarks/rolemining_defaults.py --workdir /tmp/rm [--models inmf imf] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from buffet.data.bundled import rolemining_path

BUFFET = [sys.executable, "-m", "buffet.pipeline.cli"]
FILES = {"Domino": "domino.txt", "Firewall": "fire1.txt"}


def buffet(*args: object) -> str:
    """Run one buffet command; its stdout."""
    proc = subprocess.run([*BUFFET, *map(str, args)], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"buffet {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["inmf", "imf"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=list(FILES))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.datasets:
        for seed in args.seeds:
            store = args.workdir / f"{name}-{seed}.zarr"
            buffet("ingest", "pairs", rolemining_path(FILES[name]), "--transpose", "--holdout", 0.2, "--seed", seed,
                   "--out", store, "--overwrite")
            for model in args.models:
                run = args.workdir / f"{name}-{seed}-{model}"
                start = time.perf_counter()
                buffet("fit", model, store, "--out", run, "--overwrite", "--quiet")
                seconds = time.perf_counter() - start
                result = json.loads(buffet("evaluate", run, "--json", "--quiet"))
                record = {"benchmark": "rolemining_defaults", "dataset": name, "seed": seed, "model": model,
                          "auc": result["auc"], "k_plus": result["k_plus"], "selected": result.get("selected"),
                          "fit_seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%d %H:%M")}
                results.append(record)
                print(json.dumps(record), flush=True)
    with open(Path(__file__).with_name("results.jsonl"), "a") as f:
        for record in results:
            f.write(json.dumps(record) + "\n")
    for name in args.datasets:
        for model in args.models:
            aucs = [r["auc"] for r in results if r["dataset"] == name and r["model"] == model]
            print(f"{name} {model}: mean AUC {np.mean(aucs):.4f} over seeds {args.seeds} ({', '.join(f'{a:.4f}' for a in aucs)})")


if __name__ == "__main__":
    main()

"""Reading a store from an object store (issue #11 acceptance): Bayesian NMF documents per second with
the store on a local S3 API server (moto's server mode on 127.0.0.1, its own process) against the same
store on local disk. The corpus is generated once, ingested twice (to a folder, and straight into the
bucket), and fitted with the same settings on an embedded LocalCluster; documents/s is the training
documents times the passes over the fit loop's own seconds (the last ``trace_seconds`` of the export),
so cluster start-up is left out of both. The two exports must be the same numbers.

    python benchmarks/store_on_s3.py --docs 50000 --workdir bench-data/s3

Results are appended to benchmarks/results.jsonl.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record

BUFFET = str(Path(sys.executable).with_name("buffet"))
BUCKET = "buffet-bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_s3_server() -> tuple[subprocess.Popen, dict]:
    """moto's S3 API server on a free port, with a bucket; the environment that points s3fs at it."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the S3 API server did not start")
            time.sleep(0.2)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    import s3fs

    s3fs.S3FileSystem(key="bench", secret="bench", endpoint_url=env["AWS_ENDPOINT_URL"]).mkdir(BUCKET)
    return server, env


def buffet(args: list[str], env: dict) -> None:
    proc = subprocess.run([BUFFET, *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"buffet {' '.join(args)} failed:\n{proc.stderr[-2000:]}")


def fit_and_export(store: str, run: str, out: Path, fit: list[str], env: dict) -> dict:
    buffet(["fit", "bnmf", store, "--out", run, *fit], env)
    buffet(["export", run, "--out", str(out)], env)
    return dict(np.load(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=50000)
    p.add_argument("--workdir", required=True)
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    args = p.parse_args()

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    docword = work / f"docs{args.docs}.txt"
    if not docword.exists():
        buffet(["generate", "--docs", str(args.docs), "--topics", str(args.k), "--seed", str(args.seed), "--out",
                str(docword)], dict(os.environ))
    server, env = start_s3_server()
    try:
        stores = {"local disk": str(work / "store.zarr"), "S3 server": f"s3://{BUCKET}/store.zarr"}
        runs = {"local disk": str(work / "run"), "S3 server": f"s3://{BUCKET}/run"}
        for store in stores.values():
            buffet(["ingest", "uci", str(docword), "--out", store, "--holdout", "0.01", "--overwrite"], env)
        fit = ["--mode", "svi", "--passes", str(args.passes), "--k", str(args.k), "--batch-size", "1000",
               "--eval-every", "1000000", "--overwrite", "--quiet"]
        exports = {where: fit_and_export(stores[where], runs[where], work / f"{i}.npz", fit, env)
                   for i, where in enumerate(stores)}
    finally:
        server.terminate()
        server.wait()
    train_docs = args.docs - round(0.01 * args.docs)
    rate = {where: train_docs * args.passes / float(e["trace_seconds"][-1]) for where, e in exports.items()}
    same = all(np.array_equal(exports["local disk"][k], exports["S3 server"][k], equal_nan=True)
               for k in exports["local disk"] if k != "trace_seconds")
    ratio = rate["S3 server"] / rate["local disk"]
    record(args.results, {"bench": "store_on_s3", "docs": args.docs, "k": args.k, "machine": machine(),
                          "docs_per_s_local": round(rate["local disk"]), "docs_per_s_s3": round(rate["S3 server"]),
                          "ratio": round(ratio, 3), "same_numbers": same})
    print(f"documents/s: local disk {rate['local disk']:.0f}, S3 server {rate['S3 server']:.0f} ({ratio:.2f}x); "
          f"same numbers: {same}")


if __name__ == "__main__":
    main()

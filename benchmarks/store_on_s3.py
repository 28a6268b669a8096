"""Reading a store from an object store: Bayesian NMF documents per second with
the store on a local S3 API server (moto's server mode on 127.0.0.1, its own process) against the same
store on local disk, with the run folder on local disk and, third, with the run in the bucket too. The
corpus is generated once, ingested twice (to a folder, and straight into the bucket), and fitted with
the same settings on an embedded LocalCluster; documents/s is the training documents times the passes
over the fit loop's own seconds (the last ``trace_seconds`` of the export), so cluster start-up is left
out. The S3 server's CPU seconds during each fit are recorded: on a small machine it competes with the
fit for the same cores. The three exports must be the same numbers.

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


def fit_and_export(store: str, run: str, out: Path, fit: list[str], env: dict, server: subprocess.Popen) -> dict:
    """The fit's export, and the S3 server's CPU seconds while the fit ran (``server_cpu_s``)."""
    import psutil

    cpu = psutil.Process(server.pid)
    before = sum(cpu.cpu_times()[:2])
    buffet(["fit", "bnmf", store, "--out", run, *fit], env)
    server_cpu = sum(cpu.cpu_times()[:2]) - before
    buffet(["export", run, "--out", str(out)], env)
    return {**np.load(out), "server_cpu_s": server_cpu}


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
        local, bucket = str(work / "store.zarr"), f"s3://{BUCKET}/store.zarr"
        for store in (local, bucket):
            buffet(["ingest", "uci", str(docword), "--out", store, "--holdout", "0.01", "--overwrite"], env)
        fit = ["--mode", "svi", "--passes", str(args.passes), "--k", str(args.k), "--batch-size", "1000",
               "--eval-every", "1000000", "--overwrite", "--quiet"]
        setups = {"local": (local, str(work / "run")), "store_s3": (bucket, str(work / "run-s3-store")),
                  "store_and_run_s3": (bucket, f"s3://{BUCKET}/run")}
        exports = {name: fit_and_export(store, run, work / f"{name}.npz", fit, env, server)
                   for name, (store, run) in setups.items()}
    finally:
        server.terminate()
        server.wait()
    train_docs = args.docs - round(0.01 * args.docs)
    rate = {name: train_docs * args.passes / float(e["trace_seconds"][-1]) for name, e in exports.items()}
    arrays = [k for k in exports["local"] if k not in ("trace_seconds", "server_cpu_s")]
    same = all(np.array_equal(exports["local"][k], e[k], equal_nan=True) for e in exports.values() for k in arrays)
    ratio = {name: rate[name] / rate["local"] for name in rate}
    record(args.results, {"bench": "store_on_s3", "docs": args.docs, "k": args.k, "machine": machine(),
                          **{f"docs_per_s_{name}": round(r) for name, r in rate.items()},
                          **{f"ratio_{name}": round(ratio[name], 3) for name in ("store_s3", "store_and_run_s3")},
                          **{f"server_cpu_s_{name}": round(e["server_cpu_s"], 1) for name, e in exports.items()},
                          "same_numbers": same})
    print(f"documents/s: local disk {rate['local']:.0f}; store on the S3 server {rate['store_s3']:.0f} "
          f"({ratio['store_s3']:.2f}x); store and run on it {rate['store_and_run_s3']:.0f} "
          f"({ratio['store_and_run_s3']:.2f}x); same numbers: {same}")


if __name__ == "__main__":
    main()

"""One pass of buffet's Bayesian NMF SVI against scikit-learn's and
gensim's online LDA on the same stored corpus: speed, peak memory and held-out quality.

One system per invocation (so peak memory is that system's alone); every run appends one
JSON line to ``--results``. Usage (see benchmarks/README.md for the runs behind the table):

    python benchmarks/bnmf_vs_lda.py buffet  STORE --k 100 --batch-size 1000 --workers 2
    python benchmarks/bnmf_vs_lda.py sklearn STORE --k 100 --batch-size 1000 --workers 2
    python benchmarks/bnmf_vs_lda.py gensim  STORE --k 100 --batch-size 1000 --workers 1

STORE is a ``buffet ingest uci ... --holdout`` store; its ``heldout`` documents are never
trained on and are scored afterwards by document completion (benchmarks/common.py): each
token goes to one of three folds with a fixed seed, topic weights are fitted on folds 0+1
with the topics fixed, and the per-word log likelihood of fold 2 is reported.

What ``seconds`` covers: the one training pass only. Corpus generation, ingest, cluster
start-up, loading data into memory for sklearn/gensim and the held-out scoring are outside
it. buffet's pass includes its workers reading every minibatch from the Zarr store, the
per-step broadcast of the topics, the reductions and the global updates; sklearn's and
gensim's passes start from an in-memory CSR matrix (gensim iterates it through
``Sparse2Corpus``). ``peak_rss_mb`` is the largest sum of resident memory over this process
and all its child processes (Dask nanny + workers, loky, multiprocessing), sampled every
50 ms from before the data is loaded until after the pass.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    ForeignLoad,
    PeakMemory,
    drop_empty,
    load_corpus,
    machine,
    mixture_loglik,
    record,
    run_measured,
    setting,
    thirds,
    timed_svi_pass,
    wait_quiet,
)


def buffet_config(args):
    """The BNMFConfig of a buffet run from the command line."""
    from buffet.pipeline.models.bnmf import BNMFConfig

    return BNMFConfig(n_topics=args.k, batch_size=args.batch_size, passes=1, seed=args.seed,
                      precision=args.precision, accelerate=args.accelerate,
                      **({"max_sweeps": args.max_sweeps} if args.max_sweeps else {}), **dict(args.set),
                      chunk_rows=args.chunk_rows or max(1, args.batch_size // max(1, args.workers)))


def buffet_heldout(store: str, g: np.ndarray, h: np.ndarray, config) -> dict:
    """The shared held-out score of buffet's topics (g, h), computed two ways that must agree."""
    from buffet.data.store import Dataset
    from buffet.kernels import bnmf
    from buffet.pipeline.engine.dataset import count_row_set, source_of

    hyper = config.hyper(g.shape[0])
    held_rows = np.asarray(Dataset(store).split("heldout")["test_rows"], dtype=np.int64)
    obs, held = thirds(count_row_set(source_of(store), held_rows).to_scipy())
    view = bnmf.TopicView.from_params(g, h, dtype=np.float64)
    ll, tokens = bnmf.completion_loglik(obs.indptr, obs.indices, obs.data, held.data, view, g / h, hyper,
                                        config.inference_settings())
    fit = bnmf.local_step(obs.indptr, obs.indices, obs.data, view, hyper, config.inference_settings(),
                          with_stats=False)
    beta = g / h
    check = mixture_loglik(fit.a / bnmf.theta_rate(view, hyper) * beta.sum(axis=0), beta.T, held)
    return {"heldout_ll": ll / tokens, "heldout_ll_mixture_form": check}


def run_buffet(args) -> dict:
    from buffet.pipeline.reports.bnmf import make_driver

    config = buffet_config(args)
    driver, trace, measured = timed_svi_pass(make_driver, config, args.store, args.workers, args.worker_kind)
    g, h = driver.state.g, driver.state.h
    return {**measured, "docs": driver.corpus.n_train, **buffet_heldout(args.store, g, h, config),
            "mean_sweeps": float(np.mean([r["mean_sweeps"] for r in trace])),
            "chunk_rows": config.chunk_rows, "steps": len(trace), "precision": args.precision,
            "accelerate": args.accelerate, "worker_kind": args.worker_kind,
            "max_sweeps": config.max_sweeps, "settings": dict(args.set)}


def run_buffet_cli(args) -> dict:
    """The whole ``buffet fit bnmf`` command, start-up and shutdown included, with no held-out scoring
    while it fits (``--eval-every 0``); the loop's own time is the run trace's last ``seconds``."""
    from buffet.pipeline.engine.codec import from_arrays
    from buffet.pipeline.engine.runstore import RunStore

    config = buffet_config(args)
    with tempfile.TemporaryDirectory() as tmp:
        run = str(Path(tmp) / "run")
        cmd = [str(Path(sys.executable).with_name("buffet")), "fit", "bnmf", args.store, "--out", run,
               "--k", str(args.k), "--batch-size", str(args.batch_size), "--split", "heldout", "--eval-every", "0",
               "--chunk-rows", str(config.chunk_rows), "--seed", str(args.seed), "--precision", args.precision,
               "--max-sweeps", str(config.max_sweeps), "--workers", str(args.workers),
               "--worker-kind", args.worker_kind, "--quiet",
               *(["--accelerate"] if args.accelerate else []),
               *[part for name, value in args.set for part in (f"--{name.replace('_', '-')}", str(value))]]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with ForeignLoad() as load:
            measured = run_measured(cmd)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        checkpoint = RunStore(run).read_checkpoint()
        trace, fitted = checkpoint.state["trace"], from_arrays(checkpoint.globals)  # read while the run exists
    g, h = fitted["g"], fitted["h"]
    return {"seconds": measured["seconds"], "loop_seconds": trace[-1]["seconds"],
            "outside_loop_seconds": measured["seconds"] - trace[-1]["seconds"], "docs": trace[-1]["docs_seen"],
            "peak_rss_mb": measured["peak_rss_mb"], "cpu_seconds": own, "foreign_load_cores": load.cores(own),
            **buffet_heldout(args.store, g, h, config), "command": measured["command"],
            "chunk_rows": config.chunk_rows, "steps": len(trace), "precision": args.precision,
            "worker_kind": args.worker_kind, "max_sweeps": config.max_sweeps, "settings": dict(args.set)}


def run_sklearn(args) -> dict:
    from sklearn.decomposition import LatentDirichletAllocation

    with PeakMemory() as mem:
        X_train, X_test, _ = load_corpus(args.store)
        lda = LatentDirichletAllocation(n_components=args.k, learning_method="online", batch_size=args.batch_size,
                                        max_iter=1, n_jobs=args.workers, random_state=args.seed,
                                        total_samples=X_train.shape[0])
        mem.reset_cpu()
        with ForeignLoad() as load:
            t0 = time.perf_counter()
            lda.fit(X_train)
            seconds = time.perf_counter() - t0
            own = mem.own_cpu_seconds()
    obs, held = drop_empty(*thirds(X_test))
    theta = lda.transform(obs)
    return {"seconds": seconds, "docs": X_train.shape[0], "peak_rss_mb": mem.peak / 2**20,
            "cpu_seconds": own, "foreign_load_cores": load.cores(own),
            "heldout_ll": mixture_loglik(theta, lda.components_, held)}


def run_gensim(args) -> dict:
    from gensim.matutils import Sparse2Corpus
    from gensim.models import LdaModel, LdaMulticore

    with PeakMemory() as mem:
        X_train, X_test, _ = load_corpus(args.store)
        n_words = X_train.shape[1]
        id2word = {i: str(i) for i in range(n_words)}
        corpus = Sparse2Corpus(X_train, documents_columns=False)
        common = {"num_topics": args.k, "id2word": id2word, "chunksize": args.batch_size, "passes": 1,
                  "random_state": args.seed, "eval_every": None}
        mem.reset_cpu()
        with ForeignLoad() as load:
            t0 = time.perf_counter()
            if args.workers >= 1:
                lda = LdaMulticore(corpus, workers=args.workers, **common)
            else:
                lda = LdaModel(corpus, update_every=1, **common)
            seconds = time.perf_counter() - t0
            own = mem.own_cpu_seconds()
    obs, held = drop_empty(*thirds(X_test))
    gamma, _ = lda.inference(list(Sparse2Corpus(obs, documents_columns=False)))
    return {"seconds": seconds, "docs": X_train.shape[0], "peak_rss_mb": mem.peak / 2**20,
            "cpu_seconds": own, "foreign_load_cores": load.cores(own),
            "heldout_ll": mixture_loglik(gamma, lda.get_topics(), held),
            "gensim_class": "LdaMulticore" if args.workers >= 1 else "LdaModel"}


SYSTEMS = {"buffet": run_buffet, "buffet-cli": run_buffet_cli, "sklearn": run_sklearn, "gensim": run_gensim}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("system", choices=sorted(SYSTEMS))
    p.add_argument("store")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2,
                   help="buffet: Dask workers; sklearn: n_jobs; gensim: LdaMulticore workers (0 = LdaModel)")
    p.add_argument("--chunk-rows", type=int, default=None, help="buffet: rows per block (default batch/workers)")
    p.add_argument("--precision", choices=("float64", "float32"), default="float64",
                   help="buffet: precision of the local sweeps (BNMFConfig.precision)")
    p.add_argument("--accelerate", action="store_true",
                   help="buffet: SQUAREM-accelerated local sweeps (BNMFConfig.accelerate)")
    p.add_argument("--max-sweeps", type=int, default=None,
                   help="buffet: training sweeps per document at most (default BNMFConfig's; held-out scoring "
                        "always runs to BNMFConfig.eval_max_sweeps)")
    p.add_argument("--worker-kind", choices=("processes", "threads"), default="threads",
                   help="buffet: LocalCluster workers as processes or threads (the CLI's default for bnmf: threads)")
    p.add_argument("--set", action="append", default=[], type=setting, metavar="NAME=VALUE",
                   help="buffet: any other BNMFConfig setting, e.g. --set kappa=0.7 (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    p.add_argument("--tag", default="")
    p.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine first")
    args = p.parse_args()
    busy_before = None if args.no_wait else wait_quiet()
    out = SYSTEMS[args.system](args)
    out["busy_cores_before"] = busy_before
    out["docs_per_second"] = out["docs"] / out["seconds"]
    record(args.results, {"bench": "bnmf_vs_lda", "system": args.system, "tag": args.tag, "store": args.store,
                          "k": args.k, "batch_size": args.batch_size, "workers": args.workers, **out,
                          "machine": machine()})


if __name__ == "__main__":
    main()

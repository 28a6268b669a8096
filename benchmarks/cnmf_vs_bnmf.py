"""Correlated NMF against Bayesian NMF, one SVI pass each on the same LDA-generated corpus
in one run: documents per second and held-out per-word log likelihood (targets: CNMF docs/s >= 0.5x
BNMF's, CNMF held-out LL >= BNMF's).

The corpus is the one of ``run_peers.sh``: 55,000 LDA documents (V = 8000, Poisson(300) tokens each, as many generating
topics as --k), 5,000 of them held out as whole documents (1/11 of --docs). It is written as a UCI docword
file and ingested with ``buffet ingest uci`` into WORKDIR, once; later runs reuse it (or pass --store).

    python benchmarks/cnmf_vs_bnmf.py --workdir /work/bench/cnmf                     # full size, K = 100
    python benchmarks/cnmf_vs_bnmf.py --workdir /tmp/cnmf-small --docs 5000 --k 20   # a small check

Each model: K topics, minibatch 1000, one pass, the CLI's defaults otherwise (kappa 0.51, t0 1; CNMF
m = 50), on an embedded LocalCluster of --workers workers of the kind the CLI starts for the model (threads or
processes; --worker-kind sets one for both). ``seconds`` is the fit loop only (every ``driver.step`` of the
pass), as in benchmarks/bnmf_vs_lda.py; generation, ingest, cluster start-up and held-out scoring are outside
it. The held-out score is the same for both: each held-out document's tokens split into thirds with the fixed
seed of benchmarks/common.py, the document's weights fitted by the model's own local step on folds 0 + 1 with
the topics fixed, and the per-word log likelihood of fold 2 under
p(v | d) = sum_k W_dk E[beta_vk] / sum_v' sum_k W_dk E[beta_v'k] (``kernels.bnmf.completion_score``;
W = E[theta] for BNMF, exp(l_k . u_d) for CNMF). Held-out documents get each model's scoring settings (BNMF:
``inference_settings``; CNMF: ``kernels.cnmf.LocalSettings()``, u_d to 1e-6), whatever --local-tol and
--max-steps set for training.

With --profile, one CNMF local step on 1000 training documents at the fitted globals is run under
cProfile after the pass, and the functions with the most own time are recorded with its result.
One JSON line per model is appended to --results.

With --corpus cnmf the documents are drawn from correlated NMF itself instead (``cnmf_corpus`` of the tests'
helpers: topics Gamma(0.1, 1) normalised, l_k ~ N(0, (--true-scale)^2 / m I_m) with m = --true-dims, u_d ~ N(0, I),
Poisson counts of mean --length per document), stored with ``from_array`` and 1/11 of the documents held out,
and the held-out documents are also scored at the true topics and locations (model ``oracle``: u_d fitted by
the local step on the observed thirds). --score-after 1,3,10 then fits each model in this process (no
cluster) for the largest of those passes and records the held-out score after each of them, with the CPU
seconds of the fit so far:

    python benchmarks/cnmf_vs_bnmf.py --corpus cnmf --workdir W --docs 22000 --words 5000 --k 50 --n-dims 20 \
        --length 100 --batch-size 1000 --score-after 1,3,10
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, record, setting, thirds, timed_svi_pass

BUFFET = str(Path(sys.executable).with_name("buffet"))
TESTS = Path(__file__).resolve().parent.parent / "tests"  # the correlated-NMF generator of the tests' helpers


def true_parameters(args) -> tuple[np.ndarray, np.ndarray, "sp.csr_matrix"]:
    """The correlated-NMF corpus of --corpus cnmf: (true topics V x K, true locations K x m, counts)."""
    sys.path.insert(0, str(TESTS))
    from helpers import cnmf_corpus

    rng = np.random.default_rng(args.seed)
    L = rng.normal(0.0, args.true_scale / np.sqrt(args.true_dims), size=(args.k, args.true_dims))
    X, beta = cnmf_corpus(args.docs, args.words, L, rng, length=args.length)
    return beta, L, X


def cnmf_store(args) -> str:
    """WORKDIR's correlated-NMF corpus (``true_parameters``), written the first time, 1/11 held out."""
    from buffet.data.arrays import from_array
    from buffet.data.splits import add_split, holdout_rows

    name = f"cnmf{args.docs}-v{args.words}-k{args.k}-m{args.true_dims}-x{args.true_scale}-n{args.length}-s{args.seed}"
    store = Path(args.workdir) / f"{name}.zarr"
    if not store.exists():
        ds = from_array(true_parameters(args)[2], store, "counts", rows_per_chunk=1000)
        add_split(ds, "heldout", {"test_rows": holdout_rows(ds.n_rows, 1 / 11, args.seed)}, {"kind": "rows"})
    return str(store)


def corpus_store(args) -> str:
    """The stored corpus: --store, or WORKDIR's, generated and ingested the first time."""
    if args.store:
        return args.store
    if args.corpus == "cnmf":
        return cnmf_store(args)
    from buffet.data.synthetic import write_uci_corpus

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    name = f"lda{args.docs}-k{args.k}-s{args.seed}"
    store, docword, vocab = work / f"{name}.zarr", work / f"{name}.txt", work / f"{name}.vocab"
    if not store.exists():
        write_uci_corpus(docword, args.docs, n_words=args.words, n_topics=args.k, mean_length=args.length,
                         seed=args.seed, vocab_path=vocab)
        subprocess.run([BUFFET, "ingest", "uci", str(docword), str(vocab), "--out", str(store), "--holdout",
                        str(1 / 11), "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL)
        docword.unlink()
    return str(store)


def config_of(model: str, args):
    """The model's settings: the CLI's defaults with K, the minibatch, the passes and the seed."""
    from buffet.pipeline.models.bnmf import BNMFConfig
    from buffet.pipeline.models.cnmf import CNMFConfig

    common = {"n_topics": args.k, "batch_size": args.batch_size, "passes": args.passes, "seed": args.seed,
              "chunk_rows": args.chunk_rows or max(1, args.batch_size // max(1, args.workers))}
    if model == "bnmf":
        return BNMFConfig(**common)
    local = {"local_tol": args.local_tol} if args.local_tol is not None else {}
    return CNMFConfig(**common, n_dims=args.n_dims, max_steps=args.max_steps, **local, **dict(args.set))


def timed_pass(model: str, config, store: str, args):
    """One SVI pass of ``model`` on a fresh LocalCluster; returns the driver and the pass's measurements."""
    from buffet.pipeline.registry import spec_for

    spec = spec_for(model)
    kind = args.worker_kind or spec.worker_kind
    driver, trace, measured = timed_svi_pass(spec.make_driver, config, store, args.workers, kind)
    effort_key = driver.model.effort[0]
    docs = driver.corpus.n_train * config.passes  # documents processed
    return driver, {**measured, "worker_kind": kind, "docs": docs, "docs_per_second": docs / measured["seconds"],
                    "steps": len(trace), effort_key: float(np.mean([r[effort_key] for r in trace]))}


def heldout_weights(model: str, driver, obs) -> np.ndarray:
    """Each held-out document's topic weights fitted by the model's local step on its observed thirds."""
    from buffet.kernels import bnmf

    g, h = driver.state.g, driver.state.h
    view = bnmf.TopicView.from_params(g, h)
    if model == "bnmf":
        hyper, settings = driver.model.hyper, driver.config.inference_settings()
        fit = bnmf.local_step(obs.indptr, obs.indices, obs.data, view, hyper, settings, with_stats=False)
        return fit.a / bnmf.theta_rate(view, hyper)
    return location_weights(view, driver.state.L, obs)


def location_weights(view, L: np.ndarray, obs) -> np.ndarray:
    """exp(l_k . u_d) (scaled per document) with u_d fitted by CNMF's local step on ``obs``, u_d to 1e-6."""
    from buffet.kernels import cnmf

    u = cnmf.local_step(obs.indptr, obs.indices, obs.data, view, L, cnmf.LocalSettings(), with_stats=False).u
    z = u @ L.T
    return np.exp(z - z.max(axis=1, keepdims=True))


def heldout_thirds(store: str):
    """The held-out documents' observed and predicted thirds (module docstring)."""
    from buffet.data.store import Dataset
    from buffet.pipeline.engine.dataset import count_row_set, source_of

    rows = np.asarray(Dataset(store).split("heldout")["test_rows"], dtype=np.int64)
    return thirds(count_row_set(source_of(store), rows).to_scipy())


def heldout_ll(model: str, driver, store: str) -> float:
    """Per-word log likelihood of the held-out thirds (module docstring)."""
    from buffet.kernels import bnmf

    obs, held = heldout_thirds(store)
    g, h = driver.state.g, driver.state.h
    ll, tokens = bnmf.completion_score(obs.indptr, obs.indices, held.data, heldout_weights(model, driver, obs), g / h)
    return ll / tokens


def oracle_ll(args, store: str) -> float:
    """Per-word log likelihood of the held-out thirds at the true topics and locations of --corpus cnmf."""
    from buffet.kernels import bnmf

    beta, L, _ = true_parameters(args)
    obs, held = heldout_thirds(store)
    weights = location_weights(bnmf.TopicView(beta, beta.sum(axis=0)), L, obs)
    ll, tokens = bnmf.completion_score(obs.indptr, obs.indices, held.data, weights, beta)
    return ll / tokens


def scored_passes(model: str, config, store: str, after: list[int]) -> dict:
    """Fit ``model`` in this process for max(after) passes; the held-out score and the fit's CPU seconds
    after each pass in ``after``."""
    from buffet.pipeline.engine.dataset import source_of
    from buffet.pipeline.engine.executor_choice import engine_on
    from buffet.pipeline.registry import spec_for

    driver = spec_for(model).make_driver(config, source_of(store), engine_on(None))
    driver.eval_rows = None
    driver.start()
    n_mb, cpu, out = len(driver.minibatches), 0.0, {}
    for step in range(driver.total_steps()):
        t0 = time.process_time()
        driver.step(step)
        cpu += time.process_time() - t0
        if (step + 1) % n_mb == 0 and (step + 1) // n_mb in after:
            out[(step + 1) // n_mb] = {"heldout_ll": heldout_ll(model, driver, store), "cpu_seconds": round(cpu, 2)}
    return out


def local_step_profile(driver, store: str, n_docs: int = 1000, top: int = 12) -> list[dict]:
    """Own CPU time of the functions that take most of one CNMF local step on ``n_docs`` training documents."""
    from buffet.data.store import Dataset
    from buffet.kernels import bnmf, cnmf

    rows = Dataset(store).read_rows(0, n_docs).to_scipy().tocsr()
    view = bnmf.TopicView.from_params(driver.state.g, driver.state.h)
    profile = cProfile.Profile()
    profile.runcall(cnmf.local_step, rows.indptr, rows.indices, rows.data, view, driver.state.L,
                    driver.config.local_settings())
    stats = pstats.Stats(profile).stats
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return [{"function": f"{Path(file).name}:{line}({name})", "own_s": round(tt, 3), "calls": nc}
            for (file, line, name), (_, nc, tt, _, _) in ranked]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="bench-data/cnmf", help="where the generated corpus and its store go")
    p.add_argument("--store", default=None, help="use this counts store (with a 'heldout' split) instead")
    p.add_argument("--corpus", choices=("lda", "cnmf"), default="lda",
                   help="draw the documents from LDA or from correlated NMF (with an oracle score)")
    p.add_argument("--true-dims", type=int, default=20, help="--corpus cnmf: dimension m of the true locations")
    p.add_argument("--true-scale", type=float, default=2.0,
                   help="--corpus cnmf: typical norm of the true topic locations (l_k . u_d has this spread)")
    p.add_argument("--score-after", default=None, metavar="PASSES",
                   help="comma-separated passes after which to score, fitting in this process (e.g. 1,3,10)")
    p.add_argument("--docs", type=int, default=55000, help="documents generated, 1/11 of them held out")
    p.add_argument("--words", type=int, default=8000)
    p.add_argument("--length", type=float, default=300.0, help="mean tokens per generated document")
    p.add_argument("--k", type=int, default=100, help="topics fitted (and generated)")
    p.add_argument("--n-dims", type=int, default=50, help="CNMF: dimension m of the topic and document locations")
    p.add_argument("--local-tol", type=float, default=None,
                   help="CNMF training: stop a document's Newton steps when u_d moves by less (default: the "
                        "model's; held-out: 1e-6)")
    p.add_argument("--max-steps", type=int, default=50, help="CNMF training: Newton steps per document at most")
    p.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE",
                   help="another CNMF setting (a CNMFConfig field, e.g. c0=250), repeatable")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--passes", type=int, default=1, help="SVI passes (the protocol: 1)")
    p.add_argument("--workers", type=int, default=2, help="workers of the embedded LocalCluster")
    p.add_argument("--worker-kind", choices=("threads", "processes"), default=None,
                   help="the LocalCluster's workers (default: each model's own, as the CLI starts them)")
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per block (default batch/workers)")
    p.add_argument("--models", default="bnmf,cnmf", help="comma-separated, run in this order")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="record a cProfile of one CNMF local step")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.jsonl"))
    p.add_argument("--tag", default="")
    args = p.parse_args()
    store = corpus_store(args)
    if args.score_after:
        after = [int(p) for p in args.score_after.split(",")]
        args.passes = max(after)
        head = {"bench": "cnmf_vs_bnmf", "tag": args.tag, "store": store, "k": args.k, "batch_size": args.batch_size,
                "machine": machine()}
        if args.corpus == "cnmf":
            record(args.results, {**head, "model": "oracle", "heldout_ll": oracle_ll(args, store)})
        for model in args.models.split(","):
            scores = scored_passes(model, config_of(model, args), store, after)
            record(args.results, {**head, "model": model, "set": dict(args.set) if model == "cnmf" else {},
                                  **({"n_dims": args.n_dims} if model == "cnmf" else {}),
                                  "after_passes": scores})
        return
    for model in args.models.split(","):
        config = config_of(model, args)
        driver, out = timed_pass(model, config, store, args)
        out["heldout_ll"] = heldout_ll(model, driver, store)
        if model == "cnmf" and args.profile:
            out["local_step_profile"] = local_step_profile(driver, store)
        record(args.results, {"bench": "cnmf_vs_bnmf", "model": model, "tag": args.tag,
                              "set": dict(args.set) if model == "cnmf" else {}, "store": store, "k": args.k,
                              "batch_size": args.batch_size, "workers": args.workers, "chunk_rows": config.chunk_rows,
                              **({"n_dims": args.n_dims} if model == "cnmf" else {}), **out, "machine": machine()})


if __name__ == "__main__":
    main()

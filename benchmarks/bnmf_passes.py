"""Does Bayesian NMF's held-out likelihood grow with SVI passes? Held-out per-word log likelihood by threefold
document completion (``BayesianNMF.score``) after 1, 5 and 20 passes, on real and generated corpora, 5 random
document splits each, under the topic prior of the paper (c0 = 0.05 V) and buffet's default (c0 = 0.5 V), or
the topic prior shapes c0 / V given by ``--shapes``.

Corpora (each split holds out 20% of the documents, drawn by the split's seed; K = 20 unless said):

* ``reuters``: the 395 Reuters stories of the ``lda`` package (about 210 tokens each), minibatch 50;
* ``reuters-short``: the same stories, each one's tokens dealt at random into 8 short documents
  (``data.synthetic.deal_tokens``; about 27 tokens, the length of a short review), split by story so no
  story is on both sides, minibatch 200;
* ``generated-bnmf``: 1,500 documents of about 40 tokens drawn from Bayesian NMF itself, V = 2,000, 20 sparse
  topics (``data.synthetic.bnmf_corpus``), minibatch 150;
* ``generated-lda``: 1,000 LDA documents of about 300 tokens (the New York Times length), V = 2,000, 20 topics
  (``data.synthetic.lda_documents``), minibatch 100;
* ``generated-nyt`` (not run unless named): 5,500 LDA documents of about 300 tokens, V = 8,000, 100 topics,
  K = 100, minibatch 500: the New York Times shape of the papers, small.

Every fit runs in this process on one thread (set OPENBLAS_NUM_THREADS=1), seed = split. Prints a table and
appends one JSON line per fit to ``--out``:

    OPENBLAS_NUM_THREADS=1 python benchmarks/bnmf_passes.py [--corpora reuters reuters-short] [--out FILE]
    OPENBLAS_NUM_THREADS=1 python benchmarks/bnmf_passes.py --corpora generated-nyt --passes 1 5 --splits 3
    OPENBLAS_NUM_THREADS=1 python benchmarks/bnmf_passes.py --shapes 0.5 --set step_size=adaptive --set t0=5

``--set NAME=VALUE`` passes other ``BayesianNMF`` settings to every fit (recorded in each line); ``--k`` fits
another number of topics on every corpus:

    OPENBLAS_NUM_THREADS=1 python benchmarks/bnmf_passes.py --k 50 --passes 20 --shapes 0.5 0.3 0.2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, setting

from buffet.data.synthetic import bnmf_corpus, deal_tokens, lda_documents, lda_topics
from buffet.pipeline.estimators import BayesianNMF
from buffet.pipeline.models.bnmf import TOPIC_SHAPE

PASSES = [1, 5, 20]
SPLITS = 5
HELD_OUT = 0.2
SHAPES = [0.05, TOPIC_SHAPE]  # topic prior shapes c0 / V: the paper's and the default


def reuters() -> sp.csr_matrix:
    import lda

    return sp.csr_matrix(lda.datasets.load_reuters()).astype(np.float64)


def split(X: sp.csr_matrix, seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(training rows in a random order, held-out rows): ``HELD_OUT`` of the rows drawn by ``seed``."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(X.shape[0])
    n_held = int(round(HELD_OUT * X.shape[0]))
    return X[order[n_held:]], X[np.sort(order[:n_held])]


def reuters_split(seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    return split(reuters(), seed)


def reuters_short_split(seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    train, test = split(reuters(), seed)
    rng = np.random.default_rng(1000 + seed)
    train = deal_tokens(train, 8, rng)
    return train[rng.permutation(train.shape[0])], deal_tokens(test, 8, rng)


def generated_bnmf_split(seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    X = bnmf_corpus(1500, 2000, 20, np.random.default_rng(2000 + seed), tokens_per_doc=40).X
    return split(X[np.diff(X.indptr) > 0], seed)


def generated_lda_split(seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    rng = np.random.default_rng(3000 + seed)
    return split(sp.csr_matrix(lda_documents(lda_topics(2000, 20, rng), 1000, rng, 0.05, 300.0)), seed)


def generated_nyt_split(seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    rng = np.random.default_rng(5000 + seed)
    return split(sp.csr_matrix(lda_documents(lda_topics(8000, 100, rng), 5500, rng, 0.01, 300.0)), seed)


# name -> (split maker, minibatch size, K)
CORPORA: dict[str, tuple[Callable[[int], tuple[sp.csr_matrix, sp.csr_matrix]], int, int]] = {
    "reuters": (reuters_split, 50, 20), "reuters-short": (reuters_short_split, 200, 20),
    "generated-bnmf": (generated_bnmf_split, 150, 20), "generated-lda": (generated_lda_split, 100, 20),
    "generated-nyt": (generated_nyt_split, 500, 100),
}
DEFAULT_CORPORA = ["reuters", "reuters-short", "generated-bnmf", "generated-lda"]


def heldout(train: sp.csr_matrix, test: sp.csr_matrix, n_topics: int, batch: int, passes: int, seed: int,
            shape: float, settings: dict) -> tuple[float, float]:
    """(held-out per-word LL, fit seconds) of one SVI fit with the topic prior c0 = ``shape`` V and ``settings``."""
    started = time.perf_counter()
    model = BayesianNMF(n_topics, batch_size=batch, passes=passes, seed=seed, eval_every=0,
                        c0=shape * train.shape[1], **settings).fit(train)
    return model.score(test), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", nargs="+", choices=sorted(CORPORA), default=DEFAULT_CORPORA)
    parser.add_argument("--passes", nargs="+", type=int, default=PASSES)
    parser.add_argument("--shapes", nargs="+", type=float, default=SHAPES, help="topic prior shapes c0 / V")
    parser.add_argument("--splits", type=int, default=SPLITS)
    parser.add_argument("--k", type=int, default=None, help="topics fitted on every corpus (default: the corpus's own)")
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per fit here")
    parser.add_argument("--set", action="append", default=[], type=setting, metavar="NAME=VALUE",
                        help="another BayesianNMF setting for every fit (repeatable)")
    args = parser.parse_args()
    host = {"host": platform.node(), **machine()}
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, host {json.dumps(host)}")
    passes_list = sorted(args.passes)
    print(f"{'corpus':15s} {'prior':16s} split " + " ".join(f"{p:>3d} pass" for p in passes_list)
          + f"  {passes_list[-1]}-{passes_list[0]}")
    for name in args.corpora:
        make, batch, n_topics = CORPORA[name]
        n_topics = args.k or n_topics
        for shape in args.shapes:
            prior = {TOPIC_SHAPE: "default ", 0.05: "paper "}.get(shape, "") + f"c0={shape:g}V"
            rows = []
            for seed in range(args.splits):
                train, test = make(seed)
                scores = {}
                for passes in passes_list:
                    scores[passes], seconds = heldout(train, test, n_topics, batch, passes, seed, shape,
                                                      dict(args.set))
                    if args.out:
                        with args.out.open("a") as out:
                            out.write(json.dumps({
                                "time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "bench": "bnmf_passes",
                                "machine": host, "corpus": name, "prior": prior, "split": seed, "passes": passes,
                                "heldout_ll": scores[passes], "seconds": round(seconds, 2),
                                "train_docs": train.shape[0], "batch_size": batch, "n_topics": n_topics,
                                "settings": dict(args.set)}) + "\n")
                rows.append([scores[p] for p in passes_list])
                print(f"{name:15s} {prior:16s} {seed:5d} " + " ".join(f"{s:8.4f}" for s in rows[-1])
                      + f" {rows[-1][-1] - rows[-1][0]:+7.4f}", flush=True)
            table = np.array(rows)
            print(f"{name:15s} {prior:16s}  mean " + " ".join(f"{s:8.4f}" for s in table.mean(axis=0))
                  + f" {np.mean(table[:, -1] - table[:, 0]):+7.4f}  (sd over splits "
                  + " ".join(f"{s:.4f}" for s in table.std(axis=0, ddof=1)) + ")", flush=True)


if __name__ == "__main__":
    main()

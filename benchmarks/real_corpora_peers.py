"""Bayesian NMF (SVI) against scikit-learn's online LDA, gensim's ``LdaModel`` and tomotopy's collapsed-Gibbs
``LDAModel`` on corpora of real documents that installed packages ship (nothing is downloaded): held-out
per-word log likelihood by document completion through one scorer, and the NPMI coherence of each topic's
top 10 words, each system at its documented defaults and at equal wall time.

Corpora (read from the installed packages; every split holds out 20% of the documents, drawn by its seed):

* ``reuters``: the 395 Reuters stories of the ``lda`` package, as it ships them (counts over 4,258 words);
* ``lee``: gensim's Lee news corpus (``gensim/test/test_data/lee_background.cor``, 300 Australian news
  stories);
* ``wiki``: gensim's 250 Wikipedia articles (``gensim/test/test_data/head500.noblanks.cor``, already
  lower-cased, stemmed and without stop words by gensim).

Tokens of ``lee`` and ``wiki`` (``tokenise``): lower-cased runs of letters of at least 3 characters, minus
scikit-learn's English stop words; the vocabulary is the words found in at least 2 documents of the corpus.

Systems, all on one thread (BLAS limited to one thread before NumPy loads; Bayesian NMF's estimator runs a
corpus this small in this process; scikit-learn ``n_jobs=None``; gensim ``LdaModel``, not ``LdaMulticore``;
tomotopy ``workers=1``), seed = split:

* ``bnmf``: ``BayesianNMF(K, eval_every=0)``: defaults, one SVI pass with minibatches of 1,000 documents
  (here the whole training set, one step); equal time sets ``passes``;
* ``sklearn``: ``LatentDirichletAllocation(K, learning_method="online")``: defaults, ``max_iter=10``;
  equal time sets ``max_iter``;
* ``gensim``: ``LdaModel(corpus, K)``: defaults, ``passes=1``; equal time sets ``passes``;
* ``tomotopy``: ``LDAModel(k=K)`` then ``train()``: defaults, 10 Gibbs iterations; equal time sets
  the iterations.

Equal wall time: in each (corpus, K, split) the budget is the longest of the four default fits' wall times, so
no system gets less than its defaults take (``--budget-scales 5``: five times that); every other system's
passes (iterations) are scaled from its own default fit to the budget, then corrected up to twice along the
line through the last two (passes, seconds) points until a fit lands within ``BUDGET_SLACK`` of the budget
(``equal_time_fit``); the system whose default set the budget keeps its default fit. Only the training call
is timed (not loading, tokenising or scoring); CPU seconds of this process are recorded beside the wall time.

Held-out score (benchmarks/common.py): each held-out document's tokens go into thirds (``thirds``); topic
weights are fitted on two thirds with the topics fixed, by each system's own inference (Bayesian NMF's local
step, scikit-learn's ``transform``, gensim's ``inference``); tomotopy's topic-word distributions (words it
never saw in training get its smoothing mass eta / (n_k + V eta)) go through ``fold_in``, an EM fit of the
mixture weights with tomotopy's fitted alpha as pseudocounts; ``mixture_loglik`` scores the last third.
Coherence: ``topic_npmi`` of each topic's 10 most probable words, documents counted on the held-out documents.

    OPENBLAS_NUM_THREADS=1 python benchmarks/real_corpora_peers.py scores --out benchmarks/results/real_corpora_peers.jsonl
    OPENBLAS_NUM_THREADS=1 python benchmarks/real_corpora_peers.py scores --out FILE --ks 20 --budget-scales 5 --splits 0 1 2
    python benchmarks/real_corpora_peers.py table benchmarks/results/real_corpora_peers.jsonl

``--set NAME=VALUE`` passes another ``BayesianNMF`` setting to its fits (its default fit too), e.g. the MAP
estimate; write such runs to a file of their own, as the table takes every Bayesian NMF record as one system:

    OPENBLAS_NUM_THREADS=1 python benchmarks/real_corpora_peers.py scores --out FILE --set estimate=map
"""

from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import json
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import drop_empty, machine, mixture_loglik, record, thirds, topic_npmi
from common import setting as name_value

CORPORA = ("reuters", "lee", "wiki")
SYSTEMS = ("bnmf", "sklearn", "gensim", "tomotopy")
KS = (20, 50)
SPLITS = (0, 1, 2, 3, 4)
HELD_OUT = 0.2
TOP_WORDS = 10
BUDGET_SLACK = 0.2  # an equal-time fit within this share of the budget is kept
MIN_DOCS = 2  # a word enters the vocabulary of lee and wiki if at least this many documents have it
TOKEN = re.compile(r"[^\W\d_]{3,}")


# ----- corpora -----

def tokenise(text: str, stop: frozenset[str]) -> list[str]:
    """Lower-cased runs of at least 3 letters, minus ``stop``."""
    return [t for t in TOKEN.findall(text.lower()) if t not in stop]


def counts_of(docs: list[list[str]], min_docs: int = MIN_DOCS) -> tuple[sp.csr_matrix, list[str]]:
    """Documents x words counts over the words found in at least ``min_docs`` documents (sorted)."""
    df = Counter(w for doc in docs for w in set(doc))
    vocab = sorted(w for w, n in df.items() if n >= min_docs)
    index = {w: i for i, w in enumerate(vocab)}
    rows, cols = [], []
    for d, doc in enumerate(docs):
        ids = [index[w] for w in doc if w in index]
        rows.extend([d] * len(ids))
        cols.extend(ids)
    X = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(docs), len(vocab)))
    X.sum_duplicates()
    return X, vocab


def gensim_test_file(name: str) -> Path:
    import gensim

    return Path(gensim.__file__).parent / "test" / "test_data" / name


def text_corpus(name: str) -> tuple[sp.csr_matrix, list[str]]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    lines = gensim_test_file(name).read_text(encoding="utf-8").splitlines()
    return counts_of([tokenise(line, ENGLISH_STOP_WORDS) for line in lines if line.strip()])


def reuters() -> tuple[sp.csr_matrix, list[str]]:
    import lda

    X = sp.csr_matrix(lda.datasets.load_reuters()).astype(np.float64)
    return X, list(lda.datasets.load_reuters_vocab())


LOADERS: dict[str, Callable[[], tuple[sp.csr_matrix, list[str]]]] = {
    "reuters": reuters, "lee": lambda: text_corpus("lee_background.cor"),
    "wiki": lambda: text_corpus("head500.noblanks.cor"),
}


def split(X: sp.csr_matrix, seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(training rows in a random order, held-out rows): ``HELD_OUT`` of the documents drawn by ``seed``."""
    order = np.random.default_rng(seed).permutation(X.shape[0])
    n_held = int(round(HELD_OUT * X.shape[0]))
    return X[order[n_held:]], X[np.sort(order[:n_held])]


# ----- systems: fit(train, K, seed, n or None) -> Fitted -----

@dataclass
class Fitted:
    """A fitted system: its K x V topic-word matrix, its fold-in (observed counts -> document weights for
    ``mixture_loglik``), the passes or iterations it ran and the wall and CPU seconds of its training call."""

    topics: np.ndarray
    weights: Callable[[sp.csr_matrix], np.ndarray]
    n: int
    seconds: float
    cpu_seconds: float


class Clock:
    def __enter__(self) -> "Clock":
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0


BNMF_SETTINGS: dict[str, float | int | str] = {}  # other BayesianNMF settings of every fit (``--set``)


def fit_bnmf(train: sp.csr_matrix, k: int, seed: int, n: int | None) -> Fitted:
    from buffet.pipeline.estimators import BayesianNMF

    model = BayesianNMF(k, seed=seed, eval_every=0, **BNMF_SETTINGS, **({"passes": n} if n else {}))
    with Clock() as clock:
        model.fit(train)
    mass = (model.g_ / model.h_).sum(axis=0)  # p(w|d) = sum_k theta_dk beta_kw: weights carry the topic masses
    return Fitted(model.components_, lambda obs: model.transform(obs) * mass, model.passes, clock.seconds, clock.cpu)


def fit_sklearn(train: sp.csr_matrix, k: int, seed: int, n: int | None) -> Fitted:
    from sklearn.decomposition import LatentDirichletAllocation

    model = LatentDirichletAllocation(k, learning_method="online", random_state=seed, **({"max_iter": n} if n else {}))
    with Clock() as clock:
        model.fit(train)
    return Fitted(model.components_, model.transform, model.max_iter, clock.seconds, clock.cpu)


def fit_gensim(train: sp.csr_matrix, k: int, seed: int, n: int | None) -> Fitted:
    from gensim.matutils import Sparse2Corpus
    from gensim.models import LdaModel

    id2word = {i: str(i) for i in range(train.shape[1])}
    corpus = Sparse2Corpus(train, documents_columns=False)
    with Clock() as clock:
        model = LdaModel(corpus, num_topics=k, id2word=id2word, random_state=seed, **({"passes": n} if n else {}))

    def weights(obs: sp.csr_matrix) -> np.ndarray:
        return model.inference(list(Sparse2Corpus(obs, documents_columns=False)))[0]

    return Fitted(model.get_topics(), weights, model.passes, clock.seconds, clock.cpu)


def fold_in(topics: np.ndarray, obs: sp.csr_matrix, alpha: np.ndarray, iterations: int = 200) -> np.ndarray:
    """Document weights of the mixture sum_k theta_dk topics_kw with the topics fixed, by EM with ``alpha``
    as pseudocounts: theta_dk <- alpha_k + theta_dk sum_w n_dw topics_kw / sum_j theta_dj topics_jw."""
    topics = topics / topics.sum(axis=1, keepdims=True)
    obs = obs.tocoo()
    r, c, n = obs.row, obs.col, obs.data
    theta = np.full((obs.shape[0], topics.shape[0]), 1.0 / topics.shape[0])
    for _ in range(iterations):
        p = np.einsum("nk,kn->n", theta[r], topics[:, c])
        ratio = sp.csr_matrix((n / p, (r, c)), shape=obs.shape)
        theta = theta * (ratio @ topics.T) + alpha
        theta /= theta.sum(axis=1, keepdims=True)
    return theta


def fit_tomotopy(train: sp.csr_matrix, k: int, seed: int, n: int | None) -> Fitted:
    import tomotopy as tp

    model = tp.LDAModel(k=k, seed=seed)
    for row in train:
        model.add_doc([str(w) for w in np.repeat(row.indices, row.data.astype(np.int64))])
    iterations = n or 10  # train()'s default
    with Clock() as clock:
        model.train(iterations, workers=1)
    known = np.array([int(w) for w in model.used_vocabs])
    n_k = np.asarray(model.get_count_by_topics(), dtype=np.float64)
    topics = np.repeat((model.eta / (n_k + len(known) * model.eta))[:, None], train.shape[1], axis=1)
    topics[:, known] = np.array([model.get_topic_word_dist(t) for t in range(k)])
    alpha = np.asarray(model.alpha, dtype=np.float64)
    return Fitted(topics, lambda obs: fold_in(topics, obs, alpha), iterations, clock.seconds, clock.cpu)


FITS: dict[str, Callable[[sp.csr_matrix, int, int, int | None], Fitted]] = {
    "bnmf": fit_bnmf, "sklearn": fit_sklearn, "gensim": fit_gensim, "tomotopy": fit_tomotopy}


# ----- scores -----

def evaluate(fitted: Fitted, test: sp.csr_matrix) -> dict:
    obs, held = drop_empty(*thirds(test))
    top = np.argsort(-fitted.topics, axis=1)[:, :TOP_WORDS]
    npmi = topic_npmi(top, test)
    return {"heldout_ll": mixture_loglik(fitted.weights(obs), fitted.topics, held), "npmi": float(npmi.mean()),
            "npmi_topics": [round(float(v), 4) for v in npmi], "passes": fitted.n, "seconds": fitted.seconds,
            "cpu_seconds": fitted.cpu_seconds}


def equal_time_fit(system: str, train: sp.csr_matrix, k: int, seed: int, default: dict,
                   budget: float) -> tuple[Fitted, int]:
    """A fit of ``system`` taking about ``budget`` wall seconds, and how many fits it took to find: passes scaled
    from the default fit, then up to two corrections along the line through the last two (passes, seconds)
    points, stopping once a fit is within ``BUDGET_SLACK`` of the budget (start-up costs make the first guess
    short)."""
    points = [(default["passes"], default["seconds"])]
    n = max(1, int(round(default["passes"] * budget / default["seconds"])))
    for attempt in range(1, 4):
        fitted = FITS[system](train, k, seed, n)
        points.append((n, fitted.seconds))
        if abs(fitted.seconds - budget) <= BUDGET_SLACK * budget or attempt == 3:
            return fitted, attempt
        (n_a, t_a), (n_b, t_b) = points[-2:]
        slope = (t_b - t_a) / (n_b - n_a) if n_b != n_a else 0.0
        slope = slope if slope > 0 else t_b / n_b
        n_next = max(1, int(round(n_b + (budget - t_b) / slope)))
        if n_next == n:
            return fitted, attempt
        n = n_next
    raise AssertionError("unreachable")


def setting_name(scale: float) -> str:
    return "equal-time" if scale == 1 else f"equal-time x{scale:g}"


def score_cell(corpus: str, X: sp.csr_matrix, k: int, seed: int, systems: list[str], scales: list[float],
               out: Path) -> None:
    """Default and equal-time fits of ``systems`` on one split of one corpus at one K; the default fits are
    recorded when ``scales`` holds 1 (they are fitted anyway, to set the budgets)."""
    train, test = split(X, seed)
    base = {"bench": "real_corpora_peers", "corpus": corpus, "k": k, "split": seed, "train_docs": train.shape[0],
            "test_docs": test.shape[0], "words": X.shape[1], "threads": 1, "host": os.uname().nodename,
            "machine": machine(), "bnmf_settings": BNMF_SETTINGS}
    defaults = {}
    for system in systems:
        load = os.getloadavg()[0]
        defaults[system] = {"setting": "default", **evaluate(FITS[system](train, k, seed, None), test), "load1": load}
        if 1 in scales:
            record(str(out), {**base, "system": system, **defaults[system]})
    setter = max(defaults, key=lambda s: defaults[s]["seconds"])
    for scale in scales:
        budget = scale * defaults[setter]["seconds"]
        for system in systems:
            if system == setter and scale == 1:
                row = {**defaults[system], "setting": setting_name(scale)}
            else:
                load = os.getloadavg()[0]
                fitted, attempts = equal_time_fit(system, train, k, seed, defaults[system], budget)
                row = {"setting": setting_name(scale), **evaluate(fitted, test), "load1": load,
                       "calibration_fits": attempts}
            record(str(out), {**base, "system": system, **row, "budget_seconds": budget, "budget_set_by": setter,
                              "budget_scale": scale})


def scores(args: argparse.Namespace) -> None:
    BNMF_SETTINGS.update(args.set)
    for corpus in args.corpora:
        X, _ = LOADERS[corpus]()
        for k in args.ks:
            for seed in args.splits:
                score_cell(corpus, X, k, seed, args.systems, args.budget_scales, args.out)


# ----- tables -----

def mean_sd(values: list[float], digits: int) -> str:
    if len(values) < 2:
        return f"{np.mean(values):.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


def target_line(setting: str, rows: list[dict]) -> str:
    """Whether Bayesian NMF's mean held-out score reaches the best peer's at one equal-time setting, and on
    how many splits it does."""
    ll = {(r["system"], r["split"]): r["heldout_ll"] for r in rows if r["setting"] == setting}
    systems = {s for s, _ in ll}
    means = {s: float(np.mean([v for (t, _), v in ll.items() if t == s])) for s in systems}
    peer = max((s for s in systems if s != "bnmf"), key=means.get)
    gap = means["bnmf"] - means[peer]
    paired = [ll["bnmf", split] - ll[peer, split] for s, split in ll if s == "bnmf" and (peer, split) in ll]
    return (f"\nTarget ({setting}): {'met' if gap >= 0 else 'missed'}: Bayesian NMF {means['bnmf']:.3f} against "
            f"the best peer ({peer}) {means[peer]:.3f}, {gap:+.3f} nats per word; ahead on "
            f"{sum(d >= 0 for d in paired)} of {len(paired)} splits (per-split difference {mean_sd(paired, 3)}).")


def table(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    cells = sorted({(r["corpus"], r["k"]) for r in rows}, key=lambda c: (CORPORA.index(c[0]), c[1]))
    for corpus, k in cells:
        here = [r for r in rows if r["corpus"] == corpus and r["k"] == k]
        r0 = here[0]
        print(f"\n### {corpus}, K = {k} ({r0['train_docs']} training / {r0['test_docs']} held-out documents, "
              f"{r0['words']:,} words; {len({r['split'] for r in here})} splits)\n")
        print("| system | setting | passes / iterations | wall s | CPU s | held-out LL per word | NPMI top 10 |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        settings = sorted({r["setting"] for r in here}, key=lambda t: (t != "default", len(t), t))
        for setting in settings:
            for system in SYSTEMS:
                sel = [r for r in here if r["system"] == system and r["setting"] == setting]
                if not sel:
                    continue
                passes = sorted({r["passes"] for r in sel})
                n = str(passes[0]) if len(passes) == 1 else f"{passes[0]}-{passes[-1]}"
                print(f"| {system} | {setting} | {n} | {np.mean([r['seconds'] for r in sel]):.2f} | "
                      f"{np.mean([r['cpu_seconds'] for r in sel]):.2f} | "
                      f"{mean_sd([r['heldout_ll'] for r in sel], 3)} | {mean_sd([r['npmi'] for r in sel], 3)} |")
        for setting in settings:
            systems = {r["system"] for r in here if r["setting"] == setting}
            if setting != "default" and "bnmf" in systems and len(systems) > 1:
                print(target_line(setting, here))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("scores", help="fit and score, appending JSON lines to --out")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--corpora", nargs="+", choices=CORPORA, default=list(CORPORA))
    run.add_argument("--ks", nargs="+", type=int, default=list(KS))
    run.add_argument("--splits", nargs="+", type=int, default=list(SPLITS))
    run.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    run.add_argument("--budget-scales", nargs="+", type=float, default=[1.0],
                     help="equal-time budgets as multiples of the longest default fit (1: that fit's own time)")
    run.add_argument("--set", action="append", default=[], type=name_value, metavar="NAME=VALUE",
                     help="another BayesianNMF setting for every Bayesian NMF fit (repeatable; recorded)")
    show = sub.add_parser("table", help="print the markdown tables of a results file")
    show.add_argument("results", type=Path)
    args = parser.parse_args()
    {"scores": scores, "table": table}[args.command](args)


if __name__ == "__main__":
    main()

"""Bayesian NMF's local-step stopping rule and SVI step sizes on a panel of generated and real corpora, judged by the
worst case.

The panel: generated corpora of different shapes (document length, vocabulary V, true topics and fitted K,
sparsity of the true topics, documents per minibatch and so steps per pass). ``PANEL`` lists every member's
shape, size and seed; its ``half`` says when it was first looked at (``HALVES``): the "tuning" half chose the
defaults of 2026-11-26 and "held-back" checked them; the adaptive step size was then chosen on those two and
checked on "held-back-2", whose members were added unseen; the sweep cap was chosen on the three and checked
on "held-back-3", added unseen after that; the MAP estimate (``BNMFConfig.estimate``) was tried on all of
those and checked on "held-back-4", added unseen after that; a first step chosen on the next minibatch (tried
on the branch ``tried-validated-first-step``) was found on members of every earlier half and checked on
"held-back-5" (small corpora fitted in several passes among them), added unseen after that; the banded step
(``BNMFConfig.step_size``), the defaults of 2026-11-28, was chosen on all of those by ``choice`` and checked
on "held-back-6", added unseen after that; "held-back-7" was added unseen to check it again, and the banded step
with the noise's finite-population correction and the band (10 + t)^-0.6 to (1 + t)^-0.51, the defaults since,
was found on the members where the banded step did worst (of every half up to "held-back-7") and checked on
"held-back-8", added unseen after that. LDA members draw topics from a symmetric
Dirichlet(eta) over V words (smaller eta: sparser topics) and documents from Dirichlet(alpha) topic weights
with Poisson(length) tokens (``data.synthetic.lda_documents``); BNMF members are drawn from Bayesian NMF itself
with Gamma(eta) topic weights per word (``data.synthetic.bnmf_corpus``). Each member holds out ``HELD_OUT``
documents.

``scores`` fits every rule of ``RULES`` once per member and seed (the seed of the fit: initial topics and
minibatch order; the corpus is the member's), one SVI pass in this process, and records the held-out
per-word log likelihood by threefold document completion (the same token split for every rule; scored with
the topics fixed by ``BNMFConfig.inference_settings``, which no rule changes), the mean local sweeps per
document over the pass, and the pass's wall seconds. The rules of one seed run one after another, so
their wall times are measured alternately under the same load. ``table`` prints, per half, every member's
mean over seeds under every rule, each rule's shortfall against the member's best old setting (per cent
of that member's held-out LL), and the worst case per rule, then ``choice``: among the rules within
``TARGET`` of every member of the ``CHOOSING`` halves, the one with the fewest sweeps (none within it: the
smallest worst case), and last the panel's noise floor (``noise_floor``): the worst shortfall that the seeds'
spread alone would give a rule as good as every member's best old setting. To add a member,
append it to ``PANEL`` and run ``scores --members`` it: its records join the others' and ``table`` reads
them all.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bnmf_sweep_panel.py scores --out sweeps.jsonl [--members T1] [--seeds 0 1]
    python benchmarks/bnmf_sweep_panel.py table sweeps.jsonl
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, run_rule_panel
from real_corpora_peers import LOADERS

from buffet.data.synthetic import bnmf_corpus, lda_documents, lda_topics
from buffet.kernels import bnmf
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.estimators.inputs import COUNTS, source_for
from buffet.pipeline.models.bnmf import BNMFConfig
from buffet.pipeline.reports.bnmf import make_driver

HELD_OUT = 2000  # documents held out per generated member
REAL_HELD_OUT = 0.2  # share of a real member's documents held out
# in the order they were first looked at; "real" was added after the Reuters stories had shown the adaptive
# step size's cost on real text (benchmarks/bnmf_passes.py), and its members in the file's order (R5-R7) after
# the topics tutorial's fit had shown what that order does to it, "held-back-4" to check the MAP estimate and
# "held-back-5" a first step chosen on the next minibatch, "held-back-6" the adaptive step held within two
# schedules ("banded"), "held-back-7" that again, "held-back-8" the band moved and the noise corrected, "held-back-9"
# local steps that weigh words by the topics' posterior means
HALVES = ("tuning", "held-back", "held-back-2", "held-back-3", "real", "held-back-4", "held-back-5", "held-back-6",
          "held-back-7", "held-back-8", "held-back-9")
CHOOSING = HALVES[:-1]  # what ``choice`` reads (today's defaults were chosen on these); the last half checks it
TARGET = 0.3  # per cent: the largest shortfall a chosen rule may have on any member
THIRDS_SEED = 7  # the token split of the held-out documents, the same for every rule


@dataclass(frozen=True)
class Member:
    """A generated corpus: ``docs`` training documents of about ``length`` tokens over ``words`` words from
    ``topics`` true topics of sparsity ``eta``, ``alpha`` the documents' topic concentration ("lda") or
    Gamma shape ("bnmf"); fitted with ``k`` topics, ``batch`` documents per minibatch, drawn from ``seed``."""

    name: str
    half: str
    kind: str
    docs: int
    words: int
    topics: int
    length: float
    eta: float
    alpha: float
    k: int
    batch: int
    seed: int
    passes: int = 1

    def describe(self) -> str:
        return (f"{self.kind} D {self.docs // 1000}k, V {self.words}, {self.length:g} tok, {self.topics} true, "
                f"eta {self.eta:g}, K {self.k}, batch {self.batch}")

    def corpus(self) -> tuple[sp.csr_matrix, sp.csr_matrix]:
        """(training documents, held-out documents); documents without tokens are dropped."""
        rng = np.random.default_rng(self.seed)
        n = self.docs + HELD_OUT
        if self.kind == "lda":
            X = sp.csr_matrix(lda_documents(lda_topics(self.words, self.topics, rng, self.eta), n, rng,
                                            self.alpha, self.length))
        else:
            X = bnmf_corpus(n, self.words, self.topics, rng, topic_shape=self.eta, doc_shape=self.alpha,
                            tokens_per_doc=self.length).X
        X = X[np.diff(X.indptr) > 0]
        return X[:-HELD_OUT], X[-HELD_OUT:]


@dataclass(frozen=True)
class RealMember:
    """Real documents a package ships (``real_corpora_peers.LOADERS``: the ``lda`` package's Reuters stories,
    gensim's Lee news and Wikipedia test corpora), ``REAL_HELD_OUT`` of them held out by ``seed``; fitted with
    ``k`` topics, ``batch`` documents per minibatch, ``passes`` passes (a pass of these few hundred documents
    is a handful of steps). The training documents are in a random order, or with ``ordered`` in the file's,
    as a user's store would hold them (minibatches are runs of consecutive rows)."""

    name: str
    half: str
    source: str
    k: int
    batch: int
    seed: int
    passes: int
    ordered: bool = False

    def describe(self) -> str:
        passes = f"{self.passes} pass" + ("es" if self.passes > 1 else "")
        order = ", file order" if self.ordered else ""
        return f"real: {self.source}{order}, K {self.k}, batch {self.batch}, {passes}"

    def corpus(self) -> tuple[sp.csr_matrix, sp.csr_matrix]:
        X = LOADERS[self.source]()[0]
        order = np.random.default_rng(self.seed).permutation(X.shape[0])
        held = int(round(REAL_HELD_OUT * X.shape[0]))
        train = np.sort(order[held:]) if self.ordered else order[held:]
        return X[train], X[np.sort(order[:held])]


PANEL: list[Member | RealMember] = [
    Member("T1", "tuning", "lda", 20000, 2000, 20, 50, 0.05, 0.1, 20, 1000, 101),
    Member("T2", "tuning", "lda", 20000, 5000, 50, 150, 0.01, 0.05, 50, 500, 102),
    Member("T3", "tuning", "lda", 10000, 8000, 100, 300, 0.05, 0.01, 100, 1000, 103),
    Member("T4", "tuning", "lda", 30000, 20000, 50, 100, 0.1, 0.1, 50, 2000, 104),
    Member("T5", "tuning", "bnmf", 15000, 3000, 30, 80, 0.1, 0.5, 30, 500, 105),
    Member("H1", "held-back", "lda", 50000, 8000, 100, 300, 0.05, 0.01, 100, 1000, 201),
    Member("H2", "held-back", "lda", 20000, 3000, 20, 30, 0.02, 0.1, 20, 1000, 202),
    Member("H3", "held-back", "lda", 15000, 10000, 50, 500, 0.05, 0.05, 50, 500, 203),
    Member("H4", "held-back", "lda", 20000, 15000, 50, 150, 0.2, 0.02, 100, 1000, 204),
    Member("H5", "held-back", "bnmf", 20000, 5000, 50, 200, 0.3, 0.5, 50, 1000, 205),
    Member("F1", "held-back-2", "lda", 20000, 6000, 40, 100, 0.1, 0.1, 80, 500, 301),
    Member("F2", "held-back-2", "bnmf", 15000, 4000, 20, 120, 0.2, 0.3, 40, 500, 302),
    Member("F3", "held-back-2", "lda", 30000, 12000, 80, 250, 0.03, 0.05, 60, 1000, 303),
    Member("F4", "held-back-2", "lda", 10000, 3000, 10, 60, 0.05, 0.5, 20, 250, 304),
    Member("F5", "held-back-2", "bnmf", 25000, 8000, 60, 300, 0.1, 0.5, 60, 1000, 305),
    Member("G1", "held-back-3", "lda", 25000, 10000, 30, 200, 0.05, 0.2, 60, 1000, 401),
    Member("G2", "held-back-3", "bnmf", 10000, 2000, 15, 50, 0.1, 0.3, 30, 250, 402),
    Member("G3", "held-back-3", "lda", 40000, 5000, 120, 150, 0.02, 0.03, 100, 2000, 403),
    Member("G4", "held-back-3", "lda", 15000, 20000, 40, 400, 0.1, 0.1, 40, 500, 404),
    Member("G5", "held-back-3", "bnmf", 20000, 6000, 40, 100, 0.05, 0.2, 80, 1000, 405),
    RealMember("R1", "real", "reuters", 20, 50, 501, 1),
    RealMember("R2", "real", "reuters", 20, 50, 502, 5),
    RealMember("R3", "real", "lee", 20, 50, 503, 5),
    RealMember("R4", "real", "wiki", 20, 50, 504, 5),
    RealMember("R5", "real", "reuters", 20, 50, 505, 5, ordered=True),
    RealMember("R6", "real", "reuters", 10, 64, 506, 3, ordered=True),
    RealMember("R7", "real", "lee", 20, 50, 507, 5, ordered=True),
    Member("N1", "held-back-4", "bnmf", 15000, 3000, 20, 40, 0.1, 0.3, 40, 500, 601),
    Member("N2", "held-back-4", "lda", 20000, 8000, 50, 200, 0.02, 0.05, 50, 1000, 602),
    Member("N3", "held-back-4", "lda", 10000, 4000, 30, 80, 0.1, 0.3, 30, 500, 603),
    Member("N4", "held-back-4", "bnmf", 20000, 10000, 80, 250, 0.05, 0.2, 80, 1000, 604),
    Member("N5", "held-back-4", "lda", 30000, 15000, 100, 120, 0.01, 0.02, 60, 2000, 605),
    Member("P1", "held-back-5", "bnmf", 8000, 3000, 20, 60, 0.1, 0.3, 40, 500, 701, passes=3),
    Member("P2", "held-back-5", "lda", 5000, 4000, 30, 150, 0.05, 0.1, 20, 250, 702, passes=5),
    Member("P3", "held-back-5", "lda", 30000, 10000, 80, 100, 0.02, 0.05, 80, 1000, 703),
    Member("P4", "held-back-5", "bnmf", 12000, 5000, 30, 30, 0.2, 0.5, 30, 500, 704),
    Member("P5", "held-back-5", "lda", 3000, 6000, 50, 250, 0.1, 0.2, 25, 100, 705, passes=5),
    Member("Q1", "held-back-6", "bnmf", 10000, 4000, 25, 50, 0.15, 0.4, 50, 250, 801),
    Member("Q2", "held-back-6", "lda", 20000, 6000, 40, 120, 0.1, 0.05, 40, 1000, 802),
    Member("Q3", "held-back-6", "lda", 15000, 12000, 60, 300, 0.03, 0.1, 30, 500, 803),
    RealMember("Q4", "held-back-6", "wiki", 20, 50, 808, 5, ordered=True),
    RealMember("Q5", "held-back-6", "reuters", 50, 50, 809, 3),
    Member("S1", "held-back-7", "bnmf", 12000, 6000, 20, 60, 0.1, 0.3, 40, 500, 901),
    Member("S2", "held-back-7", "lda", 20000, 10000, 60, 350, 0.02, 0.05, 60, 1000, 902),
    Member("S3", "held-back-7", "lda", 8000, 3000, 15, 20, 0.1, 0.5, 30, 250, 903, passes=3),
    RealMember("S4", "held-back-7", "lee", 50, 25, 904, 5),
    RealMember("S5", "held-back-7", "reuters", 30, 100, 905, 5, ordered=True),
    Member("U1", "held-back-8", "bnmf", 20000, 8000, 40, 80, 0.1, 0.3, 80, 1000, 1001),
    Member("U2", "held-back-8", "lda", 2000, 5000, 30, 200, 0.05, 0.1, 30, 200, 1002, passes=5),
    Member("U3", "held-back-8", "lda", 25000, 15000, 80, 150, 0.03, 0.05, 100, 2000, 1003),
    RealMember("U4", "held-back-8", "wiki", 50, 25, 1004, 5),
    RealMember("U5", "held-back-8", "lee", 10, 30, 1005, 3, ordered=True),
    Member("V1", "held-back-9", "bnmf", 15000, 6000, 30, 60, 0.1, 0.3, 60, 500, 1101),
    Member("V2", "held-back-9", "lda", 10000, 4000, 40, 250, 0.05, 0.1, 40, 500, 1102),
    Member("V3", "held-back-9", "lda", 30000, 20000, 60, 100, 0.02, 0.05, 80, 2000, 1103),
    RealMember("V4", "held-back-9", "reuters", 20, 25, 1104, 5, ordered=True),
    Member("V5", "held-back-9", "bnmf", 8000, 2500, 10, 30, 0.2, 0.5, 40, 250, 1105, passes=3),
]

def rule_settings(kappa: float, t0: float, max_sweeps: int, share_tol: float = 0.0,
                  step_size: str = "schedule", estimate: str = "vb", topic_weights: str | None = None) -> dict:
    """A rule's ``BNMFConfig`` settings, every one named, so that a change of defaults leaves the rule as it was
    (the MAP estimate's topic prior is its own default, c0 = 0.2 V, as the VB rules' is theirs); the topics weigh
    words by exp(E ln beta) unless ``topic_weights`` says otherwise (the MAP estimate: by their means)."""
    weights = topic_weights or ("mean" if estimate == "map" else "geometric")
    return {"kappa": kappa, "t0": t0, "max_sweeps": max_sweeps, "share_tol": share_tol, "step_size": step_size,
            "estimate": estimate, "topic_weights": weights}


# rule name -> settings; the first three are the old settings a rule is judged against. The rules of the noise-driven
# steps ("adaptive", "banded") run the code they are fitted with: their records up to
# results/bnmf_sweep_panel_banded.jsonl and results/bnmf_sweep_panel_fresh_seeds.jsonl were fitted before the
# noise's finite-population correction (kernels.bnmf.minibatch_noise) and, for "banded", with the band's upper
# schedule at (1 + t)^-kappa (the code of commit b4093a7); fitted now, they take both.
OLD = {
    "kappa .6, t0 10, 10 sweeps": rule_settings(0.6, 10.0, 10),
    "kappa .6, t0 10, 20 sweeps": rule_settings(0.6, 10.0, 20),
    "kappa .51, t0 1, 20 sweeps": rule_settings(0.51, 1.0, 20),
}
RULES = {
    **OLD,
    "kappa .6, t0 10, share .01, 30 sweeps": rule_settings(0.6, 10.0, 30, 0.01),
    "kappa .51, t0 1, 10 sweeps": rule_settings(0.51, 1.0, 10),
    "kappa .51, t0 1, share .01, 30 sweeps": rule_settings(0.51, 1.0, 30, 0.01),
    "kappa .51, t0 1, share .02, 30 sweeps": rule_settings(0.51, 1.0, 30, 0.02),
    "kappa .6, t0 1, 10 sweeps": rule_settings(0.6, 1.0, 10),
    "kappa .6, t0 1, share .01, 30 sweeps": rule_settings(0.6, 1.0, 30, 0.01),
    "kappa .6, t0 3, share .01, 30 sweeps": rule_settings(0.6, 3.0, 30, 0.01),
    "kappa .6, t0 3, 10 sweeps": rule_settings(0.6, 3.0, 10),
    "kappa .6, t0 5, share .01, 30 sweeps": rule_settings(0.6, 5.0, 30, 0.01),
    "adaptive, t0 5, share .01, 30 sweeps": rule_settings(0.6, 5.0, 30, 0.01, "adaptive"),
    "adaptive, t0 5, 10 sweeps": rule_settings(0.6, 5.0, 10, 0.0, "adaptive"),
    "adaptive, t0 5, share .01, 15 sweeps": rule_settings(0.6, 5.0, 15, 0.01, "adaptive"),
    "adaptive, t0 5, share .01, 20 sweeps": rule_settings(0.6, 5.0, 20, 0.01, "adaptive"),
    "MAP, kappa .6, t0 1, share .01, 30 sweeps": rule_settings(0.6, 1.0, 30, 0.01, estimate="map"),
    "MAP, adaptive, t0 5, share .01, 20 sweeps": rule_settings(0.6, 5.0, 20, 0.01, "adaptive", "map"),
    "banded, t0 5, share .01, 20 sweeps": rule_settings(0.6, 5.0, 20, 0.01, "banded"),
    "banded, t0 5, share .01, 10 sweeps": rule_settings(0.6, 5.0, 10, 0.01, "banded"),
    "MAP, banded, t0 5, share .01, 20 sweeps": rule_settings(0.6, 5.0, 20, 0.01, "banded", "map"),
    "banded .51, corrected noise, t0 10, share .01, 20 sweeps": rule_settings(0.6, 10.0, 20, 0.01, "banded"),
    "topic means, banded .51, t0 10, share .01, 20 sweeps": rule_settings(0.6, 10.0, 20, 0.01, "banded",
                                                                          topic_weights="mean"),
}


def fit_and_score(m: Member, train: sp.csr_matrix, test: sp.csr_matrix, settings: dict, seed: int) -> dict:
    """The member's SVI passes under ``settings`` in this process: held-out per-word LL, mean sweeps per document,
    seconds."""
    config = BNMFConfig(n_topics=m.k, batch_size=m.batch, passes=m.passes, seed=seed, eval_every=0,
                        chunk_rows=m.batch, **settings)
    driver = make_driver(config, source_for(train, None, COUNTS), ProcessEngine())
    driver.eval_rows = None
    driver.start()
    started = time.perf_counter()
    trace = [driver.step(s) for s in range(driver.total_steps())]
    seconds = time.perf_counter() - started
    g, h = driver.state.g, driver.state.h
    ll, tokens = bnmf.threefold_completion(test.indptr, test.indices, test.data, config.view(g, h),
                                           g / h, config.hyper(train.shape[1]), config.inference_settings(),
                                           np.random.default_rng(THIRDS_SEED))
    return {"heldout_ll": ll / tokens, "mean_sweeps": float(np.mean([r["mean_sweeps"] for r in trace])),
            "seconds": round(seconds, 2), "steps": len(trace)}


def run_member(m: Member, seeds: list[int], rules: list[str], out: Path) -> None:
    train, test = m.corpus()
    shape = {"train_docs": train.shape[0], "words": train.shape[1],
             "tokens_per_doc": float(train.sum() / train.shape[0]), "distinct_per_doc": train.nnz / train.shape[0]}
    host = {"host": platform.node(), **machine()}
    for seed in seeds:
        for rule in rules:
            result = fit_and_score(m, train, test, RULES[rule], seed)
            record = {"time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "bench": "bnmf_sweep_panel",
                      "member": m.name, "seed": seed, "rule": rule, "settings": RULES[rule], **result, **shape,
                      "machine": host}
            with out.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(m.name, seed, f"{rule:40s} {result['heldout_ll']:.4f} {result['mean_sweeps']:5.2f} sweeps "
                  f"{result['seconds']:6.1f} s", flush=True)


def common_seeds(rows: list[dict], member: str) -> set[int]:
    """The seeds on which every old setting was fitted on ``member``: the ones its rules are compared on."""
    return set.intersection(*({r["seed"] for r in rows if r["member"] == member and r["rule"] == rule}
                              for rule in OLD))


def means(rows: list[dict], member: str) -> dict[str, dict[str, float]]:
    """Per rule: the member's mean held-out LL, mean sweeps and mean seconds over the common seeds
    (``common_seeds``), and how many of them the rule was fitted on."""
    seeds = common_seeds(rows, member)
    out = {}
    for rule in RULES:
        runs = [r for r in rows if r["member"] == member and r["rule"] == rule and r["seed"] in seeds]
        if runs:
            out[rule] = {key: float(np.mean([r[key] for r in runs]))
                         for key in ("heldout_ll", "mean_sweeps", "seconds")}
            out[rule]["seeds"] = len(runs)
    return out


def shortfalls(mem: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per rule of a member's ``means``: per cent of held-out LL below the member's best old setting
    (negative: above it)."""
    best = max(mem[r]["heldout_ll"] for r in OLD)
    return {rule: 100.0 * (best - v["heldout_ll"]) / abs(best) for rule, v in mem.items()}


def table(rows: list[dict], half: str) -> str:
    """Per member of ``half``: each rule's held-out LL / mean sweeps / seconds and shortfall against the
    member's best old setting; then each rule's worst shortfall and its largest ratio of sweeps to today's."""
    panel = {m.name: m for m in PANEL}
    members = [m.name for m in PANEL if m.half == half and common_seeds(rows, m.name)]
    rules = [r for r in RULES if any(x["rule"] == r and x["member"] in members for x in rows)]
    lines = [f"**{half}**", "", "| member | shape | " + " | ".join(rules) + " |", "|---" * (len(rules) + 2) + "|"]
    worst = {r: -np.inf for r in rules}
    sweeps_ratio = {r: 0.0 for r in rules}
    ratios: dict[str, list[float]] = {r: [] for r in rules}
    today = next(iter(OLD))
    for name in members:
        m, mem = panel[name], means(rows, name)
        short = shortfalls(mem)
        seeds = mem[today]["seeds"]
        cells = []
        for r in rules:
            if r not in mem:
                cells.append("")
                continue
            worst[r] = max(worst[r], short[r])
            ratios[r].append(mem[r]["mean_sweeps"] / mem[today]["mean_sweeps"])
            sweeps_ratio[r] = max(ratios[r])
            fewer = "" if mem[r]["seeds"] == seeds else f" ({mem[r]['seeds']} seed)"
            cells.append(f"{mem[r]['heldout_ll']:.4f} ({short[r]:+.2f}%){fewer} / {mem[r]['mean_sweeps']:.1f} sw / "
                         f"{mem[r]['seconds']:.0f} s")
        shape = f"{m.describe()} ({seeds} seeds)"
        lines.append(f"| {name} | {shape} | " + " | ".join(cells) + " |")
    partial = {r: "" if len(ratios[r]) == len(members) else f" ({len(ratios[r])} of {len(members)})" for r in rules}
    lines.append("| worst shortfall | | " + " | ".join(f"{worst[r]:+.2f}%{partial[r]}" for r in rules) + " |")
    lines.append("| most sweeps vs today's | | " + " | ".join(f"{sweeps_ratio[r]:.2f}x" for r in rules) + " |")
    lines.append("| mean sweeps vs today's | | " + " | ".join(f"{np.mean(ratios[r]):.2f}x" for r in rules) + " |")
    return "\n".join(lines)


def choice(rows: list[dict]) -> str:
    """Among the rules fitted on every member of the ``CHOOSING`` halves and within ``TARGET`` per cent of each
    member's best old setting, the one with the fewest sweeps per document (mean over the members of its ratio
    to today's); if none is within the target, the one with the smallest worst shortfall."""
    members = [m.name for m in PANEL if m.half in CHOOSING and common_seeds(rows, m.name)]
    worst: dict[str, float] = {}
    sweeps: dict[str, list[float]] = {}
    today = next(iter(OLD))
    for name in members:
        mem = means(rows, name)
        short = shortfalls(mem)
        for rule in RULES:
            worst[rule] = max(worst.get(rule, -np.inf), short.get(rule, np.inf))
            if rule in mem:
                sweeps.setdefault(rule, []).append(mem[rule]["mean_sweeps"] / mem[today]["mean_sweeps"])
    within = [rule for rule in worst if worst[rule] <= TARGET]
    rule = min(within, key=lambda r: np.mean(sweeps[r])) if within else min(worst, key=worst.get)
    return (f"Chosen on {', '.join(CHOOSING)} ({len(members)} members): {rule} (worst shortfall "
            f"{worst[rule]:+.2f}%, {np.mean(sweeps[rule]):.2f}x today's sweeps)")


def seed_deviations(rows: list[dict], member: str) -> list[np.ndarray]:
    """Per rule fitted on every common seed of ``member``: its held-out LL on those seeds less their mean."""
    seeds = sorted(common_seeds(rows, member))
    out = []
    for rule in RULES:
        by_seed = {r["seed"]: r["heldout_ll"] for r in rows if r["member"] == member and r["rule"] == rule}
        if all(seed in by_seed for seed in seeds):
            values = np.array([by_seed[seed] for seed in seeds])
            out.append(values - values.mean())
    return out


def noise_floor(rows: list[dict], n_seeds: int | None = None, draws: int = 5000) -> str:
    """The worst shortfall that a rule exactly as good as each member's best old setting would show over the
    members with records, from the seeds alone: each member's spread over seeds (pooled over its rules) and
    the correlation of two rules' deviations on one seed (pooled over members), with every member's old
    settings at their measured means, every rule fitted on the members' seeds or on ``n_seeds`` each.
    Shortfalls up to about this are not told apart from none."""
    names = [m.name for m in PANEL if len(common_seeds(rows, m.name)) > 1]
    spreads, olds, pairs, seeds = [], [], [], []
    for name in names:
        devs = seed_deviations(rows, name)
        spreads.append(np.sqrt(sum(float(d @ d) for d in devs) / sum(len(d) - 1 for d in devs)))
        olds.append([means(rows, name)[rule]["heldout_ll"] for rule in OLD])
        pairs += [(a, b) for i, a in enumerate(devs) for b in devs[i + 1:]]
        seeds.append(len(devs[0]))
    shared = max(sum(float(a @ b) for a, b in pairs)
                 / np.sqrt(sum(float(a @ a) for a, _ in pairs) * sum(float(b @ b) for _, b in pairs)), 0.0)
    olds_ = np.array(olds)
    counts = np.array(seeds) if n_seeds is None else np.full(len(seeds), n_seeds)
    scale = (np.array(spreads) / np.sqrt(counts))[:, None]
    rng = np.random.default_rng(0)
    noise = (np.sqrt(shared) * rng.normal(size=(draws, len(names), 1))
             + np.sqrt(1 - shared) * rng.normal(size=(draws, len(names), len(OLD) + 1))) * scale
    measured = olds_ + noise[..., :len(OLD)]
    rule = olds_.max(axis=1) + noise[..., len(OLD)]
    best = measured.max(axis=2)
    worst = (100.0 * (best - rule) / np.abs(best)).max(axis=1)
    fitted = "-".join(sorted({str(c) for c in counts}))
    return (f"Noise floor: a rule exactly as good as each member's best old setting would show a worst shortfall "
            f"of {np.median(worst):.2f}% over these {len(names)} members (5-95%: {np.percentile(worst, 5):.2f}-"
            f"{np.percentile(worst, 95):.2f}%; {np.mean(worst > TARGET):.0%} of draws above the {TARGET}% target), "
            f"from their spread over seeds (median {np.median(spreads):.4f} per word) with {fitted} seeds per rule "
            f"(two rules' deviations on one seed correlate by {shared:.2f}).")


def report(rows: list[dict]) -> str:
    """The table of every half with records, the choice, and the noise floor of the worst shortfall."""
    halves = [h for h in HALVES if any(r["member"] in {m.name for m in PANEL if m.half == h} for r in rows)]
    return "\n\n".join(table(rows, h) for h in halves) + "\n\n" + choice(rows) + "\n\n" + noise_floor(rows)


def main() -> None:
    run_rule_panel(__doc__.split("\n\n")[0], {m.name: m for m in PANEL}, [0, 1], list(RULES), report, run_member)


if __name__ == "__main__":
    main()

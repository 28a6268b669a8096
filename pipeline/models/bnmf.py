"""Bayesian NMF (paper 002, Sec. 11.3.1; docs/models/bnmf.md): its settings and its model object for the topic
models' driver (``models.topics``): the local step of a document block, its statistics, and the batch and
stochastic updates of q(beta) on the client.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from buffet.data.errors import UserError
from buffet.data.store import CSRRows
from buffet.kernels import bnmf
from buffet.pipeline.engine.engine import BlockSet, Engine
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import inherited_option, option, require_counts
from buffet.pipeline.models.topics import CLIENT_THREADS, Corpus, TopicModelConfig, TopicState

TOPIC_SHAPE = 0.5  # the default shape c0 / V of the topic prior beta_vk ~ Gamma(c0/V, c0)


@dataclass
class BNMFConfig(TopicModelConfig):
    """Settings of a Bayesian NMF fit: the topic models' (``TopicModelConfig``) plus the theta prior
    (paper 002, Sec. 11.6) and how the local steps run.

    Why the SVI schedule (kappa 0.6, t0 1) and the local stopping rule (a document stops once fewer than 1% of
    its tokens change topic in a sweep, ``share_tol``, or after 30 sweeps) differ from the topic models' shared
    defaults: they had the smallest worst case, over the tuning half of a panel of generated corpora
    (benchmarks/bnmf_sweep_panel.py: documents of 50-300 tokens, 2,000-20,000 words, 20-100 topics, sparse and
    dense topics, 10-40 steps per pass), of one pass's held-out score against each corpus's best of the
    earlier settings, and the held-back half of the panel confirmed it. With t0 = 1 the first step
    (rho = 1) replaces the random initial topics; with t0 = 10 about a tenth of their mass was still there
    after 10 steps, and one pass scored up to 5% per word worse. A fixed cap of 10 sweeps stopped documents of
    300 tokens and 100 topics far from their fit and ran short ones past theirs; the share of a document's
    tokens still changing topic means the same at any length, so long documents get the sweeps they need and
    settled ones stop early.

    Why the topic prior defaults to c0 = 0.5 V (shape 0.5 per word and topic) and not the paper's 0.05 V:
    mean-field VB weighs a word in a topic by exp(E ln beta) = exp(psi(g)) / h, about (g - 0.5) / h for
    counts above one and vanishing for shapes far below it (Asuncion et al. 2009, "On smoothing and
    inference for topic models"), so a prior shape of 0.05 smooths less than nothing: topics keep
    sharpening on the training documents, and held-out scores fell with every pass on short documents
    (real and generated), a one-pass score looking better only while the initial topics' uniform mass was
    not yet forgotten. With shape 0.5 more passes score better or the same, and one pass the same or better
    (benchmarks/bnmf_passes.py).
    """

    c0: float | None = option(None, "Topic prior strength: beta_vk ~ Gamma(c0/V, c0), mean 1/V (> 0; unset: 0.5 V, "
                                    "a shape of 0.5 per word). Larger smooths topics more; smaller lets them be "
                                    "sparser, and can make held-out scores fall with more passes.")
    a0: float | None = option(None, "Shape of the document weights' prior theta_kd ~ Gamma(a0, b0) (> 0; unset: "
                                    "1/K, paper 002). Smaller makes each document use fewer topics.")
    b0: float | None = option(None, "Rate of the document weights' prior theta_kd ~ Gamma(a0, b0) (> 0; unset: "
                                    "1/K). The prior mean of theta is a0/b0.")
    kappa: float = inherited_option(TopicModelConfig, "kappa", 0.6)
    t0: float = inherited_option(TopicModelConfig, "t0", 1.0)
    max_sweeps: int = option(30, "Training: most local sweeps per document per step (>= 1), if --share-tol or "
                                 "--local-tol does not stop it first. Lower it to cap the time a step takes.")
    share_tol: float = option(0.01, "Training: stop a document's local sweeps once fewer than this share of its "
                                    "tokens change topic in a sweep (0 <= share < 1; 0: only --local-tol and "
                                    "--max-sweeps stop them). The same measure for short and long documents; "
                                    "smaller fits each minibatch's documents more tightly, slower.")
    eval_max_sweeps: int = option(100, "Evaluation (document completion, transform, score): most local sweeps per "
                                       "document with the topics fixed (>= 1). Raise it if scores still move with it.")
    precision: str = option("float64", "Arithmetic of the local sweeps: 'float64' or 'float32'. float32 is faster "
                                       "and held-out scores agree to 3-4 digits on the benchmarks.")
    accelerate: bool = option(False, "Run the local sweeps in SQUAREM cycles: fewer sweeps per document, but a "
                                     "document may settle at another local optimum, so results differ.")

    def check(self) -> None:
        """Refuse settings that cannot work, naming the setting."""
        super().check()
        require_counts(self, ("max_sweeps", "eval_max_sweeps"))
        if not 0.0 <= self.share_tol < 1.0:
            raise UserError(f"share_tol must be in [0, 1), got {self.share_tol}")
        if self.precision not in ("float64", "float32"):
            raise UserError(f"precision must be 'float64' or 'float32', got {self.precision!r}")

    def local_settings(self) -> bnmf.LocalSettings:
        """How the training local steps run."""
        return bnmf.LocalSettings(self.local_tol, self.max_sweeps, self.accelerate, self.share_tol)

    def inference_settings(self) -> bnmf.LocalSettings:
        """How documents are fitted with the topics fixed for evaluation and ``transform``."""
        return bnmf.LocalSettings(self.local_tol, self.eval_max_sweeps, self.accelerate)

    def hyper(self, n_words: int) -> bnmf.Hyper:
        base = bnmf.Hyper.paper_defaults(n_words, self.n_topics)
        return bnmf.Hyper(c0=TOPIC_SHAPE * n_words if self.c0 is None else self.c0,
                          a0=base.a0 if self.a0 is None else self.a0,
                          b0=base.b0 if self.b0 is None else self.b0, n_words=n_words)


@dataclass(frozen=True)
class BNMF:
    """Bayesian NMF as a ``models.topics.TopicModel``: globals q(beta) as shapes ``g`` and rates ``h``
    (V x K), a ``TopicState``; local parameters q(theta_d) shapes (named state "theta")."""

    config: BNMFConfig
    hyper: bnmf.Hyper
    local_state = "theta"
    effort = ("mean_sweeps", "sweeps")
    state_type = TopicState

    @classmethod
    def of(cls, config: BNMFConfig, n_words: int) -> "BNMF":
        return cls(config, config.hyper(n_words))

    def initial_globals(self, corpus: Corpus, n_tokens: float, n_docs: int) -> TopicState:
        """The prior plus noise scaled to the corpus (paper 002, Sec. 11.6)."""
        g, h = bnmf.initial_globals(corpus.n_words, self.config.n_topics, n_tokens, n_docs, self.hyper,
                                    stream(self.config.seed, "init"))
        return TopicState(g, h, docs_seen=0)

    def local_view(self, state: TopicState) -> bnmf.TopicView:
        """The topic expectations the local steps sweep with, in the configured precision."""
        return bnmf.TopicView.from_params(state.g, state.h, dtype=np.dtype(self.config.precision),
                                          threads=CLIENT_THREADS)

    def batch_local(self, rows: CSRRows, a: np.ndarray | None, view: bnmf.TopicView) -> tuple[np.ndarray, dict]:
        """q(theta_d) of a block warm-started from its last shapes, with the block's statistics."""
        res = bnmf.local_step(rows.indptr, rows.indices, rows.data, view, self.hyper, self.config.local_settings(),
                              a_start=a)
        return res.a, {"S": res.S, "theta_sum": res.theta_sum, "sweeps": float(res.sweeps.sum())}

    def svi_local(self, rows: CSRRows, view: bnmf.TopicView) -> dict:
        """A minibatch block's statistics from fresh local fits."""
        res = bnmf.local_step(rows.indptr, rows.indices, rows.data, view, self.hyper, self.config.local_settings())
        return {"S": res.S, "theta_sum": res.theta_sum, "docs": float(rows.n_rows), "sweeps": float(res.sweeps.sum())}

    def batch_update(self, engine: Engine, state: TopicState, stats: dict, locals_: BlockSet) -> TopicState:
        """q(beta) from every document's statistics (the batch update)."""
        g, h = bnmf.batch_update(stats["S"], stats["theta_sum"], self.hyper)
        return replace(state, g=g, h=h)

    def local_elbo(self, rows: CSRRows, a: np.ndarray, view: bnmf.TopicView) -> dict:
        return {"elbo": bnmf.local_elbo(rows.indptr, rows.indices, rows.data, view, self.hyper, a)}

    def objective(self, engine: Engine, rows: BlockSet, locals_: BlockSet, state: TopicState) -> float:
        """The ELBO at the new globals: the documents' terms, reduced, plus q(beta)'s."""
        view = engine.share(self.local_view(state))
        local = engine.reduce(engine.map(self.local_elbo, rows, locals_, view))["elbo"]
        return local + bnmf.global_elbo(state.g, state.h, self.hyper)

    def stochastic_update(self, state: TopicState, stats: dict, scale: float, rho: float) -> TopicState:
        """q(beta)'s natural-gradient step (eqs. 11.33-11.34)."""
        g, h = bnmf.stochastic_update(state.g, state.h, stats["S"], stats["theta_sum"], self.hyper, scale, rho)
        return replace(state, g=g, h=h)

    def eval_view(self, state: TopicState) -> tuple[bnmf.TopicView, np.ndarray]:
        """What document completion reads: the float64 topic view and E[beta]."""
        return bnmf.TopicView.from_params(state.g, state.h), state.g / state.h

    def completion(self, rows: CSRRows, block: int, view: tuple[bnmf.TopicView, np.ndarray]) -> dict:
        """Threefold document completion of a block of held-out documents (paper 002, Sec. 11.6)."""
        topics, mean_beta = view
        ll, tokens = bnmf.threefold_completion(rows.indptr, rows.indices, rows.data, topics, mean_beta, self.hyper,
                                               self.config.inference_settings(),
                                               stream(self.config.seed, "thirds", block))
        return {"ll": ll, "tokens": tokens}

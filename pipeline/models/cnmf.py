"""Correlated NMF (paper 002, Secs. 11.3.2 and 11.5; docs/models/cnmf.md): its settings and its model object for
the topic models' driver (``models.topics``).

Globals: q(beta) (shapes ``g``, rates ``h``) and the topic locations ``L`` (K x m). A document's local
step fits its location u_d and offset alpha_d by Newton steps (``kernels.cnmf.local_step``); batch mode
keeps (u_d, alpha_d) as the named state "u" and takes one Newton step per l_k with a line search whose
candidate sums come from the workers (eq. 11.35); SVI takes the natural-gradient step of q(beta) and a
Newton step of L from the minibatch sums scaled by D/|C_t|. The objective recorded is
``kernels.cnmf``'s F.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from buffet.data.store import CSRRows
from buffet.kernels import bnmf, cnmf
from buffet.pipeline.engine.dataset import count_blocks, row_ranges
from buffet.pipeline.engine.engine import BlockSet, Engine
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import inherited_option, option, require_counts, require_positive
from buffet.pipeline.models.bnmf import TOPIC_SHAPE, BNMFConfig
from buffet.pipeline.models.topics import CLIENT_THREADS, Corpus, TopicModelConfig, TopicState, scheduled_step

Locals = tuple[np.ndarray, np.ndarray]  # a block's (u_d rows, alpha_d)


@dataclass
class CNMFConfig(TopicModelConfig):
    """Settings of a correlated NMF fit: the topic models' (``TopicModelConfig``) plus the
    latent space of topic and document locations (defaults of paper 002, Sec. 11.6) and the
    document's local Newton iteration.

    The topic prior defaults to Bayesian NMF's c0 = 0.5 V (``models.bnmf.BNMFConfig`` says why), not the
    paper's 0.05 V: q(beta) is the same here, and so is the sharpening of mean-field VB under a prior shape
    far below one. On documents drawn from correlated NMF itself, under the paper's value the held-out score fell
    from three passes to ten, to below Bayesian NMF's; under 0.5 V it rose, above Bayesian NMF's after one, three
    and ten passes (docs/performance.md).

    Why a document's Newton steps stop once u_d moves by less than 0.01 (``local_tol``) and not 1e-4: the steps
    converge quadratically, so after the step that moves u_d by less than 0.01 it is within a few times 1e-4 of
    its optimum (measured: at most 4e-4 at K = 100, m = 50), and the step or so fewer per document (7.1 instead
    of 8.2 there) changed held-out scores by less than 1e-4 per word.
    """

    c0: float | None = inherited_option(BNMFConfig, "c0", None)
    n_dims: int = option(50, "Dimension m of the latent space of topic locations l_k and document locations "
                             "u_d (>= 1). Larger can express richer topic correlations but costs an m x m "
                             "Newton solve per document.")
    sigma2: float | None = option(None, "Prior variance of the topic locations, l_k ~ N(0, sigma2 I) (> 0; unset: "
                                        "1/m). Smaller shrinks l_k towards 0, so topic use depends less on a "
                                        "document's location.")
    local_tol: float = option(1e-2, "Stop a document's Newton iteration when an exact-Hessian step moves u_d by less "
                                    "than this (largest coordinate change, > 0). Those steps converge "
                                    "quadratically, so u_d is then within a few times the square of this of its "
                                    "optimum; smaller fits more exactly, slower. At 1e-4 or more part of the exact "
                                    "Hessian is built in single precision, whose rounding is far below that.")
    max_steps: int = option(50, "Most Newton steps per document and local step (>= 1), if --local-tol is not met "
                                "first. Raise it if documents often stop at the cap.")

    def check(self) -> None:
        """Refuse settings that cannot work, naming the setting."""
        super().check()
        require_counts(self, ("n_dims", "max_steps"))
        require_positive(self, ("sigma2",))

    def local_settings(self) -> cnmf.LocalSettings:
        """The training local step: its words' term in single precision where the tolerance allows it
        (``kernels.cnmf.single_words_suffice``)."""
        return cnmf.LocalSettings(self.local_tol, self.max_steps,
                                  single_words=cnmf.single_words_suffice(self.local_tol))

    def prior(self) -> cnmf.Prior:
        return cnmf.Prior.with_dims(self.n_dims, self.sigma2)

    def hyper(self, n_words: int) -> bnmf.Hyper:
        """q(beta)'s prior, as in Bayesian NMF; the theta prior of ``bnmf.Hyper`` is not used here."""
        base = bnmf.Hyper.paper_defaults(n_words, self.n_topics)
        return bnmf.Hyper(c0=TOPIC_SHAPE * n_words if self.c0 is None else self.c0, a0=base.a0, b0=base.b0,
                          n_words=n_words)


@dataclass
class CNMFState(TopicState):
    """The client-side values of a correlated NMF fit: q(beta) and the documents seen (``TopicState``), and
    the topic locations ``L`` (K x m)."""

    L: np.ndarray


@dataclass(frozen=True)
class CNMF:
    """Correlated NMF as a ``models.topics.TopicModel`` (module docstring)."""

    config: CNMFConfig
    hyper: bnmf.Hyper
    prior: cnmf.Prior
    local_state = "u"
    effort = ("mean_newton_steps", "steps")
    objective_key = "elbo"
    state_type = CNMFState

    @classmethod
    def of(cls, config: CNMFConfig, n_words: int) -> "CNMF":
        return cls(config, config.hyper(n_words), config.prior())

    def initial_globals(self, corpus: Corpus, n_tokens: float, n_docs: int) -> CNMFState:
        """q(beta) as Bayesian NMF starts it, and topic locations drawn from their prior; no documents seen."""
        g, h = bnmf.initial_globals(corpus.n_words, self.config.n_topics, n_tokens, n_docs, self.hyper,
                                    stream(self.config.seed, "init"))
        return CNMFState(g, h, docs_seen=0, L=cnmf.initial_topics(self.config.n_topics, self.prior,
                                                                   stream(self.config.seed, "locations")))

    def local_view(self, state: CNMFState) -> tuple[bnmf.TopicView, np.ndarray]:
        """What the local steps read: the expectations of q(beta) (eq. 11.24) and L."""
        return bnmf.TopicView.from_params(state.g, state.h, threads=CLIENT_THREADS), state.L

    def batch_local(self, rows: CSRRows, last: Locals | None, view: tuple) -> tuple[Locals, dict]:
        """(u_d, alpha_d) of a block warm-started from its last u_d, with the block's statistics."""
        topics, L = view
        res = cnmf.local_step(rows.indptr, rows.indices, rows.data, topics, L, self.config.local_settings(),
                              u_start=None if last is None else last[0])
        return (res.u, res.alpha), {**res.statistics(), "steps": float(res.steps.sum())}

    def prepare(self, engine: Engine, state: CNMFState, blocks: BlockSet) -> None:
        """Nothing to work out ahead: the local steps read every word's view."""
        return None

    def svi_statistics(self, engine: Engine, state: CNMFState, blocks: BlockSet, prepared: None) -> dict:
        """A minibatch's statistics: its blocks' local steps with every word's view, summed in block order."""
        return engine.reduce(engine.map(self.svi_local, blocks, engine.share(self.local_view(state))))

    def svi_local(self, rows: CSRRows, view: tuple) -> dict:
        """A minibatch block's statistics from fresh local fits."""
        topics, L = view
        res = cnmf.local_step(rows.indptr, rows.indices, rows.data, topics, L, self.config.local_settings())
        return {**res.statistics(), "docs": float(rows.n_rows), "steps": float(res.steps.sum())}

    def exp_sums(self, local: Locals, L: np.ndarray, direction: np.ndarray) -> dict:
        u, alpha = local
        return {"sums": cnmf.candidate_exp_sums(u, alpha, L, direction)}

    def batch_update(self, engine: Engine, state: CNMFState, stats: dict, locals_: BlockSet) -> CNMFState:
        """q(beta) (eqs. 11.25, 11.27), then one Newton step per l_k with a line search (eq. 11.35) whose
        candidate sums are reduced over the blocks."""
        g, h = bnmf.batch_update(stats["S"], stats["w_sum"], self.hyper)
        L = state.L
        beta_sum = (g / h).sum(axis=0)
        direction, grad = cnmf.topic_direction(L, stats, beta_sum, self.prior)
        sums = engine.reduce(engine.map(self.exp_sums, locals_, L, direction))["sums"]
        return replace(state, g=g, h=h, L=cnmf.batch_topic_step(L, stats, direction, grad, sums, beta_sum, self.prior))

    def local_objective(self, rows: CSRRows, local: Locals, view: tuple) -> dict:
        topics, L = view
        return {"objective": cnmf.local_objective(rows.indptr, rows.indices, rows.data, topics, L, local[0])}

    def objective(self, engine: Engine, rows: BlockSet, locals_: BlockSet, state: CNMFState) -> float:
        """F at the new globals: the documents' terms, reduced, plus the priors of L and q(beta)'s terms."""
        view = engine.share(self.local_view(state))
        local = engine.reduce(engine.map(self.local_objective, rows, locals_, view))["objective"]
        return local + cnmf.topic_prior(state.L, self.prior) + bnmf.global_elbo(state.g, state.h, self.hyper)

    def step_size(self, state: CNMFState, stats: dict, scale: float, step: int) -> float:
        """The schedule's rho_t (``models.topics.scheduled_step``)."""
        return scheduled_step(self.config, step)

    def stochastic_update(self, state: CNMFState, stats: dict, scale: float, rho: float) -> CNMFState:
        """The natural-gradient step of q(beta) (eqs. 11.33-11.34) and the Newton step of L (eq. 11.35),
        both from the globals the minibatch saw."""
        g, h = state.g, state.h
        L = cnmf.stochastic_topic_step(state.L, stats, (g / h).sum(axis=0), self.prior, scale, rho)
        g, h = bnmf.stochastic_update(g, h, stats["S"], stats["w_sum"], self.hyper, scale, rho)
        return replace(state, g=g, h=h, L=L)

    def eval_view(self, state: CNMFState) -> tuple:
        """What document completion reads: the topic view, E[beta] and L."""
        return bnmf.TopicView.from_params(state.g, state.h), state.g / state.h, state.L

    def completion(self, rows: CSRRows, block: int, view: tuple) -> dict:
        """Threefold document completion of a block of held-out documents (paper 002, Sec. 11.6)."""
        topics, mean_beta, L = view
        ll, tokens = cnmf.threefold_completion(rows.indptr, rows.indices, rows.data, topics, mean_beta, L,
                                               self.config.local_settings(), stream(self.config.seed, "thirds", block))
        return {"ll": ll, "tokens": tokens}

    def location(self, rows: CSRRows, view: tuple) -> np.ndarray:
        """u_d of a block's documents with the globals fixed (for nearest-neighbour retrieval)."""
        topics, L = view
        return cnmf.local_step(rows.indptr, rows.indices, rows.data, topics, L, self.config.local_settings(),
                               with_stats=False).u

    def locations(self, engine: Engine, corpus: Corpus, state: CNMFState) -> np.ndarray:
        """u_d of every document of the dataset (held-out ones too), in row order."""
        rows = count_blocks(engine, corpus.source, row_ranges(corpus.n_rows, self.config.chunk_rows),
                            np.zeros(0, dtype=np.int64))
        parts = engine.collect(engine.map(self.location, rows, engine.share(self.local_view(state))))
        return np.concatenate(parts, axis=0)

"""Correlated NMF on the engine: block tasks and the batch / stochastic driver (SPEC 2, 3.6).

The driver is Bayesian NMF's (``pipeline.models.bnmf.BNMFDriver``: corpus, blocks, minibatch order, held-out
documents, checkpoints) with correlated NMF's locals (u_d, alpha_d) and globals (q(beta) and the
topic locations L). A step fits the locals of every block (batch) or of a minibatch (SVI) on the
workers, tree-reduces the chunk statistics and updates q(beta) and L on the client. Batch mode keeps
u_d on the workers between iterations and takes each l_k Newton step with a line search whose
candidate sums come from the workers; the objective it records is ``kernels.cnmf``'s F.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from buffet.data.store import CSRRows
from buffet.kernels import bnmf, cnmf
from buffet.pipeline.engine.blocks import read_block, row_ranges
from buffet.pipeline.models.bnmf import BNMFDriver, Corpus, TopicModelConfig, corpus_from_source
from buffet.pipeline.engine.executors import pick, tree_reduce
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import option, require_counts, require_positive


@dataclass
class CNMFConfig(TopicModelConfig):
    """Settings of a correlated NMF fit (SPEC 3.6): the topic models' (``TopicModelConfig``) plus the
    latent space of topic and document locations (defaults of paper 002 section 11.6) and the
    document's local Newton iteration.
    """

    n_dims: int = option(50, "Dimension m of the latent space of topic locations l_k and document locations "
                             "u_d (>= 1). Larger can express richer topic correlations but costs an m x m "
                             "Newton solve per document.")
    sigma2: float | None = option(None, "Prior variance of the topic locations, l_k ~ N(0, sigma2 I) (> 0; unset: "
                                        "1/m). Smaller shrinks l_k towards 0, so topic use depends less on a "
                                        "document's location.")
    local_tol: float = option(1e-4, "Stop a document's Newton iteration when u_d moves by less than this (largest "
                                    "coordinate change, > 0). Smaller fits documents more exactly, slower.")
    max_steps: int = option(50, "Most Newton steps per document and local step (>= 1), if --local-tol is not met "
                                "first. Raise it if documents often stop at the cap.")

    def check(self) -> None:
        """Refuse settings that cannot work, naming the setting."""
        super().check()
        require_counts(self, ("n_dims", "max_steps"))
        require_positive(self, ("sigma2",))

    def local_settings(self) -> cnmf.LocalSettings:
        return cnmf.LocalSettings(self.local_tol, self.max_steps)

    def prior(self) -> cnmf.Prior:
        return cnmf.Prior.with_dims(self.n_dims, self.sigma2)

    def hyper(self, n_words: int) -> bnmf.Hyper:
        """q(beta)'s prior (SPEC 3.5); the theta prior of ``bnmf.Hyper`` is not used here."""
        base = bnmf.Hyper.paper_defaults(n_words, self.n_topics)
        return bnmf.Hyper(c0=base.c0 if self.c0 is None else self.c0, a0=base.a0, b0=base.b0, n_words=n_words)


# ----- block tasks (run on workers; plain functions of their arguments) -----

def batch_local_task(rows: CSRRows, u: np.ndarray | None, view: bnmf.TopicView, L: np.ndarray,
                     settings: cnmf.LocalSettings) -> tuple[np.ndarray, np.ndarray, dict]:
    res = cnmf.local_step(rows.indptr, rows.indices, rows.data, view, L, settings, u_start=u)
    return res.u, res.alpha, {**res.statistics(), "steps": float(res.steps.sum())}


def exp_sums_task(u: np.ndarray, alpha: np.ndarray, L: np.ndarray, direction: np.ndarray) -> dict:
    return {"sums": cnmf.candidate_exp_sums(u, alpha, L, direction)}


def objective_task(rows: CSRRows, u: np.ndarray, view: bnmf.TopicView, L: np.ndarray) -> dict:
    return {"objective": cnmf.local_objective(rows.indptr, rows.indices, rows.data, view, L, u)}


def svi_block_task(rows: CSRRows, view: bnmf.TopicView, L: np.ndarray, settings: cnmf.LocalSettings) -> dict:
    res = cnmf.local_step(rows.indptr, rows.indices, rows.data, view, L, settings)
    return {**res.statistics(), "docs": float(rows.n_rows), "steps": float(res.steps.sum())}


def completion_task(rows: CSRRows, seed: int, block: int, view: bnmf.TopicView, mean_beta: np.ndarray,
                    L: np.ndarray, settings: cnmf.LocalSettings) -> dict:
    ll, tokens = cnmf.threefold_completion(rows.indptr, rows.indices, rows.data, view, mean_beta, L, settings,
                                           stream(seed, "thirds", block))
    return {"ll": ll, "tokens": tokens}


def locations_task(rows: CSRRows, view: bnmf.TopicView, L: np.ndarray, settings: cnmf.LocalSettings) -> np.ndarray:
    return cnmf.local_step(rows.indptr, rows.indices, rows.data, view, L, settings, with_stats=False).u


# ----- the driver -----

@dataclass
class CNMFDriver(BNMFDriver):
    """Runs correlated NMF step by step on an executor (the Driver protocol of fitloop)."""

    L: np.ndarray | None = None
    label: str = "cnmf"
    local_name = "u"
    effort = ("mean_newton_steps", "steps")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.prior = self.config.prior()

    def start(self, n_tokens: float | None = None, n_docs: int | None = None) -> None:
        super().start(n_tokens, n_docs)
        self.L = cnmf.initial_topics(self.config.n_topics, self.prior, stream(self.config.seed, "locations"))

    def set_globals(self, arrays: dict) -> None:
        super().set_globals(arrays)
        self.L = arrays["L"]

    def global_arrays(self) -> dict[str, np.ndarray]:
        return {**super().global_arrays(), "L": self.L}

    def local_width(self) -> int:
        return self.config.n_dims

    def view(self) -> bnmf.TopicView:
        """The expectations of q(beta) the local steps use (eq. 11.24)."""
        return bnmf.TopicView.from_params(self.g, self.h)

    def _batch_step(self, step: int) -> dict:
        """Locals of every document; q(beta) (eqs. 11.25, 11.27); one Newton step per l_k with a line
        search (eq. 11.35); then the objective F at the new globals."""
        ex = self.executor
        view = ex.broadcast(self.view())
        results = [ex.submit(batch_local_task, rows, u, view, self.L, self.config.local_settings())
                   for rows, u in zip(self._blocks, self._states)]
        self._states = [ex.submit(pick, r, 0) for r in results]
        alphas = [ex.submit(pick, r, 1) for r in results]
        stats = ex.gather(tree_reduce(ex, [ex.submit(pick, r, 2) for r in results]))
        self.g, self.h = bnmf.batch_update(stats["S"], stats["w_sum"], self.hyper)
        beta_sum = (self.g / self.h).sum(axis=0)
        direction, grad = cnmf.topic_direction(self.L, stats, beta_sum, self.prior)
        sums = ex.gather(tree_reduce(ex, [ex.submit(exp_sums_task, u, a, self.L, direction)
                                          for u, a in zip(self._states, alphas)]))["sums"]
        self.L = cnmf.batch_topic_step(self.L, stats, direction, grad, sums, beta_sum, self.prior)
        new_view = ex.broadcast(self.view())
        local = ex.gather(tree_reduce(ex, [ex.submit(objective_task, rows, u, new_view, self.L)
                                           for rows, u in zip(self._blocks, self._states)]))["objective"]
        self.docs_seen += self.corpus.n_train
        return {"step": step + 1, "docs_seen": self.docs_seen,
                "elbo": local + cnmf.topic_prior(self.L, self.prior) + bnmf.global_elbo(self.g, self.h, self.hyper),
                "mean_newton_steps": stats["steps"] / self.corpus.n_train}

    def _svi_parts(self, blocks: list) -> list:
        """The local-step tasks of a minibatch's blocks: u_d, alpha_d and their statistics."""
        view = self.executor.broadcast(self.view())
        return [self.executor.submit(svi_block_task, rows, view, self.L, self.config.local_settings())
                for rows in blocks]

    def _svi_globals(self, stats: dict, scale: float, rho: float) -> None:
        """The natural-gradient step of q(beta) (eqs. 11.33-11.34) and the Newton step of L (eq. 11.35),
        minibatch sums scaled by D/|C_t|, both from the globals the minibatch saw."""
        beta_sum = (self.g / self.h).sum(axis=0)
        self.L = cnmf.stochastic_topic_step(self.L, stats, beta_sum, self.prior, scale, rho)
        self.g, self.h = bnmf.stochastic_update(self.g, self.h, stats["S"], stats["w_sum"], self.hyper, scale, rho)

    def heldout_loglik(self) -> float:
        """Per-word held-out log likelihood by threefold document completion (SPEC 4)."""
        view = self.executor.broadcast(self.view())
        mean_beta = self.executor.broadcast(self.g / self.h)
        parts = [self.executor.submit(completion_task, rows, self.config.seed, i, view, mean_beta, self.L,
                                      self.config.local_settings())
                 for i, rows in enumerate(self._eval)]
        total = self.executor.gather(tree_reduce(self.executor, parts))
        return total["ll"] / max(total["tokens"], 1.0)

    def locations(self) -> np.ndarray:
        """u_d of every document of the dataset (held-out ones too) with the globals fixed: the
        local step as ``transform`` (SPEC 3.6, for nearest-neighbour retrieval)."""
        view = self.executor.broadcast(self.view())
        none = np.zeros(0, dtype=np.int64)
        parts = [self.executor.submit(locations_task,
                                      self.executor.submit(read_block, self.corpus.source, r0, r1, none),
                                      view, self.L, self.config.local_settings())
                 for r0, r1 in row_ranges(self.corpus.n_rows, self.config.chunk_rows)]
        return np.concatenate(self.executor.gather(parts), axis=0)


def make_corpus(store: str, config: CNMFConfig) -> Corpus:
    """The rows of ``store`` a correlated NMF fit uses (counts in CSR layout only)."""
    return corpus_from_source(store, config.split, "correlated NMF")

"""``BayesianNMF``: the Python API in scikit-learn style (issue 2, item 4).

    >>> model = BayesianNMF(n_topics=50, mode="svi", batch_size=1000).fit("corpus.zarr", client=client)
    >>> weights = model.transform(X_new)          # E[theta] per document
    >>> model.score(X_test)                        # held-out per-word log likelihood

``fit`` takes a dataset store path, a ``Dataset``, or an in-memory SciPy sparse matrix or
NumPy array of counts. Without a Dask client the work runs in this process on the same
kernels and driver; with one it runs on the cluster.
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from buffet.data.errors import UserError
from buffet.data.store import Dataset, check_values
from buffet.kernels import bnmf
from buffet.pipeline.engine.blocks import MemoryRows
from buffet.pipeline.models.bnmf import BNMFConfig, BNMFDriver, corpus_from_source
from buffet.pipeline.reports.bnmf import top_words, topic_word
from buffet.pipeline.engine.executors import DaskExecutor, Executor, SyncExecutor
from buffet.pipeline.engine.fitloop import run_loop
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.seeds import stream


def _counts(X) -> sp.csr_matrix:
    """Validate in-memory counts (SPEC 1: non-negative integers, finite)."""
    m = sp.csr_matrix(X, dtype=np.float64)
    check_values("counts", m.data, "X")
    return m


class BayesianNMF:
    """Bayesian NMF (SPEC 3.5) fitted by batch VB or SVI; parameters are those of ``BNMFConfig``."""

    def __init__(self, n_topics: int = 20, **options: Any):
        self.config = BNMFConfig(n_topics=n_topics, **options)
        self.config.check()
        self.g_: np.ndarray | None = None
        self.h_: np.ndarray | None = None
        self.trace_: list[dict] = []
        self.vocab_: list[str] | None = None
        self.n_steps_ = 0

    def get_params(self, deep: bool = True) -> dict:
        return asdict(self.config)

    def set_params(self, **params: Any) -> "BayesianNMF":
        self.config = replace(self.config, **params)
        self.config.check()
        return self

    def _executor(self, client) -> Executor:
        return DaskExecutor(client) if client is not None else SyncExecutor()

    def fit(self, X, client=None, run_dir: str | os.PathLike | None = None, quiet: bool = True) -> "BayesianNMF":
        """Fit from scratch; with ``run_dir`` the run is checkpointed there (resumable)."""
        executor = self._executor(client)
        if isinstance(X, (str, os.PathLike, Dataset)):
            path = str(X.path if isinstance(X, Dataset) else X)
            corpus = corpus_from_source(path, self.config.split)
        else:
            corpus = corpus_from_source(MemoryRows(_counts(X)), None)
            corpus.source = executor.broadcast(corpus.source)
        driver = BNMFDriver(self.config, corpus, executor)
        run = None
        if run_dir is not None:
            run = RunStore.create(run_dir, "bnmf", path if isinstance(corpus.source, str) else None,
                                  asdict(self.config))
        driver.start()
        self.trace_ = []
        self.n_steps_ = run_loop(driver, run, self.trace_, 0, self.config.checkpoint_every, quiet=quiet)
        self.g_, self.h_, self.vocab_ = driver.g, driver.h, corpus.vocab
        return self

    def partial_fit(self, X, total_docs: int = 1_000_000) -> "BayesianNMF":
        """One SVI step with ``X`` as the minibatch of a corpus of ``total_docs`` documents
        (eqs. 11.33-11.34); the first call initialises the topics."""
        m = _counts(X)
        hyper = self.config.hyper(m.shape[1])
        if self.g_ is None:
            self.g_, self.h_ = bnmf.initial_globals(m.shape[1], self.config.n_topics,
                                                    m.sum() * total_docs / max(m.shape[0], 1), total_docs,
                                                    hyper, stream(self.config.seed, "init"))
        elif m.shape[1] != self.g_.shape[0]:
            raise UserError(f"X has {m.shape[1]} columns but the model was fitted with {self.g_.shape[0]} words")
        view = bnmf.TopicView.from_params(self.g_, self.h_)
        res = bnmf.local_step(m.indptr, m.indices, m.data, view, hyper, self.config.local_settings())
        rho = bnmf.step_size(self.n_steps_, self.config.t0, self.config.kappa)
        self.g_, self.h_ = bnmf.stochastic_update(self.g_, self.h_, res.S, res.theta_sum, hyper,
                                                  total_docs / max(m.shape[0], 1), rho)
        self.n_steps_ += 1
        return self

    def _fitted(self, X) -> tuple[sp.csr_matrix, bnmf.Hyper, bnmf.TopicView]:
        if self.g_ is None:
            raise UserError("the model is not fitted yet; call fit or partial_fit first")
        m = _counts(X)
        if m.shape[1] != self.g_.shape[0]:
            raise UserError(f"X has {m.shape[1]} columns but the model was fitted with {self.g_.shape[0]} words")
        return m, self.config.hyper(m.shape[1]), bnmf.TopicView.from_params(self.g_, self.h_)

    def transform(self, X, normalize: bool = False) -> np.ndarray:
        """E[theta_d] for every document (rows of ``X``), or topic proportions if ``normalize``."""
        m, hyper, view = self._fitted(X)
        res = bnmf.local_step(m.indptr, m.indices, m.data, view, hyper, self.config.inference_settings(),
                              with_stats=False)
        weights = res.a / bnmf.theta_rate(view, hyper)
        return weights / weights.sum(axis=1, keepdims=True) if normalize else weights

    def score(self, X) -> float:
        """Held-out per-word log likelihood of ``X`` by threefold document completion (SPEC 4)."""
        m, hyper, view = self._fitted(X)
        ll, tokens = bnmf.threefold_completion(m.indptr, m.indices, m.data, view, self.g_ / self.h_, hyper,
                                               self.config.inference_settings(),
                                               stream(self.config.seed, "score"))
        return ll / max(tokens, 1.0)

    @property
    def components_(self) -> np.ndarray:
        """Topic-word probabilities (K x V), E[beta] normalised per topic."""
        if self.g_ is None:
            raise UserError("the model is not fitted yet")
        return topic_word(self.g_, self.h_)

    def top_words(self, n: int = 10) -> list[list[str]]:
        if self.g_ is None:
            raise UserError("the model is not fitted yet")
        return top_words(self.g_, self.h_, self.vocab_, n)

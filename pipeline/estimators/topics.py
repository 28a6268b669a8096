"""The Poisson topic models as estimators: ``BayesianNMF`` (docs/models/bnmf.md) and ``CorrelatedNMF``
(docs/models/cnmf.md).

    >>> model = BayesianNMF(50, batch_size=1000).fit("corpus.zarr", client=client)
    >>> weights = model.transform(X_new)          # E[theta] per document
    >>> model.score(X_test)                        # held-out per-word log likelihood

Both read counts: a CSR store, a SciPy (or pydata ``sparse``) matrix, a dask array of either, or a
dense array of non-negative integers. ``fit`` runs the model's driver (batch VB or SVI);
``partial_fit`` is one SVI step on a minibatch through the driver's own update (``svi_update``),
the path ``fit`` takes for each minibatch.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from buffet.kernels import bnmf, cnmf
from buffet.kernels.bnmf import top_words, topic_word
from buffet.pipeline.engine.dataset import Source, count_blocks, row_ranges
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.estimators.base import Estimator, engine_for
from buffet.pipeline.estimators.inputs import COUNTS, rows_of, source_for
from buffet.pipeline.models.bnmf import SVI_SHAPES, BNMFConfig
from buffet.pipeline.models.cnmf import CNMFConfig
from buffet.pipeline.models.topics import TopicDriver

NO_ROWS = np.zeros(0, dtype=np.int64)


class _TopicModel(Estimator):
    """What Bayesian and correlated NMF share: counts in, q(beta) as ``g_``, ``h_``, SVI steps."""

    input_kind = COUNTS
    positional = ("n_topics",)
    global_names: ClassVar[tuple[str, ...]] = ("g", "h", "docs_seen")

    def _fit(self, config: Any, source: Source, engine: Engine, run: RunStore | None) -> None:
        driver = self._driver(config, source, engine)
        driver.start()
        self.trace_ = self._run(driver, config, run)
        self._adopt(driver)

    def _adopt(self, driver: TopicDriver) -> None:
        self.n_steps_ = len(self.trace_)
        self.vocab_ = driver.corpus.vocab
        self._keep(driver)

    def partial_fit(self, X, y=None, *, total_docs: int = 1_000_000, client=None) -> "_TopicModel":
        """One SVI step with the rows of ``X`` as the minibatch of a corpus of ``total_docs`` documents
        (eqs. 11.33-11.35, sums scaled by ``total_docs`` over the rows of ``X``), through the driver's ``svi_update``:
        the step ``fit`` takes for each minibatch. The first call initialises the globals as ``fit``
        does for a corpus of ``total_docs`` documents of this minibatch's mean length."""
        config = self._config()
        source = source_for(X, None, COUNTS)
        n_rows, n_cols = source.open().shape
        first = not hasattr(self, "n_features_in_")
        if not first:
            self._check_columns(n_cols)
        engine = engine_for(client)
        driver = self._driver(config, source, engine)
        if first:
            driver.start(n_tokens=driver.corpus.n_tokens * total_docs / n_rows, n_docs=total_docs)
            self.n_steps_, self.trace_, self.vocab_ = 0, [], None
        else:
            driver.set_globals({name: getattr(self, f"{name}_") for name in self.global_names})
        blocks = count_blocks(engine, source, row_ranges(n_rows, config.chunk_rows), NO_ROWS)
        driver.svi_update(blocks, self.n_steps_, total_docs)
        self.n_steps_ += 1
        self._keep(driver)
        self.n_features_in_ = n_cols
        return self

    def _keep(self, driver: TopicDriver) -> None:
        """The driver's globals as fitted attributes (``g_``, ``h_``, ...) and what follows from them."""
        for name, value in driver.global_arrays().items():
            setattr(self, f"{name}_", _own_copy(value))
        self.components_ = topic_word(self.g_, self.h_)

    def _counts(self, X) -> sp.csr_matrix:
        m = rows_of(X, None, COUNTS).to_scipy()
        self._check_columns(m.shape[1])
        return m

    def top_words(self, n: int = 10) -> list[list[str]]:
        """The ``n`` most probable words of every topic (``w<id>`` without a vocabulary)."""
        self._check_fitted()
        return top_words(self.g_, self.h_, self.vocab_, n)


def _own_copy(value: Any) -> Any:
    """``value`` with every array in it copied in C order: a driver's globals may be views of its state
    (``DriverState.to_arrays``), such as Bayesian NMF's rates, one row seen as V x K."""
    if isinstance(value, np.ndarray):
        return np.array(value, order="C")
    if isinstance(value, dict):
        return {key: _own_copy(item) for key, item in value.items()}
    return copy.deepcopy(value)


class BayesianNMF(_TopicModel):
    """Bayesian NMF by batch VB or SVI; parameters: the fields of ``BNMFConfig``.

    Fitted: ``components_`` (K x V topic-word probabilities, E[beta] normalised per topic), ``g_``,
    ``h_`` (q(beta) shapes and rates, V x K), ``trace_``, ``vocab_`` (a store's vocabulary or None), and
    ``svi_shapes_``: None, or how SVI keeps the shapes (``models.bnmf.BNMFState``), for ``partial_fit`` to go on
    with the same numbers (it is used instead of ``g_``).
    """

    config_cls = BNMFConfig
    global_names = ("g", "h", "docs_seen", SVI_SHAPES)
    model_name = "bnmf"

    def transform(self, X, normalize: bool = False) -> np.ndarray:
        """E[theta_d] of every document (row of ``X``) with the topics fixed, or topic proportions if
        ``normalize`` (the local step, run to ``local_tol`` or ``eval_max_sweeps`` sweeps)."""
        m, config = self._counts(X), self._config()
        hyper = config.hyper(m.shape[1])
        view = config.view(self.g_, self.h_)
        res = bnmf.local_step(m.indptr, m.indices, m.data, view, hyper, config.inference_settings(),
                              with_stats=False)
        weights = res.a / bnmf.theta_rate(view, hyper)
        return weights / weights.sum(axis=1, keepdims=True) if normalize else weights

    def score(self, X, y=None) -> float:
        """Held-out per-word log likelihood of the documents of ``X`` by threefold document completion
        (paper 002, Sec. 11.6); higher is better."""
        m, config = self._counts(X), self._config()
        ll, tokens = bnmf.threefold_completion(m.indptr, m.indices, m.data, config.view(self.g_, self.h_),
                                               self.g_ / self.h_, config.hyper(m.shape[1]),
                                               config.inference_settings(), stream(config.seed, "score"))
        return ll / max(tokens, 1.0)


class CorrelatedNMF(_TopicModel):
    """Correlated NMF: topics with locations l_k in a latent space; parameters: the fields of
    ``CNMFConfig``.

    Fitted: ``components_`` (K x V topic-word probabilities), ``L_`` (K x m topic locations),
    ``correlation_`` (K x K, ``corr(i, j) = l_i . l_j / (|l_i| |l_j|)``), ``g_``, ``h_``, ``trace_``, ``vocab_``.
    """

    config_cls = CNMFConfig
    model_name = "cnmf"
    global_names = ("g", "h", "docs_seen", "L")

    def _keep(self, driver: TopicDriver) -> None:
        super()._keep(driver)
        self.correlation_ = cnmf.correlation(self.L_)

    def transform(self, X) -> np.ndarray:
        """Document locations u_d (n x m) with the globals fixed: the local Newton step
        (``kernels.cnmf.local_step``), as used for nearest-neighbour retrieval."""
        m, config = self._counts(X), self._config()
        view = bnmf.TopicView.from_params(self.g_, self.h_)
        return cnmf.local_step(m.indptr, m.indices, m.data, view, self.L_, config.local_settings(),
                               with_stats=False).u

    def score(self, X, y=None) -> float:
        """Held-out per-word log likelihood of the documents of ``X`` by threefold document completion
        (paper 002, Sec. 11.6, u_d fitted on two thirds); higher is better."""
        m, config = self._counts(X), self._config()
        ll, tokens = cnmf.threefold_completion(m.indptr, m.indices, m.data, bnmf.TopicView.from_params(self.g_, self.h_),
                                               self.g_ / self.h_, self.L_, config.local_settings(),
                                               stream(config.seed, "score"))
        return ll / max(tokens, 1.0)

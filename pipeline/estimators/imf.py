"""IMF and INMF as estimators (docs/models/imf.md, docs/models/inmf.md): variational infinite (non-negative)
matrix factorization of a dense matrix with missing entries, K+ chosen by the evidence.

``fit`` runs ``IMFDriver``; new rows are fitted with the column posteriors q(A), q(pi), q(eta_X) fixed
(``kernels.imf.fit_rows``, the training row update iterated to its fixed point) and, when offsets are
fitted (``offset_reg``), their row offsets with the column offsets fixed (``kernels.imf.row_offsets``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from buffet.kernels import imf
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.estimators.base import Estimator
from buffet.pipeline.estimators.inputs import DENSE, dense_rows
from buffet.pipeline.models.imf import IMFConfig, IMFDriver, INMFConfig


class IMF(Estimator):
    """IMF: x_ij ~ N(b_i + c_j + z_i . a_j, 1/eta_X) over the observed entries, z_i binary
    under the IBP, a_j Gaussian; parameters: the fields of ``IMFConfig`` (offsets b, c only with
    ``offset_reg``). Data: a dense array (NaN or ``mask`` False = missing) or a dense store.

    Fitted: ``components_`` (E[A], K+ x D), ``k_plus_``, ``evidence_`` (L(q; K+) of the chosen K+),
    ``evidence_by_k_`` ((K+, L) of every K+ tried), ``posterior_`` (the column posteriors, arrays of
    ``kernels.imf``'s ``post``), ``column_offsets_`` (zeros without ``offset_reg``), ``trace_``.

    For binary data (role mining, paper 000) ``predict`` gives a score per entry whose ranking (AUC)
    is what matters, not its value.
    """

    config_cls = IMFConfig
    model_name = "imf"
    input_kind = DENSE

    def _fit(self, config: Any, source: Source, engine: Engine, run: RunStore | None) -> None:
        driver = self._driver(config, source, engine)
        driver.start()
        self.trace_ = self._run(driver, config, run)
        self._adopt(driver)

    def _adopt(self, driver: IMFDriver) -> None:
        driver.adopt_best()
        self.posterior_ = dict(driver.state.post)
        self.components_ = driver.state.post["m"].T.copy()
        self.k_plus_ = driver.k_plus
        self.evidence_ = float(driver.state.best_evidence)
        self.evidence_by_k_ = np.array(driver.state.history, dtype=np.float64).reshape(-1, 2)
        self.column_offsets_ = np.asarray(driver.col_off, dtype=np.float64)

    def _rows(self, X, mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """New rows (X, full mask) and their row offsets fitted with the column offsets fixed."""
        X, mask = dense_rows(X, mask)
        self._check_columns(X.shape[1])
        reg = self._config().offset_reg
        row_off = np.zeros(X.shape[0]) if reg is None else imf.row_offsets(X, mask, self.column_offsets_, reg)
        return X, mask, row_off

    def transform(self, X, mask=None) -> np.ndarray:
        """E[z_i] (n x K+) of the rows of ``X`` with the column posteriors fixed (``kernels.imf.fit_rows``)."""
        X, mask, row_off = self._rows(X, mask)
        centred = imf.remove_offsets(X, mask, row_off, self.column_offsets_)
        return imf.fit_rows(centred, mask, self.posterior_)

    def predict(self, X, mask=None) -> np.ndarray:
        """Posterior-mean predictions b_i + c_j + E[z_i] E[a_j] of every entry of the rows of ``X``
        (missing ones included), z_i and b_i fitted on the observed entries of the row."""
        X, mask, row_off = self._rows(X, mask)
        nu = imf.fit_rows(imf.remove_offsets(X, mask, row_off, self.column_offsets_), mask, self.posterior_)
        return nu @ self.components_ + row_off[:, None] + self.column_offsets_[None, :]

    def score(self, X, y=None, *, mask=None) -> float:
        """Negative mean squared error of ``predict`` over the observed entries of ``X`` (higher is better).

        The rows' own observed entries are used both to fit their z_i and to score them, so this is a
        reconstruction score; for held-out entries, pass the rows with those entries masked to
        ``predict`` and compare there."""
        X, mask = dense_rows(X, mask)
        err = (self.predict(X, mask) - X)[mask]
        return -float(np.mean(err ** 2))


class INMF(IMF):
    """INMF: IMF with a_kj >= 0 under a truncated Gaussian prior, fitted by power EP;
    parameters: the fields of ``INMFConfig``. New rows use the same row update with INMF's q(A)."""

    config_cls = INMFConfig
    model_name = "inmf"

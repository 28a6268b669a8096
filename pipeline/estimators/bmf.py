"""Binary matrix factorization as an estimator (paper 003; docs/models/bmf.md): X ~ f(U W V^T) with binary U, V
under IBP (or finite) priors, Gibbs sampling on the engine (``BMFDriver``).

New rows (same columns) are given features U by the exact pi-conditional Gibbs move of the fitted
sampler (``kernels.bmf.conditional_sweep``) with V, W and the feature frequencies of the fit fixed:
``kernels.bmf.sample_new_rows``, seeded from the ``seed`` parameter and each row's values (``base.row_streams``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import expit

from buffet.kernels import bmf
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.estimators.base import Estimator, row_streams
from buffet.pipeline.estimators.inputs import DENSE, dense_rows
from buffet.pipeline.models.bmf import BMFConfig, BMFDriver

NEW_ROW_SWEEPS = 60   # Gibbs sweeps over new rows' features (the first NEW_ROW_BURN are discarded)
NEW_ROW_BURN = 10


class BinaryMF(Estimator):
    """Binary matrix factorization; parameters: the fields of ``BMFConfig``. Data: a dense
    array (NaN or ``mask`` False = missing) or a dense store; values as ``likelihood`` needs them.

    Fitted: ``U_`` (I x K+), ``V_`` (J x L+), ``W_`` (K+ x L+) of the last sample, ``predictive_mean_``
    (E[x_ij | X] averaged over the retained sweeps, every entry of the fitted matrix, missing ones
    included), ``k_plus_``, ``l_plus_``, the last sample's hyperparameters ``alpha_``, ``lam_``,
    ``phi_``, ``theta_``, and ``trace_``.
    """

    config_cls = BMFConfig
    model_name = "bmf"
    input_kind = DENSE

    def _fit(self, config: Any, source: Source, engine: Engine, run: RunStore | None) -> None:
        driver = self._driver(config, source, engine)
        driver.start()
        self.trace_ = self._run(driver, config, run)
        self._adopt(driver)

    def _adopt(self, driver: BMFDriver) -> None:
        self.U_, self.V_, self.W_ = driver.full("u"), driver.full("v"), np.asarray(driver.state.W, np.float64)
        self.predictive_mean_ = driver.predictive_mean()
        self.k_plus_, self.l_plus_ = int(self.U_.shape[1]), int(self.V_.shape[1])
        self.alpha_, self.lam_, self.phi_, self.theta_ = (float(driver.state.alpha), float(driver.state.lam),
                                                         float(driver.state.phi), float(driver.state.theta))

    def _samples(self, X, mask, sweeps: int) -> tuple[np.ndarray, np.ndarray]:
        """U samples (S, n, K+) of the rows of ``X`` (module docstring) and the features' G = W V^T.

        A new row joins I fitted rows, so P(u_k = 1) follows the prior's predictive given the fit's
        column counts n_k: n_k / (beta + I) under the IBP (paper 003, eqs. 4-5)."""
        X, mask = dense_rows(X, mask)
        self._check_columns(X.shape[1])
        config = self._config()
        prior = config.priors(self.alpha_, self.lam_)[0]
        n_rows = self.U_.shape[0] + 1
        pi = expit(prior.log_odds(self.U_.sum(axis=0), n_rows))
        G = self.W_ @ self.V_.T
        model = bmf.Observation(config.likelihood, self.theta_)
        samples = bmf.sample_new_rows(X, mask, G, pi, model, sweeps, min(NEW_ROW_BURN, sweeps - 1),
                                      row_streams(config.seed, X, mask), config.move_size)
        return samples, G

    def transform(self, X, mask=None, *, sweeps: int = NEW_ROW_SWEEPS) -> np.ndarray:
        """Posterior mean of the binary features U (n x K+) of the rows of ``X`` (module docstring)."""
        samples, _ = self._samples(X, mask, sweeps)
        return samples.mean(axis=0)

    def predict(self, X, mask=None, *, sweeps: int = NEW_ROW_SWEEPS) -> np.ndarray:
        """Posterior predictive mean E[x_ij] of every entry of the rows of ``X`` (missing ones included),
        averaged over the U samples of ``transform``; for logistic data a probability, to rank by AUC."""
        samples, G = self._samples(X, mask, sweeps)
        likelihood = self._config().likelihood
        return np.mean([bmf.mean_of(likelihood, U @ G) for U in samples], axis=0)

    def score(self, X, y=None, *, mask=None, sweeps: int = NEW_ROW_SWEEPS) -> float:
        """Mean log likelihood of the observed entries of ``X`` under ``predict``'s predictive mean, with
        the configured likelihood (Gaussian at precision ``theta_``, Bernoulli, Poisson); higher is better."""
        X, mask = dense_rows(X, mask)
        config = self._config()
        mean = self.predict(X, mask, sweeps=sweeps)
        entries = bmf.entry_log_lik(config.likelihood, X, bmf.linear_predictor(config.likelihood, mean), self.theta_)
        return float(np.mean(entries[mask]))

"""The IBP samplers as estimators (paper 001; docs/models/particle-filters.md, docs/models/gibbs.md):
particle filters and Gibbs samplers for the infinite linear-Gaussian and noisy-OR models.

Both give posterior summaries over the samples (``ibp_summary.finalise``): ``zzt_`` (E[Z Z^T]),
``k_plus_dist_`` (P(K+ = k)), ``k_plus_mean_`` and ``components_`` (E[A], or E[Y] for noisy-OR, in the
most probable equivalence class, K+ x D). Features swap labels between samples, so a per-feature
average over samples means nothing; ``transform`` therefore gives new rows' features with respect to
one sample's features F (the most probable class for the filters, the last sample of the best chain
for Gibbs): E[z_i | x_i, F] under z_ik ~ Bern(m_k / (N + 1)) (the IBP's predictive for an (N+1)-th
row, new features left out), by a short seeded Gibbs scan (``kernels.bmf.sample_new_rows``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from buffet.data.errors import InputError
from buffet.kernels import bmf
from buffet.kernels.gibbs_noisy_or import NoisyORObservation
from buffet.kernels.pf_noisy_or import NoisyORParams
from buffet.pipeline.engine.dataset import ArrayRows, Source, source_of
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.loop import Position
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.estimators.base import Estimator, engine_for, row_streams
from buffet.pipeline.estimators.inputs import DENSE, dense_rows, rows_of
from buffet.pipeline.models.gibbs import GibbsDriver, LGGibbsConfig, NoisyORGibbsConfig
from buffet.pipeline.models.particles import LGParticleConfig, NoisyORParticleConfig, ParticleDriver

NEW_ROW_SWEEPS = 60   # Gibbs sweeps over new rows' features (the first NEW_ROW_BURN are discarded)
NEW_ROW_BURN = 10


class _IBPModel(Estimator):
    """What the four IBP estimators share: dense data, the posterior summary, ``transform``."""

    input_kind = DENSE
    noisy_or: ClassVar[bool] = False

    def _input_tags(self) -> dict[str, bool]:
        return {"sparse": True, "allow_nan": True, "positive_only": self.noisy_or}

    def _keep_summary(self, post: dict[str, np.ndarray]) -> None:
        """The posterior expectations of ``ibp_summary.finalise`` as fitted attributes."""
        self.zzt_, self.k_plus_dist_ = post["zzt"], post["k_plus_dist"]
        self.k_plus_mean_ = float(post["k_plus_mean"])
        self.components_ = np.asarray(post["A_mean"], np.float64)
        self.Z_map_ = post["Z_map"]
        self.map_class_prob_ = float(post["map_class_prob"])

    def _observation(self, config: Any):
        """The likelihood of a row given its features' linear predictor z_i F (module docstring)."""
        if self.noisy_or:
            return NoisyORObservation(NoisyORParams(config.p, config.lam, config.eps))
        return bmf.Observation("gaussian", 1.0 / self._sigma_x(config) ** 2)

    def _sigma_x(self, config: Any) -> float:
        return config.sigma_x

    def _reference(self) -> tuple[np.ndarray, np.ndarray]:
        """The sample transform works with: its Z (N x K+) and features F (K+ x D)."""
        return self.Z_map_, self.components_

    def _new_rows(self, X, mask, sweeps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """E[z_i] of the rows of ``X`` given the reference sample (module docstring), with X, mask, model."""
        X, mask = dense_rows(X, mask)
        self._check_columns(X.shape[1])
        config = self._config()
        Z, F = self._reference()
        pi = Z.sum(axis=0) / (Z.shape[0] + 1.0)
        model = self._observation(config)
        samples = bmf.sample_new_rows(X, mask, F, pi, model, sweeps, min(NEW_ROW_BURN, sweeps - 1),
                                      row_streams(config.seed, X, mask))
        return samples.mean(axis=0), X, mask, model

    def transform(self, X, mask=None, *, sweeps: int = NEW_ROW_SWEEPS) -> np.ndarray:
        """E[z_i] (n x K+) of the rows of ``X`` with respect to the reference sample's features (module
        docstring: the most probable class for a particle filter, the last sample of the best chain for
        Gibbs); the columns are that sample's features, in the order of ``components_`` for a filter."""
        return self._new_rows(X, mask, sweeps)[0]


class _ParticleFilter(_IBPModel):
    """Particle filter estimators: rows are processed in order, so ``partial_fit`` continues
    the filter with more rows, and ``score`` propagates a copy of the particles through new rows."""

    def _fit(self, config: Any, source: Source, engine: Engine, run: RunStore | None) -> None:
        driver = self._driver(config, source, engine)
        driver.start()
        self.trace_ = self._run(driver, config, run)
        self._adopt(driver)

    def _adopt(self, driver: ParticleDriver) -> None:
        self.masked_ = driver.rows.mask is not None
        self._keep(driver)

    def _keep(self, driver: ParticleDriver) -> None:
        """The filter's globals and particle arrays (``particles_``: ``weights``, ``log_evidence``,
        ``rows_done`` and ``block<b>_<array>``), its log-evidence estimate and the posterior summary."""
        self.particles_ = {name: np.asarray(value) for name, value in driver.global_arrays().items()}
        for b, block in enumerate(driver.particle_blocks()):
            self.particles_.update({f"block{b}_{name}": getattr(block, name) for name in block.FEATURE_AXES})
        self.n_rows_ = int(driver.n_rows)
        self.log_evidence_ = float(driver.state.log_evidence)
        self._keep_summary(driver.posterior())

    def _continued(self, X, mask, client) -> ParticleDriver:
        """A driver holding the fitted particles, ready to process the rows of ``X`` after the fitted ones.

        The fitted rows are not kept: the driver's data are zeros in their place followed by the new rows;
        the particles' row axis is extended. Only resample-move reads a processed row again, so the
        continued filter runs without moves (plain resampling, still an exact filter)."""
        rows = rows_of(X, mask, DENSE)
        X, observed = rows.X, rows.mask
        self._check_columns(X.shape[1])
        if observed is not None and not self.masked_ and not self.noisy_or:
            raise InputError("the filter was fitted without missing entries, so it keeps one covariance for all "
                             "columns; refit it with a mask to process rows with missing entries")
        config = replace(self._config(), moves=0)
        n_old = self.n_rows_
        data = np.vstack([np.zeros((n_old, X.shape[1])), X])
        full = None
        if self.masked_ or observed is not None:
            full = np.ones(data.shape, bool)
            if observed is not None:
                full[n_old:] = observed
        driver = self._driver(config, source_of(ArrayRows(data, full)), engine_for(client))
        blocks = [config.BLOCK_CLS(n_rows=n_old, **{name: self._block_array(b, name, data.shape[0])
                                                   for name in config.BLOCK_CLS.FEATURE_AXES})
                  for b in range(driver.n_blocks)]
        driver.continue_from(blocks, {name: self.particles_[name] for name in ("weights", "log_evidence", "rows_done")})
        return driver

    def _block_array(self, block: int, name: str, n_rows: int) -> np.ndarray:
        """Array ``name`` of a fitted particle block, Z padded with zero rows to ``n_rows`` rows."""
        value = self.particles_[f"block{block}_{name}"]
        return np.pad(value, ((0, 0), (0, n_rows - value.shape[1]), (0, 0))) if name == "Z" else value

    def partial_fit(self, X, y=None, *, mask=None, client=None) -> "_ParticleFilter":
        """Continue the filter with the rows of ``X`` (appended after the rows seen so far) through the
        driver's step, as ``fit`` processes rows; a first call is ``fit``. The last row of the earlier
        call was not followed by a resampling step (the filter resamples between rows only)."""
        if not hasattr(self, "n_features_in_"):
            return self.fit(X, mask=mask, client=client)
        driver = self._continued(X, mask, client)
        self.trace_ = self._run(driver, self._config(), None,
                                Position(self.n_rows_, list(self.trace_), self.trace_[-1]["seconds"]))
        self.n_iter_ = len(self.trace_)
        self._keep(driver)
        return self

    def score(self, X, y=None, *, mask=None, client=None) -> float:
        """log p(X | training rows) per row of ``X``: the filter's evidence increments while a copy of the
        fitted particles processes the rows of ``X`` (the fitted model is unchanged)."""
        driver = self._continued(X, mask, client)
        self._run(driver, self._config(), None, Position(self.n_rows_))
        return (driver.state.log_evidence - self.log_evidence_) / (driver.n_rows - self.n_rows_)


class _GibbsSampler(_IBPModel):
    """Gibbs sampler estimators: ``chains`` independent chains, summaries over the retained
    sweeps; the reference sample of ``transform`` is the last sample of the chain whose last log joint
    is highest."""

    def _fit(self, config: Any, source: Source, engine: Engine, run: RunStore | None) -> None:
        driver = self._driver(config, source, engine)
        driver.start()
        self.trace_ = self._run(driver, config, run)
        self._adopt(driver)

    def _adopt(self, driver: GibbsDriver) -> None:
        config = driver.config
        self._keep_summary(driver.posterior())
        last = self.trace_[-1]
        best = int(np.argmax([last[f"log_joint_{c}"] for c in range(config.chains)]))
        state = driver.chain(best).state
        self.chain_ = best
        self.Z_ = np.asarray(state.Z, bool)
        self.sample_features_ = np.asarray(config.features(driver.rows, state), np.float64)
        self.alpha_ = float(state.alpha)
        if hasattr(state, "sigma_x"):
            self.sigma_x_, self.sigma_a_ = float(state.sigma_x), float(state.sigma_a)

    def _sigma_x(self, config: Any) -> float:
        return self.sigma_x_

    def _reference(self) -> tuple[np.ndarray, np.ndarray]:
        return self.Z_, self.sample_features_

    def score(self, X, y=None, *, mask=None, sweeps: int = NEW_ROW_SWEEPS) -> float:
        """Mean over the rows of ``X`` of log p(x_i | E[z_i] F) over the observed entries, with ``transform``'s
        E[z_i] and the reference sample's features F (Gaussian at its sigma_X, or noisy-OR); higher is better."""
        nu, X, mask, model = self._new_rows(X, mask, sweeps)
        return float(np.mean(model.rows(X, mask, nu @ self._reference()[1])))


class LinearGaussianParticleFilter(_ParticleFilter):
    """Collapsed particle filter for the infinite linear-Gaussian model (paper 001 Alg. 2); parameters:
    the fields of ``LGParticleConfig``.

    Fitted: ``zzt_``, ``k_plus_dist_``, ``k_plus_mean_``, ``components_`` (E[A] in the most probable
    class), ``Z_map_`` (that class's left-ordered Z), ``map_class_prob_``, ``log_evidence_`` (log p(X)
    estimate), ``particles_`` (the particles and weights, to continue), ``trace_``.
    """

    config_cls = LGParticleConfig
    model_name = "pf-linear-gaussian"


class NoisyORParticleFilter(_ParticleFilter):
    """Particle filter for the infinite noisy-OR model (paper 001 Alg. 3) on 0/1 data; parameters: the
    fields of ``NoisyORParticleConfig``. Fitted attributes as ``LinearGaussianParticleFilter``'s, with
    ``components_`` = E[Y] in the most probable class."""

    config_cls = NoisyORParticleConfig
    model_name = "pf-noisy-or"
    noisy_or = True


class LinearGaussianGibbs(_GibbsSampler):
    """Collapsed Gibbs sampler for the infinite linear-Gaussian model; parameters: the fields
    of ``LGGibbsConfig``.

    Fitted: ``zzt_``, ``k_plus_dist_``, ``k_plus_mean_``, ``components_`` (E[A] in the most probable
    class over the retained sweeps of all chains), ``Z_map_``, ``map_class_prob_``, and of the last
    sample of the best chain ``chain_``: ``Z_``, ``sample_features_`` (E[A | Z, X]), ``alpha_``,
    ``sigma_x_``, ``sigma_a_``; ``trace_``.
    """

    config_cls = LGGibbsConfig
    model_name = "gibbs-linear-gaussian"


class NoisyORGibbs(_GibbsSampler):
    """Gibbs sampler for the infinite noisy-OR model on 0/1 data; parameters: the fields of
    ``NoisyORGibbsConfig``. Fitted attributes as ``LinearGaussianGibbs``'s, with E[Y] and the last Y
    (``sample_features_``) as features and no sigmas."""

    config_cls = NoisyORGibbsConfig
    model_name = "gibbs-noisy-or"
    noisy_or = True

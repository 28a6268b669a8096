"""Gibbs baselines on the engine: independent chains in parallel (paper 001, Sec. 4.2; docs/models/gibbs.md).

Config ``chains`` chains (default 4) run side by side, held by the engine as the named state
``CHAINS``; the rows of X are read once and shared with the tasks (``Engine.share``). An engine step
is one sweep of every chain, one task per chain, with chain c at sweep s drawing from
``stream(seed, "chain", c, s)``, so results do not depend on the workers. A chain is its sampler state
and its running posterior sums (``kernels.ibp_summary``, one unit of weight per retained sweep); the
first ``burn_in`` fraction of the sweeps (10% by default, as in paper 001, Sec. 4.2) is discarded.
Every step records K+ and the log joint of each chain (and the hyperparameters the kernels resample:
alpha, sigma_X and sigma_A for the linear-Gaussian model, alpha for noisy-OR) and their means over the
chains. The posterior (``posterior``) is the chains' sums tree-reduced in chain order. The client holds
only the number of sweeps done, so a checkpoint is that and every chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from buffet.data.errors import UserError
from buffet.data.store import DenseRows
from buffet.kernels import gibbs_linear_gaussian as lg_gibbs
from buffet.kernels import gibbs_noisy_or as nor_gibbs
from buffet.kernels import ibp_summary
from buffet.kernels.pf_noisy_or import NoisyORParams
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import checkpoint_option, option, require_counts, require_positive
from buffet.pipeline.models.ibp_data import read_dense_rows
from buffet.pipeline.models.noisy_or import NOISY_OR_HELP, noisy_or_params
from buffet.pipeline.models.state import DriverState, StatefulDriver

CHAINS = "chains"  # the named state: one Chain per block


# ----- configs: the settings and the model-specific kernel calls -----

@dataclass
class GibbsConfig:
    """Settings shared by both Gibbs samplers (chains and burn-in as in the module docstring)."""

    sweeps: int = option(200, "Sweeps per chain, burn-in included (>= 1); a sweep updates every row. Raise it "
                              "until the traced K+ and log joint stop drifting.")
    chains: int = option(4, "Independent chains, run in parallel as one task each (>= 1); the posterior pools "
                            "their retained sweeps. More chains reveal poor mixing and add samples.")
    burn_in: float = option(0.1, "Fraction of each chain's sweeps discarded before the posterior is summed, in "
                                 "[0, 1). Raise it if the traces still drift early on.")
    alpha: float = option(1.0, "Starting IBP concentration alpha (> 0), resampled every sweep under a Gamma(1, 1) "
                               "prior; a row has alpha features on average a priori.")
    max_new: int = option(4, "Most new features one row may open in one Gibbs step (>= 1), the truncation of "
                             "their Poisson count. Raise it if K+ grows in jumps of this size.")
    seed: int = option(0, "Seed of the chains' draws; the same seed gives the same chains on any number of "
                          "workers.")
    checkpoint_every: int = checkpoint_option(10, "sweeps")

    BINARY: ClassVar[bool] = False

    def check(self) -> None:
        require_counts(self, ("sweeps", "chains", "max_new", "checkpoint_every"))
        if not 0.0 <= self.burn_in < 1.0:
            raise UserError(f"burn_in must be in [0, 1), got {self.burn_in}")
        require_positive(self, ("alpha",))

    @property
    def burn_sweeps(self) -> int:
        """Sweeps discarded as burn-in: floor(burn_in * sweeps), so at least one sweep is retained."""
        return math.floor(self.burn_in * self.sweeps)

    def initial_state(self, n_rows: int, n_cols: int) -> Any:
        """A chain's start: no features, the configured hyperparameters (each model's config implements it)."""
        raise NotImplementedError

    def sweep(self, data: DenseRows, state: Any, rng: np.random.Generator) -> Any:
        """The model's kernel sweep."""
        raise NotImplementedError

    def log_joint(self, data: DenseRows, state: Any) -> float:
        """The chain's log joint, the quantity traced to monitor mixing."""
        raise NotImplementedError

    def features(self, data: DenseRows, state: Any) -> np.ndarray:
        """The sample's feature matrix (K+ x D) summarised as E[A]."""
        raise NotImplementedError


@dataclass
class LGGibbsConfig(GibbsConfig):
    """Collapsed linear-Gaussian Gibbs (Griffiths & Ghahramani 2005): alpha, sigma_X and sigma_A are
    resampled every sweep under Gamma(1, 1) priors (``LGHyperPrior``); the split-merge moves are
    ``gibbs_linear_gaussian.split_merge`` (after paper 003), the recombination moves
    ``gibbs_linear_gaussian.recombine`` (docs/models/gibbs.md)."""

    sigma_x: float = option(1.0, "Starting noise standard deviation sigma_X of X = Z A + noise, in the data's "
                                 "units (> 0), resampled every sweep. A start near the data's noise level "
                                 "shortens burn-in.")
    sigma_a: float = option(1.0, "Starting prior standard deviation sigma_A of the feature values A, in the "
                                 "data's units (> 0), resampled every sweep.")
    split_merge_moves: int = option(5, "Split-merge Metropolis-Hastings moves on the features after every sweep "
                                       "(>= 0; 0 turns them off). They help a chain escape merged or split "
                                       "features at a small cost per move.")
    recombine_moves: int = option(5, "Recombination Metropolis-Hastings moves after the split-merge moves of "
                                     "every sweep (>= 0; 0 turns them off): each proposes three features in "
                                     "place of two or back, which frees a chain holding two features as "
                                     "three. Cheap when no columns qualify.")

    STATE_CLS: ClassVar[type] = lg_gibbs.LGGibbsState

    def check(self) -> None:
        super().check()
        require_positive(self, ("sigma_x", "sigma_a"))
        for name in ("split_merge_moves", "recombine_moves"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} must be >= 0, got {getattr(self, name)}")

    def initial_state(self, n_rows: int, n_cols: int) -> lg_gibbs.LGGibbsState:
        return lg_gibbs.LGGibbsState(np.zeros((n_rows, 0), bool), self.alpha, self.sigma_x, self.sigma_a)

    def sweep(self, data: DenseRows, state: lg_gibbs.LGGibbsState,
              rng: np.random.Generator) -> lg_gibbs.LGGibbsState:
        return lg_gibbs.gibbs_sweep(data.X, state, rng, max_new=self.max_new, observed=data.mask,
                                    split_merge_moves=self.split_merge_moves, recombine_moves=self.recombine_moves)

    def log_joint(self, data: DenseRows, state: lg_gibbs.LGGibbsState) -> float:
        return lg_gibbs.log_joint(data.X, state, data.mask)

    def features(self, data: DenseRows, state: lg_gibbs.LGGibbsState) -> np.ndarray:
        """E[A | Z, X] = W^{-1} Z^T X, missing entries at the state's imputed values."""
        X = data.X if data.mask is None else np.where(data.mask, data.X, 0.0)
        if data.mask is not None:
            X[~data.mask] = state.imputed
        return lg_gibbs.feature_posterior(state.Z, X, state.sigma_x, state.sigma_a)[1]


@dataclass
class NoisyORGibbsConfig(GibbsConfig):
    """Noisy-OR Gibbs on Z and Y (Wood, Griffiths & Ghahramani 2006); alpha resampled, p, lam, eps fixed."""

    p: float = option(0.1, NOISY_OR_HELP["p"])
    lam: float = option(0.9, NOISY_OR_HELP["lam"])
    eps: float = option(0.01, NOISY_OR_HELP["eps"])

    BINARY: ClassVar[bool] = True
    STATE_CLS: ClassVar[type] = nor_gibbs.NoisyORGibbsState

    def check(self) -> None:
        super().check()
        noisy_or_params(self)

    @property
    def params(self) -> NoisyORParams:
        return noisy_or_params(self)

    def initial_state(self, n_rows: int, n_cols: int) -> nor_gibbs.NoisyORGibbsState:
        return nor_gibbs.NoisyORGibbsState(np.zeros((n_rows, 0), bool), np.zeros((0, n_cols), bool), self.alpha)

    def sweep(self, data: DenseRows, state: nor_gibbs.NoisyORGibbsState,
              rng: np.random.Generator) -> nor_gibbs.NoisyORGibbsState:
        return nor_gibbs.gibbs_sweep(data.X, state, self.params, rng, data.mask, max_new=self.max_new)

    def log_joint(self, data: DenseRows, state: nor_gibbs.NoisyORGibbsState) -> float:
        return nor_gibbs.log_joint(np.asarray(data.X, bool), state, self.params, data.mask)

    def features(self, data: DenseRows, state: nor_gibbs.NoisyORGibbsState) -> np.ndarray:
        return state.Y.astype(np.float64)


# ----- chain tasks -----

@dataclass(frozen=True)
class Chain:
    """One chain on a worker: the sampler state and the sums of its retained sweeps (None before any)."""

    state: Any
    sums: ibp_summary.Summary | None = None


def start_chain(config: GibbsConfig, n_rows: int, n_cols: int) -> Chain:
    """A chain before its first sweep (``GibbsConfig.initial_state``), no sums yet."""
    return Chain(config.initial_state(n_rows, n_cols))


def sweep_task(config: GibbsConfig, data: DenseRows, chain: Chain, sweep: int, index: int) -> tuple[Chain, dict]:
    """Sweep ``sweep`` of chain ``index``; its sample joins the sums after burn-in (module docstring)."""
    state = config.sweep(data, chain.state, stream(config.seed, "chain", index, sweep))
    record = {"k_plus": float(state.Z.shape[1]), "log_joint": config.log_joint(data, state),
              **{name: float(getattr(state, name)) for name in ("alpha", "sigma_x", "sigma_a") if hasattr(state, name)}}
    sums = chain.sums
    if sweep >= config.burn_sweeps:
        sample = ibp_summary.summarise(state.Z[None], config.features(data, state)[None], np.ones(1))
        sums = sample if sums is None else ibp_summary.merge(sums, sample)
    return Chain(state, sums), record


def chain_sums(chain: Chain) -> ibp_summary.Summary:
    """The sums of a chain's retained sweeps (what ``posterior`` reduces)."""
    return chain.sums


# ----- the driver -----

@dataclass
class GibbsState(DriverState):
    """The client-side values of the Gibbs chains: only the number of sweeps done (the chains are the named
    state ``CHAINS``)."""

    sweeps_done: int = 0

    def __post_init__(self) -> None:
        self.sweeps_done = int(self.sweeps_done)


class GibbsDriver(StatefulDriver):
    """Parallel independent Gibbs chains (module docstring; the Driver protocol of ``engine.loop``)."""

    state_type = GibbsState

    def __init__(self, config: GibbsConfig, source: Source, engine: Engine, label: str = "gibbs"):
        config.check()
        self.config, self.source, self.engine, self.label = config, source, engine, label
        self.rows = read_dense_rows(source, config.BINARY)
        self.data = engine.share(self.rows)
        self.state = GibbsState()

    def start(self) -> None:
        """Every chain at its start: no features, the configured hyperparameters."""
        self.engine.keep(CHAINS, self.engine.generate(start_chain, [(self.config, *self.rows.X.shape)]
                                                      * self.config.chains))

    def total_steps(self) -> int:
        return self.config.sweeps

    def finished(self, step: int, trace: list[dict]) -> bool:
        return step >= self.config.sweeps

    def set_globals(self, arrays: Mapping[str, Any]) -> None:
        """The globals of a checkpoint; the rows are shared again, in case the worker that held them was lost."""
        super().set_globals(arrays)
        self.data = self.engine.share(self.rows)

    def step(self, step: int) -> dict:
        """Sweep ``step`` of every chain; the record has each chain's K+ and log joint and their means."""
        engine = self.engine
        chains, records = engine.split(engine.map(sweep_task, self.config, self.data, engine.state(CHAINS), step,
                                                  engine.indices(self.config.chains)), 2)
        engine.keep(CHAINS, chains)
        records = engine.collect(records)
        self.state.sweeps_done = step + 1
        record = {"retained": float(step >= self.config.burn_sweeps)}
        for key in records[0]:
            values = [r[key] for r in records]
            record[key] = float(np.mean(values))
            record.update({f"{key}_{c}": v for c, v in enumerate(values)})
        return record

    def chain(self, index: int) -> Chain:
        """Chain ``index``, brought here."""
        return self.engine.collect(self.engine.select(self.engine.state(CHAINS), [index]))[0]

    def posterior(self) -> dict[str, np.ndarray]:
        """The posterior expectations of the retained sweeps of all chains (``ibp_summary.finalise``),
        their sums tree-reduced in chain order."""
        if self.state.sweeps_done < self.config.sweeps:
            raise UserError("the Gibbs sampler has not finished its sweeps yet (resume the run)")
        sums = self.engine.map(chain_sums, self.engine.state(CHAINS))
        return ibp_summary.finalise(self.engine.reduce(sums, ibp_summary.merge))

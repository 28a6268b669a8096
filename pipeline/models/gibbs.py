"""Gibbs baselines on the engine: independent chains in parallel (SPEC 2, 3.4; paper 001 section 4.2).

Config ``chains`` chains (default 4) run side by side; an engine step is one sweep of every
chain, one task per chain, with chain c at sweep s drawing from ``stream(seed, "chain", c, s)``,
so results do not depend on the workers. A chain's state and its running posterior sums
(``ibp_summary``, one unit of weight per retained sweep) stay on the workers as one future; the
first ``burn_in`` fraction of the sweeps (10% by default, as in paper 001 section 4.2) is
discarded. Every step records K+ and the log joint of each chain (and the hyperparameters the
kernels resample: alpha, sigma_X and sigma_A for the linear-Gaussian model, alpha for noisy-OR).
After the last sweep the chains' sums are tree-reduced in chain order into the posterior
summary. A checkpoint holds every chain's state and sums.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np

from buffet.data.errors import UserError
from buffet.data.store import DenseRows
from buffet.kernels import gibbs_linear_gaussian as lg_gibbs
from buffet.kernels import gibbs_noisy_or as nor_gibbs
from buffet.kernels.pf_noisy_or import NoisyORParams
from buffet.pipeline.models import ibp_summary as ibp_summary
from buffet.pipeline.engine.blocks import Source
from buffet.pipeline.engine.executors import Executor, pick, tree_reduce
from buffet.pipeline.models.particles import NOISY_OR_HELP, check_noisy_or, read_dense_rows
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import checkpoint_option, option, require_counts, require_positive


# ----- configs: the settings and the model-specific kernel calls -----

@dataclass
class GibbsConfig:
    """Settings shared by both Gibbs samplers (SPEC 3.4; chains and burn-in as in the module docstring)."""

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
        """The model's kernel sweep (SPEC 3.4)."""
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
    ``gibbs_linear_gaussian.split_merge`` (after paper 003)."""

    sigma_x: float = option(1.0, "Starting noise standard deviation sigma_X of X = Z A + noise, in the data's "
                                 "units (> 0), resampled every sweep. A start near the data's noise level "
                                 "shortens burn-in.")
    sigma_a: float = option(1.0, "Starting prior standard deviation sigma_A of the feature values A, in the "
                                 "data's units (> 0), resampled every sweep.")
    split_merge_moves: int = option(5, "Split-merge Metropolis-Hastings moves on the features after every sweep "
                                       "(>= 0; 0 turns them off). They help a chain escape merged or split "
                                       "features at a small cost per move.")

    STATE_CLS: ClassVar[type] = lg_gibbs.LGGibbsState

    def check(self) -> None:
        super().check()
        require_positive(self, ("sigma_x", "sigma_a"))
        if self.split_merge_moves < 0:
            raise UserError(f"split_merge_moves must be >= 0, got {self.split_merge_moves}")

    def initial_state(self, n_rows: int, n_cols: int) -> lg_gibbs.LGGibbsState:
        return lg_gibbs.LGGibbsState(np.zeros((n_rows, 0), bool), self.alpha, self.sigma_x, self.sigma_a)

    def sweep(self, data: DenseRows, state: lg_gibbs.LGGibbsState,
              rng: np.random.Generator) -> lg_gibbs.LGGibbsState:
        return lg_gibbs.gibbs_sweep(data.X, state, rng, max_new=self.max_new, observed=data.mask,
                                    split_merge_moves=self.split_merge_moves)

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
        check_noisy_or(self)

    @property
    def params(self) -> NoisyORParams:
        return NoisyORParams(self.p, self.lam, self.eps)

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


def start_chain_task(config: GibbsConfig, data: DenseRows) -> Chain:
    return Chain(config.initial_state(*data.X.shape))


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


def chain_sums_task(chain: Chain) -> ibp_summary.Summary:
    return chain.sums


def chain_arrays_task(chain: Chain, prefix: str) -> dict[str, np.ndarray]:
    """A chain as plain arrays named ``prefix + ...`` (checkpoint; absent optional fields are left out)."""
    arrays = {f"{prefix}{k}": np.asarray(v) for k, v in asdict(chain.state).items() if v is not None}
    if chain.sums is not None:
        arrays.update(ibp_summary.to_arrays(chain.sums, f"{prefix}sums_"))
    return arrays


def chain_from_arrays(state_cls: type, arrays: dict[str, np.ndarray], prefix: str) -> Chain:
    """The chain ``chain_arrays_task`` stored (0-d arrays back to floats)."""
    values = {f.name: arrays[f"{prefix}{f.name}"] for f in fields(state_cls) if f"{prefix}{f.name}" in arrays}
    state = state_cls(**{k: float(v) if v.ndim == 0 else v for k, v in values.items()})
    sums = ibp_summary.from_arrays(arrays, f"{prefix}sums_") if ibp_summary.has_summary(arrays, f"{prefix}sums_") \
        else None
    return Chain(state, sums)


# ----- the driver -----

class GibbsDriver:
    """Parallel independent Gibbs chains (module docstring; the Driver protocol of fitloop)."""

    def __init__(self, config: GibbsConfig, source: Source, executor: Executor, label: str = "gibbs"):
        config.check()
        self.config, self.source, self.executor, self.label = config, source, executor, label
        self.rows = read_dense_rows(source, config.BINARY)
        self.data = executor.broadcast(self.rows)
        self.chains: list = []
        self.summary: ibp_summary.Summary | None = None
        self._t_start = time.perf_counter()

    def start(self) -> None:
        self.chains = [self.executor.submit(start_chain_task, self.config, self.data)
                       for _ in range(self.config.chains)]

    def total_steps(self) -> int:
        return self.config.sweeps

    def finished(self, step: int, trace: list[dict]) -> bool:
        return step >= self.config.sweeps

    def step(self, step: int) -> dict:
        """Sweep ``step`` of every chain; the record has each chain's K+ and log joint and their means."""
        results = [self.executor.submit(sweep_task, self.config, self.data, chain, step, c)
                   for c, chain in enumerate(self.chains)]
        self.chains = [self.executor.submit(pick, r, 0) for r in results]
        records = self.executor.gather([self.executor.submit(pick, r, 1) for r in results])
        self.executor.release(results)
        record = {"sweep": step + 1, "retained": float(step >= self.config.burn_sweeps)}
        for key in records[0]:
            values = [r[key] for r in records]
            record[key] = float(np.mean(values))
            record.update({f"{key}_{c}": v for c, v in enumerate(values)})
        if step + 1 >= self.config.sweeps:
            self.summary = self._summarise()
        record["seconds"] = time.perf_counter() - self._t_start
        return record

    def _summarise(self) -> ibp_summary.Summary:
        """The retained sweeps of all chains, tree-reduced in chain order."""
        parts = [self.executor.submit(chain_sums_task, chain) for chain in self.chains]
        return self.executor.gather(tree_reduce(self.executor, parts, ibp_summary.merge))

    def posterior(self) -> dict[str, np.ndarray]:
        """The finished run's posterior expectations (``ibp_summary.finalise``)."""
        if self.summary is None:
            raise UserError("the Gibbs sampler has not finished its sweeps yet (resume the run)")
        return ibp_summary.finalise(self.summary)

    # -- checkpoints --
    def save(self, run: RunStore, step: int, trace: list[dict]) -> None:
        folder = run.new_checkpoint_dir(step)
        arrays: dict[str, np.ndarray] = {}
        for part in self.executor.gather([self.executor.submit(chain_arrays_task, chain, f"chain{c}_")
                                          for c, chain in enumerate(self.chains)]):
            arrays.update(part)
        if self.summary is not None:
            arrays.update(ibp_summary.to_arrays(self.summary, "summary_"))
        run.commit_checkpoint(folder, step, arrays, {"trace": trace})

    def restore(self, arrays: dict[str, np.ndarray], folder: object) -> None:
        """Chain states and sums (and a finished run's summary) from a checkpoint."""
        prefixes = [f"chain{c}_" for c in range(self.config.chains)]
        self.chains = [self.executor.submit(chain_from_arrays, self.config.STATE_CLS,
                                            {k: v for k, v in arrays.items() if k.startswith(prefix)}, prefix)
                       for prefix in prefixes]
        if ibp_summary.has_summary(arrays, "summary_"):
            self.summary = ibp_summary.from_arrays(arrays, "summary_")

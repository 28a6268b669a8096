"""Particle filters for IBP matrix factorization on the engine (paper 001, Algorithms 2-3;
docs/models/particle-filters.md).

The P particles are split into a fixed number of blocks (config ``blocks``, independent of the
workers), held by the engine as the named state ``PARTICLES``; the rows of X are read once and shared
with the tasks (``Engine.share``). One step processes one row i of X:

1. every block propagates its particles through row i and weights them, block-locally, with the
   generator ``stream(seed, "propagate", i, b)`` (``propagate_task``);
2. the client gathers the incremental log-weights of all blocks in block order and multiplies
   them into the particles' weights; unless i is the last row, it resamples globally (systematic,
   ``kernels.resampling``, with the i-th of the uniforms drawn once from ``stream(seed, "resample")``)
   when the effective sample size is below ``ess_threshold`` P, and otherwise keeps the weights
   (adaptive resampling: the weighted particles stay an exact importance sample, and rows with
   even weights lose no diversity);
3. after a resampling each destination block is rebuilt where it will live: the engine brings it the
   blocks its ancestors are in (``Engine.regroup``; systematic ancestors are sorted, so particles only
   move between neighbouring blocks) and a task takes the ancestors from them, given the small
   per-destination lists of particle indices (``rebuild_task``); the weights become uniform;
4. with ``moves``, every rebuilt block is then moved (resample-move, ``kernels.pf_moves``): Gibbs updates
   of some past rows of Z (and of Y for noisy-OR) that keep the posterior of the rows seen, with the
   generator ``stream(seed, "move", i, b)``.

The client holds only the weights, the log-evidence and the number of rows done
(``global_arrays``), so a checkpoint is those and every block of ``PARTICLES``. Nothing depends on
the number of workers, so a fit gives the same numbers on 1 worker or 8. The posterior
(``posterior``) is the blocks' weighted summaries (``kernels.ibp_summary``) under the final weights,
tree-reduced in block order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from buffet.data.errors import UserError
from buffet.data.store import DenseRows
from buffet.kernels import ibp_prior, ibp_summary
from buffet.kernels.lg_particles import LGParticles, init_lg_particles
from buffet.kernels.pf_linear_gaussian import pf_linear_gaussian_step
from buffet.kernels.pf_moves import move_lg_particles, move_noisy_or_particles
from buffet.kernels.pf_noisy_or import NoisyORParticles, init_noisy_or_particles, pf_noisy_or_step
from buffet.kernels.pf_proposals import PROPOSALS
from buffet.kernels.resampling import (ancestor_locations, concatenate_blocks, effective_sample_size,
                                       normalise_log_weights, select_particles, systematic_resample)
from buffet.pipeline.engine.dataset import Source
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import checkpoint_option, option, require_counts, require_positive
from buffet.pipeline.models.ibp_data import read_dense_rows
from buffet.pipeline.models.noisy_or import NOISY_OR_HELP, noisy_or_params
from buffet.pipeline.models.state import DriverState, StatefulDriver

PARTICLES = "particles"  # the named state: the blocks of particles
MOVES_HELP = ("Resample-move: after each resampling, every particle's Z is re-drawn on this many past rows picked at "
              "random (and, for noisy-OR, its Y entry by entry) by Gibbs updates that keep the posterior of the rows "
              "seen (0 = plain resampling, the paper's algorithm). Costs about this many Gibbs row updates per "
              "particle and resampling.")


# ----- configs: the settings and the model-specific kernel calls -----

@dataclass
class ParticleConfig:
    """Settings shared by both particle filters (resampling as in the module docstring)."""

    particles: int = option(1000, "Number of particles P (>= 1). More approximate the posterior better; time "
                                  "and memory grow in proportion.")
    blocks: int = option(4, "Blocks the particles are split into, one task per block and row (>= 1). Set it to "
                            "about the number of workers; the numbers depend on it, not on the workers.")
    alpha: float = option(1.0, "IBP concentration alpha (> 0), held fixed: a row has alpha features on average "
                               "a priori. Set it to the number of features you expect per row.")
    seed: int = option(0, "Seed of the propagation and resampling draws; the same seed and --blocks give the same "
                          "numbers on any number of workers.")
    checkpoint_every: int = checkpoint_option(10, "rows")
    ess_threshold: float = option(0.5, "Resample when the effective sample size falls below this fraction of P, "
                                       "in [0, 1]. 1 resamples after every row with uneven weights, as in the paper; "
                                       "lower resamples less often, 0 never.")
    moves: int = option(0, MOVES_HELP)

    BINARY: ClassVar[bool] = False
    BLOCK_CLS: ClassVar[type] = ibp_prior.IBPParticles

    def check(self) -> None:
        require_counts(self, ("particles", "blocks", "checkpoint_every"))
        require_positive(self, ("alpha",))
        if not 0.0 <= self.ess_threshold <= 1.0:
            raise UserError(f"ess_threshold must be in [0, 1], got {self.ess_threshold}")
        if self.moves < 0:
            raise UserError(f"moves must be >= 0, got {self.moves}")

    def empty_block(self, size: int, n_rows: int, n_cols: int, masked: bool) -> ibp_prior.IBPParticles:
        """A block of ``size`` particles with no rows yet (each model's config implements it)."""
        raise NotImplementedError

    def propagate(self, block: ibp_prior.IBPParticles, x: np.ndarray, observed: np.ndarray | None,
                  rng: np.random.Generator) -> tuple[ibp_prior.IBPParticles, np.ndarray]:
        """The model's kernel step for row x: the new block and incremental log-weights."""
        raise NotImplementedError

    def features(self, block: ibp_prior.IBPParticles) -> np.ndarray:
        """The per-particle feature matrix summarised as E[A] (L, Kc, D)."""
        raise NotImplementedError

    def move(self, block: ibp_prior.IBPParticles, X: np.ndarray, observed: np.ndarray | None,
             rng: np.random.Generator) -> ibp_prior.IBPParticles:
        """The resample-move step of every particle of ``block`` (``moves`` > 0)."""
        raise NotImplementedError


@dataclass
class LGParticleConfig(ParticleConfig):
    """Collapsed linear-Gaussian filter (paper 001 Alg. 2); the proposals are ``kernels.pf_proposals``'
    (the comparison on the figure-3 images is in docs/performance.md, 'Samplers')."""

    sigma_x: float = option(1.0, "Noise standard deviation sigma_X of X = Z A + noise, in the data's units (> 0), "
                                 "held fixed. Set it to the noise level of the data; too small invents features.")
    sigma_a: float = option(1.0, "Prior standard deviation sigma_A of the feature values A, in the data's units "
                                 "(> 0), held fixed. Set it to the typical size of a feature's effect.")
    proposal: str = option("guided", "Proposal of a row's features z_i: 'prior' (the paper's IBP prior) or "
                                     "'guided' (weighs each existing feature by how well it explains x_i; it had the "
                                     "lower error at equal time on the paper's images).")
    moves: int = option(60, MOVES_HELP + " The default 60, with the feature moves, kept the filter within 1.1x of "
                                         "an exact sampler's error on the four-image data, where 10 left half the "
                                         "runs at noise variance 0.5 in a wrong set of features "
                                         "(docs/performance.md).")
    feature_moves: int = option(1, "Metropolis-Hastings moves on whole features per particle in each resample-move, "
                                   "after its Gibbs updates (>= 0; used only with --moves > 0): each is a split-merge "
                                   "move (one feature split in two, or two merged), an exchange move (the rows of "
                                   "two features divided between them afresh) and a recombination move (three "
                                   "columns holding two features made two, or back). They undo merged features and "
                                   "wrong combinations of features, which the row updates rarely leave.")

    BLOCK_CLS: ClassVar[type] = LGParticles

    def check(self) -> None:
        super().check()
        require_positive(self, ("sigma_x", "sigma_a"))
        if self.feature_moves < 0:
            raise UserError(f"feature_moves must be >= 0, got {self.feature_moves}")
        if self.proposal not in PROPOSALS:
            raise UserError(f"proposal must be one of {', '.join(PROPOSALS)}, got {self.proposal!r}")

    def empty_block(self, size: int, n_rows: int, n_cols: int, masked: bool) -> LGParticles:
        return init_lg_particles(size, n_rows, n_cols, per_column=masked)

    def propagate(self, block: LGParticles, x: np.ndarray, observed: np.ndarray | None,
                  rng: np.random.Generator) -> tuple[LGParticles, np.ndarray]:
        return pf_linear_gaussian_step(block, x, self.alpha, self.sigma_x, self.sigma_a, rng, observed,
                                       self.proposal)

    def features(self, block: LGParticles) -> np.ndarray:
        return block.M

    def move(self, block: LGParticles, X: np.ndarray, observed: np.ndarray | None,
             rng: np.random.Generator) -> LGParticles:
        return move_lg_particles(block, X, observed, self.alpha, self.sigma_x, self.sigma_a, self.moves, rng,
                                 feature_moves=self.feature_moves)


@dataclass
class NoisyORParticleConfig(ParticleConfig):
    """Noisy-OR filter (paper 001 Alg. 3; the parameters of eq. 8, held fixed)."""

    p: float = option(0.1, NOISY_OR_HELP["p"])
    lam: float = option(0.9, NOISY_OR_HELP["lam"])
    eps: float = option(0.01, NOISY_OR_HELP["eps"])
    moves: int = option(2, MOVES_HELP + " The default 2 had the lower error at equal time on paper 001's figure-5 "
                                        "data.")

    BINARY: ClassVar[bool] = True
    BLOCK_CLS: ClassVar[type] = NoisyORParticles

    def check(self) -> None:
        super().check()
        noisy_or_params(self)

    def empty_block(self, size: int, n_rows: int, n_cols: int, masked: bool) -> NoisyORParticles:
        return init_noisy_or_particles(size, n_rows, n_cols)

    def propagate(self, block: NoisyORParticles, x: np.ndarray, observed: np.ndarray | None,
                  rng: np.random.Generator) -> tuple[NoisyORParticles, np.ndarray]:
        return pf_noisy_or_step(block, x, self.alpha, noisy_or_params(self), rng, observed)

    def features(self, block: NoisyORParticles) -> np.ndarray:
        return block.Y                  # bool; ``ibp_summary.summarise`` converts after grouping

    def move(self, block: NoisyORParticles, X: np.ndarray, observed: np.ndarray | None,
             rng: np.random.Generator) -> NoisyORParticles:
        return move_noisy_or_particles(block, X, observed, self.alpha, noisy_or_params(self), self.moves, rng)


# ----- block tasks -----

def propagate_task(config: ParticleConfig, block: ibp_prior.IBPParticles, data: DenseRows, row: int,
                   index: int) -> tuple[ibp_prior.IBPParticles, tuple[np.ndarray, np.ndarray]]:
    """Row ``row`` for block ``index`` (module docstring, 1): the new block, and its log-weights and K+
    per particle (what the client gathers)."""
    observed = None if data.mask is None else data.mask[row]
    new, log_w = config.propagate(block, data.X[row], observed, stream(config.seed, "propagate", row, index))
    return new, (log_w, new.n_features)


def move_task(config: ParticleConfig, block: ibp_prior.IBPParticles, data: DenseRows, row: int,
              index: int) -> ibp_prior.IBPParticles:
    """Block ``index`` after the resampling at row ``row``, moved (``ParticleConfig.move``; module docstring, 4)."""
    return config.move(block, data.X, data.mask, stream(config.seed, "move", row, index))


def ancestor_blocks(*blocks: ibp_prior.IBPParticles) -> tuple[ibp_prior.IBPParticles, ...]:
    """The source blocks a destination block draws its particles from, brought together (``Engine.regroup``)."""
    return blocks


def rebuild_task(sources: tuple[ibp_prior.IBPParticles, ...], picks: list[np.ndarray]) -> ibp_prior.IBPParticles:
    """A destination block: the particles ``picks[s]`` of every source block ``sources[s]``, in ancestor
    order (module docstring, 3)."""
    return concatenate_blocks([select_particles(block, index) for block, index in zip(sources, picks)])


def summary_task(config: ParticleConfig, block: ibp_prior.IBPParticles, weights: np.ndarray) -> ibp_summary.Summary:
    """The weighted sums of one block under the globally normalised final weights."""
    return ibp_summary.summarise(block.Z, config.features(block), weights)


def block_bounds(particles: int, blocks: int) -> np.ndarray:
    """Start of every block and the end, (B + 1,), for P particles in min(B, P) near-equal blocks."""
    n_blocks = min(blocks, particles)
    return (particles * np.arange(n_blocks + 1)) // n_blocks


def resampling_plan(ancestors: np.ndarray, bounds: np.ndarray) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """For every destination block: the source blocks its ancestors are in (ascending) and, per source, the
    ancestors' indices within it (module docstring, 3)."""
    source, index = ancestor_locations(ancestors, np.diff(bounds))
    groups, picks = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        src, idx = source[lo:hi], index[lo:hi]
        sources = np.unique(src)
        groups.append([int(s) for s in sources])
        picks.append([idx[src == s] for s in sources])
    return groups, picks


# ----- the driver -----

@dataclass
class ParticleState(DriverState):
    """The client-side values of the particle filter: the particles' weights (P,), the log-evidence estimate
    and the number of rows done (the particles are the named state ``PARTICLES``)."""

    weights: np.ndarray
    log_evidence: float = 0.0
    rows_done: int = 0

    def __post_init__(self) -> None:
        self.weights = np.asarray(self.weights, np.float64)
        self.log_evidence, self.rows_done = float(self.log_evidence), int(self.rows_done)


class ParticleDriver(StatefulDriver):
    """The distributed particle filter (module docstring; the Driver protocol of ``engine.loop``)."""

    state_type = ParticleState

    def __init__(self, config: ParticleConfig, source: Source, engine: Engine, label: str = "pf"):
        config.check()
        self.config, self.source, self.engine, self.label = config, source, engine, label
        self.rows = read_dense_rows(source, config.BINARY)
        self.n_rows = self.rows.n_rows
        self.data = engine.share(self.rows)
        self.bounds = block_bounds(config.particles, config.blocks)
        self.uniforms = stream(config.seed, "resample").random(self.n_rows)
        self.state = ParticleState(np.full(config.particles, 1.0 / config.particles))

    @property
    def n_blocks(self) -> int:
        return self.bounds.size - 1

    def start(self) -> None:
        """Empty blocks of particles with room for every row."""
        n_cols, masked = self.rows.X.shape[1], self.rows.mask is not None
        self.engine.keep(PARTICLES, self.engine.generate(self.config.empty_block,
                                                         [(int(size), self.n_rows, n_cols, masked)
                                                          for size in np.diff(self.bounds)]))

    def continue_from(self, blocks: list[ibp_prior.IBPParticles], arrays: dict) -> None:
        """Start from the given particle blocks and globals (``global_arrays``) instead of empty blocks: the
        estimators' ``partial_fit`` and ``score`` continue a fitted filter through more rows."""
        self.set_globals(arrays)
        self.engine.keep(PARTICLES, self.engine.from_values(blocks))

    def particle_blocks(self) -> list[ibp_prior.IBPParticles]:
        """Every block of particles, brought here (in block order)."""
        return self.engine.collect(self.engine.state(PARTICLES))

    def total_steps(self) -> int:
        return self.n_rows

    def finished(self, step: int, trace: list[dict]) -> bool:
        return step >= self.n_rows

    def set_globals(self, arrays: Mapping[str, Any]) -> None:
        """The globals of a checkpoint; the rows are shared again, in case the worker that held them was lost."""
        super().set_globals(arrays)
        self.data = self.engine.share(self.rows)

    def step(self, step: int) -> dict:
        """Row ``step``: propagate and weight every block, then resample globally (module docstring)."""
        engine = self.engine
        blocks, weighed = engine.split(engine.map(propagate_task, self.config, engine.state(PARTICLES), self.data,
                                                  step, engine.indices(self.n_blocks)), 2)
        log_w, k_plus = (np.concatenate(parts) for parts in zip(*engine.collect(weighed)))
        with np.errstate(divide="ignore"):
            log_prior = np.log(self.state.weights)
        weights, log_mean = normalise_log_weights(log_prior + log_w)
        # log sum_l W_l p(x_i, z_il | past) / q
        log_evidence = self.state.log_evidence + log_mean + np.log(weights.size)
        ess = effective_sample_size(weights)
        resample = step + 1 < self.n_rows and ess < self.config.ess_threshold * weights.size
        record = {"ess": ess, "k_plus": float(weights @ k_plus), "log_evidence": log_evidence,
                  "resampled": float(resample)}
        if resample:
            groups, picks = resampling_plan(systematic_resample(weights, float(self.uniforms[step])), self.bounds)
            blocks = engine.map(rebuild_task, engine.regroup(ancestor_blocks, blocks, groups), engine.from_values(picks))
            if self.config.moves:
                blocks = engine.map(move_task, self.config, blocks, self.data, step, engine.indices(self.n_blocks))
            weights = np.full(weights.size, 1.0 / weights.size)
        engine.keep(PARTICLES, blocks)
        self.state = ParticleState(weights, log_evidence, step + 1)
        return record

    def posterior(self) -> dict[str, np.ndarray]:
        """The filter's posterior expectations after every row (``ibp_summary.finalise``)."""
        if self.state.rows_done < self.n_rows:
            raise UserError("the particle filter has not processed every row yet (resume the run)")
        parts = [self.state.weights[lo:hi] for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]
        weights = self.engine.from_values(parts)
        sums = self.engine.map(summary_task, self.config, self.engine.state(PARTICLES), weights)
        return ibp_summary.finalise(self.engine.reduce(sums, ibp_summary.merge))

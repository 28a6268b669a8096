"""Particle filters for IBP matrix factorization on the engine (SPEC 2, 3.3; paper 001 Algs. 2-3).

The P particles are split into a fixed number of blocks (config ``blocks``, independent of the
workers); block states are futures. One engine step processes one row i of X:

1. every block propagates its particles through row i and weights them, block-locally, with the
   generator ``stream(seed, "propagate", i, b)`` (``propagate_task``);
2. the client gathers the incremental log-weights of all blocks in block order and multiplies
   them into the particles' weights; unless i is the last row, it resamples globally (systematic,
   ``kernels.resampling``, with the i-th of the uniforms drawn once from ``stream(seed, "resample")``)
   when the effective sample size is below ``ess_threshold`` P, and otherwise keeps the weights
   (adaptive resampling: the weighted particles stay an exact importance sample, and rows with
   even weights lose no diversity);
3. after a resampling each destination block is rebuilt as a task from the slices of its ancestors'
   blocks (``rebuild_task``): systematic ancestors are sorted, so particles only move between
   neighbouring blocks; the weights become uniform.

Nothing depends on the number of workers, so a fit gives the same numbers on 1 worker or 8. After
the last row the weighted summaries of the blocks (``ibp_summary``) under the final weights are
tree-reduced in block order. A checkpoint holds every block's arrays, the weights, the row index
and the log-evidence; a finished run also holds its summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from buffet.data.errors import UserError
from buffet.data.store import DenseRows, check_values
from buffet.kernels import ibp_prior
from buffet.kernels.pf_linear_gaussian import LGParticles, init_lg_particles, pf_linear_gaussian_step
from buffet.kernels.pf_noisy_or import (NoisyORParams, NoisyORParticles, init_noisy_or_particles,
                                        pf_noisy_or_step)
from buffet.kernels.pf_proposals import PROPOSALS
from buffet.kernels.resampling import (ancestor_locations, concatenate_blocks, effective_sample_size,
                                       normalise_log_weights, select_particles, systematic_resample)
from buffet.pipeline.models import ibp_summary as ibp_summary
from buffet.pipeline.engine.blocks import Source, resolve
from buffet.pipeline.engine.executors import Executor, pick, tree_reduce
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import checkpoint_option, option, require_counts, require_positive


def read_dense_rows(source: Source, binary: bool) -> DenseRows:
    """All rows of a dense dataset (read once; SPEC 3.3 data), checked for a binary model if ``binary``."""
    ds = resolve(source)
    if ds.layout != "dense":
        raise UserError(f"{source}: the IBP models need a dense dataset (real or binary)")
    rows = ds.read_rows(0, ds.n_rows)
    if binary:
        check_values("binary", rows.X, str(source), rows.mask)
    return rows


def check_noisy_or(config: object) -> None:
    """p, lam and eps of a noisy-OR config must lie in (0, 1) (paper 001 eq. 8)."""
    for name in ("p", "lam", "eps"):
        if not 0.0 < getattr(config, name) < 1.0:
            raise UserError(f"{name} must be in (0, 1), got {getattr(config, name)}")


# The noisy-OR parameters' help, shared by the particle filter and the Gibbs sampler (paper 001 eq. 8).
NOISY_OR_HELP = {
    "p": "Prior probability p that a feature is linked to a column, y_kd = 1, in (0, 1). Raise it if features "
         "should switch on many columns each.",
    "lam": "Probability lambda that one active, linked feature turns an entry on, in (0, 1). Lower it for noisier "
           "data in which features often fail to show.",
    "eps": "Leak probability epsilon that an entry is on with no active feature, in (0, 1). Raise it for data "
           "with many spurious ones.",
}


# ----- configs: the settings and the model-specific kernel calls -----

@dataclass
class ParticleConfig:
    """Settings shared by both particle filters (SPEC 3.3; resampling as in the module docstring)."""

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

    BINARY: ClassVar[bool] = False
    BLOCK_CLS: ClassVar[type] = ibp_prior.IBPParticles

    def check(self) -> None:
        require_counts(self, ("particles", "blocks", "checkpoint_every"))
        require_positive(self, ("alpha",))
        if not 0.0 <= self.ess_threshold <= 1.0:
            raise UserError(f"ess_threshold must be in [0, 1], got {self.ess_threshold}")

    def empty_block(self, size: int, n_rows: int, n_cols: int, masked: bool) -> ibp_prior.IBPParticles:
        """A block of ``size`` particles with no rows yet (each model's config implements it)."""
        raise NotImplementedError

    def propagate(self, block: ibp_prior.IBPParticles, x: np.ndarray, observed: np.ndarray | None,
                  rng: np.random.Generator) -> tuple[ibp_prior.IBPParticles, np.ndarray]:
        """The model's kernel step for row x: the new block and incremental log-weights (SPEC 3.3)."""
        raise NotImplementedError

    def features(self, block: ibp_prior.IBPParticles) -> np.ndarray:
        """The per-particle feature matrix summarised as E[A] (L, Kc, D)."""
        raise NotImplementedError


@dataclass
class LGParticleConfig(ParticleConfig):
    """Collapsed linear-Gaussian filter (paper 001 Alg. 2); the proposals are ``kernels.pf_proposals``'
    (the comparison on the figure-3 images is in benchmarks/README.md)."""

    sigma_x: float = option(1.0, "Noise standard deviation sigma_X of X = Z A + noise, in the data's units (> 0), "
                                 "held fixed. Set it to the noise level of the data; too small invents features.")
    sigma_a: float = option(1.0, "Prior standard deviation sigma_A of the feature values A, in the data's units "
                                 "(> 0), held fixed. Set it to the typical size of a feature's effect.")
    proposal: str = option("guided", "Proposal of a row's features z_i: 'prior' (the paper's IBP prior) or "
                                     "'guided' (weighs each existing feature by how well it explains x_i; it had the "
                                     "lower error at equal time on the paper's images).")

    BLOCK_CLS: ClassVar[type] = LGParticles

    def check(self) -> None:
        super().check()
        require_positive(self, ("sigma_x", "sigma_a"))
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


@dataclass
class NoisyORParticleConfig(ParticleConfig):
    """Noisy-OR filter (paper 001 Alg. 3; the parameters of eq. 8, held fixed)."""

    p: float = option(0.1, NOISY_OR_HELP["p"])
    lam: float = option(0.9, NOISY_OR_HELP["lam"])
    eps: float = option(0.01, NOISY_OR_HELP["eps"])

    BINARY: ClassVar[bool] = True
    BLOCK_CLS: ClassVar[type] = NoisyORParticles

    def check(self) -> None:
        super().check()
        check_noisy_or(self)

    def empty_block(self, size: int, n_rows: int, n_cols: int, masked: bool) -> NoisyORParticles:
        return init_noisy_or_particles(size, n_rows, n_cols)

    def propagate(self, block: NoisyORParticles, x: np.ndarray, observed: np.ndarray | None,
                  rng: np.random.Generator) -> tuple[NoisyORParticles, np.ndarray]:
        return pf_noisy_or_step(block, x, self.alpha, NoisyORParams(self.p, self.lam, self.eps), rng, observed)

    def features(self, block: NoisyORParticles) -> np.ndarray:
        return block.Y                  # bool; ``ibp_summary.summarise`` converts after grouping


# ----- block tasks -----

def empty_block_task(config: ParticleConfig, size: int, data: DenseRows) -> ibp_prior.IBPParticles:
    n_rows, n_cols = data.X.shape
    return config.empty_block(size, n_rows, n_cols, data.mask is not None)


def propagate_task(config: ParticleConfig, block: ibp_prior.IBPParticles, data: DenseRows, row: int,
                   index: int) -> tuple[ibp_prior.IBPParticles, np.ndarray, np.ndarray]:
    """Row ``row`` for block ``index`` (module docstring, 1): new block, log-weights, K+ per particle."""
    observed = None if data.mask is None else data.mask[row]
    new, log_w = config.propagate(block, data.X[row], observed, stream(config.seed, "propagate", row, index))
    return new, log_w, new.n_features


def rebuild_task(parts: list[tuple[ibp_prior.IBPParticles, np.ndarray]]) -> ibp_prior.IBPParticles:
    """A destination block from (source block, particle indices) pairs in ancestor order (module docstring, 3)."""
    return concatenate_blocks([select_particles(block, index) for block, index in parts])


def summary_task(config: ParticleConfig, block: ibp_prior.IBPParticles, weights: np.ndarray) -> ibp_summary.Summary:
    """The weighted sums of one block under the globally normalised final weights (SPEC 3.3)."""
    return ibp_summary.summarise(block.Z, config.features(block), weights)


def block_arrays_task(block: ibp_prior.IBPParticles) -> dict[str, np.ndarray]:
    """The per-particle arrays of a block, for a checkpoint."""
    return {name: getattr(block, name) for name in block.FEATURE_AXES}


def block_from_arrays(block_cls: type, arrays: dict[str, np.ndarray], n_rows: int) -> ibp_prior.IBPParticles:
    """The block ``block_arrays_task`` saved (restoring a checkpoint)."""
    return block_cls(n_rows=n_rows, **arrays)


def block_bounds(particles: int, blocks: int) -> np.ndarray:
    """Start of every block and the end, (B + 1,), for P particles in min(B, P) near-equal blocks."""
    n_blocks = min(blocks, particles)
    return (particles * np.arange(n_blocks + 1)) // n_blocks


# ----- the driver -----

class ParticleDriver:
    """The distributed particle filter (module docstring; the Driver protocol of fitloop)."""

    def __init__(self, config: ParticleConfig, source: Source, executor: Executor, label: str = "pf"):
        config.check()
        self.config, self.source, self.executor, self.label = config, source, executor, label
        rows = read_dense_rows(source, config.BINARY)
        self.n_rows = rows.n_rows
        self.data = executor.broadcast(rows)
        self.bounds = block_bounds(config.particles, config.blocks)
        self.blocks: list = []
        self.log_evidence = 0.0
        self.weights = np.full(config.particles, 1.0 / config.particles)
        self.uniforms = stream(config.seed, "resample").random(self.n_rows)
        self.summary: ibp_summary.Summary | None = None
        self._t_start = time.perf_counter()

    def start(self) -> None:
        self.blocks = [self.executor.submit(empty_block_task, self.config, int(size), self.data)
                       for size in np.diff(self.bounds)]

    def total_steps(self) -> int:
        return self.n_rows

    def finished(self, step: int, trace: list[dict]) -> bool:
        return step >= self.n_rows

    def step(self, step: int) -> dict:
        """Row ``step``: propagate and weight every block, then resample globally (module docstring)."""
        results = [self.executor.submit(propagate_task, self.config, block, self.data, step, b)
                   for b, block in enumerate(self.blocks)]
        blocks = [self.executor.submit(pick, r, 0) for r in results]
        log_w = self.executor.gather([self.executor.submit(pick, r, 1) for r in results])
        k_plus = self.executor.gather([self.executor.submit(pick, r, 2) for r in results])
        self.executor.release(results)
        with np.errstate(divide="ignore"):
            log_prior = np.log(self.weights)
        self.weights, log_mean = normalise_log_weights(log_prior + np.concatenate(log_w))
        self.log_evidence += log_mean + np.log(self.weights.size)    # log sum_l W_l p(x_i, z_il | past) / q
        ess = effective_sample_size(self.weights)
        record = {"row": step + 1, "ess": ess, "k_plus": float(self.weights @ np.concatenate(k_plus)),
                  "log_evidence": self.log_evidence}
        resample = step + 1 < self.n_rows and ess < self.config.ess_threshold * self.weights.size
        if resample:
            self.blocks = self._resample(blocks, step)
            self.weights = np.full(self.weights.size, 1.0 / self.weights.size)
        else:
            self.blocks = blocks
        record["resampled"] = float(resample)
        if step + 1 >= self.n_rows:
            self.summary = self._summarise()
        record["seconds"] = time.perf_counter() - self._t_start
        return record

    def _resample(self, blocks: list, row: int) -> list:
        """Global systematic resampling; destination blocks rebuilt from ancestor slices as tasks."""
        ancestors = systematic_resample(self.weights, float(self.uniforms[row]))
        source, index = ancestor_locations(ancestors, np.diff(self.bounds))
        rebuilt = []
        for lo, hi in zip(self.bounds[:-1], self.bounds[1:]):
            src, idx = source[lo:hi], index[lo:hi]
            parts = [(blocks[s], idx[src == s]) for s in np.unique(src)]
            rebuilt.append(self.executor.submit(rebuild_task, parts))
        self.executor.release(blocks)
        return rebuilt

    def _summarise(self) -> ibp_summary.Summary:
        """Block summaries under the final weights, tree-reduced in block order (SPEC 3.3)."""
        parts = [self.executor.submit(summary_task, self.config, block, self.weights[lo:hi])
                 for block, lo, hi in zip(self.blocks, self.bounds[:-1], self.bounds[1:])]
        return self.executor.gather(tree_reduce(self.executor, parts, ibp_summary.merge))

    def posterior(self) -> dict[str, np.ndarray]:
        """The finished filter's posterior expectations (``ibp_summary.finalise``)."""
        if self.summary is None:
            raise UserError("the particle filter has not processed every row yet (resume the run)")
        return ibp_summary.finalise(self.summary)

    # -- checkpoints --
    def save(self, run: RunStore, step: int, trace: list[dict]) -> None:
        folder = run.new_checkpoint_dir(step)
        run.commit_checkpoint(folder, step, self.state_arrays(step), {"trace": trace})

    def state_arrays(self, step: int) -> dict[str, np.ndarray]:
        """The filter after ``step`` rows as plain arrays (what a checkpoint holds and ``restore`` reads)."""
        arrays = {"log_evidence": np.float64(self.log_evidence), "rows_done": np.int64(step),
                  "weights": self.weights}
        saved = self.executor.gather([self.executor.submit(block_arrays_task, b) for b in self.blocks])
        for b, block in enumerate(saved):
            arrays.update({f"block{b}_{name}": value for name, value in block.items()})
        if self.summary is not None:
            arrays.update(ibp_summary.to_arrays(self.summary, "summary_"))
        return arrays

    def restore(self, arrays: dict[str, np.ndarray], folder: object) -> None:
        """Blocks, weights, log-evidence and (for a finished run) the summary from a checkpoint."""
        block_cls = self.config.BLOCK_CLS
        self.blocks = [self.executor.submit(block_from_arrays, block_cls,
                                            {n: arrays[f"block{b}_{n}"] for n in block_cls.FEATURE_AXES},
                                            int(arrays["rows_done"]))
                       for b in range(self.bounds.size - 1)]
        self.log_evidence = float(arrays["log_evidence"])
        self.weights = arrays["weights"]
        if ibp_summary.has_summary(arrays, "summary_"):
            self.summary = ibp_summary.from_arrays(arrays, "summary_")

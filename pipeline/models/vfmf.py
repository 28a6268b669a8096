"""VFMF and TVIMF on the engine: IMF's alternation at a fixed truncation T from random starts, keeping the
start with the best bound (as paper 000 kept the best of several random restarts; docs/models/comparators.md).

Each engine step is one alternation: the client updates the column posteriors (q(pi) or q(y), q(v); q(A);
q(eta)) from the reduced statistics, the row blocks update q(z) and return new statistics, and the bound
is recorded. When the bound stops changing, the restart is over: its state is kept if its bound is the
best so far, and the next restart draws a new q(z). q(z) starts at nu_ik uniform on (0.05, 0.95), drawn
by a hash of (restart key, row, feature) (``data.splits.entry_uniforms``), so any chunking of the rows
draws the same start; the key of restart r comes from ``seeds.stream(seed, purpose, r)``.

State: q(z) is the named per-block state "nu"; the driver's client-side values are one ``VFMFState``.
The best finished restart is its ``best`` (its bound, column posteriors and statistics) plus its q(z)
as the named state "best_nu", dropped when the last restart is done and the best state is made current.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from buffet.data.errors import UserError
from buffet.data.splits import entry_uniforms
from buffet.data.store import DenseRows
from buffet.kernels import imf, vfmf
from buffet.pipeline.engine.dataset import ArrayRows, Source, dense_blocks, row_ranges, source_of
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import checkpoint_option, option, require_counts, require_positive, split_option
from buffet.pipeline.models.imf import Converged, no_offsets_task, predict_task, saved_dict, saved_from, target_rows
from buffet.pipeline.models.state import DriverState, StatefulDriver

USED_ROWS = 0.5  # a feature counts as used when sum_i nu_ik is at least this (IMF's default pruning threshold)


@dataclass
class VFMFConfig:
    """Settings of a VFMF fit (the finite Beta-Bernoulli comparator)."""

    truncation: int = option(10, "Number of features T the model has (>= 1); features the data do not need end "
                                 "with sum_i nu_ik near 0. Paper 000 used 4 to 10; raise it if every feature is "
                                 "used.")
    alpha: float = option(1.0, "Concentration alpha (> 0) of the prior on feature probabilities: Beta(alpha/T, 1) "
                               "for VFMF, stick-breaking Beta(alpha, 1) for TVIMF. Larger favours more features.")
    restarts: int = option(5, "Random starts of q(z) (>= 1); the one with the best bound is kept. The bound has "
                              "many local optima, so one start is often not enough.")
    seed: int = option(0, "Seed of the random starts of q(z); the same seed gives the same fit on any cluster "
                          "and any --chunk-rows.")
    chunk_rows: int = option(1000, "Rows per row chunk, one task per chunk and step; q(z) stays on the workers "
                                   "in these chunks. Larger chunks mean less task overhead, smaller more parallelism.")
    tol: float = option(1e-6, "A restart has converged when the bound changes by at most this fraction of its "
                              "value (> 0). Smaller runs longer per restart for a tighter fit.")
    max_iter: int = option(500, "Most alternations per restart before it counts as converged (>= 1). Raise it "
                                "if the trace shows the bound still rising.")
    checkpoint_every: int = checkpoint_option(50, "steps")
    split: str | None = split_option("entries")

    def check(self) -> None:
        require_counts(self, ("truncation", "restarts", "chunk_rows", "max_iter", "checkpoint_every"))
        require_positive(self, ("alpha", "tol"))

    def prior(self) -> vfmf.Prior:
        return vfmf.VFMF


@dataclass
class TVIMFConfig(VFMFConfig):
    """Settings of a TVIMF fit (the truncated stick-breaking comparator): VFMF's."""

    def prior(self) -> vfmf.Prior:
        return vfmf.TVIMF


# ----- block tasks -----

def initial_nu_task(key: int, r0: int, r1: int, truncation: int) -> np.ndarray:
    return vfmf.initial_nu(entry_uniforms(key, r0, r1, truncation))


def row_task(rows: DenseRows, nu: np.ndarray, post: dict, prior: str) -> tuple[np.ndarray, dict]:
    return vfmf.row_step(rows.X, rows.mask, nu, post, vfmf.PRIORS[prior])


def stats_task(rows: DenseRows, nu: np.ndarray) -> dict:
    return imf.chunk_stats(rows.X, rows.mask, nu)


def restart_key(seed: int, purpose: str, restart: int) -> int:
    """The hash key of restart ``restart``'s random q(z) (module docstring)."""
    return int(stream(seed, purpose, restart).integers(2 ** 63))


# ----- the driver -----

@dataclass
class VFMFState(DriverState):
    """The client-side values of a VFMF/TVIMF fit: the current column posteriors and statistics, the best
    finished restart (None before one), the (restart, converged bound) of every finished restart, and where
    the alternation of the current restart is. A checkpoint holds the best restart as IMF holds its saved
    states (``models.imf.saved_dict``)."""

    post: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    best: Converged | None = None
    history: list[tuple[int, float]] = field(default_factory=list)
    restart: int = 0
    previous: float = -np.inf
    iter_in_restart: int = 0
    done: bool = False

    def to_arrays(self) -> dict[str, Any]:
        return {**super().to_arrays(), "best": saved_dict(self.best)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> "VFMFState":
        return super().from_arrays({**arrays, "best": saved_from(arrays["best"])})


class VariationalDriver(StatefulDriver):
    """VFMF/TVIMF with random restarts on an engine (module docstring; ``engine.loop.Driver``)."""

    state_type = VFMFState

    def __init__(self, config: VFMFConfig, source: Source, engine: Engine):
        config.check()
        ds = source.open()
        if ds.layout != "dense":
            raise UserError(f"{source}: {config.prior().name.upper()} needs a dense dataset (real or binary), "
                            f"got layout {ds.layout}")
        self.config, self.source, self.engine = config, source, engine
        self.split = config.split if config.split in ds.split_names() else None
        self.prior, self.hyper = config.prior(), imf.Hyper(alpha=config.alpha)
        self.label = self.prior.name
        self.ranges = row_ranges(ds.n_rows, config.chunk_rows)
        self.blocks = engine.hold(dense_blocks(engine, source, self.ranges, self.split))
        self.state = VFMFState()

    # -- the driver contract --
    def start(self) -> None:
        self._start_restart()

    def total_steps(self) -> int | None:
        return None

    def finished(self, step: int, trace: list[dict]) -> bool:
        return self.state.done

    def step(self, step: int) -> dict:
        engine, state = self.engine, self.state
        state.post = vfmf.column_update(state.stats, self.hyper, state.post, self.prior)
        nu, stats = engine.split(engine.map(row_task, self.blocks, engine.state("nu"), engine.share(state.post),
                                            self.prior.name), 2)
        engine.keep("nu", nu)
        state.stats = engine.reduce(stats)
        bound = self.bound()
        state.iter_in_restart += 1
        record = {"restart": state.restart + 1, "evidence": bound, "k_used": self.k_used}
        if abs(bound - state.previous) <= self.config.tol * abs(bound) or state.iter_in_restart >= self.config.max_iter:
            record["converged_restart"] = state.restart + 1
            self._settle(bound)
        else:
            state.previous = bound
        return record

    # -- restarts --
    def _start_restart(self) -> None:
        """A new random q(z) for the current restart and the column posteriors that go with it."""
        engine, state, t = self.engine, self.state, self.config.truncation
        key = restart_key(self.config.seed, f"{self.label}-init", state.restart)
        engine.keep("nu", engine.generate(initial_nu_task, [(key, r0, r1, t) for r0, r1 in self.ranges]))
        state.stats = engine.reduce(engine.map(stats_task, self.blocks, engine.state("nu")))
        state.post = vfmf.initial_post(state.stats, self.hyper, self.prior)
        state.previous, state.iter_in_restart = -np.inf, 0

    def _settle(self, bound: float) -> None:
        """The restart has converged: keep it if it is the best so far, then start the next or finish."""
        state = self.state
        state.history.append((state.restart + 1, bound))
        if state.best is None or bound > state.best.evidence:
            state.best = Converged(bound, state.post, state.stats)
            self.engine.keep("best_nu", self.engine.state("nu"))
        state.restart += 1
        if state.restart < self.config.restarts:
            self._start_restart()
            return
        self._load_best()
        self.engine.drop("best_nu")
        state.done = True

    def _load_best(self) -> None:
        self.state.post, self.state.stats = self.state.best.post, self.state.best.stats
        self.engine.keep("nu", self.engine.state("best_nu"))

    def adopt_best(self) -> None:
        """Make the best finished restart current, if a stopped run has one (a finished run has made it
        current already; a run stopped in its first restart reports where it is)."""
        if self.state.best is not None and not self.state.done:
            self._load_best()

    # -- results --
    @property
    def k_used(self) -> int:
        """Features with sum_i nu_ik >= ``USED_ROWS``."""
        return int(imf.keep_features(self.state.stats["sum_nu"], USED_ROWS).sum())

    def bound(self) -> float:
        """The bound of the current state."""
        return vfmf.evidence(self.state.stats, self.state.post, self.hyper, self.prior)

    def expected_z(self) -> np.ndarray:
        """E[Z] (N x T) of the current state, rows in order."""
        return np.concatenate(self.engine.collect(self.engine.state("nu")))

    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """E[Z] E[A] and the truths at every held-out entry of the split (row order)."""
        if not self.split:
            raise UserError(f"{self.source}: no held-out entries to evaluate (ingest with --holdout)")
        engine = self.engine
        targets = engine.generate(target_rows, [(self.source.part(r0, r1), r0, r1, self.split, None)
                                                for r0, r1 in self.ranges])
        zeros = engine.map(no_offsets_task, self.blocks)
        parts = engine.collect(engine.map(predict_task, targets, engine.state("nu"), zeros,
                                         engine.share(self.state.post["m"]), np.zeros(self.state.post["m"].shape[0])))
        return np.concatenate([p for p, _ in parts]), np.concatenate([t for _, t in parts])


def fit_to_end(config: VFMFConfig, data: str | ArrayRows | Source, engine: Engine | None = None) -> VariationalDriver:
    """VFMF/TVIMF fitted to the end without a run folder, on ``engine`` (default: this process)."""
    driver = VariationalDriver(config, source_of(data), ProcessEngine() if engine is None else engine)
    driver.start()
    run_loop(driver, None, Position(), config.checkpoint_every, quiet=True)
    return driver

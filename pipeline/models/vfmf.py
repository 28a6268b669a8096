"""VFMF and TVIMF on the engine: IMF's alternation at a fixed truncation T from random starts, keeping the
start with the best bound (SPEC 2, 3.8; paper 000 kept the best of several random restarts).

Each engine step is one alternation: the client updates the column posteriors (q(pi) or q(y), q(v); q(A);
q(eta)) from the reduced statistics, the row blocks update q(z) and return new statistics, and the bound
is recorded. When the bound stops changing, the restart is over: its state is kept if its bound is the
best so far, and the next restart draws a new q(z). q(z) starts at nu_ik uniform on (0.05, 0.95), drawn
by a hash of (restart key, row, feature) (``data.splits.entry_uniforms``), so any chunking of the rows
draws the same start; the key of restart r comes from ``seeds.stream(seed, purpose, r)``.

State: q(z) is the named per-block state "nu"; the best finished restart is "best" in the driver's
globals (its bound, column posteriors and statistics) plus its q(z) as the named state "best_nu",
dropped when the last restart is done and the best state is made current.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from buffet.data.errors import UserError
from buffet.data.splits import entry_uniforms
from buffet.data.store import DenseRows
from buffet.kernels import imf, vfmf
from buffet.pipeline.engine.dataset import ArrayRows, Source, dense_blocks, row_ranges, source_of
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import checkpoint_option, option, require_counts, require_positive, split_option
from buffet.pipeline.models.imf import no_offsets_task, predict_task, target_rows

USED_ROWS = 0.5  # a feature counts as used when sum_i nu_ik is at least this (IMF's default pruning threshold)


@dataclass
class VFMFConfig:
    """Settings of a VFMF fit (SPEC 3.8, the finite Beta-Bernoulli comparator)."""

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
    """Settings of a TVIMF fit (SPEC 3.8, the truncated stick-breaking comparator): VFMF's."""

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

GLOBALS = ("post", "stats", "best", "history", "restart", "previous", "iter_in_restart", "done")


class VariationalDriver:
    """VFMF/TVIMF with random restarts on an engine (module docstring; ``engine.loop.Driver``)."""

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
        self.post: dict = {}
        self.stats: dict = {}
        self.best: dict = {"evidence": -np.inf}
        self.history: list[tuple[int, float]] = []  # (restart, converged bound) of every finished restart
        self.restart = 0
        self.previous = -np.inf
        self.iter_in_restart = 0
        self.done = False

    # -- the driver contract --
    def start(self) -> None:
        self._start_restart()

    def global_arrays(self) -> dict:
        return {name: getattr(self, name) for name in GLOBALS}

    def set_globals(self, arrays: dict) -> None:
        for name in GLOBALS:
            setattr(self, name, arrays[name])

    def total_steps(self) -> int | None:
        return None

    def finished(self, step: int, trace: list[dict]) -> bool:
        return self.done

    def step(self, step: int) -> dict:
        engine = self.engine
        self.post = vfmf.column_update(self.stats, self.hyper, self.post, self.prior)
        nu, stats = engine.split(engine.map(row_task, self.blocks, engine.state("nu"), engine.share(self.post),
                                            self.prior.name), 2)
        engine.keep("nu", nu)
        self.stats = engine.reduce(stats)
        bound = self.bound()
        self.iter_in_restart += 1
        record = {"restart": self.restart + 1, "evidence": bound, "k_used": self.k_used}
        if abs(bound - self.previous) <= self.config.tol * abs(bound) or self.iter_in_restart >= self.config.max_iter:
            record["converged_restart"] = self.restart + 1
            self._settle(bound)
        else:
            self.previous = bound
        return record

    # -- restarts --
    def _start_restart(self) -> None:
        """A new random q(z) for the current restart and the column posteriors that go with it."""
        engine, t = self.engine, self.config.truncation
        key = restart_key(self.config.seed, f"{self.label}-init", self.restart)
        engine.keep("nu", engine.generate(initial_nu_task, [(key, r0, r1, t) for r0, r1 in self.ranges]))
        self.stats = engine.reduce(engine.map(stats_task, self.blocks, engine.state("nu")))
        self.post = vfmf.initial_post(self.stats, self.hyper, self.prior)
        self.previous, self.iter_in_restart = -np.inf, 0

    def _settle(self, bound: float) -> None:
        """The restart has converged: keep it if it is the best so far, then start the next or finish."""
        self.history.append((self.restart + 1, bound))
        if bound > self.best["evidence"]:
            self.best = {"evidence": bound, "post": self.post, "stats": self.stats}
            self.engine.keep("best_nu", self.engine.state("nu"))
        self.restart += 1
        if self.restart < self.config.restarts:
            self._start_restart()
            return
        self._load_best()
        self.engine.drop("best_nu")
        self.done = True

    def _load_best(self) -> None:
        self.post, self.stats = self.best["post"], self.best["stats"]
        self.engine.keep("nu", self.engine.state("best_nu"))

    def adopt_best(self) -> None:
        """Make the best finished restart current, if a stopped run has one (a finished run has made it
        current already; a run stopped in its first restart reports where it is)."""
        if "post" in self.best and not self.done:
            self._load_best()

    # -- results --
    @property
    def k_used(self) -> int:
        """Features with sum_i nu_ik >= ``USED_ROWS``."""
        return int(imf.keep_features(self.stats["sum_nu"], USED_ROWS).sum())

    def bound(self) -> float:
        """The bound of the current state."""
        return vfmf.evidence(self.stats, self.post, self.hyper, self.prior)

    def expected_z(self) -> np.ndarray:
        """E[Z] (N x T) of the current state, rows in order."""
        return np.concatenate(self.engine.collect(self.engine.state("nu")))

    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """E[Z] E[A] and the truths at every held-out entry of the split (row order)."""
        if not self.split:
            raise UserError(f"{self.source}: no held-out entries to evaluate (ingest with --holdout)")
        engine = self.engine
        targets = engine.generate(target_rows, [(self.source.part(r0, r1, engine.local), r0, r1, self.split, None)
                                                for r0, r1 in self.ranges])
        zeros = engine.map(no_offsets_task, self.blocks)
        parts = engine.collect(engine.map(predict_task, targets, engine.state("nu"), zeros,
                                         engine.share(self.post["m"]), np.zeros(self.post["m"].shape[0])))
        return np.concatenate([p for p, _ in parts]), np.concatenate([t for _, t in parts])


def fit_to_end(config: VFMFConfig, data: str | ArrayRows | Source, engine: Engine | None = None) -> VariationalDriver:
    """VFMF/TVIMF fitted to the end without a run folder, on ``engine`` (default: this process)."""
    driver = VariationalDriver(config, source_of(data), Engine() if engine is None else engine)
    driver.start()
    run_loop(driver, None, Position(), config.checkpoint_every, quiet=True)
    return driver

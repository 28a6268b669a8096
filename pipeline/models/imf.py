"""IMF and INMF on the engine: per-row q(z) on row blocks, column posteriors from reduced sums,
and K+ chosen by evidence (paper 000, Algorithm 1; docs/models/imf.md and docs/models/inmf.md).

Each engine step is one alternation at the current K+: the client updates the column
posteriors from the reduced statistics, the row blocks update q(z) and return new statistics,
features whose usage falls below a threshold are pruned, and the evidence L(q; K+) is recorded.
When L stops changing, the state is compared with the best so far and, unless growth has
stopped paying, one feature is added: blocks reduce the residual's Gram matrix, the client
finds its ``n_candidates`` leading directions, and for each in turn the blocks project onto it,
the split of the projections initialises the new column of q(z) and the alternation runs to
convergence from there. After the directions comes the restart (``restart``, on by default): q(z) at
the new K+ from scratch, each column a binary source of a FastICA of the data (skewness contrast,
``kernels.imf.ica_step``), skipped when the ICA does not converge. The candidate with the best L is
the state at the new K+; a later candidate has to beat the leader by more than tol |L|, so that two
candidates reaching one optimum are decided the same way on any chunking (paper 000 Algorithm 1
grows from the previous state; trying several residual directions keeps one unlucky direction from
deciding K+, and the restart undoes what growth merged: the best single feature of a K+ = 1 fit to
planted data is a blend of several true ones, and later growth steps never split it).
Every row update first takes the row's best exchange of two features' q(z) (``kernels.imf.swap_rows``),
a move coordinate ascent cannot make between similar features.

State: q(z) is the named per-block state "nu"; the driver's client-side values are one
``IMFState``. The search keeps up to three saved states: "best", the best converged state so far;
"base", the converged state a growth step started from; "leader", the best candidate of the growth
step. Each is its evidence, column posteriors and statistics in the ``IMFState`` plus its q(z) as the
named state "<name>_nu", dropped when the state is no longer needed. The search itself is one loop
(``IMFDriver._search_loop``) that waits at each run for the alternation to converge. The search exists
once: the in-memory reference (``fit_to_end``) is this driver on an in-process engine over in-memory rows.

With ``offset_reg`` set (an extension of the paper's model, ``kernels.imf.remove_offsets``), row
and column offsets are fitted first by alternating ridge updates (row offsets on the blocks,
column offsets from reduced sums), the training blocks are centred by them, and predictions add
them back. They are a deterministic function of the training entries, so the driver fits them
when it is built (a resumed or restored run fits them again, to the same numbers) instead of
keeping them as state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Sequence

import numpy as np

from buffet.data.errors import UserError
from buffet.data.splits import EntrySample
from buffet.data.store import DenseRows
from buffet.kernels import imf, inmf
from buffet.pipeline.engine.dataset import (ArrayRows, Source, dense_blocks, read_dense_chunk, read_seen_chunk,
                                            row_ranges, source_of)
from buffet.pipeline.engine.engine import BlockSet, Engine
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.engine.selection import Candidate
from buffet.pipeline.engine.settings import (SelectionSettings, checkpoint_option, option, require_counts,
                                             require_positive, split_option)
from buffet.pipeline.models.state import DriverState, StatefulDriver

CAP_CHOICES = (2, 4, 8)  # caps on K+ tried below max_k when settings are chosen on validation
DEFAULT_OFFSET_REG = 1.0  # ridge strength of the offsets candidate when offset_reg is not given
OFFSET_SWEEPS = 20  # alternations of row and column offsets (ridge ALS converges in a few)


@dataclass
class IMFConfig(SelectionSettings):
    """Settings of an IMF fit (the K+ search of the module docstring). The row and column
    offsets of ``offset_reg`` extend the paper's model (``kernels.imf.remove_offsets``).
    """

    max_k: int = option(20, "Largest number of features K+ the search may reach (>= 1); growth stops there. "
                            "Raise it if the learned K+ equals it. With --select, the caps 8, 4 and 2 below it are "
                            "tried too.")
    alpha: float | None = option(None, "IBP concentration alpha (> 0; unset: learned under a Gamma(1, 1) "
                                       "hyperprior). Fix it to push the evidence towards more (larger) or fewer "
                                       "(smaller) features.")
    seed: int = option(0, "Seed of the validation folds of --select; the IMF/INMF fit itself draws no random "
                          "numbers (K+ grows from 0 along residual directions).")
    chunk_rows: int = option(1000, "Rows per row chunk, one task per chunk and step; q(z) stays on the workers "
                                   "in these chunks. Larger chunks mean less task overhead, smaller more parallelism.")
    tol: float = option(1e-6, "The alternation at one K+ has converged when the evidence changes by at most this "
                              "fraction of its value (> 0). Smaller runs longer per K+ for a tighter fit.")
    max_iter: int = option(300, "Most alternations at one K+ (and per candidate feature) before it counts as "
                                "converged (>= 1). Raise it if the trace shows the evidence still rising.")
    prune_below: float = option(0.5, "Drop a feature whose expected number of rows using it, sum_i nu_ik, falls "
                                     "below this (in rows). Raise it to discard rarely used features sooner.")
    patience: int = option(1, "Stop after this many growth steps in a row that fail to beat the best evidence "
                              "(>= 1). Raise it to look past a dip in the evidence as K+ grows.")
    checkpoint_every: int = checkpoint_option(50, "steps")
    split: str | None = split_option("entries")
    offset_reg: float | None = option(None, "Unset fits the paper's model. A value lambda > 0 first fits row and "
                                            "column offsets by ridge regression (an offset from n entries shrinks "
                                            "by n / (n + lambda)) and factorises what they leave: use it for "
                                            "ratings, or binary data whose rows differ much in density. With "
                                            "--select, offsets (at this strength, or 1) are tried against none.")
    n_candidates: int = option(3, "Residual directions tried for each new feature; the candidate with the best "
                                  "evidence is kept (>= 1). 1 is fastest; more keeps one unlucky start from "
                                  "deciding K+.")
    restart: bool = option(True, "At each growth step also try a fresh start at the new K+ from an ICA of the data "
                                 "(features that greedy growth merged come apart); the evidence decides. Off: "
                                 "growth only adds to the previous state.")

    def check(self) -> None:
        require_counts(self, ("max_k", "chunk_rows", "max_iter", "patience", "checkpoint_every", "n_candidates"))
        require_positive(self, ("alpha", "offset_reg"))
        self.check_selection()

    def model(self) -> imf.Model:
        return imf.IMF

    def hyper(self) -> imf.Hyper:
        return imf.Hyper(alpha=self.alpha)


@dataclass
class INMFConfig(IMFConfig):
    """Settings of an INMF fit: IMF's plus the EP schedule for the prior sites."""

    damping: float = option(0.7, "EP damping d in (0, 1]: a site moves the fraction d of the way to its new "
                                 "value (1: undamped). Lower it if the evidence oscillates or the fit stalls.")
    ep_sweeps: int = option(1, "EP passes over every prior site per update of the column posteriors (>= 1). "
                               "Raise it if the sites settle slowly; every pass adds to each update's cost.")

    def check(self) -> None:
        super().check()
        if not 0.0 < self.damping <= 1.0:
            raise UserError(f"damping must be in (0, 1], got {self.damping}")

    def model(self) -> imf.Model:
        return inmf.INMF

    def hyper(self) -> inmf.InmfHyper:
        return inmf.InmfHyper(alpha=self.alpha, damping=self.damping, ep_sweeps=self.ep_sweeps)


def structural_candidates(config: IMFConfig) -> list[Candidate]:
    """The settings chosen on validation entries (``engine.selection``), in order of preference: no offsets
    before offsets (at ``offset_reg``, or ``DEFAULT_OFFSET_REG``), and the cap on K+ from ``max_k`` down
    through ``CAP_CHOICES`` (K+ still grows by evidence up to the cap, so the largest cap is the paper's
    method). On sparse 0/1 matrices the linear-Gaussian evidence can keep adding features while held-out
    ranking gets worse, which is why the cap is chosen."""
    caps = [config.max_k] + [k for k in sorted(CAP_CHOICES, reverse=True) if k < config.max_k]
    strength = config.offset_reg or DEFAULT_OFFSET_REG
    return [Candidate(f"K+ <= {cap}{', offsets' if reg else ''}", {"max_k": cap, "offset_reg": reg}, cap="max_k")
            for reg in (None, strength) for cap in caps]


# ----- block tasks -----

def no_offsets_task(rows: DenseRows) -> np.ndarray:
    return np.zeros(rows.n_rows)


def row_offsets_task(rows: DenseRows, col_off: np.ndarray, reg: float) -> np.ndarray:
    return imf.row_offsets(rows.X, rows.mask, col_off, reg)


def column_offset_stats_task(rows: DenseRows, row_off: np.ndarray) -> dict:
    return imf.column_offset_stats(rows.X, rows.mask, row_off)


def centre_task(rows: DenseRows, row_off: np.ndarray, col_off: np.ndarray) -> DenseRows:
    return DenseRows(imf.remove_offsets(rows.X, rows.mask, row_off, col_off), rows.mask)


def empty_nu_task(rows: DenseRows) -> np.ndarray:
    return np.zeros((rows.n_rows, 0))


def row_task(rows: DenseRows, nu: np.ndarray, post: dict) -> tuple[np.ndarray, dict]:
    return imf.row_step(rows.X, rows.mask, nu, post, swaps=True)


def stats_task(rows: DenseRows, nu: np.ndarray) -> dict:
    return imf.chunk_stats(rows.X, rows.mask, nu)


def select_task(nu: np.ndarray, keep: np.ndarray) -> np.ndarray:
    return nu[:, keep]


def residual_stats_task(rows: DenseRows, nu: np.ndarray, m: np.ndarray) -> dict:
    return imf.gram_sums(imf.residual(rows.X, rows.mask, nu, m))


def data_stats_task(rows: DenseRows) -> dict:
    return imf.gram_sums(imf.observed(rows.X, rows.mask))


def whiten_task(rows: DenseRows, mean: np.ndarray, white: np.ndarray) -> np.ndarray:
    return (imf.observed(rows.X, rows.mask) - mean) @ white


def sources_task(white: np.ndarray, unmixing: np.ndarray) -> np.ndarray:
    return white @ unmixing.T


def binary_nu_task(y: np.ndarray, signs: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    return imf.new_feature_column(y, signs, thresholds)


def project_task(rows: DenseRows, nu: np.ndarray, m: np.ndarray, direction: np.ndarray) -> np.ndarray:
    return imf.residual(rows.X, rows.mask, nu, m) @ direction


def extend_task(nu: np.ndarray, p: np.ndarray, sign: float, threshold: float) -> np.ndarray:
    return np.column_stack([nu, imf.new_feature_column(p, sign, threshold)])


def target_rows(source: Source, r0: int, r1: int, split: str | None,
                sample: EntrySample | None) -> tuple[np.ndarray, np.ndarray]:
    """X of rows [r0, r1) and the entries a fit is scored on: those of the validation ``sample`` that
    training could see (observed, not held out by ``split``), or, without a sample, the held-out
    entries of ``split``."""
    x = read_dense_chunk(source, r0, r1)
    if sample is None:
        return x, source.open().read_split_rows(split, "test_mask", r0, r1)
    return x, read_seen_chunk(source, r0, r1, split, None) & sample.rows(r0, r1, x.shape[1])


def predict_task(target: tuple[np.ndarray, np.ndarray], nu: np.ndarray, row_off: np.ndarray, m: np.ndarray,
                 col_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior-mean predictions b_i + c_j + E[z_i] E[a_j] and truths for the target entries of a block
    (``target_rows``; offsets b, c are 0 unless fitted)."""
    x, entries = target
    return (nu @ m.T + row_off[:, None] + col_off[None, :])[entries], x[entries]


# ----- the driver -----

@dataclass
class Converged:
    """A state of the search kept for later (module docstring): its evidence, column posteriors and
    statistics; its q(z) is the named state "<name>_nu"."""

    evidence: float
    post: dict
    stats: dict


@dataclass
class Growth:
    """A growth step under way: the converged state it started from, its residual directions (D, directions),
    the candidate under way (``IMFDriver._n_candidates``) and the best candidate so far."""

    base: Converged
    directions: np.ndarray
    candidate: int = 0
    leader: Converged | None = None


@dataclass
class IMFState(DriverState):
    """The client-side values of the K+ search (module docstring): the current column posteriors and statistics,
    the evidence at every converged K+, the best converged state, the growth step under way, and where the
    alternation at the current K+ is.

    A checkpoint holds them under the names the search has always used (``to_arrays``): the saved states
    "best", "base" and "leader" as dicts of evidence, column posteriors and statistics ("base" empty and
    "leader" holding only the evidence -inf between growth steps), the growth step's ``directions`` (None
    between steps) and ``candidate``."""

    post: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    history: list[tuple[int, float]] = field(default_factory=list)
    best: Converged | None = None
    growth: Growth | None = None
    previous: float = -np.inf
    iter_in_k: int = 0
    failures: int = 0
    done: bool = False

    @property
    def best_evidence(self) -> float:
        """L of the best converged state; -inf before the first K+ has converged."""
        return -np.inf if self.best is None else self.best.evidence

    def to_arrays(self) -> dict[str, Any]:
        growth = self.growth
        return {"post": self.post, "stats": self.stats, "best": saved_dict(self.best),
                "base": {} if growth is None else saved_dict(growth.base),
                "leader": saved_dict(None if growth is None else growth.leader), "history": self.history,
                "previous": self.previous, "iter_in_k": self.iter_in_k, "failures": self.failures, "done": self.done,
                "directions": None if growth is None else growth.directions,
                "candidate": 0 if growth is None else growth.candidate}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> "IMFState":
        growth = None
        if arrays["base"]:
            growth = Growth(saved_from(arrays["base"]), arrays["directions"], int(arrays["candidate"]),
                            saved_from(arrays["leader"]))
        return cls(post=arrays["post"], stats=arrays["stats"], history=list(arrays["history"]),
                   best=saved_from(arrays["best"]), growth=growth, previous=float(arrays["previous"]),
                   iter_in_k=int(arrays["iter_in_k"]), failures=int(arrays["failures"]), done=bool(arrays["done"]))


def saved_dict(saved: Converged | None) -> dict:
    """A saved state as a checkpoint holds it: a dict of its evidence, column posteriors and statistics, or
    only the evidence -inf for none."""
    if saved is None:
        return {"evidence": -np.inf}
    return {"evidence": saved.evidence, "post": saved.post, "stats": saved.stats}


def saved_from(saved: dict) -> Converged | None:
    """The saved state a checkpoint's dict holds (``saved_dict``), or None."""
    return Converged(saved["evidence"], saved["post"], saved["stats"]) if "post" in saved else None


class IMFDriver(StatefulDriver):
    """IMF/INMF with the K+ search on an engine (module docstring; ``engine.loop.Driver``). With
    ``validation``, those entries are left out of training and ``predictions`` scores them."""

    state_type = IMFState

    def __init__(self, config: IMFConfig, source: Source, engine: Engine, validation: EntrySample | None = None):
        config.check()
        ds = source.open()
        if ds.layout != "dense":
            raise UserError(f"{source}: IMF needs a dense dataset (real or binary), got layout {ds.layout}")
        self.config, self.source, self.engine, self.validation = config, source, engine, validation
        self.split = config.split if config.split in ds.split_names() else None
        self.model, self.hyper = config.model(), config.hyper()
        self.label = "inmf" if isinstance(config, INMFConfig) else "imf"
        self.ranges = row_ranges(ds.n_rows, config.chunk_rows)
        rows = engine.hold(dense_blocks(engine, source, self.ranges, self.split, validation))
        self.row_off, self.col_off = engine.map(no_offsets_task, rows), np.zeros(ds.n_cols)
        if config.offset_reg is not None:
            self.row_off, self.col_off = self._fit_offsets(rows, config.offset_reg)
            rows = engine.map(centre_task, rows, self.row_off, self.col_off)
        self.blocks = engine.hold(rows)
        self.state = IMFState()
        self._search: Generator[None, float, None] | None = None  # ``_search_loop`` at the run under way
        self._watched: list[int] = []
        self.fits_at_caps: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}  # ``watch_caps``

    @property
    def k_plus(self) -> int:
        return int(self.state.post["m"].shape[1])

    def watch_caps(self, caps: Sequence[int]) -> None:
        """Record, for each cap on K+ in ``caps`` (below ``max_k``), what a fit with that cap would end with
        (``fits_at_caps``). Until its search first holds a K+ at the cap, a capped fit takes the same steps as
        this one; there it stops and keeps its best state so far (``_search_loop``), so one fit under the highest
        cap gives the fits under every lower one."""
        self._watched = sorted(int(c) for c in caps)
        self.fits_at_caps = {}

    def _fit_offsets(self, rows: BlockSet, reg: float) -> tuple[BlockSet, np.ndarray]:
        """Row offsets (per block) and column offsets by alternating ridge updates. The column offsets go
        to the blocks as a plain value, so the centred blocks can be rebuilt from the data alone."""
        engine = self.engine

        def column_sums(row_off: BlockSet) -> dict:
            return engine.reduce(engine.map(column_offset_stats_task, rows, row_off))

        sums = column_sums(self.row_off)
        mean = float(sums["col_resid"].sum() / max(sums["col_count"].sum(), 1.0))
        col_off = np.full(self.col_off.shape, mean)
        for _ in range(OFFSET_SWEEPS):
            row_off = engine.map(row_offsets_task, rows, col_off, reg)
            col_off = imf.column_offsets(column_sums(row_off), mean, reg)
        return engine.hold(row_off), col_off

    def _reduce_stats(self) -> dict:
        return self.engine.reduce(self.engine.map(stats_task, self.blocks, self.engine.state("nu")))

    # -- the driver contract --
    def start(self, nu: np.ndarray | None = None) -> None:
        """The K+ = 0 state (no features), or q(z) started at ``nu`` (N x K0, e.g. from a known Z) with the
        K+ = 0 column posteriors given K0 new features."""
        engine, state = self.engine, self.state
        engine.keep("nu", engine.map(empty_nu_task, self.blocks))
        state.stats = self._reduce_stats()
        state.post = self.model.initial_post(state.stats, self.hyper)
        if nu is not None:
            engine.keep("nu", engine.from_values([np.asarray(nu[r0:r1], dtype=np.float64) for r0, r1 in self.ranges]))
            state.stats = self._reduce_stats()
            for _ in range(nu.shape[1]):
                state.post = self.model.add_feature(state.post, self.hyper)

    def set_globals(self, arrays: Mapping[str, Any]) -> None:
        """The values of a checkpoint; the search goes on from the run they are in (``_search_loop``)."""
        super().set_globals(arrays)
        self._search = None

    def total_steps(self) -> int | None:
        return None

    def finished(self, step: int, trace: list[dict]) -> bool:
        return self.state.done

    def step(self, step: int) -> dict:
        """One alternation at the current K+; once L has settled, the K+ search takes it (``_search_loop``)."""
        engine, state = self.engine, self.state
        state.post = self.model.column_update(state.stats, self.hyper, state.post)
        nu, stats = engine.split(engine.map(row_task, self.blocks, engine.state("nu"), engine.share(state.post)), 2)
        engine.keep("nu", nu)
        state.stats = engine.reduce(stats)
        self._prune()
        evidence = self.model.evidence(state.stats, state.post, self.hyper)
        state.iter_in_k += 1
        record = {"k_plus": self.k_plus, "evidence": evidence}
        if abs(evidence - state.previous) <= self.config.tol * abs(evidence) or state.iter_in_k >= self.config.max_iter:
            record["converged_k"] = self.k_plus
            self._settled(evidence)
        else:
            state.previous = evidence
        return record

    def _prune(self) -> None:
        state = self.state
        keep = imf.keep_features(state.stats["sum_nu"], self.config.prune_below)
        if keep.all():
            return
        self.engine.keep("nu", self.engine.map(select_task, self.engine.state("nu"), keep))
        state.post = imf.select_features(state.post, keep, self.model.feature_axes)
        state.stats = self._reduce_stats()
        state.post = self.model.column_update(state.stats, self.hyper, state.post)
        state.previous = -np.inf

    # -- saved search states --
    def _save(self, name: str, evidence: float) -> Converged:
        """The current state with its L, its q(z) kept as the named state "<name>_nu" (module docstring)."""
        self.engine.keep(f"{name}_nu", self.engine.state("nu"))
        return Converged(evidence, self.state.post, self.state.stats)

    def _load(self, name: str, saved: Converged) -> None:
        """Make the saved state ``saved``, kept under ``name``, current."""
        self.state.post, self.state.stats = saved.post, saved.stats
        self.engine.keep("nu", self.engine.state(f"{name}_nu"))

    def adopt_best(self) -> None:
        """Make the best converged state current (the search keeps the K+ with the best L): what a run
        stopped part-way reports, since a stop during growth leaves q(z) one column ahead of q(A). A
        finished search has made it current already."""
        if self.state.best is not None and not self.state.done:
            self._load("best", self.state.best)

    # -- the K+ search --
    def _settled(self, evidence: float) -> None:
        """Hand the settled L of the run under way to the search, which goes on to start the next run or ends."""
        if self._search is None:
            self._search = self._search_loop()
            next(self._search)
        try:
            self._search.send(evidence)
        except StopIteration:
            self._search = None

    def _search_loop(self) -> Generator[None, float, None]:
        """The K+ search (module docstring). Each ``yield`` waits for the run just started to
        converge: ``step`` alternates until L settles and sends it here. Everything the loop needs after a
        yield is in ``self.state``, so a restored search enters the loop again at the run under way, the start
        or a growth step's candidate."""
        state, config = self.state, self.config
        if state.growth is None:
            evidence, grew = (yield), True  # the start converges
        else:
            evidence, grew = yield from self._grow_on()
        while True:
            state.history.append((self.k_plus, evidence))
            if evidence > state.best_evidence:
                state.best, state.failures = self._save("best", evidence), 0
            else:
                state.failures += 1
            self._record_caps()
            if not grew or state.failures >= config.patience or self.k_plus >= config.max_k:
                break
            self._start_growth()
            evidence, grew = yield from self._grow_on()
        self._load("best", state.best)
        self.engine.drop("best_nu")
        state.done = True

    def _record_caps(self) -> None:
        """For each watched cap the search now holds for the first time, the predictions, truths and K+ of the
        best state so far: where a fit with that cap stops (``watch_caps``)."""
        best = self.state.best
        for cap in [c for c in self._watched if c not in self.fits_at_caps and self.k_plus >= c]:
            predicted, truth = self._predict(self.engine.state("best_nu"), best.post["m"])
            self.fits_at_caps[cap] = (predicted, truth, int(best.post["m"].shape[1]))

    def _grow_on(self) -> Generator[None, float, tuple[float, bool]]:
        """The growth step under way, from its candidate under way: each candidate converges in turn and the
        leader becomes the state at the new K+. Its L and whether K+ grew: when every candidate's new feature
        was pruned away, growing again would repeat this step."""
        growth = self.state.growth
        while True:
            evidence = yield  # the candidate under way converges
            if self._beats(evidence, growth.leader):
                growth.leader = self._save("leader", evidence)
            growth.candidate += 1
            if growth.candidate >= self._n_candidates(growth) or not self._start_candidate(growth):
                break
        self._load("leader", growth.leader)
        self.state.growth = None
        self.engine.drop("base_nu")
        self.engine.drop("leader_nu")
        return growth.leader.evidence, self.k_plus > growth.base.post["m"].shape[1]

    def _beats(self, evidence: float, leader: Converged | None) -> bool:
        """Whether a growth candidate's converged L beats the leader's by more than the convergence tolerance
        (tol |L|): candidates that reach one optimum (the restart often reaches a direction's, features
        reordered) differ by rounding only, and the earlier one stays, on any chunking."""
        return leader is None or evidence > leader.evidence + self.config.tol * abs(leader.evidence)

    def _start_growth(self) -> None:
        """A growth step from the converged state: residual directions from reduced Gram sums, and its first
        candidate started."""
        engine = self.engine
        m = engine.share(self.state.post["m"])
        sums = engine.reduce(engine.map(residual_stats_task, self.blocks, engine.state("nu"), m))
        count = min(self.config.n_candidates, sums["gram"].shape[0])
        directions = imf.residual_directions(sums["gram"], sums["col_sum"], sums["n_rows"], count)
        self.state.growth = Growth(self._save("base", -np.inf), directions)
        self._start_candidate(self.state.growth)

    def _n_candidates(self, growth: Growth) -> int:
        """Candidates of a growth step: one per residual direction, then the ICA restart when it is on and the
        new K+ is at most the number of columns."""
        d, k = growth.base.post["m"].shape
        return growth.directions.shape[1] + int(self.config.restart and k + 1 <= d)

    def _start_candidate(self, growth: Growth) -> bool:
        """From the base state, one more q(z) column split from the projections on the candidate's direction, or
        the restart (``_start_restart``) after the last direction. False if the candidate cannot start."""
        engine, state = self.engine, self.state
        self._load("base", growth.base)
        if growth.candidate == growth.directions.shape[1]:
            return self._start_restart()
        nu = engine.state("nu")
        direction = growth.directions[:, growth.candidate]
        projections = engine.hold(engine.map(project_task, self.blocks, nu, engine.share(state.post["m"]), direction))
        sign, threshold = imf.orient_and_split(np.concatenate(engine.collect(projections)))
        engine.keep("nu", engine.map(extend_task, nu, projections, sign, threshold))
        state.post = self.model.add_feature(state.post, self.hyper)
        state.stats = self._reduce_stats()
        state.previous, state.iter_in_k = -np.inf, 0
        return True

    def _start_restart(self) -> bool:
        """q(z) at K+ = base K+ + 1 from scratch: the binary sources of an ICA of the data (``kernels.imf.fastica``
        on the moments of the whitened rows, one reduction), with the column posteriors of a fresh start
        (``start``); the alternation then runs as for any candidate. False
        (no restart) when the ICA does not converge: features used by half the rows are not skewed, and
        without a fixed point the unmixing would depend on rounding, so on the chunking."""
        engine, state = self.engine, self.state
        k = self.k_plus + 1
        data_sums = engine.reduce(engine.map(data_stats_task, self.blocks))
        mean, white = imf.whitening(data_sums, k)
        whitened = engine.hold(engine.map(whiten_task, self.blocks, mean, white))
        unmixing = imf.fastica(engine.reduce(engine.map(imf.ica_moments, whitened)), float(data_sums["n_rows"]))
        if unmixing is None:
            return False
        sources = engine.hold(engine.map(sources_task, whitened, unmixing))
        signs, thresholds = imf.binary_sources(np.concatenate(engine.collect(sources)))
        engine.keep("nu", engine.map(binary_nu_task, sources, signs, thresholds))
        empty = engine.map(empty_nu_task, self.blocks)
        state.post = self.model.initial_post(engine.reduce(engine.map(stats_task, self.blocks, empty)), self.hyper)
        for _ in range(k):
            state.post = self.model.add_feature(state.post, self.hyper)
        state.stats = self._reduce_stats()
        state.previous, state.iter_in_k = -np.inf, 0
        return True

    # -- results --
    def expected_z(self) -> np.ndarray:
        """E[Z] (N x K+) of the current state, rows in order."""
        return np.concatenate(self.engine.collect(self.engine.state("nu")))

    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """Predictions and truths for every target entry (row order): the validation entries of a fit given
        ``validation``, else the held-out entries of the split."""
        if not self.split and self.validation is None:
            raise UserError(f"{self.source}: no held-out entries to evaluate (ingest with --holdout)")
        return self._predict(self.engine.state("nu"), self.state.post["m"])

    def _predict(self, nu: BlockSet, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictions and truths of the target entries (``predictions``) from q(z) ``nu`` and the loadings' mean
        ``m``."""
        engine = self.engine
        targets = engine.generate(target_rows, [(self.source.part(r0, r1), r0, r1, self.split,
                                                 self.validation) for r0, r1 in self.ranges])
        parts = engine.collect(engine.map(predict_task, targets, nu, self.row_off, engine.share(m),
                                         engine.share(self.col_off)))
        return np.concatenate([p for p, _ in parts]), np.concatenate([t for _, t in parts])


def fit_to_end(config: IMFConfig, data: str | ArrayRows | Source, engine: Engine | None = None,
               start: np.ndarray | None = None) -> IMFDriver:
    """IMF/INMF fitted to the end without a run folder, on ``engine`` (default: this process), from K+ = 0
    or from the q(z) ``start`` (``IMFDriver.start``). On in-memory rows and an in-process engine this is
    the in-memory reference of the K+ search (module docstring)."""
    driver = IMFDriver(config, source_of(data), ProcessEngine() if engine is None else engine)
    driver.start(start)
    run_loop(driver, None, Position(), config.checkpoint_every, quiet=True)
    return driver

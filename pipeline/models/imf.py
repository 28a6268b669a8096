"""IMF and INMF on the engine: per-row q(z) on row chunks, column posteriors from reduced sums,
and K+ chosen by evidence (SPEC 2, 3.1, 3.2; paper 000 Algorithm 1).

Each engine step is one alternation at the current K+: the client updates the column
posteriors from the reduced statistics, the row chunks update q(z) and return new statistics,
features whose usage falls below a threshold are pruned, and the evidence L(q; K+) is recorded.
When L stops changing, the state is compared with the best so far and, unless growth has
stopped paying, one feature is added: chunks reduce the residual's Gram matrix, the client
finds its ``n_candidates`` leading directions, and for each in turn the chunks project onto it,
the split of the projections initialises the new column of q(z) and the alternation runs to
convergence from there. The candidate with the best L is the state at the new K+ (paper 000
Algorithm 1 grows from the previous state; trying several residual directions, as the
in-memory reference ``kernels.imf.fit_in_memory`` does, keeps one unlucky direction from
deciding K+).

With ``offset_reg`` set (an extension of the paper's model, ``kernels.imf.remove_offsets``), row
and column offsets are fitted first by alternating ridge updates (row offsets on the chunks,
column offsets from reduced sums), the training blocks are centred by them, and predictions add
them back. They are a deterministic function of the training entries, so a resumed run refits
them instead of storing them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from buffet.data.errors import UserError
from buffet.data.urls import open_array
from buffet.data.store import DenseRows
from buffet.kernels import imf, inmf
from buffet.data.splits import EntrySample
from buffet.pipeline.engine.blocks import (Source, load_training_rows, resolve, row_ranges, target_entries,
                                          task_source)
from buffet.pipeline.engine.executors import Executor, pick, tree_reduce
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.selection import Candidate
from buffet.pipeline.engine.settings import (SelectionSettings, checkpoint_option, option, require_counts,
                                             require_positive, split_option)

CAP_CHOICES = (2, 4, 8)  # caps on K+ tried below max_k when settings are chosen on validation
DEFAULT_OFFSET_REG = 1.0  # ridge strength of the offsets candidate when offset_reg is not given
SAVED_STATES = ("best", "base", "leader")  # driver states a checkpoint holds besides the current one
OFFSET_SWEEPS = 20  # alternations of row and column offsets (ridge ALS converges in a few)


@dataclass
class IMFConfig(SelectionSettings):
    """Settings of an IMF fit (SPEC 3.1; the K+ search of the module docstring). The row and column
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
    """Settings of an INMF fit: IMF's plus the EP schedule for the prior sites (SPEC 3.2)."""

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
    return [Candidate(f"K+ <= {cap}{', offsets' if reg else ''}", {"max_k": cap, "offset_reg": reg})
            for reg in (None, strength) for cap in caps]


# ----- block tasks -----

def row_offsets_task(rows: DenseRows, col_off: np.ndarray, reg: float) -> np.ndarray:
    return imf.row_offsets(rows.X, rows.mask, col_off, reg)


def column_offset_stats_task(rows: DenseRows, row_off: np.ndarray) -> dict:
    return imf.column_offset_stats(rows.X, rows.mask, row_off)


def centre_task(rows: DenseRows, row_off: np.ndarray, col_off: np.ndarray) -> DenseRows:
    return DenseRows(imf.remove_offsets(rows.X, rows.mask, row_off, col_off), rows.mask)


def empty_nu_task(rows: DenseRows) -> np.ndarray:
    return np.zeros((rows.n_rows, 0))


def row_task(rows: DenseRows, nu: np.ndarray, post: dict) -> tuple[np.ndarray, dict]:
    return imf.row_step(rows.X, rows.mask, nu, post)


def stats_task(rows: DenseRows, nu: np.ndarray) -> dict:
    return imf.chunk_stats(rows.X, rows.mask, nu)


def select_task(nu: np.ndarray, keep: np.ndarray) -> np.ndarray:
    return nu[:, keep]


def residual_stats_task(rows: DenseRows, nu: np.ndarray, m: np.ndarray) -> dict:
    r = imf.residual(rows.X, rows.mask, nu, m)
    return {"gram": r.T @ r, "col_sum": r.sum(axis=0), "n_rows": np.float64(r.shape[0])}


def project_task(rows: DenseRows, nu: np.ndarray, m: np.ndarray, direction: np.ndarray) -> np.ndarray:
    return imf.residual(rows.X, rows.mask, nu, m) @ direction


def extend_task(nu: np.ndarray, p: np.ndarray, sign: float, threshold: float) -> np.ndarray:
    return np.column_stack([nu, imf.new_feature_column(p, sign, threshold)])


def predict_task(source: Source, r0: int, r1: int, split: str | None, sample: EntrySample | None, nu: np.ndarray,
                 m: np.ndarray, row_off: np.ndarray, col_off: np.ndarray) -> tuple:
    """Posterior-mean predictions b_i + c_j + E[z_i] E[a_j] and truths for the target entries of the rows
    (``blocks.target_entries``: held-out, or validation; offsets b, c are 0 unless fitted)."""
    target = target_entries(source, r0, r1, split, sample)
    X = resolve(source).read_rows(r0, r1).X
    return (nu @ m.T + row_off[:, None] + col_off[None, :])[target], X[target]


def write_rows_task(values: np.ndarray, path: str, name: str, r0: int) -> None:
    open_array(f"{path}/{name}", "r+")[r0:r0 + values.shape[0], :] = values


def read_rows_task(path: str, name: str, r0: int, r1: int) -> np.ndarray:
    return np.asarray(open_array(f"{path}/{name}", "r")[r0:r1, :])


# ----- the driver -----

@dataclass
class IMFDriver:
    """IMF/INMF with K+ search on an executor (the Driver protocol of fitloop)."""

    config: IMFConfig
    source: Source
    executor: Executor
    validation: EntrySample | None = None  # entries left out of training and scored by ``predictions``
    label: str = "imf"
    post: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    best: dict = field(default_factory=lambda: {"evidence": -np.inf})
    history: list = field(default_factory=list)
    previous: float = -np.inf
    iter_in_k: int = 0
    failures: int = 0
    done: bool = False
    base: dict = field(default_factory=dict)  # the converged state a growth step started from
    leader: dict = field(default_factory=lambda: {"evidence": -np.inf})  # best candidate of this growth
    directions: np.ndarray | None = None  # (D, candidates) residual directions of this growth
    candidate: int = 0

    def __post_init__(self) -> None:
        self.config.check()
        ds = resolve(self.source)
        if ds.layout != "dense":
            raise UserError(f"{self.source}: IMF needs a dense dataset (real or binary), got layout {ds.layout}")
        self.split = self.config.split if self.config.split in ds.split_names() else None
        self.model, self.hyper = self.config.model(), self.config.hyper()
        self.label = "inmf" if isinstance(self.config, INMFConfig) else "imf"
        self.ranges = row_ranges(ds.n_rows, self.config.chunk_rows)
        self.rows = task_source(self.source, self.executor)
        self.blocks = [self.executor.submit(load_training_rows, self.rows, r0, r1, self.split, self.validation)
                       for r0, r1 in self.ranges]
        self.row_off: list = [np.zeros(r1 - r0) for r0, r1 in self.ranges]
        self.col_off = np.zeros(ds.n_cols)
        if self.config.offset_reg is not None:
            self._fit_offsets(self.config.offset_reg)
        self.nu: list = []
        self._t_start = time.perf_counter()

    @property
    def k_plus(self) -> int:
        return int(self.post["m"].shape[1])

    def _fit_offsets(self, reg: float) -> None:
        """Row and column offsets by alternating ridge updates, then centre the training blocks."""
        def column_sums(row_off: list) -> dict:
            return self.executor.gather(tree_reduce(self.executor, [
                self.executor.submit(column_offset_stats_task, b, r) for b, r in zip(self.blocks, row_off)]))

        sums = column_sums(self.row_off)
        mean = float(sums["col_resid"].sum() / max(sums["col_count"].sum(), 1.0))
        col_off = np.full(self.col_off.shape, mean)
        for _ in range(OFFSET_SWEEPS):
            col = self.executor.broadcast(col_off)
            row_off = [self.executor.submit(row_offsets_task, b, col, reg) for b in self.blocks]
            col_off = imf.column_offsets(column_sums(row_off), mean, reg)
        self.row_off, self.col_off = self.executor.gather(row_off), col_off
        col = self.executor.broadcast(col_off)
        self.blocks = [self.executor.submit(centre_task, b, r, col) for b, r in zip(self.blocks, self.row_off)]

    def _reduce_stats(self) -> dict:
        parts = [self.executor.submit(stats_task, b, nu) for b, nu in zip(self.blocks, self.nu)]
        return self.executor.gather(tree_reduce(self.executor, parts))

    def start(self) -> None:
        self.nu = [self.executor.submit(empty_nu_task, b) for b in self.blocks]
        self.stats = self._reduce_stats()
        self.post = self.model.initial_post(self.stats, self.hyper)

    def total_steps(self) -> int | None:
        return None

    def finished(self, step: int, trace: list[dict]) -> bool:
        return self.done

    def step(self, step: int) -> dict:
        self.post = self.model.column_update(self.stats, self.hyper, self.post)
        post = self.executor.broadcast(self.post)
        results = [self.executor.submit(row_task, b, nu, post) for b, nu in zip(self.blocks, self.nu)]
        self.nu = [self.executor.submit(pick, r, 0) for r in results]
        self.stats = self.executor.gather(tree_reduce(self.executor, [self.executor.submit(pick, r, 1)
                                                                      for r in results]))
        self._prune()
        evidence = self.model.evidence(self.stats, self.post, self.hyper)
        self.iter_in_k += 1
        record = {"step": step + 1, "k_plus": self.k_plus, "evidence": evidence}
        if abs(evidence - self.previous) <= self.config.tol * abs(evidence) or self.iter_in_k >= self.config.max_iter:
            record["converged_k"] = self.k_plus
            self._settle(evidence)
        else:
            self.previous = evidence
        record["seconds"] = time.perf_counter() - self._t_start
        return record

    def _prune(self) -> None:
        keep = imf.keep_features(self.stats["sum_nu"], self.config.prune_below)
        if keep.all():
            return
        self.nu = [self.executor.submit(select_task, nu, keep) for nu in self.nu]
        self.post = imf.select_features(self.post, keep, self.model.feature_axes)
        self.stats = self._reduce_stats()
        self.post = self.model.column_update(self.stats, self.hyper, self.post)
        self.previous = -np.inf

    def adopt_best(self) -> None:
        """Make the best converged state current (SPEC 3.1 keeps the K+ with the best L): what a run
        stopped part-way reports, since a stop during growth leaves q(z) one column ahead of q(A)."""
        if "post" in self.best:
            self._load(self.best)

    def _state(self, evidence: float) -> dict:
        return {"evidence": evidence, "post": self.post, "nu": self.nu, "stats": self.stats}

    def _load(self, state: dict) -> None:
        self.post, self.nu, self.stats = state["post"], state["nu"], state["stats"]

    def _settle(self, evidence: float) -> None:
        """The alternation has converged (SPEC 3.1, choosing K+). During growth: go on with the next
        candidate, or take the best candidate as the new K+. Then keep the state if it is the best
        so far, and grow or stop."""
        grew = True
        if self.base:
            if evidence > self.leader["evidence"]:
                self.leader = self._state(evidence)
            self.candidate += 1
            if self.candidate < self.directions.shape[1]:
                self._start_candidate()
                return
            evidence, base_k = self.leader["evidence"], self.base["post"]["m"].shape[1]
            self._load(self.leader)
            grew = self.k_plus > base_k  # every candidate's new feature pruned away: growing again repeats this
            self.base, self.leader, self.directions = {}, {"evidence": -np.inf}, None
        self.history.append((self.k_plus, evidence))
        if evidence > self.best["evidence"]:
            self.best = self._state(evidence)
            self.failures = 0
        else:
            self.failures += 1
        if not grew or self.failures >= self.config.patience or self.k_plus >= self.config.max_k:
            self._load(self.best)
            self.done = True
        else:
            self._grow()

    def _grow(self) -> None:
        """Residual directions of the converged state from reduced Gram sums; start the first candidate."""
        m = self.executor.broadcast(self.post["m"])
        sums = self.executor.gather(tree_reduce(self.executor, [
            self.executor.submit(residual_stats_task, b, nu, m) for b, nu in zip(self.blocks, self.nu)]))
        count = min(self.config.n_candidates, sums["gram"].shape[0])
        self.directions = imf.residual_directions(sums["gram"], sums["col_sum"], sums["n_rows"], count)
        self.base, self.candidate = self._state(-np.inf), 0
        self._start_candidate()

    def _start_candidate(self) -> None:
        """From the base state, one more q(z) column split from the projections on the current direction."""
        self._load(self.base)
        m = self.executor.broadcast(self.post["m"])
        direction = self.directions[:, self.candidate]
        projections = [self.executor.submit(project_task, b, nu, m, direction) for b, nu in zip(self.blocks, self.nu)]
        sign, threshold = imf.orient_and_split(np.concatenate(self.executor.gather(projections)))
        self.nu = [self.executor.submit(extend_task, nu, p, sign, threshold) for nu, p in zip(self.nu, projections)]
        self.post = self.model.add_feature(self.post, self.hyper)
        self.stats = self._reduce_stats()
        self.previous, self.iter_in_k = -np.inf, 0

    # -- checkpoints --
    def save(self, run: RunStore, step: int, trace: list[dict]) -> None:
        folder = run.new_checkpoint_dir(step)
        arrays = {f"post_{k}": v for k, v in self.post.items()}
        arrays.update({f"stats_{k}": v for k, v in self.stats.items()})
        for name in SAVED_STATES:
            state = getattr(self, name)
            if "post" in state:
                arrays.update({f"{name}_post_{k}": v for k, v in state["post"].items()})
                arrays.update({f"{name}_stats_{k}": v for k, v in state["stats"].items()})
                arrays[f"{name}_evidence"] = np.float64(state["evidence"])
                self._write_rows(run, folder, f"{name}_nu", state["nu"])
        if self.directions is not None:
            arrays["directions"] = self.directions
        self._write_rows(run, folder, "nu", self.nu)
        arrays.update({"history": np.array(self.history, dtype=np.float64).reshape(-1, 2),
                       "previous": np.float64(self.previous), "iter_in_k": np.int64(self.iter_in_k),
                       "failures": np.int64(self.failures), "done": np.bool_(self.done),
                       "candidate": np.int64(self.candidate)})
        run.commit_checkpoint(folder, step, arrays, {"trace": trace})

    def _write_rows(self, run: RunStore, folder: Path, name: str, nus: list) -> None:
        k = self.executor.gather(self.executor.submit(np.shape, nus[0]))[1]
        path = run.locals_array(folder, name, (self.ranges[-1][1], k), (self.config.chunk_rows, max(k, 1)))
        self.executor.gather([self.executor.submit(write_rows_task, nu, path, name, r0)
                              for nu, (r0, _) in zip(nus, self.ranges)])

    def restore(self, arrays: dict, folder: Path) -> None:
        def unpack(prefix: str) -> dict:
            return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}

        path = str(folder / "locals.zarr")
        self.post, self.stats = unpack("post_"), unpack("stats_")
        self.nu = [self.executor.submit(read_rows_task, path, "nu", r0, r1) for r0, r1 in self.ranges]
        for name in SAVED_STATES:
            if f"{name}_evidence" in arrays:
                setattr(self, name, {"evidence": float(arrays[f"{name}_evidence"]), "post": unpack(f"{name}_post_"),
                                     "stats": unpack(f"{name}_stats_"),
                                     "nu": [self.executor.submit(read_rows_task, path, f"{name}_nu", r0, r1)
                                            for r0, r1 in self.ranges]})
        self.directions, self.candidate = arrays.get("directions"), int(arrays["candidate"])
        self.history = [(int(k), float(ev)) for k, ev in arrays["history"]]
        self.previous, self.iter_in_k = float(arrays["previous"]), int(arrays["iter_in_k"])
        self.failures, self.done = int(arrays["failures"]), bool(arrays["done"])

    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """Predictions and truths for every target entry (row order): the validation entries of a fit given
        ``validation``, else the held-out entries of the split."""
        if not self.split and self.validation is None:
            raise UserError(f"{self.source}: no held-out entries to evaluate (ingest with --holdout)")
        m = self.executor.broadcast(self.post["m"])
        col = self.executor.broadcast(self.col_off)
        parts = self.executor.gather([self.executor.submit(predict_task, self.rows, r0, r1, self.split,
                                                           self.validation, nu, m, row_off, col)
                                      for nu, row_off, (r0, r1) in zip(self.nu, self.row_off, self.ranges)])
        return np.concatenate([p for p, _ in parts]), np.concatenate([t for _, t in parts])

"""Bayesian NMF on the engine: block tasks and the batch / stochastic driver (SPEC 2, 3.5).

Batch VB keeps each chunk's rows and q(theta) on the workers between iterations; SVI reads
a minibatch of contiguous rows per step (minibatch order shuffled per pass from the seed)
and splits it into blocks of ``chunk_rows`` rows that run in parallel. Statistics are
tree-reduced and the small global update of q(beta) runs on the client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

import numpy as np

from buffet.data.errors import UserError
from buffet.data.urls import open_array
from buffet.data.store import CSRRows
from buffet.kernels import bnmf
from buffet.pipeline.engine.blocks import Source, kept_rows, read_block, read_row_set, resolve, row_ranges
from buffet.pipeline.engine.executors import Executor, pick, tree_reduce
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import (checkpoint_option, option, require_counts, require_positive,
                                             split_option)

EVAL_BLOCK_ROWS = 500


@dataclass
class TopicModelConfig:
    """Settings shared by the Poisson topic models (Bayesian NMF, correlated NMF; SPEC 3.5-3.6).

    The step size rho_t = (t0 + t)^-kappa defaults to t0 = 1, kappa = 0.51: the NYT schedule of
    paper 002 (kappa = 0.5) moved just inside the convergent range (0.5, 1] that SPEC 3.5 requires.
    Its large early steps escape the merged-topic optima that a slower schedule (e.g. online LDA's
    t0 = 10, kappa = 0.7) and batch VB get stuck in.
    """

    n_topics: int = option(20, "Number of topics K, a whole number >= 1. More topics split themes more finely "
                                   "and cost time in proportion; the papers use 50-150 for large news corpora.")
    mode: str = option("svi", "Inference: 'svi' (stochastic VI on minibatches, for large corpora) or 'batch' "
                              "(every document each iteration; keeps the documents and q(theta) on the workers).")
    batch_size: int = option(1000, "SVI: documents per minibatch, i.e. per step. Larger minibatches give less noisy "
                                   "steps but fewer steps per pass; the papers use 500-2000.")
    passes: int = option(1, "SVI: passes over the training documents; the fit runs passes x ceil(documents / "
                            "batch_size) steps. Raise it for a small corpus that one pass cannot fit.")
    max_iter: int = option(200, "Batch: most iterations (passes over every document). Raise it if the run ends "
                                "before the ELBO settles at --tol.")
    tol: float = option(1e-6, "Batch: stop once the ELBO changes by at most this fraction of its value between "
                              "iterations (> 0). Smaller runs longer for a tighter fit.")
    seed: int = option(0, "Seed of every random draw (initial topics, minibatch order, scored documents); the "
                          "same seed gives the same numbers on any number of workers.")
    c0: float | None = option(None, "Topic prior strength: beta_vk ~ Gamma(c0/V, c0), mean 1/V (> 0; unset: 0.05 V, "
                                    "paper 002). Larger c0 pulls topics towards uniform; smaller lets them be sparser.")
    kappa: float = option(0.51, "SVI: forgetting rate of the step size rho_t = (t0 + t)^-kappa, in (0.5, 1]. "
                                "Larger shrinks the steps faster: steadier late, but slower to leave a poor start.")
    t0: float = option(1.0, "SVI: delay of the step size rho_t = (t0 + t)^-kappa (> 0). Larger makes the first "
                            "steps smaller, so early, still random minibatches weigh less.")
    local_tol: float = option(1e-3, "Stop a document's local sweeps when q(theta_d)'s shapes move by less than this "
                                    "on average over a sweep (> 0). Smaller fits documents more exactly, slower.")
    chunk_rows: int = option(500, "Rows (documents) per block task. Larger blocks mean less task overhead, "
                                  "smaller ones more parallelism and less memory per task.")
    eval_every: int = option(10, "Score held-out documents every this many steps (and after the last). Raise it "
                                 "to spend less time evaluating; the run's trace records the scores.")
    eval_docs: int = option(1000, "At most this many held-out documents (drawn by --seed) are scored while "
                                  "fitting; `buffet evaluate` scores all of them. Lower it to evaluate faster.")
    checkpoint_every: int = checkpoint_option(20, "steps")
    split: str | None = split_option("documents")

    def check(self) -> None:
        """Refuse settings that cannot work, naming the setting."""
        if self.mode not in ("batch", "svi"):
            raise UserError(f"mode must be 'batch' or 'svi', got {self.mode!r}")
        require_counts(self, ("n_topics", "batch_size", "passes", "max_iter", "chunk_rows", "eval_every",
                              "checkpoint_every"))
        require_positive(self, ("c0", "local_tol", "t0"))
        if not 0.5 < self.kappa <= 1.0:
            raise UserError(f"kappa must be in (0.5, 1], got {self.kappa}")


@dataclass
class BNMFConfig(TopicModelConfig):
    """Settings of a Bayesian NMF fit: the topic models' (``TopicModelConfig``) plus the theta prior
    (paper 002 section 11.6) and how the local steps run.

    Why ``max_sweeps`` defaults to 20: on held-out documents of two generated corpora, one SVI pass
    with 20 sweeps scores better than with 50 or 100 (fully converged local fits to the first, still
    random topics entrench them; benchmarks/README.md section 13) and costs about 30% fewer sweeps.
    """

    a0: float | None = option(None, "Shape of the document weights' prior theta_kd ~ Gamma(a0, b0) (> 0; unset: "
                                    "1/K, paper 002). Smaller makes each document use fewer topics.")
    b0: float | None = option(None, "Rate of the document weights' prior theta_kd ~ Gamma(a0, b0) (> 0; unset: "
                                    "1/K). The prior mean of theta is a0/b0.")
    max_sweeps: int = option(20, "Training: most local sweeps per document per step (>= 1), if --local-tol is not "
                                 "met first. More sweeps fit early, still random topics harder, which can hurt.")
    eval_max_sweeps: int = option(100, "Evaluation (document completion, transform, score): most local sweeps per "
                                       "document with the topics fixed (>= 1). Raise it if scores still move with it.")
    precision: str = option("float64", "Arithmetic of the local sweeps: 'float64' or 'float32'. float32 is faster "
                                       "and held-out scores agree to 3-4 digits on the benchmarks.")
    accelerate: bool = option(False, "Run the local sweeps in SQUAREM cycles: fewer sweeps per document, but a "
                                     "document may settle at another local optimum, so results differ.")

    def check(self) -> None:
        """Refuse settings that cannot work, naming the setting."""
        super().check()
        require_counts(self, ("max_sweeps", "eval_max_sweeps"))
        if self.precision not in ("float64", "float32"):
            raise UserError(f"precision must be 'float64' or 'float32', got {self.precision!r}")

    def local_settings(self) -> bnmf.LocalSettings:
        """How the training local steps run (SPEC 3.5 local step)."""
        return bnmf.LocalSettings(self.local_tol, self.max_sweeps, self.accelerate)

    def inference_settings(self) -> bnmf.LocalSettings:
        """How documents are fitted with the topics fixed for evaluation and ``transform`` (SPEC 4)."""
        return bnmf.LocalSettings(self.local_tol, self.eval_max_sweeps, self.accelerate)

    def hyper(self, n_words: int) -> bnmf.Hyper:
        base = bnmf.Hyper.paper_defaults(n_words, self.n_topics)
        return bnmf.Hyper(c0=base.c0 if self.c0 is None else self.c0,
                          a0=base.a0 if self.a0 is None else self.a0,
                          b0=base.b0 if self.b0 is None else self.b0, n_words=n_words)


# ----- block tasks (run on workers; plain functions of their arguments) -----

def batch_local_task(rows: CSRRows, a: np.ndarray | None, view: bnmf.TopicView, hyper: bnmf.Hyper,
                     settings: bnmf.LocalSettings) -> tuple[np.ndarray, dict]:
    res = bnmf.local_step(rows.indptr, rows.indices, rows.data, view, hyper, settings, a_start=a)
    return res.a, {"S": res.S, "theta_sum": res.theta_sum, "sweeps": float(res.sweeps.sum())}


def elbo_task(rows: CSRRows, a: np.ndarray, view: bnmf.TopicView, hyper: bnmf.Hyper) -> dict:
    return {"elbo": bnmf.local_elbo(rows.indptr, rows.indices, rows.data, view, hyper, a)}


def svi_block_task(rows: CSRRows, view: bnmf.TopicView, hyper: bnmf.Hyper, settings: bnmf.LocalSettings) -> dict:
    res = bnmf.local_step(rows.indptr, rows.indices, rows.data, view, hyper, settings)
    return {"S": res.S, "theta_sum": res.theta_sum, "docs": float(rows.n_rows),
            "sweeps": float(res.sweeps.sum())}


def completion_task(rows: CSRRows, seed: int, block: int, view: bnmf.TopicView, mean_beta: np.ndarray,
                    hyper: bnmf.Hyper, settings: bnmf.LocalSettings) -> dict:
    ll, tokens = bnmf.threefold_completion(rows.indptr, rows.indices, rows.data, view, mean_beta, hyper,
                                           settings, stream(seed, "thirds", block))
    return {"ll": ll, "tokens": tokens}


def write_locals_task(a: np.ndarray, path: str, r0: int, r1: int, held_out: np.ndarray, name: str = "a") -> None:
    open_array(f"{path}/{name}", "r+").oindex[r0 + kept_rows(r0, r1, held_out), :] = a


def read_locals_task(path: str, r0: int, r1: int, held_out: np.ndarray, name: str = "a") -> np.ndarray:
    return np.asarray(open_array(f"{path}/{name}", "r").oindex[r0 + kept_rows(r0, r1, held_out), :])


# ----- the driver -----

@dataclass
class Corpus:
    """The rows a fit uses: where they live, their size and the held-out documents."""

    source: Source
    n_rows: int
    n_words: int
    held_out: np.ndarray
    n_tokens: float
    vocab: list[str] | None = None

    @property
    def n_train(self) -> int:
        return self.n_rows - len(self.held_out)


def corpus_from_source(source: Source, split: str | None, model: str = "Bayesian NMF") -> Corpus:
    """Describe a source for a fit of ``model``; refuses data a count model cannot take (SPEC 1)."""
    src = resolve(source)
    held = np.zeros(0, dtype=np.int64)
    vocab = None
    if isinstance(source, str):
        if src.layout != "csr" or src.kind != "counts":
            raise UserError(f"{source}: {model} needs a counts dataset in CSR layout "
                            f"(this one is {src.kind}, {src.layout})")
        if split and split in src.split_names():
            held = np.asarray(src.split(split).get("test_rows", held), dtype=np.int64)
        vocab = src.strings("vocab")
        total = src.total()
    else:
        if src.layout != "csr":
            raise UserError(f"{model} needs a sparse count matrix")
        total = float(src.X.sum())
    if src.n_rows - len(held) < 1:
        raise UserError("no training documents left after the held-out split")
    return Corpus(source, src.n_rows, src.n_cols, held, total, vocab)


@dataclass
class BNMFDriver:
    """Runs Bayesian NMF step by step on an executor (the Driver protocol of fitloop)."""

    config: BNMFConfig
    corpus: Corpus
    executor: Executor
    g: np.ndarray | None = None
    h: np.ndarray | None = None
    docs_seen: int = 0
    label: str = "bnmf"
    local_name: ClassVar[str] = "a"
    effort: ClassVar[tuple[str, str]] = ("mean_sweeps", "sweeps")  # (trace key, statistic) of local-step effort
    _blocks: list = field(default_factory=list)
    _states: list = field(default_factory=list)
    _eval: list = field(default_factory=list)
    _prefetched: dict = field(default_factory=dict)
    _t_start: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.config.check()
        self.hyper = self.config.hyper(self.corpus.n_words)
        self.ranges = row_ranges(self.corpus.n_rows, self.config.chunk_rows)
        self.minibatches = row_ranges(self.corpus.n_rows, self.config.batch_size)
        self._eval = self._load_eval_blocks()

    # -- set-up and restore --
    def start(self, n_tokens: float | None = None, n_docs: int | None = None) -> None:
        """Initial globals for a corpus of ``n_docs`` documents and ``n_tokens`` tokens (default: this
        corpus's training documents; the estimators' ``partial_fit`` passes the streamed corpus's size)."""
        rng = stream(self.config.seed, "init")
        self.g, self.h = bnmf.initial_globals(self.corpus.n_words, self.config.n_topics,
                                              self.corpus.n_tokens if n_tokens is None else n_tokens,
                                              self.corpus.n_train if n_docs is None else n_docs, self.hyper, rng)
        if self.config.mode == "batch":
            self._load_batch_blocks()
            self._states = [None] * len(self._blocks)

    def restore(self, arrays: dict, folder: Path) -> None:
        self.set_globals(arrays)
        if self.config.mode == "batch":
            self._load_batch_blocks()
            path = str(folder / "locals.zarr")
            self._states = [self.executor.submit(read_locals_task, path, r0, r1, self.corpus.held_out,
                                                 self.local_name)
                            for r0, r1 in self.ranges] if (folder / "locals.zarr").exists() else \
                [None] * len(self._blocks)

    def set_globals(self, arrays: dict) -> None:
        """Globals from a checkpoint (``global_arrays``)."""
        self.g, self.h, self.docs_seen = arrays["g"], arrays["h"], int(arrays["docs_seen"])

    def global_arrays(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps besides the row-local state."""
        return {"g": self.g, "h": self.h, "docs_seen": np.array(self.docs_seen)}

    def local_width(self) -> int:
        """Columns of the row-local state kept between batch iterations (q(theta) shapes)."""
        return self.config.n_topics

    def _load_batch_blocks(self) -> None:
        self._blocks = [self.executor.submit(read_block, self.corpus.source, r0, r1, self.corpus.held_out)
                        for r0, r1 in self.ranges]

    def _load_eval_blocks(self) -> list:
        held = self.corpus.held_out
        if len(held) == 0:
            return []
        rng = stream(self.config.seed, "eval")
        chosen = np.sort(rng.choice(held, size=min(self.config.eval_docs, len(held)), replace=False))
        return [self.executor.submit(read_row_set, self.corpus.source, chosen[i:i + EVAL_BLOCK_ROWS])
                for i in range(0, len(chosen), EVAL_BLOCK_ROWS)]

    # -- stepping --
    def total_steps(self) -> int:
        if self.config.mode == "batch":
            return self.config.max_iter
        return self.config.passes * len(self.minibatches)

    def finished(self, step: int, trace: list[dict]) -> bool:
        if step >= self.total_steps():
            return True
        if self.config.mode == "batch" and len(trace) >= 2:
            new, old = trace[-1]["elbo"], trace[-2]["elbo"]
            return abs(new - old) <= self.config.tol * abs(old)
        return False

    def step(self, step: int) -> dict:
        record = self._batch_step(step) if self.config.mode == "batch" else self._svi_step(step)
        if (step + 1) % self.config.eval_every == 0 or step + 1 >= self.total_steps():
            if self._eval:
                record["heldout_ll"] = self.heldout_loglik()
        record["seconds"] = time.perf_counter() - self._t_start
        return record

    def _batch_step(self, step: int) -> dict:
        view = self.executor.broadcast(self._sweep_view())
        results = [self.executor.submit(batch_local_task, rows, a, view, self.hyper,
                                        self.config.local_settings()) for rows, a in zip(self._blocks, self._states)]
        self._states = [self.executor.submit(pick, r, 0) for r in results]
        stats = self.executor.gather(tree_reduce(self.executor, [self.executor.submit(pick, r, 1) for r in results]))
        self.g, self.h = bnmf.batch_update(stats["S"], stats["theta_sum"], self.hyper)
        new_view = self.executor.broadcast(self._sweep_view())
        elbo = self.executor.gather(tree_reduce(self.executor, [
            self.executor.submit(elbo_task, rows, a, new_view, self.hyper)
            for rows, a in zip(self._blocks, self._states)]))["elbo"]
        self.docs_seen += self.corpus.n_train
        return {"step": step + 1, "elbo": elbo + bnmf.global_elbo(self.g, self.h, self.hyper),
                "docs_seen": self.docs_seen,
                "mean_sweeps": stats["sweeps"] / self.corpus.n_train}

    def _sweep_view(self) -> bnmf.TopicView:
        """The topic expectations the local steps sweep with, in the configured precision."""
        return bnmf.TopicView.from_params(self.g, self.h, dtype=np.dtype(self.config.precision))

    def _minibatch_rows(self, step: int) -> list:
        """Read tasks for the blocks of minibatch ``step`` (shuffled order per pass, from the seed)."""
        n_mb = len(self.minibatches)
        order = stream(self.config.seed, "order", step // n_mb).permutation(n_mb)
        lo, hi = self.minibatches[order[step % n_mb]]
        return [self.executor.submit(read_block, self.corpus.source, r0, min(r0 + self.config.chunk_rows, hi),
                                     self.corpus.held_out)
                for r0 in range(lo, hi, self.config.chunk_rows)]

    def _svi_step(self, step: int) -> dict:
        """One SVI step; the next minibatch is read while this one is processed."""
        n_mb = len(self.minibatches)
        blocks = self._prefetched.pop(step, None) or self._minibatch_rows(step)
        if step + 1 < self.total_steps():
            self._prefetched = {step + 1: self._minibatch_rows(step + 1)}
        stats, rho = self.svi_update(blocks, step, self.corpus.n_train)
        record_key, stat_key = self.effort
        return {"step": step + 1, "pass": step // n_mb + 1, "docs_seen": self.docs_seen, "rho": rho,
                record_key: stats[stat_key] / max(stats["docs"], 1.0)}

    def svi_update(self, blocks: list, step: int, n_docs: float) -> tuple[dict, float]:
        """SVI step ``step`` on the minibatch ``blocks`` of a corpus of ``n_docs`` documents: local steps
        on the workers, then the natural-gradient update of the globals with the minibatch sums scaled
        by n_docs / |batch| (eqs. 11.33-11.34). The one update path of ``fit`` and of the estimators'
        ``partial_fit``. Returns the reduced statistics and the step size."""
        stats = self.executor.gather(tree_reduce(self.executor, self._svi_parts(blocks)))
        rho = bnmf.step_size(step, self.config.t0, self.config.kappa)
        if stats["docs"] > 0:
            self._svi_globals(stats, n_docs / stats["docs"], rho)
        self.docs_seen += int(stats["docs"])
        return stats, rho

    def _svi_parts(self, blocks: list) -> list:
        """The local-step tasks of a minibatch's blocks (``svi_block_task``)."""
        view = self.executor.broadcast(self._sweep_view())
        return [self.executor.submit(svi_block_task, rows, view, self.hyper, self.config.local_settings())
                for rows in blocks]

    def _svi_globals(self, stats: dict, scale: float, rho: float) -> None:
        """q(beta)'s natural-gradient step (eqs. 11.33-11.34)."""
        self.g, self.h = bnmf.stochastic_update(self.g, self.h, stats["S"], stats["theta_sum"], self.hyper,
                                                scale, rho)

    def heldout_loglik(self) -> float:
        """Per-word held-out log likelihood by threefold document completion (SPEC 4)."""
        view = self.executor.broadcast(bnmf.TopicView.from_params(self.g, self.h))
        mean_beta = self.executor.broadcast(self.g / self.h)
        parts = [self.executor.submit(completion_task, rows, self.config.seed, i, view, mean_beta, self.hyper,
                                      self.config.inference_settings())
                 for i, rows in enumerate(self._eval)]
        total = self.executor.gather(tree_reduce(self.executor, parts))
        return total["ll"] / max(total["tokens"], 1.0)

    # -- checkpoints --
    def save(self, run: RunStore, step: int, trace: list[dict]) -> None:
        folder = run.new_checkpoint_dir(step)
        if self.config.mode == "batch" and self._states and self._states[0] is not None:
            width = self.local_width()
            path = run.locals_array(folder, self.local_name, (self.corpus.n_rows, width),
                                    (self.config.chunk_rows, width))
            self.executor.gather([self.executor.submit(write_locals_task, a, path, r0, r1, self.corpus.held_out,
                                                       self.local_name)
                                  for a, (r0, r1) in zip(self._states, self.ranges)])
        run.commit_checkpoint(folder, step, self.global_arrays(), {"trace": trace})

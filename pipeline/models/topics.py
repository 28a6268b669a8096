"""The Poisson topic models' driver: one algorithm, batch VB or SVI, for Bayesian and correlated NMF
(docs/models/bnmf.md, docs/models/cnmf.md).

The models (``TopicModel``: ``models.bnmf.BNMF``, ``models.cnmf.CNMF``) say what a document's local
step is, what statistics it returns and how the globals are updated from them; this driver says when
each runs. Bayesian and correlated NMF differ only in their model object.

* Batch VB keeps the training documents and their local parameters (named state ``model.local_state``:
  q(theta) shapes, or u_d) on the workers; every iteration runs the local step over every block, reduces
  the statistics, updates the globals on the client and records the objective.
* SVI reads one minibatch of contiguous rows per step (the minibatch order is shuffled per pass from the
  seed), cut into blocks of ``chunk_rows`` rows, while the next minibatch is read and what the model needs of
  its documents alone is worked out (``prepare``); the model's local steps give the minibatch's statistics
  (``svi_statistics``), which scaled by D/|C_t| take a natural-gradient
  step of size rho_t = (t0 + t)^-kappa (eqs. 11.33-11.35).

Held-out documents (the ``split``'s rows) are scored by threefold document completion every
``eval_every`` steps (paper 002, Sec. 11.6).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import numpy as np

from buffet.data.errors import UserError
from buffet.data.store import CSRRows
from buffet.kernels import bnmf
from buffet.pipeline.engine.dataset import ArrayRows, Source, count_blocks, count_row_set, row_ranges, source_of
from buffet.pipeline.engine.engine import BlockSet, Engine
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import (checkpoint_option, option, require_counts, require_positive,
                                             split_option)
from buffet.pipeline.models.state import DriverState, StatefulDriver

EVAL_BLOCK_ROWS = 500  # held-out documents per scoring block
CLIENT_THREADS = min(os.cpu_count() or 1, 4)  # threads for the client's topic view, while the workers wait
NOT_PREPARED = object()  # ``TopicDriver.svi_update``'s default: the model has not prepared the blocks yet


@dataclass
class TopicModelConfig:
    """Settings shared by the Poisson topic models (Bayesian NMF, correlated NMF).

    The step size rho_t = (t0 + t)^-kappa defaults to t0 = 1, kappa = 0.51: the NYT schedule of
    paper 002 (kappa = 0.5) moved just inside the range (0.5, 1] where SVI converges.
    Its large early steps escape the merged-topic optima that a slower schedule (e.g. online LDA's
    t0 = 10, kappa = 0.7) and batch VB get stuck in. Bayesian NMF has its own, measured on held-out
    documents (``models.bnmf.BNMFConfig``).
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
    eval_every: int = option(10, "Score held-out documents every this many steps (and after the last); 0: never "
                                 "while fitting (`buffet evaluate RUN` scores the run afterwards). Raise it to "
                                 "spend less time evaluating; the run's trace records the scores.")
    eval_docs: int = option(1000, "At most this many held-out documents (drawn by --seed) are scored while "
                                  "fitting; `buffet evaluate` scores all of them. Lower it to evaluate faster.")
    checkpoint_every: int = checkpoint_option(20, "steps")
    split: str | None = split_option("documents")

    def check(self) -> None:
        """Refuse settings that cannot work, naming the setting."""
        if self.mode not in ("batch", "svi"):
            raise UserError(f"mode must be 'batch' or 'svi', got {self.mode!r}")
        require_counts(self, ("n_topics", "batch_size", "passes", "max_iter", "chunk_rows", "checkpoint_every"))
        if self.eval_every < 0:
            raise UserError(f"eval_every must be >= 0 (0: never while fitting), got {self.eval_every}")
        require_positive(self, ("c0", "local_tol", "t0"))
        if not 0.5 < self.kappa <= 1.0:
            raise UserError(f"kappa must be in (0.5, 1], got {self.kappa}")


@dataclass
class Corpus:
    """The documents a fit uses: where they are, their size and the held-out documents."""

    source: Source
    n_rows: int
    n_words: int
    held_out: np.ndarray
    n_tokens: float
    vocab: list[str] | None = None

    @property
    def n_train(self) -> int:
        return self.n_rows - len(self.held_out)


def corpus_from_source(data: str | ArrayRows | Source, split: str | None, model: str = "Bayesian NMF") -> Corpus:
    """Describe the data of a fit of ``model``; refuses data a count model cannot take."""
    source = source_of(data)
    src = source.open()
    held = np.zeros(0, dtype=np.int64)
    if src.layout != "csr" or getattr(src, "kind", "counts") != "counts":
        raise UserError(f"{source}: {model} needs a counts dataset in CSR layout "
                        f"(this one is {getattr(src, 'kind', 'real')}, {src.layout})")
    if split and split in src.split_names():
        held = np.asarray(src.split(split).get("test_rows", held), dtype=np.int64)
    if src.n_rows - len(held) < 1:
        raise UserError("no training documents left after the held-out split")
    vocab = src.column_names() if source.url is not None else None
    return Corpus(source, src.n_rows, src.n_cols, held, src.total(), vocab)


@dataclass
class TopicState(DriverState):
    """The client-side values of a topic model's fit: q(beta) as shapes ``g`` and rates ``h`` (V x K), and
    the documents the fit has seen. A model whose globals hold more derives its own (``models.cnmf.CNMFState``)."""

    g: np.ndarray
    h: np.ndarray
    docs_seen: int

    def __post_init__(self) -> None:
        self.docs_seen = int(self.docs_seen)


class TopicModel(Protocol):
    """A Poisson topic model: its globals (a ``state_type``), local step, statistics and updates (module
    docstring). Its methods that take blocks run on the workers; the others on the client."""

    config: TopicModelConfig
    local_state: str           # the name of the documents' local parameters in batch mode
    effort: tuple[str, str]    # (trace key, statistic) of the local steps' work per document
    objective_key: str         # the trace key of the batch objective (``objective``)
    state_type: type[TopicState]

    def initial_globals(self, corpus: Corpus, n_tokens: float, n_docs: int) -> TopicState: ...
    def local_view(self, state: TopicState) -> Any: ...
    def batch_local(self, rows: CSRRows, local: Any, view: Any) -> tuple[Any, dict]: ...
    def prepare(self, engine: Engine, state: TopicState, blocks: BlockSet) -> Any: ...
    def svi_statistics(self, engine: Engine, state: TopicState, blocks: BlockSet, prepared: Any) -> dict: ...
    def batch_update(self, engine: Engine, state: TopicState, stats: dict, locals_: BlockSet) -> TopicState: ...
    def objective(self, engine: Engine, rows: BlockSet, locals_: BlockSet, state: TopicState) -> float: ...
    def step_size(self, state: TopicState, stats: dict, scale: float, step: int) -> float: ...
    def stochastic_update(self, state: TopicState, stats: dict, scale: float, rho: float) -> TopicState: ...
    def eval_view(self, state: TopicState) -> Any: ...
    def completion(self, rows: CSRRows, block: int, view: Any) -> dict: ...


def scheduled_step(config: TopicModelConfig, step: int) -> float:
    """The schedule's rho_t = (t0 + t)^-kappa of SVI step ``step`` (eq. 11.35)."""
    return bnmf.step_size(step, config.t0, config.kappa)


def no_local(rows: CSRRows) -> None:
    """A document block's local parameters before the first batch iteration: none yet."""
    return None


class TopicDriver(StatefulDriver):
    """Batch VB or SVI of a topic model on the engine (module docstring; ``engine.loop.Driver``). Its
    ``state`` (of the model's ``state_type``) exists from ``start`` or ``set_globals`` on."""

    state: TopicState

    def __init__(self, model: TopicModel, corpus: Corpus, engine: Engine, label: str):
        model.config.check()
        self.model, self.corpus, self.engine, self.label = model, corpus, engine, label
        self.config = model.config
        self.state_type = model.state_type
        self.minibatches = row_ranges(corpus.n_rows, self.config.batch_size)
        # batch VB keeps every block on the workers; SVI reads each minibatch's blocks when it needs them
        self.rows = engine.hold(count_blocks(engine, corpus.source, row_ranges(corpus.n_rows, self.config.chunk_rows),
                                             corpus.held_out)) if self.config.mode == "batch" else None
        self.eval_rows = self._eval_blocks(self.config.eval_docs)
        if self.eval_rows is not None:
            engine.hold(self.eval_rows)
        self._prefetched: tuple[int, BlockSet, Any] | None = None

    def _eval_blocks(self, count: int | None) -> BlockSet | None:
        """``count`` held-out documents drawn by the seed (all with None), in blocks of
        ``EVAL_BLOCK_ROWS``."""
        held = self.corpus.held_out
        if len(held) == 0:
            return None
        rng = stream(self.config.seed, "eval")
        chosen = np.sort(rng.choice(held, size=min(count or len(held), len(held)), replace=False))
        parts = [(self.corpus.source, chosen[i:i + EVAL_BLOCK_ROWS]) for i in range(0, len(chosen), EVAL_BLOCK_ROWS)]
        return self.engine.generate(count_row_set, parts)

    # -- the driver contract --
    def start(self, n_tokens: float | None = None, n_docs: int | None = None) -> None:
        """Initial globals for a corpus of ``n_docs`` documents and ``n_tokens`` tokens (default: this
        corpus's training documents; the estimators' ``partial_fit`` passes the streamed corpus's size)."""
        self.state = self.model.initial_globals(self.corpus, self.corpus.n_tokens if n_tokens is None else n_tokens,
                                                self.corpus.n_train if n_docs is None else n_docs)
        if self.config.mode == "batch":
            self.engine.keep(self.model.local_state, self.engine.map(no_local, self.rows))

    def set_globals(self, arrays: Mapping[str, Any]) -> None:
        super().set_globals(arrays)
        self._prefetched = None

    def recover(self, mark: Any) -> None:
        """Back to the state ``mark`` kept (``DriverState.mark``), not through ``set_globals``' arrays: Bayesian
        NMF's mark keeps only the rows of q(beta) that changed since, not a V x K copy."""
        self.state = self.state_type.from_mark(mark)
        self._prefetched = None

    def total_steps(self) -> int:
        if self.config.mode == "batch":
            return self.config.max_iter
        return self.config.passes * len(self.minibatches)

    def finished(self, step: int, trace: list[dict]) -> bool:
        if step >= self.total_steps():
            return True
        if self.config.mode == "batch" and len(trace) >= 2:
            key = self.model.objective_key
            new, old = trace[-1][key], trace[-2][key]
            return abs(new - old) <= self.config.tol * abs(old)
        return False

    def step(self, step: int) -> dict:
        record = self._batch_step() if self.config.mode == "batch" else self._svi_step(step)
        if self._scores_after(step) and self.eval_rows:
            record["heldout_ll"] = self.heldout_loglik()
        return record

    def _scores_after(self, step: int) -> bool:
        """Whether held-out documents are scored after ``step``: every ``eval_every`` steps and after the
        last, never with ``eval_every`` 0."""
        every = self.config.eval_every
        return every > 0 and ((step + 1) % every == 0 or step + 1 >= self.total_steps())

    # -- batch VB --
    def _batch_step(self) -> dict:
        engine, model = self.engine, self.model
        view = engine.share(model.local_view(self.state))
        results = engine.map(model.batch_local, self.rows, engine.state(model.local_state), view)
        locals_, stats = engine.split(results, 2)
        engine.keep(model.local_state, locals_)
        stats = engine.reduce(stats)
        self.state = model.batch_update(engine, self.state, stats, locals_)
        objective = model.objective(engine, self.rows, locals_, self.state)
        self.state.docs_seen += self.corpus.n_train
        record_key, stat_key = model.effort
        return {model.objective_key: objective, "docs_seen": self.state.docs_seen,
                record_key: stats[stat_key] / self.corpus.n_train}

    # -- SVI --
    def _minibatch(self, step: int) -> BlockSet:
        """The blocks of minibatch ``step`` (shuffled order per pass, from the seed): its rows cut into
        blocks of ``chunk_rows``. Built from its own row ranges, so a step's graph holds only its blocks
        whatever the size of the corpus (a selection from a whole-corpus array sent the corpus's graph to
        the scheduler every step)."""
        n_mb = len(self.minibatches)
        order = stream(self.config.seed, "order", step // n_mb).permutation(n_mb)
        lo, hi = self.minibatches[order[step % n_mb]]
        return count_blocks(self.engine, self.corpus.source, row_ranges(hi, self.config.chunk_rows, start=lo),
                            self.corpus.held_out)

    def _svi_step(self, step: int) -> dict:
        """One SVI step; the next minibatch is read, and prepared (``TopicModel.prepare``), while this one is
        processed."""
        ahead = self._prefetched if self._prefetched and self._prefetched[0] == step else self._read_ahead(step)
        _, blocks, prepared = ahead
        self._prefetched = self._read_ahead(step + 1) if step + 1 < self.total_steps() else None
        stats, rho = self.svi_update(blocks, step, self.corpus.n_train, prepared)
        record_key, stat_key = self.model.effort
        return {"pass": step // len(self.minibatches) + 1, "docs_seen": self.state.docs_seen, "rho": rho,
                record_key: stats[stat_key] / max(stats["docs"], 1.0)}

    def _read_ahead(self, step: int) -> tuple[int, BlockSet, Any]:
        """Minibatch ``step``'s blocks and what the model prepares of them, started now."""
        blocks = self.engine.read_ahead(self._minibatch(step))
        return step, blocks, self.model.prepare(self.engine, self.state, blocks)

    def svi_update(self, blocks: BlockSet, step: int, n_docs: float,
                   prepared: Any = NOT_PREPARED) -> tuple[dict, float]:
        """SVI step ``step`` on the minibatch ``blocks`` of a corpus of ``n_docs`` documents: local steps
        on the workers, then the natural-gradient update of the globals with the minibatch sums scaled
        by n_docs / |batch| (eqs. 11.33-11.35). The one update path of ``fit`` and of the estimators'
        ``partial_fit``; ``prepared`` is the model's ``prepare`` of ``blocks`` if it was started ahead (None is
        a model's answer too). Returns the reduced statistics and the step size."""
        if prepared is NOT_PREPARED:
            prepared = self.model.prepare(self.engine, self.state, blocks)
        stats = self.model.svi_statistics(self.engine, self.state, blocks, prepared)
        scale = n_docs / max(stats["docs"], 1.0)
        rho = self.model.step_size(self.state, stats, scale, step)
        if stats["docs"] > 0:
            self.state = self.model.stochastic_update(self.state, stats, scale, rho)
        self.state.docs_seen += int(stats["docs"])
        return stats, rho

    # -- evaluation --
    def heldout_loglik(self, every_document: bool = False) -> float:
        """Per-word held-out log likelihood by threefold document completion (paper 002, Sec. 11.6), of the documents
        scored while fitting or of ``every_document`` of the split."""
        rows = self._eval_blocks(None) if every_document else self.eval_rows
        view = self.engine.share(self.model.eval_view(self.state))
        total = self.engine.reduce(self.engine.map(self.model.completion, rows, self.engine.indices(rows.n), view))
        return total["ll"] / max(total["tokens"], 1.0)

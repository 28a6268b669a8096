"""Bayesian NMF (paper 002, Sec. 11.3.1; docs/models/bnmf.md): its settings and its model object for the topic
models' driver (``models.topics``): the local step of a document block, its statistics, and the batch and
stochastic updates of q(beta) on the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from buffet.data.errors import UserError
from buffet.data.store import CSRRows
from buffet.kernels import bnmf, bnmf_sparse
from buffet.pipeline.engine.engine import BlockSet, Engine
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.engine.settings import inherited_option, option, require_counts
from buffet.pipeline.models.state import DriverState
from buffet.pipeline.models.topics import CLIENT_THREADS, Corpus, TopicModelConfig, scheduled_step

TOPIC_SHAPE = 0.5  # the default shape c0 / V of the topic prior beta_vk ~ Gamma(c0/V, c0)
MAP_TOPIC_SHAPE = 0.2  # the same for the MAP estimate (``BNMFConfig.estimate``)
ESTIMATES = ("vb", "map")
TOPIC_WEIGHTS = ("mean", "geometric")  # ``BNMFConfig.topic_weights``
STEP_SIZES = ("banded", "adaptive", "schedule")  # ``BNMFConfig.step_size``
BAND_T0, BAND_KAPPA = 1.0, 0.51  # the schedule that bounds the "banded" steps from above: (1 + t)^-0.51
SVI_SHAPES = "svi_shapes"  # the globals' name of the lazy shapes' own values (``BNMFState.to_arrays``)
# A minibatch is sent the whole vocabulary's view, without first gathering its words, when that view holds at
# most this many entries (words x K) beyond the words the last minibatch touched: computing them (about 12 ns
# each on two threads) then costs about what the round of tasks that finds the words does (``BNMF.prepare``).
# Same numbers either way.
WHOLE_VIEW_SPARE = 1_000_000
ALL_WORDS = "all words"  # ``BNMF.prepare``'s answer when the next minibatch gets the whole vocabulary's view


@dataclass
class BNMFConfig(TopicModelConfig):
    """Settings of a Bayesian NMF fit: the topic models' (``TopicModelConfig``) plus the theta prior
    (paper 002, Sec. 11.6) and how the local steps run.

    Why these SVI steps and local sweeps: each step takes the step the minibatch's own noise calls for, held between
    the schedule (kappa 0.6, t0 10) and the undelayed schedule (1 + t)^-0.51 (``step_size`` "banded"), and a
    document's local sweeps stop once fewer than 1% of its tokens change topic in a sweep (``share_tol``) or after
    20. The noise is that of a draw without replacement from the corpus (``kernels.bnmf.minibatch_noise``), so a
    small corpus's minibatches, which cannot differ by more than the corpus holds, take longer steps. Corpora with
    dense topics or more topics than they hold want small early steps, which the noise-driven step finds and no
    fixed schedule gives every corpus; the upper bound keeps the steps from chasing each minibatch where a store
    holds like documents together (there a minibatch's own spread understates how much the next one differs;
    docs/models/bnmf.md, "Step sizes").

    Why the local sweeps weigh words in topics by exp(E ln beta), mean-field VB's update, and not by the topics'
    means E[beta] (``topic_weights``): over the panel of 57 corpora of benchmarks/bnmf_sweep_panel.py the means do
    better (largest shortfall against each corpus's best earlier setting 0.31% at ten fresh seeds against 0.35%,
    0.2-0.9% above it on the 14 of real text), but on a corpus drawn from Bayesian NMF with short documents their
    held-out score falls with more passes (0.014 per word from one pass to twenty, where exp(E ln beta) rises by
    0.026; benchmarks/bnmf_passes.py), and a default must not score worse for more passes over the same data
    (docs/models/bnmf.md, "Topic weights").

    Why the topic prior defaults to c0 = 0.5 V (shape 0.5 per word and topic) and not the paper's 0.05 V:
    mean-field VB weighs a word in a topic by exp(E ln beta) = exp(psi(g)) / h, about (g - 0.5) / h for
    counts above one and vanishing for shapes far below it (Asuncion et al. 2009, "On smoothing and
    inference for topic models"), so a prior shape of 0.05 smooths less than nothing: topics keep
    sharpening on the training documents, and held-out scores fell with every pass on short documents
    (real and generated), a one-pass score looking better only while the initial topics' uniform mass was
    not yet forgotten. With shape 0.5 more passes score better or the same, and one pass the same or better
    (benchmarks/bnmf_passes.py). With the topics' means in the sweeps (``topic_weights``) it is the same: in trials
    on the same panel (three seeds, before the starting topics were spread) a shape of 0.3 fell up to 0.72% short of
    a corpus's best earlier setting and 0.2 (the MAP estimate's) up to 0.93% on eight corpora tried, against 0.30%
    for 0.5 on all but the one corpus whose topics then stayed alike.
    """

    c0: float | None = option(None, "Topic prior strength: beta_vk ~ Gamma(c0/V, c0), mean 1/V (> 0; unset: 0.5 V, "
                                    "a shape of 0.5 per word; 0.2 V with --estimate map). Larger smooths topics "
                                    "more; smaller lets them be sparser, and can make held-out scores fall with "
                                    "more passes.")
    a0: float | None = option(None, "Shape of the document weights' prior theta_kd ~ Gamma(a0, b0) (> 0; unset: "
                                    "1/K, paper 002). Smaller makes each document use fewer topics.")
    b0: float | None = option(None, "Rate of the document weights' prior theta_kd ~ Gamma(a0, b0) (> 0; unset: "
                                    "1/K). The prior mean of theta is a0/b0.")
    estimate: str = option("vb", "What is fitted: 'vb' gamma posteriors q(beta), q(theta) (paper 002; see "
                                 "--topic-weights for how the local sweeps weigh the topics); "
                                 "'map' the MAP estimate of beta and theta under priors whose shapes are one "
                                 "larger, by EM (online EM in SVI), whose local sweeps weigh topics in a document by "
                                 "the means of theta as well: fewer topics left empty, and on the real text measured "
                                 "higher held-out scores (docs/models/bnmf.md, 'The MAP estimate'). Its topic prior "
                                 "defaults to c0 = 0.2 V.")
    topic_weights: str | None = option(None, "How the local sweeps weigh a word in a topic: 'geometric' by "
                                               "exp(E ln beta_vk), paper 002's mean-field update, whose batch ELBO "
                                               "never falls; 'mean' by the topic's posterior mean E[beta_vk], which "
                                               "leaves fewer topics starved of tokens and measured higher held-out "
                                               "scores after one or a few passes, on real text most, but can score "
                                               "lower with many passes over short documents (docs/models/bnmf.md, "
                                               "'Topic weights'). Unset: 'geometric', and the means for the MAP "
                                               "estimate, which always uses them.")
    kappa: float = inherited_option(TopicModelConfig, "kappa", 0.6)
    t0: float = inherited_option(TopicModelConfig, "t0", 10.0)
    step_size: str = option("banded", "SVI step sizes: 'banded' takes the step the minibatch's own noise calls for, "
                                      "at least the schedule's rho_t = (t0 + t)^-kappa and at most (1 + t)^-0.51; "
                                      "'adaptive' the same without the upper bound (it chases each minibatch where "
                                      "the store holds like documents together); 'schedule' rho_t alone "
                                      "(docs/models/bnmf.md, 'Step sizes').")
    max_sweeps: int = option(20, "Training: most local sweeps per document per step (>= 1), if --share-tol or "
                                 "--local-tol does not stop it first. Lower it to cap the time a step takes.")
    share_tol: float = option(0.01, "Training: stop a document's local sweeps once fewer than this share of its "
                                    "tokens change topic in a sweep (0 <= share < 1; 0: only --local-tol and "
                                    "--max-sweeps stop them). The same measure for short and long documents; "
                                    "smaller fits each minibatch's documents more tightly, slower.")
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
        if not 0.0 <= self.share_tol < 1.0:
            raise UserError(f"share_tol must be in [0, 1), got {self.share_tol}")
        if self.step_size not in STEP_SIZES:
            raise UserError(f"step_size must be one of {', '.join(STEP_SIZES)}, got {self.step_size!r}")
        if self.estimate not in ESTIMATES:
            raise UserError(f"estimate must be one of {', '.join(ESTIMATES)}, got {self.estimate!r}")
        if self.topic_weights is not None and self.topic_weights not in TOPIC_WEIGHTS:
            raise UserError(f"topic_weights must be one of {', '.join(TOPIC_WEIGHTS)}, got {self.topic_weights!r}")
        if self.estimate == "map" and self.topic_weights == "geometric":
            raise UserError("the MAP estimate weighs words by the topics' means: drop --topic-weights geometric or "
                            "use --estimate vb")
        if self.precision not in ("float64", "float32"):
            raise UserError(f"precision must be 'float64' or 'float32', got {self.precision!r}")

    @property
    def map_estimate(self) -> bool:
        """Whether the MAP estimate is fitted: the local sweeps weigh topics in a document by the means of theta too,
        and batch mode ascends the log posterior density instead of the ELBO."""
        return self.estimate == "map"

    @property
    def topic_means(self) -> bool:
        """Whether the local sweeps weigh words in topics by E[beta] (``topic_weights``, and the MAP estimate)
        instead of exp(E ln beta)."""
        return self.map_estimate or self.topic_weights == "mean"

    @property
    def spread_start(self) -> bool:
        """Whether the starting topics draw the prior's part of their shapes too (``kernels.bnmf.initial_globals``):
        for VB with the topics' means, whose starting differences the prior's shape would otherwise dilute."""
        return self.topic_means and not self.map_estimate

    def local_settings(self) -> bnmf.LocalSettings:
        """How the training local steps run."""
        return bnmf.LocalSettings(self.local_tol, self.max_sweeps, self.accelerate, self.share_tol, self.map_estimate)

    def inference_settings(self) -> bnmf.LocalSettings:
        """How documents are fitted with the topics fixed for evaluation and ``transform``."""
        return bnmf.LocalSettings(self.local_tol, self.eval_max_sweeps, self.accelerate, means=self.map_estimate)

    def view(self, g: np.ndarray, h: np.ndarray, dtype=np.float64, threads: int = 1) -> bnmf.TopicView:
        """The view of topics g, h that this estimate's local steps read (``kernels.bnmf.word_weights``)."""
        return bnmf.TopicView.from_params(g, h, dtype=dtype, threads=threads, means=self.topic_means)

    def objective_view(self, g: np.ndarray, h: np.ndarray, dtype=np.float64, threads: int = 1) -> bnmf.TopicView:
        """The view the batch objective is written in: exp(E ln beta) for the ELBO, whatever the local sweeps weigh
        topics by (``topic_weights``), and E[beta] for the MAP estimate's log posterior density."""
        return bnmf.TopicView.from_params(g, h, dtype=dtype, threads=threads, means=self.map_estimate)

    def hyper(self, n_words: int) -> bnmf.Hyper:
        base = bnmf.Hyper.paper_defaults(n_words, self.n_topics)
        shape = MAP_TOPIC_SHAPE if self.map_estimate else TOPIC_SHAPE
        return bnmf.Hyper(c0=shape * n_words if self.c0 is None else self.c0,
                          a0=base.a0 if self.a0 is None else self.a0,
                          b0=base.b0 if self.b0 is None else self.b0, n_words=n_words)


@dataclass
class BNMFState(DriverState):
    """The client-side values of a Bayesian NMF fit: q(beta) kept lazily (``kernels.bnmf_sparse.LazyTopics``)
    and the documents seen. ``g`` and ``h`` are q(beta)'s shapes and rates (V x K) as a ``models.topics.TopicState``
    has them, made when read; a checkpoint holds them, ``docs_seen`` and ``SVI_SHAPES`` (``to_arrays``)."""

    topics: bnmf_sparse.LazyTopics
    docs_seen: int
    touched: int = 0  # words the last minibatch touched (not checkpointed: 0 on resume)

    @classmethod
    def of(cls, g: np.ndarray, h: np.ndarray, docs_seen: int) -> "BNMFState":
        return cls(bnmf_sparse.LazyTopics.of(g, h), int(docs_seen))

    @property
    def g(self) -> np.ndarray:
        return self.topics.shapes()

    @property
    def h(self) -> np.ndarray:
        """The rates, one row for every word (a read-only V x K view of it)."""
        return np.broadcast_to(self.topics.rate, self.topics.E.shape)

    def to_arrays(self) -> dict[str, Any]:
        """g, h, docs_seen, and under ``SVI_SHAPES`` what else restores the lazy shapes exactly (P, the prior
        shape, E's column sums and sum of squares as the updates summed them, and E itself unless P is 1, when
        E is g): a fit resumed from a checkpoint, or continued by ``partial_fit``, goes on with the same numbers
        as the fit that wrote it. h is the read-only V x K view of its one row and E the live array, not copies (at
        V = 100,000 and K = 100 each copy is 80 MB): they hold until the next update (``DriverState.to_arrays``)."""
        t = self.topics
        lazy = {"P": np.float64(t.P), "prior": np.float64(t.prior), "column_sums": t.column_sums.copy(),
                "squares": np.float64(t.squares)}
        if t.P != 1.0:
            lazy["E"] = t.E
        return {"g": self.g, "h": self.h, "docs_seen": self.docs_seen, SVI_SHAPES: lazy}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> "BNMFState":
        lazy = arrays.get(SVI_SHAPES)
        if lazy is None:
            return cls.of(arrays["g"], arrays["h"], arrays["docs_seen"])
        h = arrays["h"]
        topics = bnmf_sparse.LazyTopics(np.array(lazy.get("E", arrays["g"]), dtype=np.float64),
                                        np.array(h[0] if h.ndim == 2 else h),
                                        float(lazy["P"]), float(lazy["prior"]), np.array(lazy["column_sums"]),
                                        float(lazy["squares"]) if "squares" in lazy else None)
        return cls(topics, int(arrays["docs_seen"]))

    def mark(self) -> tuple[bnmf_sparse.Mark, int]:
        """The values of now at the cost of the rows the next update changes (``LazyTopics.mark``)."""
        return self.topics.mark(), self.docs_seen

    @classmethod
    def from_mark(cls, mark: tuple[bnmf_sparse.Mark, int]) -> "BNMFState":
        return cls(mark[0].restore(), mark[1])


def distinct_words(rows: CSRRows) -> np.ndarray:
    """The sorted distinct words of a block."""
    return np.unique(rows.indices)


@dataclass(frozen=True)
class BNMF:
    """Bayesian NMF as a ``models.topics.TopicModel``: globals q(beta) as shapes ``g`` and rates ``h``
    (V x K), a ``BNMFState``; local parameters q(theta_d) shapes (named state "theta"). An SVI step costs what
    its minibatch touches: each block reads and returns its own words only (``kernels.bnmf_sparse``)."""

    config: BNMFConfig
    hyper: bnmf.Hyper
    local_state = "theta"
    effort = ("mean_sweeps", "sweeps")
    state_type = BNMFState

    @classmethod
    def of(cls, config: BNMFConfig, n_words: int) -> "BNMF":
        return cls(config, config.hyper(n_words))

    @property
    def objective_key(self) -> str:
        """The trace's name of the batch objective: the ELBO (``elbo``), or for the MAP estimate the log posterior
        density at it (``log_posterior``)."""
        return "log_posterior" if self.config.map_estimate else "elbo"

    def initial_globals(self, corpus: Corpus, n_tokens: float, n_docs: int) -> BNMFState:
        """The prior plus noise scaled to the corpus (paper 002, Sec. 11.6); the new g becomes the topics' own
        array (no copy: at V = 100,000 and K = 100 each V x K array is 80 MB)."""
        g, h = bnmf.initial_globals(corpus.n_words, self.config.n_topics, n_tokens, n_docs, self.hyper,
                                    stream(self.config.seed, "init"), spread_prior=self.config.spread_start)
        return BNMFState(bnmf_sparse.LazyTopics(g, h[0].copy()), docs_seen=0)

    def local_view(self, state: BNMFState) -> bnmf.TopicView:
        """The topic expectations the local steps sweep with, in the configured precision."""
        return self.config.view(state.g, state.topics.rate, np.dtype(self.config.precision), CLIENT_THREADS)

    def batch_local(self, rows: CSRRows, a: np.ndarray | None, view: bnmf.TopicView) -> tuple[np.ndarray, dict]:
        """q(theta_d) of a block warm-started from its last shapes, with the block's statistics."""
        res = bnmf.local_step(rows.indptr, rows.indices, rows.data, view, self.hyper, self.config.local_settings(),
                              a_start=a)
        return res.a, {"S": res.S, "theta_sum": res.theta_sum, "sweeps": float(res.sweeps.sum())}

    def prepare(self, engine: Engine, state: BNMFState, blocks: BlockSet) -> BlockSet | str:
        """The minibatch blocks' distinct words, kept on the workers until ``svi_statistics`` brings them here:
        the driver starts this with the minibatch's reading, a step ahead, so a step waits for one round of
        tasks (the local steps), not two. ``ALL_WORDS`` instead when the whole vocabulary's view holds at most
        ``WHOLE_VIEW_SPARE`` entries beyond the words the last minibatch touched."""
        engine.hold(blocks)  # read once for both passes over them
        n_words, n_topics = state.topics.E.shape
        if (n_words - state.touched) * n_topics <= WHOLE_VIEW_SPARE:
            return ALL_WORDS
        return engine.hold(engine.map(distinct_words, blocks))

    def svi_statistics(self, engine: Engine, state: BNMFState, blocks: BlockSet, prepared: BlockSet | str) -> dict:
        """A minibatch's statistics, for the words it touches: the blocks' distinct words (``prepare``) come
        here, the view of their union is sent (not the vocabulary's, unless ``prepared`` is ``ALL_WORDS``), and
        the blocks' statistics of their own words are merged in block order (``bnmf_sparse.add_word_stats``)."""
        if isinstance(prepared, str):
            union, words = np.arange(len(state.topics.E)), None
        else:
            union = words = np.unique(np.concatenate(engine.collect(prepared)))
        view = state.topics.view(words, dtype=np.dtype(self.config.precision), threads=CLIENT_THREADS,
                                 means=self.config.topic_means)
        return engine.reduce(engine.map(self.svi_local, blocks, engine.share((union, view))),
                             combine=bnmf_sparse.add_word_stats)

    def svi_local(self, rows: CSRRows, shared: tuple[np.ndarray, bnmf.TopicView]) -> dict:
        """A minibatch block's statistics of its own words from fresh local fits, with the rows of the view
        ``shared`` (words, their view) for those words."""
        words, local = bnmf_sparse.block_words(rows.indices)
        view = bnmf_sparse.words_view(shared[1], shared[0], words)
        res = bnmf.local_step(rows.indptr, local, rows.data, view, self.hyper, self.config.local_settings(),
                              with_spread=self.config.step_size != "schedule")
        return {bnmf_sparse.WORDS: words, "S": res.S, "theta_sum": res.theta_sum, "docs": float(rows.n_rows),
                "sweeps": float(res.sweeps.sum()), "square_sum": res.square_sum}

    def batch_update(self, engine: Engine, state: BNMFState, stats: dict, locals_: BlockSet) -> BNMFState:
        """q(beta) from every document's statistics (the batch update)."""
        g, h = bnmf.batch_update(stats["S"], stats["theta_sum"], self.hyper)
        return BNMFState.of(g, h, state.docs_seen)

    def local_elbo(self, rows: CSRRows, a: np.ndarray, view: bnmf.TopicView) -> dict:
        """A block's terms of the objective: the ELBO's, or the MAP objective's (``BNMFConfig.estimate``)."""
        terms = bnmf.map_local_objective if self.config.map_estimate else bnmf.local_elbo
        return {"elbo": terms(rows.indptr, rows.indices, rows.data, view, self.hyper, a)}

    def objective(self, engine: Engine, rows: BlockSet, locals_: BlockSet, state: BNMFState) -> float:
        """The ELBO (or with the MAP estimate, the log posterior density at it) at the new globals: the
        documents' terms, reduced, plus the topics'."""
        view = engine.share(self.config.objective_view(state.g, state.topics.rate, np.dtype(self.config.precision),
                                                       CLIENT_THREADS))
        local = engine.reduce(engine.map(self.local_elbo, rows, locals_, view))["elbo"]
        topics = bnmf.map_global_objective if self.config.map_estimate else bnmf.global_elbo
        return local + topics(state.g, state.topics.rate, self.hyper)

    def step_size(self, state: BNMFState, stats: dict, scale: float, step: int) -> float:
        """rho of SVI step ``step``: the schedule's (t0 + t)^-kappa, or with ``step_size`` "adaptive" the larger
        of it and the step the minibatch's own noise calls for (``kernels.bnmf.adaptive_step_size``), and with
        "banded" that step held at most at the undelayed schedule (1 + t)^-0.51 (docs/models/bnmf.md, "Step
        sizes"). A minibatch of fewer than two documents has no spread to measure: the schedule."""
        floor = scheduled_step(self.config, step)
        if self.config.step_size == "schedule" or stats["docs"] < 2:
            return floor
        noise = bnmf.minibatch_noise(stats["S"], stats["square_sum"], stats["docs"], scale)
        distance = state.topics.distance(stats[bnmf_sparse.WORDS], stats["S"], scale,
                                         self.hyper.c0 / self.hyper.n_words)
        ceiling = bnmf.step_size(step, BAND_T0, BAND_KAPPA) if self.config.step_size == "banded" else 1.0
        return bnmf.adaptive_step_size(distance, noise, floor, ceiling)

    def stochastic_update(self, state: BNMFState, stats: dict, scale: float, rho: float) -> BNMFState:
        """q(beta)'s natural-gradient step (eqs. 11.33-11.34) in the words the minibatch touched, in place."""
        state.topics.update(stats[bnmf_sparse.WORDS], stats["S"], stats["theta_sum"], self.hyper, scale, rho)
        state.touched = len(stats[bnmf_sparse.WORDS])
        return state

    def eval_view(self, state: BNMFState) -> tuple[bnmf.TopicView, np.ndarray]:
        """What document completion reads: the float64 topic view and E[beta]."""
        g, rate = state.g, state.topics.rate
        return self.config.view(g, rate), g / rate

    def completion(self, rows: CSRRows, block: int, view: tuple[bnmf.TopicView, np.ndarray]) -> dict:
        """Threefold document completion of a block of held-out documents (paper 002, Sec. 11.6)."""
        topics, mean_beta = view
        ll, tokens = bnmf.threefold_completion(rows.indptr, rows.indices, rows.data, topics, mean_beta, self.hyper,
                                               self.config.inference_settings(),
                                               stream(self.config.seed, "thirds", block))
        return {"ll": ll, "tokens": tokens}

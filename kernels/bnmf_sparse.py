"""Bayesian NMF's SVI step in the words a minibatch touches (paper 002, eqs. 11.33-11.34; docs/models/bnmf.md).

A minibatch touches a few thousand words of a vocabulary that may hold 10^5 or more, and its statistics
S_vk are zero for every other word. For such a word the natural-gradient step
g <- (1 - rho) g + rho (c0/V + scale S) only pulls the shape towards the prior's c0/V, by the factor
(1 - rho). So the shapes are kept as g_vk = P E_vk + (c0/V) (1 - P), with P the product of the (1 - rho_t)
since E was last rescaled: a step multiplies P by (1 - rho) and adds rho scale S / P to the rows of E of the
words it touched, in time proportional to those words. While P is 1 (at the start, after a batch update,
on restoring a checkpoint) g is E, digit for digit. The rates h_vk are the same for every word
(eq. 11.34) and are kept as one row.

Each block fits its documents with the expectations of its own words only (``block_words``, a
``TopicView`` of those rows) and returns its statistics for them (``WORDS`` and an S of (words, K));
``add_word_stats`` merges two blocks' statistics. Where both hold a word the sum is the one the
V x K sum would give, so the merged statistics equal the dense ones bit for bit.

Against the eager update (``bnmf.stochastic_update``) only rounding differs: g is P E + c0/V (1 - P)
instead of the recursion's own sum, and sum_v g_vk is kept from the column sums of E instead of summed over
the vocabulary. All terms are positive, so each step adds a relative error of a few units in the last
place: after t steps g and the topic sums agree with the eager update's to about t x 1e-16, relatively.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from buffet.kernels.bnmf import Hyper, TopicView, word_weights

WORDS = "words"  # the statistics' key of the sorted word ids the rows of "S" belong to
RESCALE_BELOW = 1e-100  # P is folded into E when it falls below this (or to 0, a step of rho = 1)


def block_words(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct words of a block's nonzeros, and each nonzero's position among them."""
    words, local = np.unique(indices, return_inverse=True)
    return words, local.reshape(-1)


def words_view(view: TopicView, view_words: np.ndarray, words: np.ndarray) -> TopicView:
    """The rows of ``view`` (whose rows are the words ``view_words``, sorted) for ``words``, a subset."""
    return TopicView(view.exp_elog_beta[np.searchsorted(view_words, words)], view.beta_sum)


def add_word_stats(left: dict, right: dict) -> dict:
    """Two blocks' statistics summed: ``S`` rows of the union of their words (``WORDS``), the other keys
    added as they are. A word only one side holds gets its row unchanged (x + 0 = x), so the result is the
    dense V x K sum's rows, bit for bit."""
    words = np.union1d(left[WORDS], right[WORDS])
    S = np.zeros((len(words), left["S"].shape[1]))
    S[np.searchsorted(words, left[WORDS])] = left["S"]
    S[np.searchsorted(words, right[WORDS])] += right["S"]
    rest = {key: left[key] + right[key] for key in left if key not in (WORDS, "S")}
    return {WORDS: words, "S": S, **rest}


@dataclass
class LazyTopics:
    """q(beta) with the shapes decayed lazily (module docstring): g = P E + prior (1 - P), h the row ``rate``.

    ``E`` (V x K) is owned and changed in place by ``update``. ``prior`` (c0/V) is recorded by the first
    update; while P is 1 it plays no part. After ``mark`` every update records the rows of E it overwrites,
    so ``Mark.restore`` goes back at the cost of those rows instead of a V x K copy."""

    E: np.ndarray
    rate: np.ndarray       # (K,) h_k, the same for every word
    P: float = 1.0
    prior: float = 0.0
    column_sums: np.ndarray | None = None  # (K,) sum_v E_vk
    squares: float | None = None  # sum_vk E_vk^2, for ``distance``
    journal: list | None = field(default=None, repr=False)  # (words or None for all, their old rows of E)

    def __post_init__(self) -> None:
        if self.column_sums is None:
            self.column_sums = self.E.sum(axis=0)
        if self.squares is None:
            self.squares = float(np.vdot(self.E, self.E))

    @classmethod
    def of(cls, g: np.ndarray, h: np.ndarray) -> "LazyTopics":
        """From shapes g (V x K) and rates h, (V x K) with equal rows or one row (K,); g is copied."""
        return cls(np.array(g, dtype=np.float64), np.array(h[0] if h.ndim == 2 else h, dtype=np.float64))

    def shapes(self, words: np.ndarray | None = None) -> np.ndarray:
        """g of ``words`` (all words with None), as a new array."""
        g = self.E * self.P if words is None else self.E[words] * self.P
        g += self.prior * (1.0 - self.P)
        return g

    def mean_sums(self) -> np.ndarray:
        """sum_v E beta_vk = sum_v g_vk / h_k (the rate of q(theta), eq. 11.29)."""
        return (self.P * self.column_sums + len(self.E) * self.prior * (1.0 - self.P)) / self.rate

    def view(self, words: np.ndarray | None, dtype=np.float64, threads: int = 1, means: bool = False) -> TopicView:
        """What the local steps of documents using only ``words`` (every word with None) read (eq. 11.24; with
        ``means``, E beta: ``kernels.bnmf.word_weights``)."""
        return TopicView(word_weights(self.shapes(words), self.rate, dtype, threads, means, overwrite=True),
                         self.mean_sums())

    def distance(self, words: np.ndarray, S: np.ndarray, scale: float, prior: float) -> float:
        """|g_hat - g|^2 over every word and topic, g_hat the minibatch's estimate of the shapes: prior + scale S
        in the rows of ``words``, the prior ``prior`` (c0/V) in every other row (eq. 11.33). O(len(words) x K):
        the untouched rows' share comes from the kept sum of squares of E."""
        gap = self.shapes(words)
        gap -= prior
        touched_prior = float(np.vdot(gap, gap))  # sum over the touched rows of (g - prior)^2
        gap /= scale
        gap -= S
        touched = scale * scale * float(np.vdot(gap, gap))
        whole = self.squares - 2.0 * prior * float(self.column_sums.sum()) + self.E.size * prior * prior
        return touched + max(self.P * self.P * whole - touched_prior, 0.0)

    def update(self, words: np.ndarray, S: np.ndarray, theta_sum: np.ndarray, hyper: Hyper,
               scale: float, rho: float) -> None:
        """The natural-gradient step (eqs. 11.33-11.34) from statistics ``S`` of ``words`` (the rows of every
        other word are zero), in place: O(len(words) x K) unless P is rescaled. ``S`` is used up (its memory
        holds the new rows)."""
        self.prior = hyper.c0 / hyper.n_words
        P = self.P * (1.0 - rho)
        if P < RESCALE_BELOW:
            self.P = P
            self.fold()
            P = 1.0
        self.P = P
        step = np.multiply(S, rho * scale / P, out=S)  # the statistics are not read again: their memory serves
        self.column_sums += step.sum(axis=0)
        rows = self.E[words]
        if self.journal is not None:
            self.journal.append((words, rows))
        self.squares -= float(np.vdot(rows, rows))
        step += rows  # the same sum as rows + step, without a third array of the touched words' size
        self.squares += float(np.vdot(step, step))
        self.E[words] = step
        rate = np.multiply(self.rate, 1.0 - rho)
        rate += rho * (hyper.c0 + scale * theta_sum)
        self.rate = rate

    def fold(self) -> None:
        """Make P 1 with the same shapes: E becomes g (O(V x K)), as in topics made afresh from g (``of``)."""
        if self.P == 1.0:
            return
        if self.journal is not None:
            self.journal.append((None, self.E.copy()))
        self.E *= self.P
        self.E += self.prior * (1.0 - self.P)
        self.column_sums = self.E.sum(axis=0)
        self.squares = float(np.vdot(self.E, self.E))
        self.P = 1.0

    def mark(self) -> "Mark":
        """The values of now, for ``Mark.restore``; from now on updates record what they overwrite."""
        self.journal = []
        return Mark(self, self.P, self.prior, self.column_sums.copy(), self.squares, self.rate.copy())


@dataclass(frozen=True)
class Mark:
    """``LazyTopics`` as they were at ``LazyTopics.mark``."""

    topics: LazyTopics
    P: float
    prior: float
    column_sums: np.ndarray
    squares: float
    rate: np.ndarray

    def restore(self) -> LazyTopics:
        """The marked topics, their overwritten rows written back (latest first); the mark stays usable."""
        topics = self.topics
        for words, rows in reversed(topics.journal or []):
            if words is None:
                topics.E[...] = rows
            else:
                topics.E[words] = rows
        topics.journal = []
        topics.P, topics.prior = self.P, self.prior
        topics.column_sums, topics.squares, topics.rate = self.column_sums.copy(), self.squares, self.rate.copy()
        return topics

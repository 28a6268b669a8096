"""Correlated NMF per-chunk mathematics: paper 002, Secs. 11.3.2 and 11.5; docs/models/cnmf.md.

X_dv ~ Poisson(sum_k beta_vk w_kd) with w_kd = exp(alpha_d + l_k . u_d). q(beta_vk) = Gamma(g_vk, h_vk)
is Bayesian NMF's (``kernels.bnmf``: TopicView, batch and stochastic updates, its ELBO term);
alpha_d, l_k (rows of L, K x m) and u_d (rows of U, D x m) are point estimates with
l_k ~ N(0, sigma^2 I_m) and u_d ~ N(0, I_m).

The objective batch inference ascends is the ELBO in beta plus the log joint in the point estimates,
with the auxiliary p^(vd) of eq. (11.23) at its optimum:

    F = sum_d f_d + sum_k ln N(l_k; 0, sigma^2 I_m) + sum_vk (E ln p(beta_vk) - E ln q(beta_vk)),
    f_d = sum_v X_dv ln sum_k exp(E ln beta_vk + ln w_kd) - sum_k B_k w_kd - sum_v ln X_dv!
          + ln N(u_d; 0, I_m),

B_k = sum_v E beta_vk. alpha_d enters f_d at its maximiser (eq. 11.32), so f_d is a function of u_d:
with c_d any shift and w'_kd = exp(l_k . u_d - c_d),

    f_d(u_d) = sum_v X_dv ln sum_k exp(E ln beta_vk) w'_kd - N_d ln sum_k B_k w'_kd + N_d ln N_d - N_d + ...,

N_d = sum_v X_dv. The local step maximises f_d by Newton steps with the exact Hessian,

    -grad^2 f_d = I + N_d Cov_q(l) - sum_v X_dv Cov_{p^(vd)}(l),   q_k propto B_k w_kd,

whose first two terms are the curvature of the bound at fixed p^(vd) (alpha_d profiled out) and whose
last, the information that fixing p^(vd) leaves out, makes the steps converge quadratically instead of
linearly. That last term is the costly one (nnz K m flops a document), and far from the optimum, where the
exact Hessian is mostly indefinite anyway, it buys little: a document's first steps use the bound's curvature
alone, over-relaxed (``step_directions``), and the exact Hessian takes over once a step moves u_d by less
than ``LocalSettings.exact_below``. f_d need not be concave, so where the exact Hessian is not negative
definite a step takes only part of the last term (``newton_directions``), and a line search keeps every
step uphill.

The local step works on a CSR chunk, SLICE_DOCS documents at a time; every per-document quantity
is computed with row-wise or per-document products, so a document's numbers do not depend on the
other documents of its chunk, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping

import numpy as np
import scipy.sparse as sp
from scipy.linalg.lapack import dpotrf
from scipy.special import gammaln, xlogy

from buffet.kernels import bnmf

ARMIJO = 1e-4  # sufficient-increase constant of the backtracking line searches
EXACTNESS = (1.0, 0.9, 0.8, 0.6, 0.3, 0.0)  # fractions of the missing information tried (newton_directions)
FLAT = 1e-10  # a local Newton step whose predicted rise g.direction is below FLAT |f_d| is taken whole
LOOP_ENTRIES = 4096  # a document with at least this many gathered entries (words x K) has phi summed by its own
#                     matrix-vector product (``word_sums``); smaller ones share one vectorised product
SINGLE_WORDS_TOL = 1e-4  # the least local tolerance at which the words' term may be built in single precision
SLICE_DOCS = 128  # documents fitted together; bounds their gathered (nonzeros x K) rows, ~30 MB at K = 100
TOPIC_STEP_HALVINGS = 30  # candidate step sizes 1, 1/2, ..., 2^-30 of the batch l_k line search
Stats = Mapping[str, np.ndarray]  # summed LocalResult.statistics()


@dataclass(frozen=True)
class Prior:
    """l_k ~ N(0, sigma2 I_m), u_d ~ N(0, I_m) (paper 002's defaults m = 50, sigma^2 = 1/m)."""

    n_dims: int = 50
    sigma2: float = 1.0 / 50

    @classmethod
    def with_dims(cls, n_dims: int, sigma2: float | None = None) -> "Prior":
        """The default sigma^2 = 1/m unless ``sigma2`` is given."""
        return cls(n_dims, 1.0 / n_dims if sigma2 is None else sigma2)


@dataclass(frozen=True)
class LocalSettings:
    """Newton iteration of the local step. A document's first steps use the bound's curvature at fixed p^(vd),
    their direction stretched by ``overrelax``, until one moves u_d by less than ``exact_below`` (max norm); its
    steps use the exact Hessian after that (``newton_step``), and from the first step if ``exact_below`` is
    infinite. It stops when an exact step moved u_d by less than ``tol`` or found no increase, or after
    ``max_steps`` steps in all."""

    tol: float = 1e-6
    max_steps: int = 50
    max_halvings: int = 30
    exact_below: float = 0.2
    overrelax: float = 1.5
    single_words: bool = False  # the words' term's largest product in single precision (``word_informations``)


@dataclass
class LocalResult:
    """A chunk's locals and statistics: the sums over its documents that the global step needs."""

    u: np.ndarray        # (n, m) document locations
    alpha: np.ndarray    # (n,) ln N_d - ln sum_k B_k exp(l_k . u_d) (eq. 11.32); -inf for empty documents
    S: np.ndarray        # (V, K) sum_d X_dv p_k^(vd)
    w_sum: np.ndarray    # (K,) sum_d w_kd
    nu: np.ndarray       # (K, m) sum_d n_kd u_d
    wu: np.ndarray       # (K, m) sum_d w_kd u_d
    wuu: np.ndarray      # (K, m, m) sum_d w_kd u_d u_d^T
    steps: np.ndarray    # (n,) Newton steps each document used

    def statistics(self) -> dict[str, np.ndarray]:
        """The chunk's sums, keyed as the global updates take them (summed over chunks by the engine)."""
        return {"S": self.S, "w_sum": self.w_sum, "nu": self.nu, "wu": self.wu, "wuu": self.wuu}


@dataclass(frozen=True)
class Docs:
    """Documents in CSR form with what every local iteration reads: the rows exp(E ln beta_v) of their
    words, gathered once into a table that the documents' subsets share (document d's rows are
    table[first[d]:first[d] + its nonzeros]), the document of each nonzero, and the terms of f_d that do not
    depend on u_d."""

    indptr: np.ndarray
    counts: np.ndarray
    rows: np.ndarray      # (nnz,) document of each nonzero
    table: np.ndarray     # (nonzeros of the whole run, K) exp(E ln beta_vk) of each nonzero's word v
    first: np.ndarray     # (n,) where each document's rows begin in ``table``
    length: np.ndarray    # (n,) N_d = sum_v X_dv
    constant: np.ndarray  # (n,) N_d ln N_d - N_d - sum_v ln X_dv! - (m/2) ln 2 pi
    single: np.ndarray | None = None  # ``table`` in single precision, where the words' term may use it

    @classmethod
    def of(cls, indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: bnmf.TopicView,
           n_dims: int) -> "Docs":
        """The CSR documents with the rows of ``view`` gathered, for locations of dimension ``n_dims``."""
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        length = np.bincount(rows, weights=counts, minlength=len(indptr) - 1)
        constant = (xlogy(length, length) - length - _rowsum(rows, gammaln(counts + 1.0), len(length))
                    - 0.5 * n_dims * np.log(2 * np.pi))
        return cls(indptr, counts, rows, view.exp_elog_beta[indices], indptr[:-1], length, constant)

    def positions(self, docs: np.ndarray) -> np.ndarray:
        """Where the nonzeros of the documents ``docs`` (increasing positions) are in the per-nonzero arrays."""
        sizes = np.diff(self.indptr)[docs]
        return np.repeat(self.indptr[docs] - (np.cumsum(sizes) - sizes), sizes) + np.arange(sizes.sum())

    def subset(self, docs: np.ndarray) -> "Docs":
        """The documents ``docs`` (increasing positions), sharing this run's table of rows."""
        if len(docs) == len(self.length):
            return self
        sizes, at = np.diff(self.indptr)[docs], self.positions(docs)
        return Docs(np.concatenate([[0], np.cumsum(sizes)]), self.counts[at], np.repeat(np.arange(len(docs)), sizes),
                    self.table, self.first[docs], self.length[docs], self.constant[docs], self.single)

    def in_table(self) -> np.ndarray:
        """Where each nonzero's row is in ``table``."""
        return self.first[self.rows] + np.arange(len(self.rows)) - self.indptr[self.rows]

    def words(self, d: int, table: np.ndarray | None = None) -> np.ndarray:
        """The rows exp(E ln beta_v) of document d's words, from ``table`` (by default this run's)."""
        table = self.table if table is None else table
        return table[self.first[d]:self.first[d] + self.indptr[d + 1] - self.indptr[d]]


def _slices(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: bnmf.TopicView,
            n_dims: int) -> Iterator[tuple[slice, Docs]]:
    """Consecutive runs of at most SLICE_DOCS documents of a CSR chunk, each as ``Docs``."""
    for start in range(0, len(indptr) - 1, SLICE_DOCS):
        stop = min(start + SLICE_DOCS, len(indptr) - 1)
        lo, hi = indptr[start], indptr[stop]
        yield slice(start, stop), Docs.of(indptr[start:stop + 1] - lo, indices[lo:hi], counts[lo:hi], view, n_dims)


@dataclass
class _DocState:
    """Per-document quantities at the current u, p^(vd) and alpha_d at their optima."""

    f: np.ndarray       # (n,) f_d(u_d)
    scaled: np.ndarray  # (n, K) w'_kd = exp(l_k . u_d - max_j l_j . u_d)
    phi: np.ndarray     # (nnz,) sum_k exp(E ln beta_vk) w'_kd, the normaliser of p^(vd)
    ratio: np.ndarray   # (nnz,) X_dv / phi
    w: np.ndarray       # (n, K) w_kd
    n: np.ndarray       # (n, K) n_kd = sum_v X_dv p_k^(vd)

    def take(self, docs: np.ndarray, nonzeros: np.ndarray) -> "_DocState":
        """The state of the documents ``docs``, whose nonzeros are at ``nonzeros``."""
        return _DocState(self.f[docs], self.scaled[docs], self.phi[nonzeros], self.ratio[nonzeros], self.w[docs],
                         self.n[docs])

    def put(self, docs: np.ndarray, nonzeros: np.ndarray, part: "_DocState") -> None:
        """Overwrite the state of the documents ``docs`` (nonzeros at ``nonzeros``) with ``part``'s."""
        self.f[docs], self.scaled[docs], self.w[docs], self.n[docs] = part.f, part.scaled, part.w, part.n
        self.phi[nonzeros], self.ratio[nonzeros] = part.phi, part.ratio


def _rowsum(rows: np.ndarray, values: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-document sums of per-nonzero ``values`` (sequential within each document)."""
    return np.bincount(rows, weights=values, minlength=n_docs)


def _per_doc(a: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Row d of ``a`` times ``M``, one product per document (stacked, so rows stay independent)."""
    return np.matmul(a[:, None, :], M)[:, 0, :]


def word_sums(docs: Docs, scaled: np.ndarray, with_p: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """phi_v = sum_k exp(E ln beta_vk) w'_kd of every nonzero and, with ``with_p``, the ratios X_dv / phi_v and
    sum_v (X_dv / phi_v) exp(E ln beta_vk) per document (n_kd is w'_kd times it). A document with at least
    LOOP_ENTRIES gathered entries gets matrix-vector products of its own (gathering w'_d for each of its words
    costs more than the product); the smaller ones share one row-wise product and one sparse product. Which way a
    document goes depends on its own size only, and either way its sums are computed from its own rows, so they
    do not depend on the documents beside it."""
    sizes = np.diff(docs.indptr)
    looped = sizes * docs.table.shape[1] >= LOOP_ENTRIES
    phi, ratio = np.empty(len(docs.counts)), np.empty(len(docs.counts) if with_p else 0)
    sums = np.zeros(scaled.shape if with_p else 0)
    if not looped.all():
        at = np.flatnonzero(~looped[docs.rows])
        rows = docs.in_table()[at]
        phi[at] = np.einsum("nk,nk->n", docs.table[rows], scaled[docs.rows[at]])
        if with_p:
            ratio[at] = docs.counts[at] / phi[at]
            indptr = np.concatenate([[0], np.cumsum(np.where(looped, 0, sizes))])
            sums += sp.csr_matrix((ratio[at], rows, indptr), shape=(len(sizes), len(docs.table))) @ docs.table
    for d in np.flatnonzero(looped):
        lo, hi, words = docs.indptr[d], docs.indptr[d + 1], docs.words(d)
        phi[lo:hi] = words @ scaled[d]
        if with_p:
            ratio[lo:hi] = docs.counts[lo:hi] / phi[lo:hi]
            sums[d] = ratio[lo:hi] @ words
    return phi, ratio, sums


def _doc_state(docs: Docs, view: bnmf.TopicView, L: np.ndarray, U: np.ndarray, with_p: bool = True) -> _DocState:
    """f_d(u_d) (module docstring) and, with ``with_p``, alpha_d (eq. 11.32), w_kd and n_kd with p^(vd)
    as in Bayesian NMF with E ln theta replaced by ln w."""
    z = _per_doc(U, L.T)
    scaled = np.exp(z - z.max(axis=1, keepdims=True, initial=-np.inf))
    phi, ratio, sums = word_sums(docs, scaled, with_p)
    n_docs = len(docs.length)
    mass = np.einsum("nk,k->n", scaled, view.beta_sum)  # per row: a matrix-vector product rounds by position
    f = (_rowsum(docs.rows, xlogy(docs.counts, phi), n_docs) - docs.length * np.log(mass) + docs.constant
         - 0.5 * np.einsum("nm,nm->n", U, U))
    if not with_p:
        return _DocState(f, scaled, phi, ratio, np.empty(0), np.empty(0))
    w = (docs.length / mass)[:, None] * scaled
    return _DocState(f, scaled, phi, ratio, w, scaled * sums)


def alpha_of(indptr: np.ndarray, counts: np.ndarray, view: bnmf.TopicView, L: np.ndarray,
             U: np.ndarray) -> np.ndarray:
    """alpha_d = ln sum_v X_dv - ln sum_k B_k exp(l_k . u_d) (eq. 11.32); -inf for empty documents."""
    z = _per_doc(U, L.T)
    top = z.max(axis=1, initial=-np.inf)
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    with np.errstate(divide="ignore"):
        return (np.log(_rowsum(rows, counts, len(indptr) - 1)) - top
                - np.log(np.einsum("nk,k->n", np.exp(z - top[:, None]), view.beta_sum)))


def doc_gradient(state: _DocState, view: bnmf.TopicView, L: np.ndarray, U: np.ndarray) -> np.ndarray:
    """grad_u f_d = sum_k (n_kd - B_k w_kd) l_k - u_d (eq. 11.31), per document."""
    return _per_doc(state.n - view.beta_sum * state.w, L) - U


def _gram(weights: np.ndarray, L: np.ndarray) -> np.ndarray:
    """sum_k v_kd l_k l_k^T per document, for the rows v_d of ``weights`` (one product per document)."""
    return np.matmul(weights[:, None, :] * L.T[None, :, :], L)


def _profiled_curvature(weights: np.ndarray, w: np.ndarray, view: bnmf.TopicView, L: np.ndarray) -> np.ndarray:
    """I + sum_k v_kd l_k l_k^T - a_d a_d^T / N_d per document, a_d = sum_k B_k w_kd l_k: the curvature of the
    bound at fixed p^(vd) with alpha_d profiled out when v = B w (``bound_precision``), and the part of the exact
    one without the words' term when v = B w - n (``exact_precision``)."""
    bw = view.beta_sum * w
    a = _per_doc(bw, L)
    length = bw.sum(axis=1)
    inv = np.divide(1.0, length, out=np.zeros_like(length), where=length > 0)
    return _gram(weights, L) + np.eye(L.shape[1]) - inv[:, None, None] * a[:, :, None] * a[:, None, :]


def _bound_curvature(w: np.ndarray, view: bnmf.TopicView, L: np.ndarray) -> np.ndarray:
    """``bound_precision`` of the documents with weights ``w`` (rows w_d)."""
    return _profiled_curvature(view.beta_sum * w, w, view, L)


def bound_precision(state: _DocState, view: bnmf.TopicView, L: np.ndarray) -> np.ndarray:
    """Minus the Hessian in u_d of the bound at fixed p^(vd) with alpha_d at its optimum, per document:

        I + sum_k B_k w_kd l_k l_k^T - a_d a_d^T / N_d,   a_d = sum_k B_k w_kd l_k,

    I plus N_d times the covariance of l_k under q_k propto B_k w_kd, so positive definite. (The first
    two terms alone are the curvature with alpha_d held fixed as well.)
    """
    return _bound_curvature(state.w, view, L)


def exact_precision(docs: Docs, state: _DocState, view: bnmf.TopicView, L: np.ndarray,
                    which: np.ndarray | None = None) -> np.ndarray:
    """Minus the exact Hessian of f_d for the documents ``which`` (positions; all by default): ``bound_precision``
    less the missing information sum_v X_dv Cov_{p^(vd)}(l) = sum_k n_kd l_k l_k^T - sum_v X_dv y_v y_v^T
    (y_v = sum_k p_k^(vd) l_k), which says how much less curved f_d is than the bound at fixed p^(vd); assembled
    with one sum over the topics,

        I + sum_k (B_k w_kd - n_kd) l_k l_k^T - a_d a_d^T / N_d + sum_v X_dv y_v y_v^T.

    It is not positive definite everywhere, as f_d is a log-sum-exp of l_k . u_d, convex in u_d, minus another
    plus the log prior.
    """
    which = np.arange(len(docs.length)) if which is None else which
    w = state.w[which]
    return (_profiled_curvature(view.beta_sum * w - state.n[which], w, view, L)
            + word_informations(docs, state, L, which))


def _information_through_locations(words: np.ndarray, scaled: np.ndarray, weight: np.ndarray,
                                   L: np.ndarray) -> np.ndarray:
    """``word_information`` through the m-vectors y_v * phi_v = (exp(E ln beta_v) w'_d) L, each scaled by
    sqrt(weight_v) so that the sum of outer products is one symmetric rank-k product Z^T Z (half the flops of a
    general product)."""
    Z = (words @ (scaled[:, None] * L)) * np.sqrt(weight)[:, None]
    return Z.T @ Z


def _information_through_topics(words: np.ndarray, scaled: np.ndarray, weight: np.ndarray,
                                L: np.ndarray) -> np.ndarray:
    """``word_information`` through the K x K matrix sum_v X_dv p^(vd) p^(vd)^T."""
    Q = words * scaled
    return L.T @ ((Q.T * weight) @ Q) @ L


def _through_topics_cheaper(nnz: int, K: int, m: int) -> bool:
    """Whether ``word_information`` costs fewer flops through the topics (nnz K^2 + K^2 m + K m^2) than through
    the locations (nnz K m + nnz m^2): when K is small beside m."""
    return nnz * K * K + K * K * m + K * m * m < nnz * K * m + nnz * m * m


def word_information(words: np.ndarray, scaled: np.ndarray, weight: np.ndarray, L: np.ndarray,
                     single: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """sum_v X_dv y_v y_v^T of one document, y_v = sum_k p_k^(vd) l_k, from its gathered word rows
    exp(E ln beta_v), w'_d and weight_v = X_dv / phi_v^2 (p^(vd) = exp(E ln beta_v) w'_d / phi_v): through
    the y_v or, when it costs fewer flops, through the K x K matrix sum_v X_dv p^(vd) p^(vd)^T. With ``single``,
    the same rows and L in single precision, the y_v are formed from those (``word_informations``)."""
    if _through_topics_cheaper(*words.shape, L.shape[1]):
        return _information_through_topics(words, scaled, weight, L)
    if single is not None:
        return _information_through_locations(single[0], scaled.astype(np.float32), weight, single[1])
    return _information_through_locations(words, scaled, weight, L)


def word_informations(docs: Docs, state: _DocState, L: np.ndarray, which: np.ndarray) -> np.ndarray:
    """``word_information`` of the documents ``which`` (positions), one document at a time, so a document's
    numbers do not depend on the other documents it is fitted with (one product over many documents rounds a
    row differently depending on its position).

    With ``docs.single`` (``LocalSettings.single_words``), the product that goes through the locations forms the
    y_v phi_v in single precision (half the memory traffic and twice the vector width of its nnz K m flops) and
    sums their outer products in double. The term's relative rounding is then about 1e-7, subtracted from a
    curvature of its own size, so a step's direction is off by about 1e-7 N_d |l|^2 / (smallest curvature) of its
    length: far below the quadratic error tol^2 that a local tolerance of SINGLE_WORDS_TOL or more leaves."""
    out = np.empty((len(which), L.shape[1], L.shape[1]))
    weight = state.ratio / state.phi  # X_dv / phi^2, as p^(vd) = exp(E ln beta_v) w'_d / phi
    single_L = None if docs.single is None else L.astype(np.float32)
    for i, d in enumerate(which):
        lo, hi = docs.indptr[d], docs.indptr[d + 1]
        single = None if single_L is None else (docs.words(d, docs.single), single_L)
        out[i] = word_information(docs.words(d), state.scaled[d], weight[lo:hi], L, single)
    return out


def single_words_suffice(tol: float) -> bool:
    """Whether a local step to tolerance ``tol`` may build the words' term in single precision
    (``word_informations``)."""
    return tol >= SINGLE_WORDS_TOL


def positive_definite(matrices: np.ndarray) -> np.ndarray:
    """Whether each of a stack of symmetric matrices has a Cholesky factor (LAPACK dpotrf, one matrix at a
    time: it reports failure instead of raising, which a stacked numpy factorisation cannot do per matrix)."""
    return np.array([dpotrf(matrix, lower=1)[1] == 0 for matrix in matrices], dtype=bool)


def newton_directions(exact: np.ndarray, bound: Callable[[np.ndarray], np.ndarray], grad: np.ndarray) -> np.ndarray:
    """Per document, P^-1 grad with P = c exact + (1 - c) bound (the bound's curvature less c times the
    missing information, ``exact_precision``) for the first c of EXACTNESS whose P is positive definite: the
    exact Hessian (c = 1) where f_d is concave, else part of the way to the bound's curvature (c = 0, always
    positive definite), so every direction ascends. ``bound``
    gives the bound's curvature of the documents it is passed, and is asked only for those whose exact
    Hessian is not negative definite (near a maximum, none)."""
    chosen, left, fallback = exact.copy(), np.arange(len(grad)), None
    for c in EXACTNESS:
        if fallback is None and c < 1.0:
            fallback = bound(left)
        trial = exact[left] if fallback is None else c * exact[left] + (1.0 - c) * fallback
        ok = positive_definite(trial) if c > 0 else np.ones(len(left), dtype=bool)
        chosen[left[ok]] = trial[ok]
        left, fallback = left[~ok], None if fallback is None else fallback[~ok]
        if not len(left):
            break
    return np.linalg.solve(chosen, grad[:, :, None])[:, :, 0]


def step_directions(docs: Docs, state: _DocState, view: bnmf.TopicView, L: np.ndarray, grad: np.ndarray,
                    exact: np.ndarray, overrelax: float) -> np.ndarray:
    """The direction of each document's step: where ``exact``, P^-1 g with the exact Hessian or part of the way
    to the bound's curvature (``newton_directions``); elsewhere ``overrelax`` times the bound's P^-1 g
    (``bound_precision``: positive definite, and free of the words' term, which costs nnz K m flops a
    document). The bound's steps are those of maximising the bound at fixed p^(vd) and then refreshing p^(vd),
    an MM iteration; they are cheap and go uphill from far away, but converge only linearly, and stretching
    them by a factor above one makes up part of the curvature they overstate (over-relaxed bound optimisation,
    Salakhutdinov and Roweis 2003)."""
    out = np.empty_like(grad)
    cheap, full = np.flatnonzero(~exact), np.flatnonzero(exact)
    if len(cheap):
        bound = _bound_curvature(state.w[cheap], view, L)
        out[cheap] = overrelax * np.linalg.solve(bound, grad[cheap][:, :, None])[:, :, 0]
    if len(full):
        out[full] = newton_directions(exact_precision(docs, state, view, L, full),
                                      lambda some: _bound_curvature(state.w[full[some]], view, L), grad[full])
    return out


def newton_step(docs: Docs, view: bnmf.TopicView, L: np.ndarray, U: np.ndarray, state: _DocState,
                exact: np.ndarray, settings: LocalSettings) -> tuple[np.ndarray, _DocState]:
    """One Newton step on every u_d with a backtracking (Armijo) line search on f_d.

    The direction uses the gradient of f_d (``doc_gradient``, exact since p^(vd) and alpha_d are at their
    optima) and, where ``exact``, the exact Hessian (``exact_precision``) where it is negative definite, so
    the steps converge quadratically near a maximum, or else a curvature between it and the bound's at fixed
    p^(vd) (``newton_directions``); elsewhere the bound's curvature, over-relaxed (``step_directions``). The
    step is halved until f_d rises by ARMIJO x step x g.direction, and a document with no such step stays where
    it is. A step whose predicted rise g.direction is below FLAT |f_d| is taken whole: there f_d's change is near
    its rounding, which would decide the halvings (and then the same document would end elsewhere by up to ~1e-7
    when the globals change in their last digit, as they do with the chunking), while the quadratic model the
    step solves is exact to far below that.
    Returns the new locations and the state there (the accepted trials', not computed again).
    """
    grad = doc_gradient(state, view, L, U)
    direction = step_directions(docs, state, view, L, grad, exact, settings.overrelax)
    slope = np.einsum("nm,nm->n", grad, direction)
    flat = slope <= FLAT * np.maximum(1.0, np.abs(state.f))
    step = np.zeros(len(U))
    new = state.take(np.arange(len(U)), np.arange(len(state.phi)))
    pending, size = np.arange(len(U)), 1.0
    for _ in range(settings.max_halvings + 1):
        if not len(pending):
            break
        part = docs.subset(pending)
        trial = _doc_state(part, view, L, U[pending] + size * direction[pending])
        ok = (trial.f >= state.f[pending] + ARMIJO * size * slope[pending]) | flat[pending]
        accepted = np.flatnonzero(ok)
        new.put(pending[ok], docs.positions(pending[ok]), trial.take(accepted, part.positions(accepted)))
        step[pending[ok]] = size
        pending, size = pending[~ok], size / 2
    return U + step[:, None] * direction, new


def _fit(docs: Docs, view: bnmf.TopicView, L: np.ndarray, settings: LocalSettings, U: np.ndarray,
         steps: np.ndarray) -> None:
    """Newton steps (``newton_step``) on the documents ``docs`` until each stops (``LocalSettings``: the bound's
    steps until one moves less than ``exact_below``, exact ones until one moves less than ``tol``), writing their
    locations ``U`` and step counts ``steps`` in place."""
    live, current, exact = np.arange(len(U)), docs, np.full(len(U), settings.exact_below == np.inf)
    state = _doc_state(current, view, L, U[live])
    for _ in range(settings.max_steps):
        if not len(live):
            return
        new, state = newton_step(current, view, L, U[live], state, exact, settings)
        moved = np.abs(new - U[live]).max(axis=1, initial=0.0)
        U[live] = new
        steps[live] += 1
        going = np.flatnonzero(~exact | (moved >= settings.tol))
        exact |= moved < settings.exact_below
        if len(going) < len(live):
            live, exact = live[going], exact[going]
            state, current = state.take(going, current.positions(going)), current.subset(going)


def local_step(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: bnmf.TopicView,
               L: np.ndarray, settings: LocalSettings = LocalSettings(), u_start: np.ndarray | None = None,
               with_stats: bool = True) -> LocalResult:
    """Fit u_d (Newton steps with line search, ``newton_step``), alpha_d and p^(vd) for every document
    of a CSR chunk with beta and L fixed, starting from ``u_start`` or zero; SLICE_DOCS
    documents at a time.

    The statistics use p^(vd) and alpha_d at the returned u, so they belong to the returned locals.
    """
    n_docs, (K, m) = len(indptr) - 1, L.shape
    U = np.zeros((n_docs, m)) if u_start is None else u_start.copy()
    steps = np.zeros(n_docs, dtype=np.int64)
    S, w_sum = np.zeros((view.exp_elog_beta.shape[0], K) if with_stats else 0), np.zeros(K)
    nu, wu, wuu = np.zeros((K, m)), np.zeros((K, m)), np.zeros((K, m, m))
    for part, docs in _slices(indptr, indices, counts, view, m):
        if settings.single_words and not _through_topics_cheaper(np.diff(docs.indptr), K, m).all():
            docs = replace(docs, single=docs.table.astype(np.float32))  # some document's term goes through it
        _fit(docs, view, L, settings, U[part], steps[part])
        if with_stats:
            state, u = _doc_state(docs, view, L, U[part]), U[part]
            lo, hi = indptr[part.start], indptr[part.stop]
            S += bnmf.word_topic_stats(docs.indptr, indices[lo:hi], state.ratio, state.scaled, view.exp_elog_beta)
            w_sum += state.w.sum(axis=0)
            nu += state.n.T @ u
            wu += state.w.T @ u
            wuu += np.matmul(state.w.T[:, None, :] * u.T[None], u)
    return LocalResult(U, alpha_of(indptr, counts, view, L, U), S, w_sum, nu, wu, wuu, steps)


def local_objective(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: bnmf.TopicView,
                    L: np.ndarray, U: np.ndarray) -> float:
    """sum_d f_d(u_d) over a chunk (module docstring), alpha_d and p^(vd) at their optima."""
    return float(sum(_doc_state(docs, view, L, U[part], with_p=False).f.sum()
                     for part, docs in _slices(indptr, indices, counts, view, L.shape[1])))


def topic_prior(L: np.ndarray, prior: Prior) -> float:
    """sum_k ln N(l_k; 0, sigma^2 I_m)."""
    return float(-0.5 * (L * L).sum() / prior.sigma2 - 0.5 * L.size * np.log(2 * np.pi * prior.sigma2))


def topic_gradient(L: np.ndarray, nu: np.ndarray, wu: np.ndarray, beta_sum: np.ndarray, prior: Prior,
                   scale: float = 1.0) -> np.ndarray:
    """grad_l_k = scale sum_d (n_kd - B_k w_kd) u_d - l_k / sigma^2 (eq. 11.30; scale = D/|C_t| in SVI)."""
    return scale * (nu - beta_sum[:, None] * wu) - L / prior.sigma2


def topic_precision(wuu: np.ndarray, beta_sum: np.ndarray, prior: Prior, scale: float = 1.0) -> np.ndarray:
    """G_k^-1 = I / sigma^2 + scale sum_d B_k w_kd u_d u_d^T, block-diagonal per topic (eq. 11.35)."""
    return scale * beta_sum[:, None, None] * wuu + np.eye(wuu.shape[1]) / prior.sigma2


def topic_direction(L: np.ndarray, stats: Stats, beta_sum: np.ndarray, prior: Prior,
                    scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The Newton direction G_k grad_l_k of every topic (eq. 11.35) and the gradient, from the summed
    ``LocalResult.statistics``."""
    grad = topic_gradient(L, stats["nu"], stats["wu"], beta_sum, prior, scale)
    return np.linalg.solve(topic_precision(stats["wuu"], beta_sum, prior, scale), grad[:, :, None])[:, :, 0], grad


def stochastic_topic_step(L: np.ndarray, stats: Stats, beta_sum: np.ndarray, prior: Prior,
                          scale: float, rho: float) -> np.ndarray:
    """l_k <- l_k + rho_t G_k grad_l_k with minibatch sums scaled by D/|C_t| (eq. 11.35)."""
    direction, _ = topic_direction(L, stats, beta_sum, prior, scale)
    return L + rho * direction


def step_sizes() -> np.ndarray:
    """Candidate sizes 1, 1/2, ..., 2^-TOPIC_STEP_HALVINGS of the batch l_k line search."""
    return 0.5 ** np.arange(TOPIC_STEP_HALVINGS + 1)


def candidate_exp_sums(U: np.ndarray, alpha: np.ndarray, L: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """sum_d exp(alpha_d + (l_k + s dir_k) . u_d) for every candidate size s (``step_sizes``): (J, K).

    A chunk's part of the l_k line search; empty documents (alpha_d = -inf) add nothing."""
    keep = np.isfinite(alpha)
    U, alpha = U[keep], alpha[keep]
    trial = L[None] + step_sizes()[:, None, None] * direction[None]
    return np.exp(alpha[None, :, None] + np.einsum("dm,jkm->jdk", U, trial)).sum(axis=1)


def topic_objective(L: np.ndarray, nu: np.ndarray, exp_sum: np.ndarray, beta_sum: np.ndarray,
                    prior: Prior) -> np.ndarray:
    """Per topic, the terms of the bound that depend on l_k with p^(vd), u, alpha fixed:
    l_k . sum_d n_kd u_d - B_k sum_d exp(alpha_d + l_k . u_d) - |l_k|^2 / (2 sigma^2)."""
    return np.einsum("...km,km->...k", L, nu) - beta_sum * exp_sum - 0.5 * (L * L).sum(axis=-1) / prior.sigma2


def batch_topic_step(L: np.ndarray, stats: Stats, direction: np.ndarray, grad: np.ndarray,
                     exp_sums: np.ndarray, beta_sum: np.ndarray, prior: Prior) -> np.ndarray:
    """Batch l_k update: the Newton step (eq. 11.35, scale 1) of the largest candidate size that raises
    ``topic_objective`` by ARMIJO x s x grad.direction, per topic; no move where none does.

    ``exp_sums`` are the corpus sums of ``candidate_exp_sums``; stats["w_sum"] is the sum at s = 0."""
    sizes = step_sizes()
    trial = L[None] + sizes[:, None, None] * direction[None]
    now = topic_objective(L, stats["nu"], stats["w_sum"], beta_sum, prior)
    gain = topic_objective(trial, stats["nu"], exp_sums, beta_sum, prior) - now
    ok = gain >= ARMIJO * sizes[:, None] * np.einsum("km,km->k", grad, direction)[None]
    size = np.where(ok.any(axis=0), sizes[np.argmax(ok, axis=0)], 0.0)
    return L + size[:, None] * direction


def initial_topics(n_topics: int, prior: Prior, rng: np.random.Generator) -> np.ndarray:
    """l_k drawn from its prior N(0, sigma^2 I_m)."""
    return rng.normal(0.0, np.sqrt(prior.sigma2), size=(n_topics, prior.n_dims))


def correlation(L: np.ndarray) -> np.ndarray:
    """Topic correlations corr(i, j) = l_i . l_j / (|l_i| |l_j|)."""
    unit = L / np.linalg.norm(L, axis=1, keepdims=True)
    return unit @ unit.T


def threefold_completion(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: bnmf.TopicView,
                         mean_beta: np.ndarray, L: np.ndarray, settings: LocalSettings,
                         rng: np.random.Generator) -> tuple[float, float]:
    """Document completion by thirds (``bnmf.thirds_loglik``): u_d fitted on two thirds,
    the third scored with weights exp(l_k . u_d) (alpha_d cancels in p(v | d))."""
    def score(observed: np.ndarray, held: np.ndarray) -> tuple[float, float]:
        fit = local_step(indptr, indices, observed, view, L, settings, with_stats=False)
        z = _per_doc(fit.u, L.T)
        weights = np.exp(z - z.max(axis=1, keepdims=True, initial=-np.inf))
        return bnmf.completion_score(indptr, indices, held, weights, mean_beta)
    return bnmf.thirds_loglik(counts, rng, score)

"""Bayesian NMF (Poisson-gamma) per-chunk mathematics: paper 002, eqs. (11.23)-(11.34); docs/models/bnmf.md.

Documents are rows. Globals are the Gamma parameters (g, h) of q(beta) (V x K); the local
variables of document d are the Gamma parameters (a_d, b) of q(theta_d) (b is shared).

The local step works on a row chunk in CSR form. Documents are sorted by length and swept
in small padded groups (cache-sized), so each sweep costs O(nnz x K) with a batched
matrix-vector product and never builds a documents x vocabulary array. Each document stops
at its own tolerance and is padded to a length fixed by its own length (``padded_length``),
so its arithmetic, bit for bit, does not depend on which other documents share its chunk
or group (BLAS sums a padded product in a length-dependent order).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln

GROUP_BYTES = 4 << 20
COMPACT_FRACTION = 0.75
SQUAREM_SHRINK_LIMIT = 0.5  # an extrapolated shape is at least this fraction of the plain iterate


@dataclass(frozen=True)
class Hyper:
    """Prior parameters: beta ~ Gamma(c0/V, c0), theta ~ Gamma(a0, b0)."""

    c0: float
    a0: float
    b0: float
    n_words: int

    @classmethod
    def paper_defaults(cls, n_words: int, n_topics: int) -> "Hyper":
        """c0 = 0.05 V and a0 = b0 = 1/K (paper 002, Sec. 11.6)."""
        return cls(c0=0.05 * n_words, a0=1.0 / n_topics, b0=1.0 / n_topics, n_words=n_words)


@dataclass(frozen=True)
class TopicView:
    """Expectations of q(beta) that the local step needs (eq. 11.24 and 11.29)."""

    exp_elog_beta: np.ndarray  # (V, K) exp(E ln beta_vk)
    beta_sum: np.ndarray       # (K,)   sum_v E beta_vk

    @classmethod
    def from_params(cls, g: np.ndarray, h: np.ndarray, dtype=np.float64, threads: int = 1,
                    means: bool = False) -> "TopicView":
        """The view of every word: ``exp_elog_beta`` of g and h (``word_weights``), and the sums of
        E beta = g / h. ``h`` is (V, K) or, the same for every word, one row (K,)."""
        return cls(word_weights(g, h, dtype, threads, means), (g / h).sum(axis=0))


def word_weights(g: np.ndarray, h: np.ndarray, dtype=np.float64, threads: int = 1, means: bool = False,
                 overwrite: bool = False) -> np.ndarray:
    """What a local sweep weighs each word's topics by: exp(E ln beta) (``exp_elog_beta``, variational Bayes),
    or with ``means`` E beta = g / h, the MAP estimate's (``LocalSettings.means``); arguments as
    ``exp_elog_beta``'s."""
    if not means:
        return exp_elog_beta(g, h, dtype, threads, overwrite)
    out = np.divide(g, h, out=g if overwrite and g.dtype == np.float64 else None)
    return out if out.dtype == dtype else out.astype(dtype)


def exp_elog_beta(g: np.ndarray, h: np.ndarray, dtype=np.float64, threads: int = 1,
                  overwrite: bool = False) -> np.ndarray:
    """exp(E ln beta) = exp(psi(g) - ln h) elementwise (eq. 11.24), for rows of shapes ``g`` and rates ``h``
    shaped like ``g`` or one row (K,) for every row of ``g``. ``dtype=np.float32`` (opt-in) makes the local
    step sweep in single precision. ``threads`` > 1 computes it by row slices on that many threads: the same
    numbers (it is elementwise), in about 1/threads of the time of the digamma, which dominates the client's
    share of an SVI step. ``overwrite`` lets a float64 result take ``g``'s own memory (``g`` is then lost), so
    that no second array of its size is made: at V = 100,000 and K = 100 each is 80 MB."""
    in_place = overwrite and dtype == np.float64 and g.dtype == np.float64
    out = g if in_place else np.empty(g.shape, dtype=dtype)
    bounds = np.linspace(0, len(g), max(threads, 1) + 1).astype(int)
    log_row = np.log(h) if h.ndim == 1 else None

    def fill(lo: int, hi: int) -> None:
        elog = digamma(g[lo:hi], out=out[lo:hi] if dtype == np.float64 else None)
        elog -= np.log(h[lo:hi]) if log_row is None else log_row
        np.exp(elog, out=out[lo:hi])

    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fill, bounds[:-1], bounds[1:]))
    else:
        fill(0, len(g))
    return out


@dataclass
class LocalResult:
    """Output of the local step for a chunk: q(theta) shapes and the chunk's statistics."""

    a: np.ndarray         # (n_docs, K) shapes of q(theta_d); the rate is TopicView-derived
    S: np.ndarray         # (V, K) sum_d X_dv p_k^(vd), V the words of the view
    theta_sum: np.ndarray  # (K,) sum_d E theta_kd
    sweeps: np.ndarray    # (n_docs,) sweeps each document used
    square_sum: float = 0.0  # sum_d |S^(d)|^2 (``document_square_sum``), with ``with_spread`` only


def theta_rate(view: TopicView, hyper: Hyper) -> np.ndarray:
    """b_kd = b0 + sum_v E beta_vk, the same for every document (eq. 11.29)."""
    return hyper.b0 + view.beta_sum


def initial_shapes(indptr: np.ndarray, counts: np.ndarray, n_topics: int, hyper: Hyper) -> np.ndarray:
    """Deterministic start: each document's words spread evenly over the topics."""
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    lengths = np.bincount(rows, weights=counts, minlength=len(indptr) - 1)
    return hyper.a0 + np.repeat((lengths / n_topics)[:, None], n_topics, axis=1)


def padded_length(n_words: int) -> int:
    """The padded length of a document with ``n_words`` distinct words: rounded up to a
    multiple of 8, and of 2^(floor(log2 n) - 4) beyond 128 (at most ~6% padding)."""
    step = max(8, 1 << max(int(n_words).bit_length() - 5, 0))
    return -(-int(n_words) // step) * step


def _padded_group(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray,
                  docs: np.ndarray, ws: _Workspace | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Word ids, counts and CSR positions of ``docs`` as (g, L) arrays; padding has word 0,
    count 0 and position -1. With a workspace the arrays are views of its buffers."""
    starts, lengths = indptr[docs], indptr[docs + 1] - indptr[docs]
    n, L = len(docs), padded_length(lengths.max())
    ws = ws or _Workspace(n * L, n, indices.dtype, counts.dtype)
    flat, words, x = ws.flat[:n * L].reshape(n, L), ws.words[:n * L].reshape(n, L), ws.x[:n * L].reshape(n, L)
    np.add(starts[:, None], ws.arange[:L], out=flat)
    pad = ws.arange[None, :L] >= lengths[:, None]
    flat[pad] = 0
    np.take(indices, flat, out=words, mode="clip")
    np.take(counts, flat, out=x, mode="clip")
    flat[pad], words[pad], x[pad] = -1, 0, 0.0
    return words, x, flat


class _Workspace:
    """Buffers a local step reuses for every group: the padded (g, L, K) block, the (g, L)
    word/count/position/ratio arrays and the (g, K) shapes, so a sweep allocates nothing.

    This matters on Dask workers, which run with MALLOC_TRIM_THRESHOLD_=65536: glibc hands
    freed memory back at once and every large temporary is a fresh mmap that page-faults on
    first touch. The previous kernel, which allocated per sweep and copied the block each
    time a document converged, ran 8-9x slower there than in a plain process."""

    def __init__(self, cells: int, rows: int, index_dtype=np.int64, count_dtype=np.float64, n_topics: int = 0,
                 dtype=np.float64):
        self.arange = np.arange(cells, dtype=np.int64)
        self.flat, self.words = np.empty(cells, dtype=np.int64), np.empty(cells, dtype=index_dtype)
        self.x, self.ratio = np.empty(cells, dtype=count_dtype), np.empty(cells, dtype=dtype)
        self.B = np.empty(cells * n_topics, dtype=dtype)
        exact = ("a_in", "a_out", "x0", "x1", "t", "diff")
        self.rk = {name: np.empty(rows * n_topics, dtype=np.float64 if name in exact else dtype)
                   for name in exact + (("t_lo", "s") if dtype != np.float64 else ())}

    def rows_by_topics(self, name: str, n: int, k: int) -> np.ndarray:
        return self.rk[name][:n * k].reshape(n, k)


def _sweep(B: np.ndarray, x: np.ndarray, a: np.ndarray, rate: np.ndarray, a0: float,
           t: np.ndarray, t_lo: np.ndarray, ratio: np.ndarray, s: np.ndarray, a_new: np.ndarray,
           means: bool = False) -> None:
    """One update of p^(vd) then a_d for a padded group (eqs. 11.24 and 11.28).

    Writes exp(E ln theta) (used for p; with ``means`` E theta = a / rate, ``LocalSettings.means``) into ``t``,
    x / normaliser per word into ``ratio`` and the new shapes into ``a_new``; nothing is allocated. Padding
    rows of ``B`` hold ones (see ``_fit_group``), so their normaliser is positive and their ratio exactly 0
    without a mask.
    In float64 ``t_lo`` is ``t`` and ``s`` is ``a_new``; with a float32 ``B`` they are float32
    buffers for the two products, while ``a`` and ``t`` stay float64.
    """
    if means:
        np.copyto(t, a)
    else:
        digamma(a, out=t)
        np.exp(t, out=t)
    t /= rate
    if t_lo is not t:
        t_lo[...] = t
    np.matmul(B, t_lo[:, :, None], out=ratio[:, :, None])
    np.divide(x, ratio, out=ratio)
    np.matmul(ratio[:, None, :], B, out=s[:, None, :])
    np.multiply(s, t, out=a_new)
    a_new += a0


def _groups(lengths: np.ndarray, n_topics: int, itemsize: int = 8) -> list[np.ndarray]:
    """Non-empty documents sorted by length, cut into groups of one padded length each
    (``padded_length``) whose (g, L, K) block stays near ``GROUP_BYTES``."""
    order = np.argsort(lengths, kind="stable")
    order = order[lengths[order] > 0]
    padded = np.array([padded_length(n) for n in lengths[order]], dtype=np.int64)
    groups, start = [], 0
    while start < len(order):
        stop = start + 1
        while (stop < len(order) and padded[stop] == padded[start]
               and (stop + 1 - start) * padded[stop] * n_topics * itemsize <= GROUP_BYTES):
            stop += 1
        groups.append(order[start:stop])
        start = stop
    return groups


@dataclass(frozen=True)
class LocalSettings:
    """How the per-document fixed-point iteration of ``local_step`` runs and stops.

    A document stops when the mean absolute change of a_d over one sweep falls below ``tol``, or
    when fewer than ``share_tol`` of its tokens change topic in a sweep, or after ``max_sweeps``
    sweeps. The tokens changing topic are half the total change sum_k |a_dk change| (a_d sums to
    K a0 + n_d after every sweep, as sum_k p^(vd)_k = 1): a measure that means the same for a
    document of 30 tokens as of 3000, where ``tol`` is an absolute amount that a long document
    meets many sweeps later than a short one. ``accelerate`` runs the sweeps in SQUAREM cycles
    (``_extrapolate``): fewer sweeps per document, but a document may stop at a different
    local optimum of its ELBO than plain iteration, so results differ from the default's. ``means`` sweeps with
    E theta = a / rate in place of exp(E ln theta), with a view holding E beta (``word_weights``): each sweep is
    then an EM step towards the MAP estimate of theta_d under Gamma(a0 + 1, b0), whose mode is the mean a / rate
    (docs/models/bnmf.md, "The MAP estimate").
    """

    tol: float = 1e-3
    max_sweeps: int = 100
    accelerate: bool = False
    share_tol: float = 0.0
    means: bool = False


def local_step(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: TopicView,
               hyper: Hyper, settings: LocalSettings = LocalSettings(),
               a_start: np.ndarray | None = None, with_stats: bool = True,
               with_spread: bool = False) -> LocalResult:
    """Fit q(theta_d) for every document of a CSR chunk with the topics fixed (paper 002,
    eqs. 11.24, 11.28), each document iterated as ``settings`` says.

    Statistics use the p of each document's last sweep, so a_d = a0 + sum_v X_dv p^(vd)
    holds exactly for the returned shapes. ``with_spread`` also sums the documents' own statistics'
    squared norms (``document_square_sum``), which the adaptive step size reads.
    """
    n_docs, n_topics = len(indptr) - 1, view.exp_elog_beta.shape[1]
    rate = theta_rate(view, hyper)
    a = initial_shapes(indptr, counts, n_topics, hyper) if a_start is None else a_start.copy()
    t_final = np.zeros((n_docs, n_topics))
    ratio_final = np.zeros(len(indices))
    sweeps = np.zeros(n_docs, dtype=np.int64)
    dtype = view.exp_elog_beta.dtype
    groups = _groups(np.diff(indptr), n_topics, dtype.itemsize)
    lengths = np.diff(indptr)
    size = max((len(d) * padded_length(lengths[d].max()) for d in groups), default=0)
    ws = _Workspace(size, max((len(d) for d in groups), default=0), indices.dtype, counts.dtype, n_topics, dtype)
    for docs in groups:
        _fit_group(indptr, indices, counts, view, hyper, settings, docs, a, rate,
                   t_final, ratio_final, sweeps, ws)
    S = np.zeros(view.exp_elog_beta.shape)
    square_sum = 0.0
    if with_stats and len(indices):
        S = word_topic_stats(indptr, indices, ratio_final, t_final, view.exp_elog_beta)
        if with_spread:
            square_sum = document_square_sum(indptr, indices, ratio_final, t_final, view.exp_elog_beta)
    return LocalResult(a=a, S=S, theta_sum=(a / rate).sum(axis=0), sweeps=sweeps, square_sum=square_sum)


def word_topic_stats(indptr: np.ndarray, indices: np.ndarray, ratio: np.ndarray, t: np.ndarray,
                     exp_elog_beta: np.ndarray) -> np.ndarray:
    """S_vk = sum_d X_dv p^(vd)_k with p^(vd)_k = exp_elog_beta_vk t_dk / normaliser (eq. 11.24, 11.25),
    from ``ratio`` = X_dv / normaliser per nonzero and the document weights ``t`` (D x K)."""
    R = sp.csr_matrix((ratio, indices, indptr), shape=(len(indptr) - 1, exp_elog_beta.shape[0]))
    S = np.asarray(R.T @ t)
    S *= exp_elog_beta  # in place: no second (words x K) array
    return S


def document_square_sum(indptr: np.ndarray, indices: np.ndarray, ratio: np.ndarray, t: np.ndarray,
                        exp_elog_beta: np.ndarray) -> float:
    """sum_d |S^(d)|^2 over a chunk's documents, S^(d)_vk = X_dv p^(vd)_k the statistics of document d alone
    (``word_topic_stats`` of one row): sum_d sum_k t_dk^2 sum_v (X_dv / normaliser)^2 exp_elog_beta_vk^2. With
    the minibatch's sum of the S^(d) it gives the spread of the documents' statistics (``minibatch_noise``)."""
    R = sp.csr_matrix((np.square(ratio), indices, indptr), shape=(len(indptr) - 1, exp_elog_beta.shape[0]))
    per_doc = np.asarray(R @ np.square(exp_elog_beta, dtype=np.float64))
    per_doc *= np.square(t)
    return float(per_doc.sum())


def normalisers(indptr: np.ndarray, indices: np.ndarray, exp_elog_beta: np.ndarray, t: np.ndarray) -> np.ndarray:
    """sum_k exp_elog_beta_vk t_dk per nonzero (d, v): the normaliser of p^(vd) (eq. 11.24)."""
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return np.einsum("nk,nk->n", exp_elog_beta[indices], t[rows])


def _extrapolate(x0: np.ndarray, x1: np.ndarray, x2: np.ndarray, floor: float, out: np.ndarray) -> None:
    """SQUAREM step (Varadhan and Roland 2008, scheme S3) per row, written into ``out``.

    From x1 = F(x0) and x2 = F(x1): r = x1 - x0, v = x2 - x1 - r, alpha = -|r| / |v| capped
    at -1, and x' = x0 - 2 alpha r + alpha^2 v. alpha = -1 gives x' = x2, the plain iterate,
    which is also what an entry gets when x' leaves the domain (a shape not above ``floor``).
    No entry is taken below ``SQUAREM_SHRINK_LIMIT`` times its plain iterate: with shapes
    below one (a0 < 1) a topic pushed near the floor stays there, and the unguarded step
    lands in worse local optima of the document's ELBO.
    """
    r = x1 - x0
    v = x2 - x1 - r
    r_norm, v_norm = np.sqrt(np.einsum("nk,nk->n", r, r)), np.sqrt(np.einsum("nk,nk->n", v, v))
    alpha = np.minimum(-np.divide(r_norm, v_norm, out=np.ones_like(r_norm), where=v_norm > 0), -1.0)
    np.multiply((-2.0 * alpha)[:, None], r, out=out)
    out += x0
    out += (alpha * alpha)[:, None] * v
    np.maximum(out, SQUAREM_SHRINK_LIMIT * x2, out=out)
    np.copyto(out, x2, where=out <= floor)


def _fit_group(indptr, indices, counts, view, hyper, settings, docs, a, rate,
               t_final, ratio_final, sweeps, ws) -> None:
    """Iterate one padded group to per-document convergence, writing results in place.

    Each sweep maps shapes a_in to a_out = F(a_in) (eqs. 11.24, 11.28); a document stops
    when mean |a_out - a_in| < tol, or sum |a_out - a_in| / 2 < share_tol times its token
    count (``LocalSettings``), and returns a_out with the p of that sweep. With
    ``settings.accelerate`` the sweeps run in SQUAREM cycles: after x1 = F(x0) and x2 = F(x1) the
    next input is the extrapolated x' (``_extrapolate``) instead of x2, which converges
    to the same fixed point in fewer sweeps.

    A document that has converged is written out at once; its row stays in the group's
    arrays (and keeps being swept, its new values unused) until the unfinished rows fall to
    ``COMPACT_FRACTION`` of the rows, when the unfinished rows are moved to the front in
    place. So the (g, L, K) block is neither copied every time a document finishes nor
    reallocated; the workspace ``ws`` holds it and the other buffers.
    """
    words, x, flat = _padded_group(indptr, indices, counts, docs, ws)
    n, L, K = len(docs), words.shape[1], view.exp_elog_beta.shape[1]
    lo = view.exp_elog_beta.dtype
    x = x.astype(lo, copy=False)  # a copy only for integer counts or a float32 view
    B = ws.B[:n * L * K].reshape(n, L, K)
    np.take(view.exp_elog_beta, words, axis=0, out=B, mode="clip")
    B[flat < 0] = 1.0
    rows = np.arange(n)
    live = np.ones(n, dtype=bool)
    a_in_buf, a_out_buf = ws.rows_by_topics("a_in", n, K), ws.rows_by_topics("a_out", n, K)
    x0_buf, x1_buf = ws.rows_by_topics("x0", n, K), ws.rows_by_topics("x1", n, K)
    np.take(a, docs, axis=0, out=a_in_buf)
    t_buf, diff_buf = ws.rows_by_topics("t", n, K), ws.rows_by_topics("diff", n, K)
    ratio_buf = ws.ratio[:n * L].reshape(n, L)
    single = lo != np.float64
    t_lo_buf, s_buf = (ws.rows_by_topics("t_lo", n, K), ws.rows_by_topics("s", n, K)) if single else (None, None)
    m = n
    max_sweeps, accelerate = settings.max_sweeps, settings.accelerate
    tol, moved_limit = settings.tol, 2.0 * settings.share_tol * x.sum(axis=1, dtype=np.float64)
    for sweep in range(1, max_sweeps + 1):
        a_in, a_out = a_in_buf[:m], a_out_buf[:m]
        t, ratio = t_buf[:m], ratio_buf[:m]
        t_lo, s = (t_lo_buf[:m], s_buf[:m]) if single else (t, a_out)
        _sweep(B, x, a_in, rate, hyper.a0, t, t_lo, ratio, s, a_out, settings.means)
        if sweep == max_sweeps:
            done = live
        else:
            diff = np.subtract(a_out, a_in, out=diff_buf[:m])
            np.abs(diff, out=diff)
            moved = np.add.reduce(diff, axis=1)
            done = live & ((moved / K < tol) | (moved < moved_limit))
        if done.any():
            finished = docs[rows[done]]
            a[finished] = a_out[done]
            t_final[finished] = t[done]
            sweeps[finished] = sweep
            fl = flat[done]
            real = fl >= 0
            ratio_final[fl[real]] = ratio[done][real]
            live &= ~done
            n_live = int(np.count_nonzero(live))
            if n_live == 0:
                return
            if n_live <= COMPACT_FRACTION * m:
                keep = np.flatnonzero(live)
                for i, j in enumerate(keep):  # i <= j: moving rows forward in order is safe
                    if i != j:
                        B[i] = B[j]
                m = n_live
                B = B[:m]
                for buf in (a_in_buf, a_out_buf, x0_buf, x1_buf):
                    buf[:m] = buf[keep]
                a_in, a_out = a_in_buf[:m], a_out_buf[:m]
                rows, x, flat, moved_limit = rows[keep], x[keep], flat[keep], moved_limit[keep]
                live = np.ones(m, dtype=bool)
        phase = sweep % 3  # SQUAREM cycle: 1 records x0 -> x1, 2 extrapolates, 0 stabilises
        if accelerate and phase == 1:
            x0_buf[:m], x1_buf[:m] = a_in, a_out
        if accelerate and phase == 2:
            _extrapolate(x0_buf[:m], x1_buf[:m], a_out, hyper.a0, a_in)
        else:
            a_in[...] = a_out


def local_elbo(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: TopicView,
               hyper: Hyper, a: np.ndarray) -> float:
    """The chunk's share of the ELBO at (q(theta) = a, q(beta)), with p^(vd) optimal (eq. 11.23).

    Terms: sum X ln sum_k exp(E ln beta + E ln theta) - sum_k (sum_v E beta)(sum_d E theta)
    - sum ln X! + sum_dk (E ln p(theta) - E ln q(theta)).
    """
    rate = theta_rate(view, hyper)
    elog_theta = digamma(a) - np.log(rate)
    phi = normalisers(indptr, indices, view.exp_elog_beta, np.exp(elog_theta))
    data = float(counts @ np.log(phi)) - float(view.beta_sum @ (a / rate).sum(axis=0)) \
        - float(gammaln(counts + 1).sum())
    return data + float(gamma_kl_terms(a, rate[None, :], hyper.a0, hyper.b0).sum())


def map_local_objective(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: TopicView,
                        hyper: Hyper, a: np.ndarray) -> float:
    """The chunk's share of the MAP objective (docs/models/bnmf.md, "The MAP estimate") at theta = a / rate and
    the beta of ``view`` (a view of the means, ``TopicView.from_params(..., means=True)``): the Poisson log
    likelihood of the counts plus sum_dk ln Gamma(theta_kd; a0 + 1, b0)."""
    theta = a / theta_rate(view, hyper)
    mean = normalisers(indptr, indices, view.exp_elog_beta, theta)
    data = float(counts @ np.log(mean)) - float(view.beta_sum @ theta.sum(axis=0)) - float(gammaln(counts + 1).sum())
    return data + float(gamma_log_density(theta, hyper.a0 + 1.0, hyper.b0).sum())


def map_global_objective(g: np.ndarray, h: np.ndarray, hyper: Hyper) -> float:
    """The topics' share of the MAP objective: sum_vk ln Gamma(beta_vk; c0/V + 1, c0) at beta = g / h."""
    return float(gamma_log_density(g / h, hyper.c0 / hyper.n_words + 1.0, hyper.c0).sum())


def gamma_log_density(x: np.ndarray, shape: float, rate: float) -> np.ndarray:
    """ln Gamma(x; shape, rate), elementwise."""
    return shape * np.log(rate) - gammaln(shape) + (shape - 1.0) * np.log(x) - rate * x


def gamma_kl_terms(shape: np.ndarray, rate: np.ndarray, a0: float, b0: float) -> np.ndarray:
    """E_q ln Gamma(x; a0, b0) - E_q ln Gamma(x; shape, rate), elementwise (minus a KL)."""
    elog = digamma(shape) - np.log(rate)
    mean = shape / rate
    prior = a0 * np.log(b0) - gammaln(a0) + (a0 - 1) * elog - b0 * mean
    entropy_part = shape * np.log(rate) - gammaln(shape) + (shape - 1) * elog - rate * mean
    return prior - entropy_part


def global_elbo(g: np.ndarray, h: np.ndarray, hyper: Hyper) -> float:
    """sum_vk E ln p(beta_vk) - E ln q(beta_vk) (the global part of the ELBO)."""
    return float(gamma_kl_terms(g, h, hyper.c0 / hyper.n_words, hyper.c0).sum())


def batch_update(S: np.ndarray, theta_sum: np.ndarray, hyper: Hyper) -> tuple[np.ndarray, np.ndarray]:
    """g = c0/V + S, h_vk = c0 + sum_d E theta_kd (eqs. 11.25-11.26)."""
    g = hyper.c0 / hyper.n_words + S
    h = np.broadcast_to(hyper.c0 + theta_sum, S.shape).copy()
    return g, h


def stochastic_update(g: np.ndarray, h: np.ndarray, S: np.ndarray, theta_sum: np.ndarray,
                      hyper: Hyper, scale: float, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Natural-gradient step with the minibatch statistics scaled by D/|C_t| (eqs. 11.33-11.34):
    (1 - rho) q + rho q_hat with q_hat the batch update (``batch_update``) of the scaled statistics,
    computed with two V x K temporaries instead of seven (h_hat is one row, broadcast)."""
    step = np.multiply(S, scale)
    step += hyper.c0 / hyper.n_words
    step *= rho
    g_new = np.multiply(g, 1 - rho)
    g_new += step
    h_new = np.multiply(h, 1 - rho)
    h_new += rho * (hyper.c0 + scale * theta_sum)
    return g_new, h_new


def step_size(t: int, t0: float, kappa: float) -> float:
    """rho_t = (t0 + t)^(-kappa), kappa in (0.5, 1] (paper 002, Sec. 11.5.2)."""
    return float((t0 + t) ** (-kappa))


def minibatch_noise(S: np.ndarray, square_sum: float, docs: float, scale: float) -> float:
    """tr Var of the minibatch's estimate c0/V + scale S of q(beta)'s shapes (eq. 11.33), from its ``docs``
    documents' statistics: their sum ``S`` and the sum of their squared norms ``square_sum``. The |B| documents
    are a draw without replacement from the corpus's D = scale |B| (a pass visits each document once), so the
    estimate's variance is scale^2 |B| (1 - |B| / D) times the sample variance of one document's statistics,
    (square_sum - |S|^2 / |B|) / (|B| - 1): the finite-population correction 1 - |B| / D takes out what a small
    corpus's minibatches cannot differ by, and a minibatch of the whole corpus has no noise. Zero for fewer than
    two documents (docs/models/bnmf.md, "Step sizes")."""
    if docs < 2:
        return 0.0
    spread = (square_sum - float(np.vdot(S, S)) / docs) / (docs - 1.0)
    return scale * scale * docs * max(1.0 - 1.0 / scale, 0.0) * max(spread, 0.0)


def adaptive_step_size(distance: float, noise: float, floor: float, ceiling: float = 1.0) -> float:
    """The step that brings q(beta) closest, in expectation, to the mean of the minibatch estimates:
    rho = 1 - tr Var(g) / |g|^2 for the natural gradient g (the estimate minus the current shapes, whose
    squared norm is ``distance``; Ranganath et al. 2013, with the noise from the minibatch's own documents,
    ``minibatch_noise``), but at least ``floor`` (the schedule's rho_t), at most ``ceiling`` where that is above
    ``floor`` (a schedule of longer steps), and at most 1 (docs/models/bnmf.md, "Step sizes")."""
    signal = 1.0 - noise / distance if distance > 0 else 0.0
    return float(min(1.0, max(floor, min(signal, ceiling))))


def initial_globals(n_words: int, n_topics: int, n_tokens: float, n_docs: int, hyper: Hyper,
                    rng: np.random.Generator, spread_prior: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The prior plus Uniform(0, 1) noise scaled to the corpus size (paper 002, Sec. 11.6).

    The noise on g is scaled so each topic starts with about ``n_tokens / K`` pseudo-counts;
    h starts as if every document gave each topic an expected weight of 1/K. g is built in place and h, whose
    rows are all the same, is a read-only V x K view of one row: one V x K array in all.

    With ``spread_prior`` the prior's part c0/V of each g_vk is drawn too, as c0/V times Uniform(0, 2) (the same
    mean). Local steps that weigh words by E[beta] = g / h see the topics differ only by that noise over the
    prior's shape, and on a small corpus (few pseudo-counts per word) the topics then start so alike that the
    first sweeps move no token and every topic stays the same; exp(E ln beta) magnifies the same differences
    several times (docs/models/bnmf.md, "Topic weights").
    """
    g = rng.uniform(0.0, 1.0, size=(n_words, n_topics))
    noise_sums = g.sum(axis=0, keepdims=True)
    g *= n_tokens / n_topics
    g /= noise_sums
    if spread_prior:
        g += (2.0 * hyper.c0 / n_words) * rng.uniform(0.0, 1.0, size=(n_words, n_topics))
    else:
        g += hyper.c0 / n_words
    h = np.broadcast_to(np.full(n_topics, hyper.c0 + n_docs / n_topics), (n_words, n_topics))
    return g, h


def split_thirds(counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Assign each token of each entry to one of three folds: (nnz, 3) integer counts (paper 002, Sec. 11.6)."""
    return rng.multinomial(counts.astype(np.int64), [1 / 3, 1 / 3, 1 / 3])


def completion_score(indptr: np.ndarray, indices: np.ndarray, held: np.ndarray, weights: np.ndarray,
                     mean_beta: np.ndarray) -> tuple[float, float]:
    """Score ``held`` counts by p(v | d) = sum_k E beta_vk W_dk / sum_v' sum_k E beta_v'k W_dk.

    ``weights`` W (D x K) are the document weights fitted on the observed counts (any positive
    per-document scale); returns (sum of log p(word) over held-out tokens, held-out tokens).
    """
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    rate = np.empty(len(indices))
    for d in range(len(indptr) - 1):  # a product per document: no nonzeros x K temporaries
        lo, hi = indptr[d], indptr[d + 1]
        rate[lo:hi] = mean_beta[indices[lo:hi]] @ weights[d]
    total = weights @ mean_beta.sum(axis=0)
    keep = held > 0
    ll = held[keep] @ (np.log(rate[keep]) - np.log(total[rows[keep]]))
    return float(ll), float(held.sum())


def completion_loglik(indptr: np.ndarray, indices: np.ndarray, observed: np.ndarray,
                      held: np.ndarray, view: TopicView, mean_beta: np.ndarray,
                      hyper: Hyper, settings: LocalSettings) -> tuple[float, float]:
    """Document completion (paper 002, Sec. 11.6): fit theta on ``observed`` counts, score ``held`` counts
    with the means of q (``completion_score`` with W = E theta); ``mean_beta`` is E beta = g / h.
    """
    res = local_step(indptr, indices, observed, view, hyper, settings, with_stats=False)
    return completion_score(indptr, indices, held, res.a / theta_rate(view, hyper), mean_beta)


def thirds_loglik(counts: np.ndarray, rng: np.random.Generator,
                  score_fold: Callable[[np.ndarray, np.ndarray], tuple[float, float]]) -> tuple[float, float]:
    """Paper 002, Sec. 11.6: split each document's tokens into thirds and predict each third
    from the other two with ``score_fold(observed, held)``, which returns (log-likelihood, tokens).
    Returns the sums over the three folds."""
    folds = split_thirds(counts, rng).astype(np.float64)
    ll = tokens = 0.0
    for f in range(3):
        held = folds[:, f]
        part_ll, part_tokens = score_fold(folds.sum(axis=1) - held, held)
        ll, tokens = ll + part_ll, tokens + part_tokens
    return ll, tokens


def threefold_completion(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray,
                         view: TopicView, mean_beta: np.ndarray, hyper: Hyper, settings: LocalSettings,
                         rng: np.random.Generator) -> tuple[float, float]:
    """Threefold document completion (``thirds_loglik``) for Bayesian NMF."""
    return thirds_loglik(counts, rng, lambda observed, held: completion_loglik(
        indptr, indices, observed, held, view, mean_beta, hyper, settings))


def topic_word(g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """E[beta] normalised per topic: a K x V matrix of word probabilities."""
    mean = (g / h).T
    return mean / mean.sum(axis=1, keepdims=True)


def topic_tokens(g: np.ndarray, c0: float) -> np.ndarray:
    """The tokens each topic holds: its column of q(beta)'s shapes less the prior's part, c0 (eq. 11.25:
    g_vk = c0/V + S_vk, where S_vk counts the tokens of word v given to topic k; SVI's blend of such columns
    estimates the corpus's). ``topic_mass`` is near 1 for every topic, as the prior holds each topic's E beta
    near a distribution; these tell the topics the data use from those left at their prior."""
    return g.sum(axis=0) - c0


def topic_mass(g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """sum_v E beta_vk per topic, the scale each topic carries; ``h`` V x K or one row (K,). One topic at a time,
    so that no V x K array is made besides g and h (``top_words``)."""
    h = np.broadcast_to(h, g.shape)
    return np.array([np.sum(g[:, k] / h[:, k]) for k in range(g.shape[1])])


def top_words(g: np.ndarray, h: np.ndarray, vocab: list[str] | None, n: int = 10) -> list[list[str]]:
    """The ``n`` most probable words of every topic (``w<id>`` when there is no vocabulary), most probable
    first, ties by word id. A topic's order is that of E[beta_vk] = g_vk / h_vk (normalising the topic does not
    change it), found one topic at a time: no V x K array is made besides g and h (four were, 320 MB at
    V = 100,000 and K = 100, the peak of a whole fit)."""
    h = np.broadcast_to(h, g.shape)
    count = min(n, g.shape[0])
    words = []
    for k in range(g.shape[1]):
        mean = g[:, k] / h[:, k]
        best = np.argpartition(-mean, count - 1)[:count] if 0 < count < len(mean) else np.arange(count)
        best = best[np.lexsort((best, -mean[best]))]
        words.append([vocab[v] if vocab else f"w{v}" for v in best])
    return words

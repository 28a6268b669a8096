"""Bayesian NMF (Poisson-gamma) per-chunk mathematics: SPEC 3.5, paper 002 eqs. (11.23)-(11.34).

Documents are rows. Globals are the Gamma parameters (g, h) of q(beta) (V x K); the local
variables of document d are the Gamma parameters (a_d, b) of q(theta_d) (b is shared).

The local step works on a row chunk in CSR form. Documents are sorted by length and swept
in small padded groups (cache-sized), so each sweep costs O(nnz x K) with a batched
matrix-vector product and never builds a documents x vocabulary array. Each document stops
at its own tolerance, so its result does not depend on which other documents share its
chunk or group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln

GROUP_BYTES = 4 << 20


@dataclass(frozen=True)
class Hyper:
    """Prior parameters (SPEC 3.5): beta ~ Gamma(c0/V, c0), theta ~ Gamma(a0, b0)."""

    c0: float
    a0: float
    b0: float
    n_words: int

    @classmethod
    def paper_defaults(cls, n_words: int, n_topics: int) -> "Hyper":
        """c0 = 0.05 V and a0 = b0 = 1/K (paper 002 section 11.6)."""
        return cls(c0=0.05 * n_words, a0=1.0 / n_topics, b0=1.0 / n_topics, n_words=n_words)


@dataclass(frozen=True)
class TopicView:
    """Expectations of q(beta) that the local step needs (eq. 11.24 and 11.29)."""

    exp_elog_beta: np.ndarray  # (V, K) exp(E ln beta_vk)
    beta_sum: np.ndarray       # (K,)   sum_v E beta_vk

    @classmethod
    def from_params(cls, g: np.ndarray, h: np.ndarray) -> "TopicView":
        return cls(np.exp(digamma(g) - np.log(h)), (g / h).sum(axis=0))


@dataclass
class LocalResult:
    """Output of the local step for a chunk: q(theta) shapes and the chunk's statistics."""

    a: np.ndarray         # (n_docs, K) shapes of q(theta_d); the rate is TopicView-derived
    S: np.ndarray         # (V, K) sum_d X_dv p_k^(vd)
    theta_sum: np.ndarray  # (K,) sum_d E theta_kd
    sweeps: np.ndarray    # (n_docs,) sweeps each document used


def theta_rate(view: TopicView, hyper: Hyper) -> np.ndarray:
    """b_kd = b0 + sum_v E beta_vk, the same for every document (eq. 11.29)."""
    return hyper.b0 + view.beta_sum


def initial_shapes(indptr: np.ndarray, counts: np.ndarray, n_topics: int, hyper: Hyper) -> np.ndarray:
    """Deterministic start: each document's words spread evenly over the topics."""
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    lengths = np.bincount(rows, weights=counts, minlength=len(indptr) - 1)
    return hyper.a0 + np.repeat((lengths / n_topics)[:, None], n_topics, axis=1)


def _padded_group(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray,
                  docs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Word ids, counts and CSR positions of ``docs`` as (g, L) arrays; padding has count 0
    and position -1."""
    starts, lengths = indptr[docs], indptr[docs + 1] - indptr[docs]
    pos = np.arange(int(lengths.max()))
    valid = pos[None, :] < lengths[:, None]
    flat = np.where(valid, starts[:, None] + pos[None, :], -1)
    safe = np.maximum(flat, 0)
    return np.where(valid, indices[safe], 0), np.where(valid, counts[safe], 0.0), flat


def _sweep(B: np.ndarray, x: np.ndarray, a: np.ndarray, rate: np.ndarray,
           a0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One update of p^(vd) then a_d for a padded group (eqs. 11.24 and 11.28).

    Returns the new shapes, exp(E ln theta) used for p, and x / normaliser per word.
    """
    t = np.exp(digamma(a)) / rate
    phi = np.matmul(B, t[:, :, None])[:, :, 0]
    ratio = x / np.where(x > 0, phi, 1.0)
    a_new = a0 + t * np.matmul(ratio[:, None, :], B)[:, 0, :]
    return a_new, t, ratio


def _groups(lengths: np.ndarray, n_topics: int) -> list[np.ndarray]:
    """Non-empty documents sorted by length, cut into groups whose padded (g, L, K) block
    stays near ``GROUP_BYTES`` (the longest document of a group sets L)."""
    order = np.argsort(lengths, kind="stable")
    order = order[lengths[order] > 0]
    groups, start = [], 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop + 1 - start) * lengths[order[stop]] * n_topics * 8 <= GROUP_BYTES:
            stop += 1
        groups.append(order[start:stop])
        start = stop
    return groups


def local_step(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: TopicView,
               hyper: Hyper, tol: float = 1e-3, max_sweeps: int = 100,
               a_start: np.ndarray | None = None, with_stats: bool = True) -> LocalResult:
    """Fit q(theta_d) for every document of a CSR chunk with the topics fixed (SPEC 3.5).

    A document iterates p and a until the mean absolute change of a_d falls below ``tol``
    or ``max_sweeps`` is reached. Statistics use the p of each document's last sweep, so
    a_d = a0 + sum_v X_dv p^(vd) holds exactly for the returned shapes.
    """
    n_docs, n_topics = len(indptr) - 1, view.exp_elog_beta.shape[1]
    rate = theta_rate(view, hyper)
    a = initial_shapes(indptr, counts, n_topics, hyper) if a_start is None else a_start.copy()
    t_final = np.zeros((n_docs, n_topics))
    ratio_final = np.zeros(len(indices))
    sweeps = np.zeros(n_docs, dtype=np.int64)
    for docs in _groups(np.diff(indptr), n_topics):
        _fit_group(indptr, indices, counts, view, hyper, tol, max_sweeps, docs, a, rate,
                   t_final, ratio_final, sweeps)
    S = np.zeros_like(view.exp_elog_beta)
    if with_stats and len(indices):
        R = sp.csr_matrix((ratio_final, indices, indptr), shape=(n_docs, view.exp_elog_beta.shape[0]))
        S = view.exp_elog_beta * np.asarray(R.T @ t_final)
    return LocalResult(a=a, S=S, theta_sum=(a / rate).sum(axis=0), sweeps=sweeps)


def _fit_group(indptr, indices, counts, view, hyper, tol, max_sweeps, docs, a, rate,
               t_final, ratio_final, sweeps) -> None:
    """Iterate one padded group to per-document convergence, writing results in place."""
    words, x, flat = _padded_group(indptr, indices, counts, docs)
    B = view.exp_elog_beta[words]
    active = np.arange(len(docs))
    a_g = a[docs]
    for sweep in range(1, max_sweeps + 1):
        a_new, t, ratio = _sweep(B, x, a_g, rate, hyper.a0)
        done = np.abs(a_new - a_g).mean(axis=1) < tol
        if sweep == max_sweeps:
            done[:] = True
        a_g = a_new
        finished = docs[active[done]]
        a[finished] = a_g[done]
        t_final[finished] = t[done]
        sweeps[finished] = sweep
        real = flat[done] >= 0
        ratio_final[flat[done][real]] = ratio[done][real]
        keep = ~done
        if not keep.any():
            return
        active, a_g, B, x, flat = active[keep], a_g[keep], B[keep], x[keep], flat[keep]


def local_elbo(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, view: TopicView,
               hyper: Hyper, a: np.ndarray) -> float:
    """The chunk's share of the ELBO at (q(theta) = a, q(beta)), with p^(vd) optimal (eq. 11.23).

    Terms: sum X ln sum_k exp(E ln beta + E ln theta) - sum_k (sum_v E beta)(sum_d E theta)
    - sum ln X! + sum_dk (E ln p(theta) - E ln q(theta)).
    """
    rate = theta_rate(view, hyper)
    elog_theta = digamma(a) - np.log(rate)
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    phi = np.einsum("nk,nk->n", view.exp_elog_beta[indices], np.exp(elog_theta)[rows])
    data = float(counts @ np.log(phi)) - float(view.beta_sum @ (a / rate).sum(axis=0)) \
        - float(gammaln(counts + 1).sum())
    return data + float(gamma_kl_terms(a, rate[None, :], hyper.a0, hyper.b0).sum())


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
    """Natural-gradient step with the minibatch statistics scaled by D/|C_t| (eqs. 11.33-11.34)."""
    g_hat, h_hat = batch_update(scale * S, scale * theta_sum, hyper)
    return (1 - rho) * g + rho * g_hat, (1 - rho) * h + rho * h_hat


def step_size(t: int, t0: float, kappa: float) -> float:
    """rho_t = (t0 + t)^(-kappa), kappa in (0.5, 1] (paper 002 section 11.5.2)."""
    return float((t0 + t) ** (-kappa))


def initial_globals(n_words: int, n_topics: int, n_tokens: float, n_docs: int, hyper: Hyper,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The prior plus Uniform(0, 1) noise scaled to the corpus size (SPEC 3.5, paper 11.6).

    The noise on g is scaled so each topic starts with about ``n_tokens / K`` pseudo-counts;
    h starts as if every document gave each topic an expected weight of 1/K.
    """
    noise = rng.uniform(0.0, 1.0, size=(n_words, n_topics))
    g = hyper.c0 / n_words + noise * (n_tokens / n_topics) / noise.sum(axis=0, keepdims=True)
    h = np.full((n_words, n_topics), hyper.c0 + n_docs / n_topics)
    return g, h


def split_thirds(counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Assign each token of each entry to one of three folds: (nnz, 3) integer counts (SPEC 4)."""
    return rng.multinomial(counts.astype(np.int64), [1 / 3, 1 / 3, 1 / 3])


def completion_loglik(indptr: np.ndarray, indices: np.ndarray, observed: np.ndarray,
                      held: np.ndarray, view: TopicView, mean_beta: np.ndarray,
                      hyper: Hyper, tol: float, max_sweeps: int) -> tuple[float, float]:
    """Document completion (SPEC 4): fit theta on ``observed`` counts, score ``held`` counts.

    Returns (sum of log p(word) over held-out tokens, number of held-out tokens), where
    p(v | d) = sum_k E beta_vk E theta_kd / sum_v' sum_k E beta_v'k E theta_kd (means of q);
    ``mean_beta`` is E beta = g / h.
    """
    res = local_step(indptr, indices, observed, view, hyper, tol, max_sweeps, with_stats=False)
    mean_theta = res.a / theta_rate(view, hyper)
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    rate = np.einsum("nk,nk->n", mean_beta[indices], mean_theta[rows])
    total = mean_theta @ mean_beta.sum(axis=0)
    keep = held > 0
    ll = held[keep] @ (np.log(rate[keep]) - np.log(total[rows[keep]]))
    return float(ll), float(held.sum())


def threefold_completion(indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray,
                         view: TopicView, mean_beta: np.ndarray, hyper: Hyper, tol: float,
                         max_sweeps: int, rng: np.random.Generator) -> tuple[float, float]:
    """Paper 002 section 11.6: split each document's tokens into thirds; predict each third
    from the other two. Returns (summed log-likelihood, held-out tokens) over the three folds."""
    folds = split_thirds(counts, rng).astype(np.float64)
    ll = tokens = 0.0
    for f in range(3):
        held = folds[:, f]
        part_ll, part_tokens = completion_loglik(indptr, indices, folds.sum(axis=1) - held, held, view,
                                                 mean_beta, hyper, tol, max_sweeps)
        ll, tokens = ll + part_ll, tokens + part_tokens
    return ll, tokens

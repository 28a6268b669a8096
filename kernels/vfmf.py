"""VFMF and TVIMF: paper 000's variational comparators with a fixed truncation T (docs/models/comparators.md).

Both keep IMF's linear-Gaussian likelihood, its q(A) (a Gaussian per column, full T x T covariance),
q(eta_X), q(eta_A) and q(z_ik) = Bern(nu_ik); only the prior on the feature probabilities
differs, and with it q(pi) and the prior term of the bound:

* VFMF, the finite Beta-Bernoulli model: pi_k ~ Beta(alpha/T, 1), q(pi_k) = Beta(t1_k, t2_k);
* TVIMF (Doshi-Velez et al. 2009), stick-breaking: v_k ~ Beta(alpha, 1), pi_k = prod_{m<=k} v_m,
  q(v_k) = Beta(t1_k, t2_k); E ln(1 - pi_k) is replaced by the multinomial lower bound with the auxiliary
  q_k(y), y = 1..k, held in ``post["qy"]`` (T, T), row k over y <= k (zero above the diagonal).

Every update is a coordinate maximum of the bound, and the q(A), q(eta) updates and the q(z) sweep are
IMF's own functions (``kernels.imf``): this module adds the ``Prior`` of each model (its E ln pi_k and
E ln(1 - pi_k), its q(pi) or q(v) update, its Beta(a, 1) concentration a) and the bound that combines them.
The q(z) logit uses the second moments Lambda^j of the full-covariance q(a_j), the coordinate
maximum for this family; for a q(A) factorised over features, Lambda^j_rk would be E[a_rj] E[a_kj]
off the diagonal.

``stats`` and ``post`` are IMF's (``kernels.imf`` docstring) with K = T features throughout, plus ``qy``
for TVIMF. ``hyper`` is ``imf.Hyper`` with alpha fixed (a float).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import softmax, xlogy

from . import imf
from .bnmf import gamma_kl_terms

Stats = imf.Stats
Post = imf.Post


@dataclass(frozen=True)
class Prior:
    """One model's prior on the feature probabilities, as the bound sees it (module docstring).

    ``concentration(alpha, T)`` is a in the Beta(a, 1) prior of each pi_k (VFMF) or v_k (TVIMF);
    ``log_means(post)`` gives E ln pi_k and E ln(1 - pi_k) (or its lower bound), each (T,);
    ``update(stats, post, a)`` is the coordinate-ascent update of q(pi) (VFMF) or of q(y) then q(v) (TVIMF);
    ``pi_means(post)`` gives E[pi_k] (T,).
    """

    name: str
    concentration: Callable[[float, int], float]
    log_means: Callable[[Post], tuple[np.ndarray, np.ndarray]]
    update: Callable[[Stats, Post, float], Post]
    pi_means: Callable[[Post], np.ndarray]


# ----------------------------------------------------------------------------- VFMF


def finite_log_means(post: Post) -> tuple[np.ndarray, np.ndarray]:
    """E ln pi_k and E ln(1 - pi_k) under q(pi_k) = Beta(t1_k, t2_k)."""
    return imf.beta_log_means(post["t1"], post["t2"])


def beta_means(post: Post) -> np.ndarray:
    """E[x_k] = t1_k / (t1_k + t2_k) under Beta(t1_k, t2_k): E[pi_k] for VFMF, E[v_k] for TVIMF."""
    return post["t1"] / (post["t1"] + post["t2"])


def update_finite(stats: Stats, post: Post, a: float) -> Post:
    """q(pi_k) = Beta(a + sum_i nu_ik, 1 + sum_i (1 - nu_ik)) with a = alpha / T (VFMF)."""
    m_k = stats["sum_nu"]
    return {**post, "t1": a + m_k, "t2": 1.0 + stats["n_rows"] - m_k}


# ----------------------------------------------------------------------------- TVIMF


def aux_logits(t1: np.ndarray, t2: np.ndarray) -> np.ndarray:
    """c_y = E ln(1 - v_y) + sum_{m<y} E ln v_m (T,): q_k(y) is proportional to exp(c_y) on y <= k."""
    log_v, log_1mv = imf.beta_log_means(t1, t2)
    return log_1mv + np.cumsum(log_v) - log_v


def update_aux(post: Post) -> Post:
    """q_k(y) that maximises the multinomial bound on E ln(1 - pi_k) for every k, given q(v)."""
    t = post["t1"].shape[0]
    support = np.tri(t, dtype=bool)
    logits = np.where(support, aux_logits(post["t1"], post["t2"])[None, :], -np.inf)
    return {**post, "qy": softmax(logits, axis=1)}


def stick_log_means(post: Post) -> tuple[np.ndarray, np.ndarray]:
    """E ln pi_k = sum_{m<=k} E ln v_m, and the multinomial lower bound on E ln(1 - pi_k) at ``post["qy"]``:
    sum_y q_ky c_y + H(q_k) (``aux_logits``)."""
    qy = post["qy"]
    log_v, _ = imf.beta_log_means(post["t1"], post["t2"])
    bound = qy @ aux_logits(post["t1"], post["t2"]) - np.sum(xlogy(qy, qy), axis=1)
    return np.cumsum(log_v), bound


def stick_means(post: Post) -> np.ndarray:
    """E[pi_k] = prod_{m<=k} E[v_m] (the v_m are independent under q)."""
    return np.cumprod(beta_means(post))


def reverse_cumsum(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """sum_{n >= k} a_n along ``axis``."""
    return np.flip(np.cumsum(np.flip(a, axis), axis=axis), axis)


def update_sticks(stats: Stats, post: Post, a: float) -> Post:
    """q(v_k) = Beta(t1_k, t2_k) given q(y) (TVIMF), with m_k = sum_i nu_ik, w_m = N - m_m:
    t1_k = a + sum_{m>=k} m_m + sum_{m>k} w_m sum_{n=k+1..m} q_mn,  t2_k = 1 + sum_{m>=k} w_m q_mk.
    (q_mn is 0 for n > m, so the sums over m can run over every m.)"""
    qy, m_k = post["qy"], stats["sum_nu"]
    w = stats["n_rows"] - m_k
    beyond = reverse_cumsum(qy, axis=1) - qy  # [m, k] = sum_{n>k} q_mn
    return {**post, "t1": a + reverse_cumsum(m_k) + w @ beyond, "t2": 1.0 + w @ qy}


def update_stick_prior(stats: Stats, post: Post, a: float) -> Post:
    """q(y) given q(v), then q(v) given q(y): two coordinate steps of TVIMF's bound."""
    return update_sticks(stats, update_aux(post), a)


def finite_concentration(alpha: float, truncation: int) -> float:
    """VFMF's pi_k ~ Beta(alpha / T, 1)."""
    return alpha / truncation


def stick_concentration(alpha: float, truncation: int) -> float:
    """TVIMF's v_k ~ Beta(alpha, 1), whatever the truncation."""
    return alpha


VFMF = Prior("vfmf", finite_concentration, finite_log_means, update_finite, beta_means)
TVIMF = Prior("tvimf", stick_concentration, stick_log_means, update_stick_prior, stick_means)
PRIORS = {p.name: p for p in (VFMF, TVIMF)}


# ----------------------------------------------------------------------------- the alternation


def concentration(prior: Prior, hyper: imf.Hyper, post: Post) -> float:
    """a of the Beta(a, 1) prior at this truncation (``Prior``)."""
    return prior.concentration(hyper.alpha, post["t1"].shape[0])


def row_step(x: np.ndarray, mask: np.ndarray | None, nu: np.ndarray, post: Post,
             prior: Prior) -> tuple[np.ndarray, Stats]:
    """One sweep of q(z_ik) over k for every row of a chunk (IMF's sweep with this prior's E ln pi_k and
    E ln(1 - pi_k)); the new nu (n, T) and the chunk's statistics."""
    log_pi, log_1mpi = prior.log_means(post)
    return imf.row_step(x, mask, nu, post, prior_logit=log_pi - log_1mpi)


def column_update(stats: Stats, hyper: imf.Hyper, post: Post, prior: Prior) -> Post:
    """The global step: q(pi) (or q(y), q(v)), q(A), q(eta_X), q(eta_A) in turn, each a coordinate maximum."""
    post = prior.update(stats, post, concentration(prior, hyper, post))
    for step in (imf.update_a, imf.update_eta_x, imf.update_eta_a):
        post = step(stats, post, hyper)
    return post


def initial_post(stats: Stats, hyper: imf.Hyper, prior: Prior) -> Post:
    """Column posteriors to start the alternation from the q(z) whose statistics are ``stats``: q(A) at
    zero (V = 0), q(eta_A) at its prior, q(eta_X) fitted to X alone, q(pi) (and q(y)) updated from ``stats``."""
    d, t = stats["xz"].shape
    shared = stats["zz"].ndim == 2
    post = {"m": np.zeros((d, t)), "V": np.zeros((t, t) if shared else (d, t, t)),
            "t1": np.ones(t), "t2": np.ones(t), "aa": np.float64(hyper.aa0), "ba": np.float64(hyper.ba0)}
    post = prior.update(stats, post, concentration(prior, hyper, post))
    return imf.update_eta_x(stats, post, hyper)


# ----------------------------------------------------------------------------- the bound


def z_terms(stats: Stats, post: Post, prior: Prior) -> float:
    """sum_k [ m_k E ln pi_k + (N - m_k) E ln(1 - pi_k) ]: E_q ln p(Z | pi), m_k = sum_i nu_ik."""
    log_pi, log_1mpi = prior.log_means(post)
    m_k = stats["sum_nu"]
    return float(np.sum(m_k * log_pi + (stats["n_rows"] - m_k) * log_1mpi))


def beta_one_prior(post: Post, a: float) -> float:
    """sum_k E_q ln Beta(x_k; a, 1) = sum_k [ln a + (a - 1) E ln x_k], x = pi (VFMF) or v (TVIMF)."""
    log_x, _ = imf.beta_log_means(post["t1"], post["t2"])
    return float(np.sum(np.log(a) + (a - 1.0) * log_x))


def evidence_terms(stats: Stats, post: Post, hyper: imf.Hyper, prior: Prior) -> dict[str, float]:
    """The named terms of the bound E_q[ln p(X, Z, A, pi or v, eta) - ln q] (TVIMF: with E ln(1 - pi_k)
    replaced by its multinomial lower bound). Only ``stats`` depends on the rows."""
    return {
        "loglik": imf.expected_log_lik(stats, post),
        "prior_a": imf.gaussian_prior_a(stats, post, hyper),
        "z": z_terms(stats, post, prior),
        "pi": beta_one_prior(post, concentration(prior, hyper, post)),
        "entropy_z": float(stats["entropy_z"]),
        "entropy_pi": imf.beta_entropy(post["t1"], post["t2"]),
        "entropy_a": imf.gaussian_entropy(post),
        "eta_x": float(gamma_kl_terms(post["ax"], post["bx"], hyper.ax0, hyper.bx0)),
        "eta_a": float(gamma_kl_terms(post["aa"], post["ba"], hyper.aa0, hyper.ba0)),
    }


def evidence(stats: Stats, post: Post, hyper: imf.Hyper, prior: Prior) -> float:
    """The bound: the sum of ``evidence_terms``."""
    return float(sum(evidence_terms(stats, post, hyper, prior).values()))


def initial_nu(uniforms: np.ndarray) -> np.ndarray:
    """A random start for q(z): nu_ik drawn uniformly from (0.05, 0.95) by the given uniforms on [0, 1)."""
    return 0.05 + 0.9 * uniforms

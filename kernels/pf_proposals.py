"""Proposals for row i of Z in the collapsed linear-Gaussian particle filter (paper 001, eqs. 3-5).

Every proposal returns, for a block of L particles with column counts m (L, Kc), the new row's
entries for the existing columns z (L, Kc) bool, the number of new features K_new (L,) and the
log-ratio log p(z_i | past) - log q(z_i) (L,) that the filter adds to the predictive
log-density p(x_i | z_i, past) to get the exact importance weight of eq. 5 with proposal q:

* ``"prior"``: q = the IBP conditional (paper 001 Alg. 1), as in the paper's Algorithm 2; the
  log-ratio is 0 and the weight is the predictive density (eq. 7);
* ``"guided"``: the existing features independently, z_ik ~ Bern(q_k) with
  q_k = pi_k f(e_k) / (pi_k f(e_k) + (1 - pi_k) f(0)), pi_k = m_k / i the prior probability and
  f(z) the collapsed predictive density of x_i given z_i,1:Kc = z, averaged over the prior of the
  new features: f(z) = sum_{j <= NEW_FEATURE_TERMS} Poisson(j; alpha / i) N(x_i; z M, (sigma_X^2 +
  z S z^T + j sigma_A^2) I), (M, S) the particle's posterior of A; e_k has feature k alone on.
  K_new from the prior Poisson(alpha / i). The Poisson parts of p and q cancel, and per feature
  p(z_ik) / q(z_ik) = c_k / f(e_k) if z_ik = 1, c_k / f(0) if not, with
  c_k = pi_k f(e_k) + (1 - pi_k) f(0). Every feature's q_k comes from one array operation over
  all particles and features, so a row costs a fixed number of NumPy calls whatever Kc.

Averaging over K_new matters: with the new features off in f, "existing feature off, a new one
on" gets a tiny q but a large weight, and the weights are heavy-tailed. Truncating the sum only
changes q, not the exactness of the weights. An earlier guided proposal drew the features one at
a time, each given the ones before it (Kc NumPy passes per row); on the figure-3 images the
independent one had the lower ZZ^T error at P = 100 as well as the lower cost.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .ibp_prior import new_feature_log_prior, sample_ibp_conditional
from .lg_particles import LGParticles

Proposal = Callable[[LGParticles, np.ndarray, float, float, float, np.random.Generator, np.ndarray | None],
                    tuple[np.ndarray, np.ndarray, np.ndarray]]
NEW_FEATURE_TERMS = 3   # K_new = 0..3 in the guided proposal's predictive (module docstring)


def row_log_density(resid: np.ndarray, var: np.ndarray, observed: np.ndarray | None) -> np.ndarray:
    """sum over observed d of log N(r_d; 0, var_d) (the particle's weight), over the last axis.

    resid (..., D); var (..., G) with G = 1 (one variance for the row, summed as
    n log(2 pi var) + sum r^2 / var) or G = D, broadcasting with resid; observed (D,) bool or None
    (all observed). Returns the broadcast leading shape.
    """
    sq = resid ** 2 if observed is None else np.where(observed, resid ** 2, 0.0)
    if var.shape[-1] == 1:
        n_obs = resid.shape[-1] if observed is None else np.count_nonzero(observed)
        return -0.5 * (n_obs * np.log(2.0 * np.pi * var[..., 0]) + sq.sum(axis=-1) / var[..., 0])
    log_dens = np.log(2.0 * np.pi * var) + sq / var
    return -0.5 * (log_dens if observed is None else np.where(observed, log_dens, 0.0)).sum(axis=-1)


def log_sum_exp(a: np.ndarray) -> np.ndarray:
    """log sum exp over the first axis, stably (a short leading axis reduces fast in NumPy)."""
    top = a.max(axis=0)
    return top + np.log(np.exp(a - top).sum(axis=0))


def feature_alone_log_density(x: np.ndarray, M: np.ndarray, S: np.ndarray, var: np.ndarray,
                              observed: np.ndarray | None) -> np.ndarray:
    """log N(x; M_k, (var_j + S_kk) I) over the observed entries, for every particle and feature alone.

    x (D,), M (L, K, D), S (L, G, K, K) (``lg_particles``), var (J,) extra variances;
    returns (J, L, K). With G = 1 every entry is observed (``kalman_row_update`` checks), and
    |x - M_k|^2 = x.x - 2 M_k.x + M_k.M_k avoids (L, K, D) temporaries.
    """
    diag = np.diagonal(S, axis1=2, axis2=3)                                         # (L, G, K)
    if S.shape[1] == 1:
        v = var[:, None, None] + diag[:, 0]                                         # (J, L, K)
        sq = (x @ x) - 2.0 * (M @ x) + np.einsum("lkd,lkd->lk", M, M)
        return -0.5 * (x.size * np.log(2.0 * np.pi * v) + sq / v)
    return row_log_density(x - M, var[:, None, None, None] + diag.transpose(0, 2, 1), observed)


def prior_proposal(block: LGParticles, x: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                   rng: np.random.Generator, observed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """z_i from the IBP conditional (paper 001 Alg. 1); the log-ratio is 0 (module docstring)."""
    z, k_new = sample_ibp_conditional(block.m, block.n_rows + 1, alpha, rng)
    return z, k_new, np.zeros(block.n_particles)


def guided_proposal(block: LGParticles, x: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                    rng: np.random.Generator, observed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Existing features independently from their conditional given x_i, the others off (module docstring).

    ``block`` carries the posterior of A of every particle: M (L, Kc, D) and S (L, G, Kc, Kc)
    (``lg_particles``). O(Kc J D) per particle, J = NEW_FEATURE_TERMS. Padding columns have
    m = 0, so they are never switched on and add 0 to the log-ratio.
    """
    i = block.n_rows + 1
    prior_on = block.m / i
    log_new = new_feature_log_prior(i, alpha, NEW_FEATURE_TERMS)                      # (J + 1,)
    var = sigma_x ** 2 + sigma_a ** 2 * np.arange(NEW_FEATURE_TERMS + 1)              # (J + 1,)
    log_f_off = log_sum_exp(row_log_density(x, var[:, None], observed) + log_new)     # log f(0)
    log_f_on = log_sum_exp(feature_alone_log_density(x, block.M, block.S, var, observed)
                           + log_new[:, None, None])                                   # log f(e_k), (L, Kc)
    with np.errstate(divide="ignore"):
        joint_on = np.log(prior_on) + log_f_on
    log_c = np.logaddexp(joint_on, np.log1p(-prior_on) + log_f_off)
    z = rng.random(prior_on.shape) < np.exp(joint_on - log_c)
    log_ratio = (log_c - np.where(z, log_f_on, log_f_off)).sum(axis=1)
    return z, rng.poisson(alpha / i, size=z.shape[0]).astype(np.int64), log_ratio


PROPOSALS: dict[str, Proposal] = {"prior": prior_proposal, "guided": guided_proposal}

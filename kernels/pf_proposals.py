"""Proposals for row i of Z in the collapsed linear-Gaussian particle filter (SPEC 3.3; paper 001 eqs. 3-5).

Every proposal returns, for a block of L particles with column counts m (L, Kc), the new row's
entries for the existing columns z (L, Kc) bool, the number of new features K_new (L,) and the
log-ratio log p(z_i | past) - log q(z_i) (L,) that the filter adds to the predictive
log-density p(x_i | z_i, past) to get the exact importance weight of eq. 5 with proposal q:

* ``"prior"``: q = the IBP conditional (paper 001 Alg. 1), as in the paper's Algorithm 2; the
  log-ratio is 0 and the weight is the predictive density (eq. 7);
* ``"guided"``: the existing features one at a time, k = 1..Kc, from
  q(z_ik | z_i,<k, x_i) = p(z_ik | m_k, i) f_k(z_i,<=k) / c_k, with f_k the collapsed predictive
  density of x_i given z_i,<=k and the later existing features off, averaged over the prior of the
  new features: f_k = sum_{j <= NEW_FEATURE_TERMS} Poisson(j; alpha / i) N(x_i; z M, (sigma_X^2 +
  z S z^T + j sigma_A^2) I), (M, S) the particle's posterior of A. Then K_new from the prior
  Poisson(alpha / i). As p(z_ik | m_k, i) / q(z_ik) = c_k / f_k(z_i,<=k) and the Poisson parts of
  p and q cancel, the log-ratio is sum_k (log c_k - log f_k(z_i,<=k)).

Averaging over K_new matters: with the new features off in f_k, "existing feature off, a new one
on" gets a tiny q but a large weight, and the weights are heavy-tailed (the filter's class
frequencies were off by 0.06 in total variation on a 3-row problem). Truncating the sum only
changes q, not the exactness of the weights. ``append_row`` writes the proposed row into a block
(the proposals only read it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from .ibp_prior import Block, new_feature_log_prior, new_feature_slots, sample_ibp_conditional
from .resampling import concatenate_blocks

if TYPE_CHECKING:
    from .pf_linear_gaussian import LGParticles

Proposal = Callable[["LGParticles", np.ndarray, float, float, float, np.random.Generator, np.ndarray | None],
                    tuple[np.ndarray, np.ndarray, np.ndarray]]
NEW_FEATURE_TERMS = 3   # K_new = 0..3 in the guided proposal's predictive (module docstring)


def row_log_density(resid: np.ndarray, var: np.ndarray, observed: np.ndarray | None) -> np.ndarray:
    """sum over observed d of log N(r_d; 0, var_d) (SPEC 3.3 weight), over the last axis.

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


def prior_proposal(block: LGParticles, x: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                   rng: np.random.Generator, observed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """z_i from the IBP conditional (paper 001 Alg. 1); the log-ratio is 0 (module docstring)."""
    z, k_new = sample_ibp_conditional(block.m, block.n_rows + 1, alpha, rng)
    return z, k_new, np.zeros(block.n_particles)


def guided_proposal(block: LGParticles, x: np.ndarray, alpha: float, sigma_x: float, sigma_a: float,
                    rng: np.random.Generator, observed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Existing features one at a time from their conditional given x_i (module docstring).

    ``block`` carries the posterior of A of every particle: M (L, Kc, D) and S (L, G, Kc, Kc)
    (``pf_linear_gaussian``). O(Kc (J D + G Kc)) per particle, J = NEW_FEATURE_TERMS. Padding
    columns have m = 0, so they are never switched on and add 0 to the log-ratio.
    """
    i = block.n_rows + 1
    n_particles, capacity = block.m.shape
    M, S = block.M, block.S
    with np.errstate(divide="ignore"):
        log_on = np.log(block.m / i)
    log_off = np.log1p(-block.m / i)
    log_new = new_feature_log_prior(i, alpha, NEW_FEATURE_TERMS)                     # (J + 1,)
    extra_var = (sigma_a ** 2 * np.arange(NEW_FEATURE_TERMS + 1))[:, None]          # (J + 1, 1)

    def log_predictive(resid: np.ndarray, var: np.ndarray) -> np.ndarray:
        """log f: the predictive of x_i averaged over K_new, per particle."""
        log_dens = row_log_density(resid[:, None, :], var[:, None, :] + extra_var, observed)
        return np.logaddexp.reduce(log_dens + log_new, axis=1)

    u = rng.random((n_particles, capacity))
    z = np.zeros((n_particles, capacity), bool)
    resid = np.broadcast_to(np.asarray(x, np.float64), (n_particles, M.shape[2]))   # x_i - z M
    var = np.full((n_particles, S.shape[1]), sigma_x ** 2)                          # sigma_X^2 + z S z^T
    Sz = np.zeros((n_particles, S.shape[1], capacity))                              # S z^T
    log_f = log_predictive(resid, var)
    log_ratio = np.zeros(n_particles)
    for k in range(capacity):
        resid_on = resid - M[:, k]
        var_on = var + 2.0 * Sz[:, :, k] + S[:, :, k, k]
        log_f_on = log_predictive(resid_on, var_on)
        joint_on = log_on[:, k] + log_f_on
        log_c = np.logaddexp(joint_on, log_off[:, k] + log_f)
        on = u[:, k] < np.exp(joint_on - log_c)
        z[:, k] = on
        log_f = np.where(on, log_f_on, log_f)
        log_ratio += log_c - log_f
        resid = np.where(on[:, None], resid_on, resid)
        var = np.where(on[:, None], var_on, var)
        Sz = Sz + on[:, None, None] * S[:, :, :, k]
    return z, rng.poisson(alpha / i, size=n_particles).astype(np.int64), log_ratio


PROPOSALS: dict[str, Proposal] = {"prior": prior_proposal, "guided": guided_proposal}


def append_row(block: Block, z: np.ndarray, k_new: np.ndarray) -> tuple[Block, tuple[np.ndarray, np.ndarray,
                                                                                           np.ndarray]]:
    """Block with row i = (z, K_new new features) appended (paper 001 Alg. 1 lines 9-13).

    The feature axes grow to the block-wide maximum K+ only when needed (zero padding by
    ``resampling.concatenate_blocks``). Z and m of the result are new arrays; the model's other
    arrays are the input's (padded copies if the axes grew), so a caller that writes into them
    copies them first. Returns the block and the new features' slots (``ibp_prior.new_feature_slots``).
    """
    i = block.n_rows + 1
    k_before = block.n_features
    need = int((k_before + k_new).max(initial=0))
    grown = concatenate_blocks([block], need) if need > block.m.shape[1] else \
        dataclasses.replace(block, Z=block.Z.copy())
    row = np.zeros(grown.m.shape, bool)
    row[:, :z.shape[1]] = z
    slots = new_feature_slots(k_before, k_new)
    row[slots[0], slots[1]] = True
    grown.Z[:, i - 1] = row
    return dataclasses.replace(grown, m=grown.m + row, n_rows=i), slots

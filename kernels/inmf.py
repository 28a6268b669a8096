"""INMF: Power-EP infinite nonnegative MF (paper 000, Sec. 3; docs/models/inmf.md).

Same model as IMF (``imf``) but a_kj ~ N(0, 1/eta_A) I(a_kj >= 0), i.e. the normalised density
p(a_kj | eta_A) = 2 N(a_kj | 0, 1/eta_A) on a_kj >= 0. The prior is approximated by one Gaussian
site per entry, site_kj(a) = exp(-tau_kj a^2 / 2 + rho_kj a), so q(a_j) has precision
diag(tau_:j) + E[eta_X] sum_{Omega_j} E[z z^T] and shift rho_:j + E[eta_X] sum_{Omega_j} x_ij nu_i
(always one covariance per column). Everything else (rows, q(pi), q(eta), the evidence's other
terms, K+ growth) is IMF's, reused from ``imf``.

Extra state in ``post``: ``tau``, ``rho`` (D, K) the sites' natural parameters and ``lns`` (D, K)
their log normalisers ln s_kj (chosen at each update so that the scaled site s * site and the exact
prior factor give the cavity the same mass).

EP evidence: IMF's VB terms (``kernels.imf``) with E ln p(A | eta_A) replaced by
E_q sum_kj ln site_kj(a_kj) + sum_kj ln s_kj. The sites are fitted at eta_A = E[eta_A]; q(eta_A)
keeps its IMF update (the truncated prior has the same eta_A-dependence, sqrt(eta_A) exp(-eta_A a^2/2),
with E[a^2] from q, which matches the tilted moments at an EP fixed point) and its -KL(q || prior)
term stays in the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import erfcx, log_ndtr

from . import imf
from .imf import Hyper, Post, Stats

LOG_2 = float(np.log(2.0))
SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
SITE_KEYS = ("m", "V", "tau", "rho", "lns")  # what an EP site update changes


@dataclass(frozen=True)
class InmfHyper(Hyper):
    """IMF hyper-parameters plus the EP schedule: ``damping`` d in (0, 1] of the site
    update and ``ep_sweeps`` passes over all sites per column update."""

    damping: float = 0.7
    ep_sweeps: int = 1


def truncnorm_moments(m_w: np.ndarray, v_w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, variance and ln Phi(z) of N(m_w, v_w) truncated to [0, inf) (the tilted distribution of an EP site update).

    z = m_w / sqrt(v_w), r = phi(z) / Phi(z), mean = m_w + sqrt(v_w) r, variance = v_w (1 - r (r + z)).
    r is exp(log phi(z) - log_ndtr(z)) written as sqrt(2/pi) / erfcx(-z / sqrt(2)): the same number,
    exact to rounding. For z << 0 the variance factor 1 - r (r + z) ~ 1/z^2 multiplies the relative
    error of r by about z^2, so through log_ndtr it is off by 2e-7 at z = -40 and negative by z = -1000;
    here the error is the cancellation alone (~1e-16 z^4: 3e-10 at z = -40). ``site_update`` refuses
    an update whose variance is still not positive (z below about -1e4).
    """
    sd = np.sqrt(v_w)
    z = m_w / sd
    r = SQRT_2_OVER_PI / erfcx(-z / np.sqrt(2.0))
    return m_w + sd * r, v_w * (1.0 - r * (r + z)), log_ndtr(z)


def log_gauss_site_mass(m_c: np.ndarray, v_c: np.ndarray, tau: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """ln int N(a; m_c, v_c) exp(-tau a^2 / 2 + rho a) da (needs 1/v_c + tau > 0)."""
    precision = 1.0 / v_c + tau
    shift = m_c / v_c + rho
    return 0.5 * (-np.log(v_c * precision) + shift * shift / precision - m_c * m_c / v_c)


def log_tilted_mass(m_c: np.ndarray, v_c: np.ndarray, eta_a: float, log_phi: np.ndarray) -> np.ndarray:
    """ln int N(a; m_c, v_c) 2 N(a; 0, 1/eta_A) I(a >= 0) da = ln 2 + ln N(m_c; 0, v_c + 1/eta_A) + ln Phi(z)."""
    variance = v_c + 1.0 / eta_a
    return LOG_2 - 0.5 * (imf.LOG_2PI + np.log(variance) + m_c * m_c / variance) + log_phi


def add_to_site(m: np.ndarray, v: np.ndarray, k: int, d_tau: np.ndarray, d_rho: np.ndarray) -> None:
    """q(a_j) after adding (d_tau_j, d_rho_j) to site (k, j) of every column j, written into ``m`` and ``v``:
    Sherman-Morrison, V' = V - g V_k V_k^T with g = d_tau / (1 + d_tau V_kk), m' = V' (P m + d_rho e_k),
    O(K^2) per column."""
    v_k = v[:, :, k].copy()
    gain = d_tau / (1.0 + d_tau * v_k[:, k])
    v -= (gain[:, None] * v_k)[:, :, None] * v_k[:, None, :]
    m -= (gain * m[:, k])[:, None] * v_k
    m += d_rho[:, None] * v[:, :, k]


def update_site(post: Post, k: int, eta_a: float, damping: float) -> None:
    """EP update of the sites (k, j) for all columns j at once (paper 000, eqs. (15)-(20), in marginal form),
    written into ``post``'s arrays (``site_update`` leaves its argument alone).

    1. cavity marginal N(m_c, v_c) of a_kj: q's marginal with the site divided out (rank-one downdate);
    2. tilted moments of N(a; m_c, v_c) N(a; 0, 1/eta_A) I(a >= 0) via ``truncnorm_moments``;
    3. new site tau = 1/s - 1/v_c, rho = mu/s - m_c/v_c, damped, with its log normaliser. An update is
       refused where the cavity is improper, the tilted variance is not positive (rounding, z below
       about -1e4) or it would make the precision of q(a_j) indefinite (1 + d_tau V_kk <= 0);
       q(a_j) follows by ``add_to_site``.
    """
    tau, rho = post["tau"][:, k], post["rho"][:, k]
    v_q = post["V"][:, k, k]
    prec_c = 1.0 / v_q - tau
    shift_c = post["m"][:, k] / v_q - rho
    cavity_ok = prec_c > 0.0
    v_c = 1.0 / np.where(cavity_ok, prec_c, 1.0)
    m_c = shift_c * v_c
    v_w = 1.0 / (1.0 / v_c + eta_a)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # refused entries only
        mu, s, log_phi = truncnorm_moments(v_w * shift_c, v_w)
        d_tau = damping * (1.0 / s - 1.0 / v_c - tau)
        d_rho = damping * (mu / s - m_c / v_c - rho)
        accept = (cavity_ok & (s > 0.0) & (1.0 + d_tau * v_q > 1e-12)
                  & np.isfinite(d_tau) & np.isfinite(d_rho))
        d_tau, d_rho = np.where(accept, d_tau, 0.0), np.where(accept, d_rho, 0.0)
        new_lns = (log_tilted_mass(m_c, v_c, eta_a, log_phi)
                   - log_gauss_site_mass(m_c, v_c, tau + d_tau, rho + d_rho))
    add_to_site(post["m"], post["V"], k, d_tau, d_rho)
    post["lns"][:, k] = np.where(accept, new_lns, post["lns"][:, k])
    tau += d_tau
    rho += d_rho


def site_update(post: Post, k: int, eta_a: float, damping: float) -> Post:
    """A copy of ``post`` with the sites (k, j) of every column j updated (``update_site``)."""
    out = {**post, **{key: post[key].copy() for key in SITE_KEYS}}
    update_site(out, k, eta_a, damping)
    return out


def update_a(stats: Stats, post: Post, hyper: InmfHyper) -> Post:
    """INMF q(A): the Gaussian from the likelihood messages and the current sites, then
    ``hyper.ep_sweeps`` EP passes over the sites k = 1..K+, vectorised over columns."""
    eta_x, _ = imf.gamma_means(post["ax"], post["bx"])
    eta_a, _ = imf.gamma_means(post["aa"], post["ba"])
    tau = post["tau"]
    prior_precision = tau[:, :, None] * np.eye(tau.shape[1])
    m, v = imf.gaussian_columns(prior_precision, post["rho"], stats, eta_x)
    post = {**post, "m": m, "V": v, **{key: post[key].copy() for key in ("tau", "rho", "lns")}}
    for _ in range(hyper.ep_sweeps):
        for k in range(tau.shape[1]):
            update_site(post, k, eta_a, hyper.damping)
    return post


def column_update(stats: Stats, hyper: InmfHyper, post: Post) -> Post:
    """INMF global step: IMF's ``column_update`` with the EP q(A) step (paper 000, Algorithm 1)."""
    return imf.column_update(stats, hyper, post, a_update=update_a)


def site_prior_a(stats: Stats, post: Post, hyper: InmfHyper) -> float:
    """E_q sum_kj ln(s_kj site_kj(a_kj)) = sum_kj [-tau_kj E[a_kj^2] / 2 + rho_kj m_jk + ln s_kj],
    the EP stand-in for E ln p(A | eta_A) (module docstring)."""
    second = np.diagonal(imf.second_moments(post), axis1=1, axis2=2)
    return float(np.sum(-0.5 * post["tau"] * second + post["rho"] * post["m"] + post["lns"]))


def evidence_terms(stats: Stats, post: Post, hyper: InmfHyper) -> dict[str, float]:
    """The named terms of the EP/VB free energy: IMF's with the site term as ``prior_a``."""
    return imf.evidence_terms(stats, post, hyper, prior_a=site_prior_a)


def evidence(stats: Stats, post: Post, hyper: InmfHyper) -> float:
    """The INMF evidence L(q; K+) used to choose K+: the sum of ``evidence_terms``."""
    return float(sum(evidence_terms(stats, post, hyper).values()))


def prior_sites(post: Post, n_features: int) -> dict[str, np.ndarray]:
    """Sites equal to the untruncated prior N(0, 1/E[eta_A]) for ``n_features`` features:
    tau = E[eta_A], rho = 0, ln s = ln sqrt(E[eta_A] / 2 pi) (their starting point)."""
    d = post["m"].shape[0]
    eta_a, _ = imf.gamma_means(post["aa"], post["ba"])
    return {"tau": np.full((d, n_features), eta_a), "rho": np.zeros((d, n_features)),
            "lns": np.full((d, n_features), 0.5 * (np.log(eta_a) - imf.LOG_2PI))}


def initial_post(stats: Stats, hyper: InmfHyper) -> Post:
    """IMF's K+ = 0 state with per-column covariances and no sites."""
    post = imf.initial_post(stats, hyper)
    d = post["m"].shape[0]
    return {**post, "V": np.zeros((d, 0, 0)), **prior_sites(post, 0)}


def add_feature(post: Post, hyper: InmfHyper) -> Post:
    """Append prior sites for a new feature before the first ``column_update`` at K+ + 1."""
    new = prior_sites(post, 1)
    return {**post, **{key: np.concatenate([post[key], new[key]], axis=1) for key in new}}


FEATURE_AXES: dict[str, tuple[int, ...]] = {**imf.FEATURE_AXES, "tau": (1,), "rho": (1,), "lns": (1,)}

INMF = imf.Model(column_update=column_update, evidence=evidence, initial_post=initial_post,
                 add_feature=add_feature, feature_axes=FEATURE_AXES)

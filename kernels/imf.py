"""IMF: variational infinite linear-Gaussian matrix factorisation (paper 000, Sec. 2; docs/models/imf.md).

Model: x_ij ~ N(z_i . a_j, 1/eta_X) for (i, j) in Omega, z_ik ~ Bern(pi_k) under the IBP
limit with the paper's equivalence classes, a_kj ~ N(0, 1/eta_A), eta_X ~ Gamma(ax0, bx0),
eta_A ~ Gamma(aa0, ba0) and alpha fixed or ~ Gamma(alpha_a0, alpha_b0) (shape, rate).

The kernels follow the engine's split (a local step per row chunk, then a small global update):

* ``row_step`` works on one row chunk given the broadcast column posteriors and returns the chunk's
  new q(z) and its statistics (``chunk_stats``), a dict of float64 arrays that add up elementwise
  over chunks;
* ``column_update`` turns the summed statistics into the global posteriors (a small update);
* ``evidence`` is L(q; K+) computed from the summed statistics and the globals only.

State ``post`` (a dict of float64 arrays, K = K+ active features, D columns):
``m`` (D, K) means of q(a_j); ``V`` (K, K) one covariance shared by all columns (no entry missing)
or (D, K, K) one per column; ``t1``, ``t2`` (K,) of q(pi_k) = Beta(t1, t2); ``ax``, ``bx`` and
``aa``, ``ba`` () shape and rate of q(eta_X) and q(eta_A); ``alpha_a``, ``alpha_b`` () of
q(alpha) when alpha is learned.

Statistics (``chunk_stats``): ``n_rows`` () rows, ``n_obs`` () observed entries, ``xx`` () sum of
x_ij^2 over Omega, ``xz`` (D, K) sum_{i in Omega_j} x_ij nu_i, ``zz`` (K, K) sum_i E[z_i z_i^T]
when the chunk has no mask or (D, K, K) sum_{i in Omega_j} E[z_i z_i^T] when it has one,
``sum_nu`` (K,) sum_i nu_ik, ``entropy_z`` () the entropy of the chunk's q(Z). Either every chunk
has a mask (all True where nothing is missing) or none has, so that the ``zz`` shapes agree.

Choosing K+ (docs/models/imf.md) uses chunk-local pieces plus small client steps: ``residual`` per chunk, its
sums R^T R and sum_i r_i reduced, ``residual_directions`` on the client, projections p = R v per
chunk, ``orient_and_split`` on the gathered p (one float per row), ``new_feature_column`` per chunk;
``keep_features`` / ``select_features`` prune features whose reduced sum_i nu_ik is too small. The restart
at a new K+, which separates features that the residual directions mix, is ``gram_sums`` of the data
reduced, ``whitening`` on the client, ``ica_moments`` per chunk reduced and ``fastica`` on the client,
``binary_sources`` on the gathered sources.
``swap_rows`` (in ``row_step`` with ``swaps``) exchanges two features' q(z) in a row where that raises L.
Row and column offsets (an extension of the paper's model, ``remove_offsets``) are fitted the same
way: ``row_offsets`` per chunk, ``column_offset_stats`` reduced, ``column_offsets`` on the client.
The K+ search that composes them is the engine's driver (``pipeline.models.imf``), the same in
process and on a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy.special import digamma, expit, gammaln, xlogy

from .bnmf import gamma_kl_terms
from .ibp_prior import harmonic_number

Stats = dict[str, np.ndarray]
Post = dict[str, np.ndarray]

LOG_2PI = float(np.log(2.0 * np.pi))

ICA_STEPS = 200  # most FastICA steps of a restart (it converges in a few on planted features)
ICA_TOL = 1e-8  # FastICA has converged when every unmixing row moves by at most this (1 - |w_new . w_old|)
ICA_RANK_TOL = 1e-10
"""``ica_step`` gives up when the smallest eigenvalue of W W^T is below this fraction of the largest: the rows
of W are then linearly dependent to rounding, and its inverse square root would amplify rounding noise."""

LOGIT_BOUND = 345.0
"""Bound on |logit nu_ik| in the q(z) update: every nu_ik lies in [expit(-345), 1], expit(-345) =
1.5e-150.

A fit drives q(z) to saturation: unbounded, the smallest nu_ik fall to 1e-309 and the products nu_ir nu_ik
that ``chunk_stats`` forms (E[z_i z_i^T]) become subnormal floats, which the CPU handles many times slower
than normal ones (measured: the row step ran 2.2x slower). With the bound, a
product of two nu_ik is at least 2.2e-300, a normal float (the smallest is 2.2e-308). The bound is far below
anything float64 resolves in a sum or in L: in each nu_ik, L is nu_ik logit_ik + H(nu_ik) + const, so
holding nu_ik at the bound instead of expit(logit_ik) lowers L by less than 1.5e-150 |logit_ik|, against
the rounding of L (1e-16 |L|); its entropy term, xlogy(nu, nu) = -5e-148, is as negligible. The upper end
needs no care: expit(345) rounds to 1, as expit(logit) does from logit 37 on, 1 - nu_ik is then 0 (xlogy
gives 0) or at least 1.1e-16, never subnormal.
"""


@dataclass(frozen=True)
class Hyper:
    """Hyper-parameters of IMF: Gamma priors as (shape, rate), alpha fixed or learned.

    ``alpha=None`` gives alpha the Gamma(alpha_a0, alpha_b0) hyperprior and a variational q(alpha).
    """

    ax0: float = 1.0
    bx0: float = 1.0
    aa0: float = 1.0
    ba0: float = 1.0
    alpha: float | None = 1.0
    alpha_a0: float = 1.0
    alpha_b0: float = 1.0


# ----------------------------------------------------------------------------- expectations


def beta_log_means(t1: np.ndarray, t2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E ln pi and E ln(1 - pi) under Beta(t1, t2), as in q(pi_k)."""
    total = digamma(t1 + t2)
    return digamma(t1) - total, digamma(t2) - total


def gamma_means(shape: np.ndarray, rate: np.ndarray) -> tuple[float, float]:
    """E[eta] and E[ln eta] under Gamma(shape, rate) (for q(eta_X) and q(eta_A))."""
    return float(shape / rate), float(digamma(shape) - np.log(rate))


def second_moments(post: Post) -> np.ndarray:
    """Lambda^j = V_j + m_j m_j^T for every column, shape (D, K, K)."""
    m = post["m"]
    return post["V"] + m[:, :, None] * m[:, None, :]


def column_total(a: np.ndarray, n_columns: int) -> np.ndarray:
    """sum_j A_j of a per-column (D, K, K) array, or D * A for one shared (K, K) array."""
    return a.sum(axis=0) if a.ndim == 3 else n_columns * a


def lambda_total(post: Post) -> np.ndarray:
    """sum_j Lambda^j (K, K) without forming the per-column array."""
    m = post["m"]
    return column_total(post["V"], m.shape[0]) + m.T @ m


# ----------------------------------------------------------------------------- row step


def row_terms(x: np.ndarray, mask: np.ndarray | None, post: Post) -> tuple[np.ndarray, np.ndarray]:
    """Per-row pieces of the q(z) logit (paper 000, eq. (8)): b_ik = sum_{j in Omega_i} x_ij m_jk and
    G_i = sum_{j in Omega_i} Lambda^j, one shared (K, K) G when the chunk has no mask, else (n, K, K).
    """
    m = post["m"]
    if mask is None:
        return x @ m, lambda_total(post)
    k = m.shape[1]
    observed = mask.astype(np.float64)
    g = observed @ second_moments(post).reshape(m.shape[0], k * k)
    return np.where(mask, x, 0.0) @ m, g.reshape(x.shape[0], k, k)


def sweep_rows(nu: np.ndarray, b: np.ndarray, g: np.ndarray, prior_logit: np.ndarray,
               eta_x: float) -> np.ndarray:
    """One coordinate-ascent sweep over k of q(z_ik), vectorised over rows (the logit of paper 000, eq. (8)):
    logit nu_ik = E ln pi_k - E ln(1-pi_k) - (E eta_X / 2)(G_kk - 2 b_ik + 2 sum_{r != k} nu_ir G_rk),
    clipped to +-``LOGIT_BOUND`` so that no product of two nu_ik is a subnormal float.
    """
    nu = nu.copy()
    for k in range(nu.shape[1]):
        g_k = g[..., :, k]
        cross = np.sum(nu * g_k, axis=-1) - nu[:, k] * g_k[..., k]
        logit = prior_logit[k] - 0.5 * eta_x * (g_k[..., k] - 2.0 * b[:, k] + 2.0 * cross)
        nu[:, k] = expit(np.clip(logit, -LOGIT_BOUND, LOGIT_BOUND))
    return nu


def swap_gains(nu: np.ndarray, b: np.ndarray, g: np.ndarray, prior_logit: np.ndarray, eta_x: float) -> np.ndarray:
    """(n, K, K): entry [i, k, l] is the change of L from exchanging nu_ik and nu_il (row i's terms of L; the
    entropy of q(z_i) is unchanged). L's part of row i is nu_i . (logit + eta_X b_i) - (eta_X / 2)(nu_i G nu_i^T
    + sum_r G_rr (nu_ir - nu_ir^2)); the exchange adds e = delta (e_k - e_l), delta = nu_il - nu_ik. With G
    symmetric the change collects into delta (c_k - c_l + eta_X delta G_kl), where
    c_k = logit_k + eta_X (b_ik - (G nu_i)_k - G_kk (1 - 2 nu_ik) / 2) is the same for every pair."""
    g_nu = nu @ g if g.ndim == 2 else np.einsum("nr,nrk->nk", nu, g)
    diag = np.diagonal(g, axis1=-2, axis2=-1)
    c = prior_logit + eta_x * (b - g_nu - 0.5 * diag * (1.0 - 2.0 * nu))
    delta = nu[:, None, :] - nu[:, :, None]
    g_kl = g if g.ndim == 3 else g[None, :, :]
    return delta * (c[:, :, None] - c[:, None, :] + eta_x * delta * g_kl)


def swap_rows(nu: np.ndarray, b: np.ndarray, g: np.ndarray, prior_logit: np.ndarray, eta_x: float,
              min_gain: float = 1e-6) -> np.ndarray:
    """In every row, the exchange of two features' q(z) values that raises L most (``swap_gains``), where it
    raises it by more than ``min_gain`` nats. Coordinate ascent changes one nu_ik at a time; with similar
    features (nonnegative bases are) a row that holds the wrong one of two is a fixed point of it, one flip
    either way costing more than the exchange gains."""
    n, n_features = nu.shape
    if n_features < 2:
        return nu
    gains = swap_gains(nu, b, g, prior_logit, eta_x).reshape(n, n_features * n_features)
    best = np.argmax(gains, axis=1)
    rows = np.flatnonzero(gains[np.arange(n), best] > min_gain)
    k, l = np.divmod(best[rows], n_features)
    out = nu.copy()
    out[rows, k], out[rows, l] = nu[rows, l], nu[rows, k]
    return out


def chunk_stats(x: np.ndarray, mask: np.ndarray | None, nu: np.ndarray) -> Stats:
    """The chunk's additive sufficient statistics for q(A), q(pi), q(eta_X) and L.

    E[z_i z_i^T] has nu_ir nu_ik off the diagonal and nu_ik on it. Keys and shapes: module docstring.
    """
    n, k = nu.shape
    variance = nu - nu * nu
    if mask is None:
        xo, n_obs = x, x.size
        zz = nu.T @ nu + np.diag(variance.sum(axis=0))
    else:
        observed = mask.astype(np.float64)
        xo, n_obs = np.where(mask, x, 0.0), observed.sum()
        outer = (nu[:, :, None] * nu[:, None, :]).reshape(n, k * k)
        zz = (observed.T @ outer).reshape(x.shape[1], k, k)
        diag = np.arange(k)
        zz[:, diag, diag] += observed.T @ variance
    entropy = -np.sum(xlogy(nu, nu) + xlogy(1.0 - nu, 1.0 - nu))
    return {
        "n_rows": np.float64(n),
        "n_obs": np.float64(n_obs),
        "xx": np.float64(np.sum(xo * xo)),
        "xz": xo.T @ nu,
        "zz": zz,
        "sum_nu": nu.sum(axis=0),
        "entropy_z": np.float64(entropy),
    }


def row_step(x: np.ndarray, mask: np.ndarray | None, nu: np.ndarray, post: Post,
             n_sweeps: int = 1, prior_logit: np.ndarray | None = None, swaps: bool = False) -> tuple[np.ndarray, Stats]:
    """Update q(z_i) of every row of a chunk given the column posteriors (paper 000, eq. (8)),
    then return the new nu (n, K) and the chunk's statistics (``chunk_stats``). With ``swaps``, each row
    first takes its best exchange of two features (``swap_rows``), which coordinate ascent cannot make.

    ``prior_logit`` (K,) is E ln pi_k - E ln(1 - pi_k); None takes it from q(pi_k) = Beta(t1, t2) (IMF, VFMF),
    a model whose E ln(1 - pi_k) has no closed form passes its own (TVIMF, docs/models/comparators.md).
    """
    b, g = row_terms(x, mask, post)
    if prior_logit is None:
        log_pi, log_1mpi = beta_log_means(post["t1"], post["t2"])
        prior_logit = log_pi - log_1mpi
    eta_x, _ = gamma_means(post["ax"], post["bx"])
    if swaps:
        nu = swap_rows(nu, b, g, prior_logit, eta_x)
    for _ in range(n_sweeps):
        nu = sweep_rows(nu, b, g, prior_logit, eta_x)
    return nu, chunk_stats(x, mask, nu)


def fit_rows(x: np.ndarray, mask: np.ndarray | None, post: Post, tol: float = 1e-8,
             max_sweeps: int = 500) -> np.ndarray:
    """q(z_i) of rows not in the fit, with the column posteriors fixed (``row_step``'s update).

    Starts every nu_ik at E[pi_k] and repeats the coordinate-ascent sweep (``sweep_rows``) until no
    nu_ik moves by more than ``tol`` (or ``max_sweeps`` sweeps): a fixed point of paper eq. 8 for each
    row. Returns nu (n, K).
    """
    b, g = row_terms(x, mask, post)
    log_pi, log_1mpi = beta_log_means(post["t1"], post["t2"])
    eta_x, _ = gamma_means(post["ax"], post["bx"])
    nu = np.broadcast_to(post["t1"] / (post["t1"] + post["t2"]), (x.shape[0], post["m"].shape[1])).copy()
    for _ in range(max_sweeps):
        new = sweep_rows(nu, b, g, log_pi - log_1mpi, eta_x)
        moved = np.max(np.abs(new - nu), initial=0.0)
        nu = new
        if moved <= tol:
            break
    return nu


# ----------------------------------------------------------------------------- column update


def update_pi(stats: Stats, post: Post, hyper: Hyper) -> Post:
    """q(pi_k) = Beta(sum_i nu_ik, N - sum_i nu_ik + 1) (paper 000, eq. (7))."""
    return {**post, "t1": stats["sum_nu"].copy(), "t2": stats["n_rows"] - stats["sum_nu"] + 1.0}


def gaussian_columns(prior_precision: np.ndarray, prior_shift: np.ndarray | float, stats: Stats,
                     eta_x: float) -> tuple[np.ndarray, np.ndarray]:
    """q(a_j) = N(m_j, V_j) with precision P_j = prior_precision_j + E[eta_X] sum_{Omega_j} E[z z^T]
    and m_j = V_j (prior_shift_j + E[eta_X] sum_{Omega_j} x_ij nu_i) (IMF's q(a_j) and INMF's).

    Shapes broadcast: a (K, K) precision gives one shared V, a (D, K, K) one gives one per column.
    """
    precision = prior_precision + eta_x * stats["zz"]
    v = np.linalg.inv(precision)
    v = 0.5 * (v + np.swapaxes(v, -1, -2))
    shift = prior_shift + eta_x * stats["xz"]
    m = shift @ v if v.ndim == 2 else np.einsum("dkl,dl->dk", v, shift)
    return m, v


def update_a(stats: Stats, post: Post, hyper: Hyper) -> Post:
    """IMF q(a_j) with the Gaussian prior N(0, I / E[eta_A]) (paper 000, eqs. (9)-(11))."""
    eta_a, _ = gamma_means(post["aa"], post["ba"])
    k = stats["sum_nu"].shape[0]
    m, v = gaussian_columns(eta_a * np.eye(k), 0.0, stats, gamma_means(post["ax"], post["bx"])[0])
    return {**post, "m": m, "V": v}


def zz_dot_lambda(zz: np.ndarray, post: Post) -> float:
    """sum_j sum_{r,k} (sum_{i in Omega_j} E[z_ir z_ik]) Lambda^j_rk for shared or per-column zz, V."""
    m, v = post["m"], post["V"]
    if v.ndim == 2:
        covariance = np.sum(column_total(zz, m.shape[0]) * v)
    else:
        covariance = np.sum(zz * v) if zz.ndim == 3 else np.sum(zz * v.sum(axis=0))
    mean = np.sum((m @ zz) * m) if zz.ndim == 2 else np.einsum("dk,dkl,dl->", m, zz, m)
    return float(covariance + mean)


def expected_sq_error(stats: Stats, post: Post) -> float:
    """sum_Omega E[(x_ij - z_i a_j)^2] = sum x^2 - 2 x nu_i.m_j + sum_rk E[z_ir z_ik] Lambda^j_rk
    (this keeps Var(z), which paper 000's eta_X update, with E[z] E[a a^T] E[z]^T, drops)."""
    return float(stats["xx"] - 2.0 * np.sum(stats["xz"] * post["m"]) + zz_dot_lambda(stats["zz"], post))


def update_eta_x(stats: Stats, post: Post, hyper: Hyper) -> Post:
    """q(eta_X) = Gamma(ax0 + |Omega|/2, bx0 + sum_Omega E[(x - z a)^2] / 2)."""
    return {**post, "ax": np.float64(hyper.ax0 + 0.5 * stats["n_obs"]),
            "bx": np.float64(hyper.bx0 + 0.5 * expected_sq_error(stats, post))}


def update_eta_a(stats: Stats, post: Post, hyper: Hyper) -> Post:
    """q(eta_A) = Gamma(aa0 + K+ D / 2, ba0 + sum_j trace(Lambda^j) / 2)."""
    d, k = post["m"].shape
    return {**post, "aa": np.float64(hyper.aa0 + 0.5 * k * d),
            "ba": np.float64(hyper.ba0 + 0.5 * np.trace(lambda_total(post)))}


def update_alpha(stats: Stats, post: Post, hyper: Hyper) -> Post:
    """q(alpha) = Gamma(alpha_a0 + K+, alpha_b0 + H_N) when alpha is learned (alpha enters L
    only through K+ ln alpha - alpha H_N); a fixed alpha leaves ``post`` unchanged."""
    if hyper.alpha is not None:
        return post
    return {**post, "alpha_a": np.float64(hyper.alpha_a0 + post["m"].shape[1]),
            "alpha_b": np.float64(hyper.alpha_b0 + harmonic_number(int(stats["n_rows"])))}


ColumnStep = Callable[[Stats, Post, Hyper], Post]


def column_update(stats: Stats, hyper: Hyper, post: Post, a_update: ColumnStep = update_a) -> Post:
    """The global step (paper 000, Algorithm 1): q(pi), q(A), q(eta_X), q(eta_A), q(alpha) in
    turn from the summed statistics, each a coordinate-ascent step on L. ``post`` supplies the current
    q(eta) for the q(A) step; ``a_update`` is the q(A) step (IMF here, EP for INMF)."""
    for step in (update_pi, a_update, update_eta_x, update_eta_a, update_alpha):
        post = step(stats, post, hyper)
    return post


# ----------------------------------------------------------------------------- evidence


def expected_log_lik(stats: Stats, post: Post) -> float:
    """E_q ln p(X | Z, A, eta_X) over Omega (paper appendix T1, with q(eta_X))."""
    eta_x, log_eta_x = gamma_means(post["ax"], post["bx"])
    return float(0.5 * stats["n_obs"] * (log_eta_x - LOG_2PI) - 0.5 * eta_x * expected_sq_error(stats, post))


def gaussian_prior_a(stats: Stats, post: Post, hyper: Hyper) -> float:
    """E_q ln p(A+ | eta_A) for a_kj ~ N(0, 1/eta_A) (paper appendix T2, with q(eta_A))."""
    d, k = post["m"].shape
    eta_a, log_eta_a = gamma_means(post["aa"], post["ba"])
    return float(0.5 * k * d * (log_eta_a - LOG_2PI) - 0.5 * eta_a * np.trace(lambda_total(post)))


def ibp_terms(stats: Stats, post: Post, hyper: Hyper) -> float:
    """E_q ln of the IBP equivalence-class prior of (Z+, pi+) (paper 000, eqs. (5)-(6) and appendix term T3).

    Finite form used (K -> infinity limit of C_K^{K+} prod_k p(z_k, pi_k) prod p(z_k = 0)):
    ln p(Z+, pi+ | alpha) = sum_{k<=K+} [ (m_k - 1) ln pi_k + (N - m_k) ln(1 - pi_k) + ln(alpha / k) ]
    - alpha H_N, with m_k = sum_i z_ik; the pi_k^{-1} factor is the Beta(alpha/K, 1) limit and is
    left unnormalised. The alpha-dependent part is in ``alpha_terms``.
    """
    log_pi, log_1mpi = beta_log_means(post["t1"], post["t2"])
    m_k = stats["sum_nu"]
    return float(np.sum((m_k - 1.0) * log_pi + (stats["n_rows"] - m_k) * log_1mpi))


def alpha_terms(stats: Stats, post: Post, hyper: Hyper) -> float:
    """sum_{k<=K+} ln(alpha / k) - alpha H_N, under q(alpha) with -KL(q(alpha) || p(alpha)) when alpha
    is learned (for a fixed alpha: K+ ln alpha - ln K+! - alpha H_N)."""
    k = post["m"].shape[1]
    h_n = harmonic_number(int(stats["n_rows"]))
    if hyper.alpha is not None:
        return float(k * np.log(hyper.alpha) - gammaln(k + 1.0) - hyper.alpha * h_n)
    mean, log_mean = gamma_means(post["alpha_a"], post["alpha_b"])
    kl = float(gamma_kl_terms(post["alpha_a"], post["alpha_b"], hyper.alpha_a0, hyper.alpha_b0))
    return float(k * log_mean - gammaln(k + 1.0) - mean * h_n + kl)


def beta_entropy(t1: np.ndarray, t2: np.ndarray) -> float:
    """sum_k of the entropy of q(pi_k) = Beta(t1_k, t2_k) (paper appendix H3)."""
    log_b = gammaln(t1) + gammaln(t2) - gammaln(t1 + t2)
    return float(np.sum(log_b - (t1 - 1.0) * digamma(t1) - (t2 - 1.0) * digamma(t2)
                        + (t1 + t2 - 2.0) * digamma(t1 + t2)))


def gaussian_entropy(post: Post) -> float:
    """sum_j entropy of q(a_j) = N(m_j, V_j) (paper appendix H1)."""
    d, k = post["m"].shape
    _, logdet = np.linalg.slogdet(post["V"])
    total_logdet = np.sum(logdet) if post["V"].ndim == 3 else d * logdet
    return float(0.5 * total_logdet + 0.5 * d * k * (1.0 + LOG_2PI))


PriorTerm = Callable[[Stats, Post, Hyper], float]


def evidence_terms(stats: Stats, post: Post, hyper: Hyper,
                   prior_a: PriorTerm = gaussian_prior_a) -> dict[str, float]:
    """The named terms of L(q; K+) (paper 000, appendix A, with the terms it leaves out added). Only
    ``stats`` depends on the rows, so L is exact at any point of the alternation; ``prior_a`` is the E ln p(A) term
    (the Gaussian prior here, the EP sites for INMF)."""
    return {
        "loglik": expected_log_lik(stats, post),
        "prior_a": prior_a(stats, post, hyper),
        "ibp": ibp_terms(stats, post, hyper),
        "alpha": alpha_terms(stats, post, hyper),
        "entropy_z": float(stats["entropy_z"]),
        "entropy_pi": beta_entropy(post["t1"], post["t2"]),
        "entropy_a": gaussian_entropy(post),
        "eta_x": float(gamma_kl_terms(post["ax"], post["bx"], hyper.ax0, hyper.bx0)),
        "eta_a": float(gamma_kl_terms(post["aa"], post["ba"], hyper.aa0, hyper.ba0)),
    }


def evidence(stats: Stats, post: Post, hyper: Hyper) -> float:
    """L(q; K+) of IMF: the sum of ``evidence_terms``."""
    return float(sum(evidence_terms(stats, post, hyper).values()))


# ----------------------------------------------------------------------------- K+ growth and pruning


def observed(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """X on the observed entries, 0 where missing."""
    return x if mask is None else np.where(mask, x, 0.0)


def residual(x: np.ndarray, mask: np.ndarray | None, nu: np.ndarray, m: np.ndarray) -> np.ndarray:
    """R = X - E[Z] E[A] on the observed entries, 0 where missing: where the K+ search starts a new feature."""
    r = x - nu @ m.T
    return r if mask is None else np.where(mask, r, 0.0)


def gram_sums(r: np.ndarray) -> Stats:
    """A chunk's sums of R^T R (``gram``), sum_i r_i (``col_sum``) and its row count (``n_rows``)."""
    return {"gram": r.T @ r, "col_sum": r.sum(axis=0), "n_rows": np.float64(r.shape[0])}


def residual_directions(gram: np.ndarray, col_sum: np.ndarray, n_rows: float, count: int) -> np.ndarray:
    """The ``count`` leading eigenvectors (D, count), largest first, of the residual's covariance
    R^T R - s s^T / N built from chunk sums of R^T R and s = sum_i r_i (a new feature starts
    from a leading singular direction of the residual; centring keeps features that co-occur apart)."""
    _, vectors = np.linalg.eigh(gram - np.outer(col_sum, col_sum) / n_rows)
    return vectors[:, ::-1][:, :count]


def orient_and_split(p: np.ndarray, n_iter: int = 20) -> tuple[float, float]:
    """Sign and threshold that turn the projections p_i = r_i . v into a binary feature.

    p_i is about z_i c for the new feature's z_i in {0, 1}: the sign makes c > 0 (mean of p), the
    threshold is the 1-D two-means split of sign * p.
    """
    sign = 1.0 if p.sum() >= 0.0 else -1.0
    return sign, two_means_threshold(sign * p, n_iter)


def two_means_threshold(q: np.ndarray, n_iter: int = 20) -> float:
    """The 1-D two-means split of q: from the midrange, the midpoint of the two sides' means, repeated."""
    threshold = 0.5 * (q.min() + q.max())
    for _ in range(n_iter):
        high, low = q[q > threshold], q[q <= threshold]
        if high.size == 0 or low.size == 0:
            break
        threshold = 0.5 * (high.mean() + low.mean())
    return float(threshold)


def new_feature_column(p: np.ndarray, sign: float, threshold: float, soft: float = 0.1) -> np.ndarray:
    """q(z_i,new) initialised from the residual projection: 1 - soft above the split, soft below."""
    return np.where(sign * p > threshold, 1.0 - soft, soft)


def keep_features(sum_nu: np.ndarray, threshold: float) -> np.ndarray:
    """Boolean (K,) of features to keep: sum_i nu_ik at or above the pruning threshold."""
    return sum_nu >= threshold


FEATURE_AXES: dict[str, tuple[int, ...]] = {"m": (1,), "V": (-2, -1), "t1": (0,), "t2": (0,)}


def select_features(post: Post, keep: np.ndarray, axes: dict[str, tuple[int, ...]] = FEATURE_AXES) -> Post:
    """``post`` restricted to the kept features along each per-feature axis (pruning)."""
    out = dict(post)
    for key, key_axes in axes.items():
        for axis in key_axes:
            out[key] = np.compress(keep, out[key], axis=axis)
    return out


# ----------------------------------------------------------------------------- offsets (extension)


def row_offsets(x: np.ndarray, mask: np.ndarray | None, col_offsets: np.ndarray, reg: float) -> np.ndarray:
    """b_i = sum_{j in Omega_i} (x_ij - c_j) / (|Omega_i| + reg): the ridge (MAP) row offsets given the
    column offsets c (an extension of paper 000's model, see ``remove_offsets``); 0 for a row with nothing observed."""
    observed = np.ones(x.shape, dtype=bool) if mask is None else mask
    resid = np.where(observed, x - col_offsets[None, :], 0.0)
    return resid.sum(axis=1) / (observed.sum(axis=1) + reg)


def column_offset_stats(x: np.ndarray, mask: np.ndarray | None, row_offsets: np.ndarray) -> Stats:
    """A chunk's additive sums for the column offsets: ``col_resid`` (D,) sum_{i in Omega_j} (x_ij - b_i)
    and ``col_count`` (D,) |Omega_j| over the chunk's rows."""
    observed = np.ones(x.shape, dtype=bool) if mask is None else mask
    resid = np.where(observed, x - row_offsets[:, None], 0.0)
    return {"col_resid": resid.sum(axis=0), "col_count": observed.sum(axis=0).astype(np.float64)}


def column_offsets(stats: Stats, mean: float, reg: float) -> np.ndarray:
    """c_j = mean + sum_{i in Omega_j} (x_ij - b_i - mean) / (|Omega_j| + reg) from the reduced
    ``column_offset_stats``: ridge (MAP) column offsets around the observed ``mean`` given the row offsets."""
    return mean + (stats["col_resid"] - mean * stats["col_count"]) / (stats["col_count"] + reg)


def remove_offsets(x: np.ndarray, mask: np.ndarray | None, row_off: np.ndarray,
                   col_off: np.ndarray) -> np.ndarray:
    """x_ij - b_i - c_j on the observed entries, 0 where missing.

    Extension of the paper's model (not in paper 000): x_ij ~ N(b_i + c_j + z_i . a_j, 1/eta_X)
    with row and column offsets fitted first, as MAP estimates under Gaussian priors (alternating
    ``row_offsets`` and ``column_offsets``), and held fixed while IMF/INMF fits the centred data. Binary
    data with rows of very different density (role mining) are ranked by these offsets where z_i . a_j
    cannot tell entries apart, e.g. in rows with no observed one.
    """
    centred = x - row_off[:, None] - col_off[None, :]
    return centred if mask is None else np.where(mask, centred, 0.0)


# ----------------------------------------------------------------------------- model pieces


def initial_post(stats: Stats, hyper: Hyper) -> Post:
    """The K+ = 0 state: no features, q(eta_A) at its prior, q(eta_X) fitted to X alone.

    ``stats`` are those of an (N, 0) nu; V is (D, 0, 0) when they are per-column (a mask exists).
    """
    d = stats["xz"].shape[0]
    shared = stats["zz"].ndim == 2
    empty = {"m": np.zeros((d, 0)), "V": np.zeros((0, 0) if shared else (d, 0, 0)),
             "t1": np.zeros(0), "t2": np.zeros(0), "aa": np.float64(hyper.aa0), "ba": np.float64(hyper.ba0)}
    return update_alpha(stats, update_eta_x(stats, empty, hyper), hyper)


def keep_post(post: Post, hyper: Hyper) -> Post:
    """IMF adds no per-feature state before ``column_update`` when K+ grows: ``post`` as it is."""
    return post


@dataclass(frozen=True)
class Model:
    """The model-specific pieces of the alternation, so one driver serves IMF and INMF."""

    column_update: Callable[[Stats, Hyper, Post], Post] = column_update
    evidence: Callable[[Stats, Post, Hyper], float] = evidence
    initial_post: Callable[[Stats, Hyper], Post] = initial_post
    add_feature: Callable[[Post, Hyper], Post] = keep_post
    feature_axes: dict[str, tuple[int, ...]] = field(default_factory=FEATURE_AXES.copy)


IMF = Model()


# ----------------------------------------------------------------------------- restart by ICA


def whitening(sums: Stats, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and whitening map (D, count) of the rows from their reduced ``gram_sums``: the ``count``
    leading principal directions of the covariance, each divided by its standard deviation, so that
    (x_i - mean) @ map has identity covariance (zero variances are floored)."""
    n = float(sums["n_rows"])
    mean = sums["col_sum"] / n
    values, vectors = np.linalg.eigh(sums["gram"] / n - np.outer(mean, mean))
    values, vectors = values[::-1][:count], vectors[:, ::-1][:, :count]
    return mean, vectors / np.sqrt(np.maximum(values, 1e-12 * max(values[0], 1e-300)))


def ica_moments(white: np.ndarray) -> Stats:
    """A chunk's moment sums of whitened rows x_i (N x K): ``first`` (K,) sum_i x_i and ``third`` (K, K, K)
    sum_i x_i (x) x_i (x) x_i. With the skewness contrast every FastICA step is a function of these
    (``ica_step``), so the whole iteration runs on the client after one reduction (``fastica``). Memory: one
    N x K product at a time."""
    k = white.shape[1]
    third = np.empty((k, k, k))
    for a in range(k):
        third[a] = (white * white[:, a:a + 1]).T @ white
    return {"first": white.sum(axis=0), "third": third}


def ica_step(moments: Stats, unmixing: np.ndarray, n_rows: float) -> np.ndarray | None:
    """The symmetric FastICA fixed point w_k <- E[x g(y_k)] - E[g'(y_k)] w_k with g(u) = u^2 and sources
    y_k = w_k . x, followed by W <- (W W^T)^(-1/2) W; None when the updated rows are (numerically) linearly
    dependent, so that (W W^T)^(-1/2) does not exist: the contrast has no fixed point from here.

    From the moments (``ica_moments``): sum_i y_ik^2 x_i = T(w_k, w_k, .) and sum_i y_ik = w_k . sum_i x_i.
    Binary sources z_ik ~ Bern(p_k), p_k != 1/2, are skewed (skewness (1 - 2 p) / sqrt(p (1 - p))), so
    maximising the third moments of the whitened rows unmixes X = Z A + noise into one source per feature
    where the residual directions mix them.
    """
    gy = np.einsum("kb,kbc->kc", unmixing, np.tensordot(unmixing, moments["third"], axes=(1, 0)))
    y_sum = unmixing @ moments["first"]
    updated = gy / n_rows - 2.0 * (y_sum / n_rows)[:, None] * unmixing
    if not np.all(np.isfinite(updated)):
        return None
    values, vectors = np.linalg.eigh(updated @ updated.T)
    if values[0] <= ICA_RANK_TOL * values[-1]:
        return None
    return (vectors / np.sqrt(values)) @ vectors.T @ updated


def fastica(moments: Stats, n_rows: float) -> np.ndarray | None:
    """Unmixing matrix (K, K) of the whitened rows whose moments are ``moments`` (``ica_moments``, summed over
    every chunk): ``ica_step`` from the identity until every row moves by at most ``ICA_TOL``
    (1 - |w_new . w_old|); None if that takes more than ``ICA_STEPS`` steps or a step has no fixed point."""
    unmixing = np.eye(moments["first"].shape[0])
    for _ in range(ICA_STEPS):
        updated = ica_step(moments, unmixing, n_rows)
        if updated is None:
            return None
        moved = np.max(1.0 - np.abs(np.sum(updated * unmixing, axis=1)))
        unmixing = updated
        if moved <= ICA_TOL:
            return unmixing
    return None


def binary_sources(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sign and threshold per source column of y (N x K) that make a binary feature of it: the sign puts the
    long tail (positive third moment, the rarer value of a skewed binary source) high, the threshold is the
    two-means split of the signed source (``two_means_threshold``)."""
    signs = np.where(np.sum(y ** 3, axis=0) >= 0.0, 1.0, -1.0)
    return signs, np.array([two_means_threshold(signs[k] * y[:, k]) for k in range(y.shape[1])])


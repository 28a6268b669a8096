"""Binary matrix factorization kernels (Meeds, Ghahramani, Neal & Roweis 2007, paper 003; docs/models/bmf.md).

Model: X (I x J) ~ f(U W V^T) over the observed entries (mask True), U (I x K) and V (J x L) binary
under IBP priors (or finite Beta-Bernoulli ones with K, L fixed), W (K x L) ~ N(w0, 1/phi).
Observation models (``LIKELIHOODS``): Gaussian with precision theta, logistic (Bernoulli with
mean sigmoid(UWV^T)) and Poisson with a *log* link, rate exp(UWV^T) (the paper's identity link
needs a positive mean, which a Gaussian W does not give).

Binary prior (paper 003, Sec. 2): pi_k ~ Beta(alpha/K, beta), u_ik ~ Bern(pi_k); K -> infinity gives
the two-parameter IBP with P(u_ik = 1 | rest of column) = n_{-i,k} / (beta + I - 1) (eqs. 4-5) and
Poisson(alpha / (beta + I - 1)) new features for a row (Sec. 3.2).

Both sides are sampled with the same code: the rows of one side (a *panel* of U with the rows of
X, or of V with the rows of X^T) see the data through ``G = W_side @ other.T``, where ``W_side``
is W (U side) or W^T (V side) and ``other`` the other side's binary matrix. The distributed sweep
combines two exact moves:

* ``collapsed_panel_sweep`` on the designated panel: Gibbs for every u_ik with n_{-i,k} > 0
  (eqs. 2-5, counts over all rows, the other panels fixed) and, for the IBP, the
  Metropolis-Hastings move of eqs. 6-8 replacing row i's singleton features;
* ``conditional_panel_sweep`` on every other panel: given the designated panel's rows, the other
  rows' entries in the features S that the designated panel uses are Beta-Bernoulli with
  pi_k | U ~ Beta(n_k, beta + I - n_k) (IBP; Beta(alpha/K + n_k, beta + I - n_k) finite), so
  after drawing pi_S (``auxiliary_pi``) those rows are independent and are updated in parallel,
  vectorised over rows. S depends only on rows this move does not change, which keeps it exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.special import expit, gammaln, log_expit

from buffet.kernels.metrics import auc

LIKELIHOODS = ("gaussian", "logistic", "poisson")


# ----- observation models (paper 003, eq. 1) -----

def entry_log_lik(likelihood: str, X: np.ndarray, M: np.ndarray, theta: float) -> np.ndarray:
    """log f(x | m) entry by entry for the linear predictor M = U W V^T (paper eq. 1)."""
    if likelihood == "gaussian":
        return 0.5 * math.log(theta / (2.0 * math.pi)) - 0.5 * theta * (X - M) ** 2
    if likelihood == "logistic":
        return X * log_expit(M) + (1.0 - X) * log_expit(-M)
    if likelihood == "poisson":
        return X * M - np.exp(M) - gammaln(X + 1.0)
    raise ValueError(f"unknown likelihood {likelihood!r}")


def log_likelihood(likelihood: str, X: np.ndarray, mask: np.ndarray, M: np.ndarray, theta: float) -> float:
    """Sum of ``entry_log_lik`` over the observed entries (mask True; missing entries are left out)."""
    return float(np.sum(entry_log_lik(likelihood, X, M, theta), where=mask))


def mean_of(likelihood: str, M: np.ndarray) -> np.ndarray:
    """E[x | m]: m (Gaussian), sigmoid(m) (logistic), exp(m) (Poisson, log link)."""
    if likelihood == "gaussian":
        return M
    if likelihood == "logistic":
        return np.exp(log_expit(M))
    return np.exp(M)


# ----- the binary prior (paper 003, Sec. 2, eqs. 2-5) -----

@dataclass(frozen=True)
class BinaryPrior:
    """One side's prior: IBP(alpha, beta) when ``k`` is None, else Beta(alpha/k, beta)-Bernoulli with k columns."""

    alpha: float
    beta: float = 1.0
    k: int | None = None

    @property
    def infinite(self) -> bool:
        return self.k is None

    def a(self) -> float:
        """The Beta prior's first shape: 0 in the IBP limit, alpha/K for the finite prior."""
        return 0.0 if self.k is None else self.alpha / self.k

    def log_odds(self, n_minus: np.ndarray, n_rows: int) -> np.ndarray:
        """log P(u_ik = 1) / P(u_ik = 0) given the other rows' count n_{-i,k} (eqs. 2-3 and 4-5)."""
        return np.log(self.a() + n_minus) - np.log(self.beta + n_rows - 1 - n_minus)

    def new_feature_rate(self, n_rows: int) -> float:
        """Mean of the Poisson number of a row's new features, alpha / (beta + I - 1) (paper 003, Sec. 3.2)."""
        return self.alpha / (self.beta + n_rows - 1)

    def log_prob(self, Z: np.ndarray) -> float:
        """log P(Z): of Z's class under the IBP (all-zero columns ignored), of the matrix for finite k.

        IBP: alpha^K+ / prod_h K_h! exp(-alpha sum_i 1/(beta + i - 1)) prod_k B(n_k, beta + I - n_k),
        the K -> infinity limit of the Beta(alpha/K, beta) prior (paper 001 eq. 2 when beta = 1).
        """
        Z = np.asarray(Z, bool)
        n_rows = Z.shape[0]
        n = Z.sum(axis=0)
        if self.k is not None:
            a = self.a()
            return float(np.sum(gammaln(a + n) + gammaln(self.beta + n_rows - n) - gammaln(a + self.beta + n_rows)
                                + gammaln(a + self.beta) - gammaln(a) - gammaln(self.beta)))
        Z, n = Z[:, n > 0], n[n > 0]
        _, multiplicity = np.unique(Z, axis=1, return_counts=True)
        return float(n.size * math.log(self.alpha) - gammaln(multiplicity + 1).sum()
                     - self.alpha * harmonic_sum(n_rows, self.beta)
                     + np.sum(gammaln(n) + gammaln(self.beta + n_rows - n) - gammaln(self.beta + n_rows)))


def harmonic_sum(n_rows: int, beta: float) -> float:
    """sum_{i=1}^{I} 1 / (beta + i - 1): H_I when beta = 1 (the IBP's exp(-alpha ...) term)."""
    return float(np.sum(1.0 / (beta + np.arange(n_rows))))


def sample_concentration(prior: BinaryPrior, k_plus: int, n_rows: int, shape: float, rate: float,
                         rng: np.random.Generator) -> float:
    """alpha (or lambda) | U ~ Gamma(shape + K+, rate + sum_i 1/(beta + i - 1)), conjugate under the IBP."""
    return float(rng.gamma(shape + k_plus, 1.0 / (rate + harmonic_sum(n_rows, prior.beta))))


def auxiliary_pi(prior: BinaryPrior, counts: np.ndarray, n_rows: int, rng: np.random.Generator) -> np.ndarray:
    """pi_k | U ~ Beta(alpha/K + n_k, beta + I - n_k) (IBP: alpha/K -> 0; n_k > 0 needed there)."""
    return rng.beta(prior.a() + counts, prior.beta + n_rows - counts)


# ----- one side's rows (eqs. 2-8) -----

def logit_uniform(rng: np.random.Generator, size: int | None = None) -> float | np.ndarray:
    """logit(u) for u ~ U(0, 1): a binary variable with log odds r is 1 iff this is below r (no overflow)."""
    u = rng.random(size)
    return np.log(u) - np.log1p(-u)


@dataclass(frozen=True)
class Observation:
    """The observation model of a fit: ``likelihood`` in LIKELIHOODS and the Gaussian precision theta."""

    likelihood: str
    theta: float = 1.0

    def row(self, x: np.ndarray, obs: np.ndarray, m: np.ndarray) -> float:
        """Log likelihood of one row's observed entries at linear predictor m."""
        return float(np.sum(entry_log_lik(self.likelihood, x, m, self.theta), where=obs))

    def rows(self, X: np.ndarray, mask: np.ndarray, M: np.ndarray) -> np.ndarray:
        """Log likelihood of each row's observed entries (vector over rows)."""
        return np.sum(entry_log_lik(self.likelihood, X, M, self.theta), axis=1, where=mask)


def entry_log_odds(x: np.ndarray, obs: np.ndarray, m: np.ndarray, g: np.ndarray, z: bool, prior_log_odds: float,
                   model: Observation, current: float) -> tuple[float, np.ndarray, float]:
    """log P(u_ik = 1 | rest) / P(u_ik = 0 | rest) (paper eqs. 2-5): prior odds times row i's likelihood ratio.

    m is row i's linear predictor at the current z = u_ik, ``current`` its log likelihood and
    g = (W V^T)_k. Also returns the change of m when u_ik flips and the log likelihood after the flip.
    """
    flip = -g if z else g
    flipped = model.row(x, obs, m + flip)
    delta = flipped - current
    return prior_log_odds + (-delta if z else delta), flip, flipped


def resample_singletons(x: np.ndarray, obs: np.ndarray, m_base: np.ndarray, W_single: np.ndarray,
                        other: np.ndarray, rate: float, w0: float, phi: float, model: Observation,
                        rng: np.random.Generator) -> np.ndarray:
    """One Metropolis-Hastings update of row i's singleton features (set B; paper eqs. 6-8).

    ``m_base`` is row i's linear predictor without its singletons, whose weight rows are
    ``W_single`` (n_B x L). Proposes n* ~ Poisson(rate) and n* weight rows from the prior
    N(w0, 1/phi) (eq. 7) and accepts with the likelihood ratio (eq. 8). Returns the new rows.
    """
    n_new = rng.poisson(rate)
    W_new = w0 + rng.standard_normal((n_new, other.shape[1])) / math.sqrt(phi)
    current = model.row(x, obs, m_base + W_single.sum(axis=0) @ other.T)
    proposed = model.row(x, obs, m_base + W_new.sum(axis=0) @ other.T)
    return W_new if math.log(rng.random()) < proposed - current else W_single


def multi_feature_move(X: np.ndarray, mask: np.ndarray, Z: np.ndarray, G: np.ndarray, P: np.ndarray,
                       eligible: np.ndarray, size: int, model: Observation, rng: np.random.Generator) -> np.ndarray:
    """Metropolis-Hastings on several features of each row at once (paper 003, Sec. 3.3).

    ``size`` features drawn at random from ``eligible`` have their entries in every row redrawn
    independently from their conditional priors P (R x K, P(u_ik = 1 | the other rows)); as the
    proposal is the conditional prior, each row accepts with its likelihood ratio. Returns Z.
    """
    if size == 0 or eligible.size == 0:
        return Z
    subset = rng.choice(eligible, size=min(size, eligible.size), replace=False)
    proposal = Z.copy()
    proposal[:, subset] = rng.random((Z.shape[0], subset.size)) < P[:, subset]
    log_ratio = model.rows(X, mask, proposal @ G) - model.rows(X, mask, Z @ G)
    return np.where((np.log(rng.random(Z.shape[0])) < log_ratio)[:, None], proposal, Z)


def collapsed_panel_sweep(X: np.ndarray, mask: np.ndarray, Z: np.ndarray, W: np.ndarray, other: np.ndarray,
                          counts_rest: np.ndarray, n_rows: int, prior: BinaryPrior, model: Observation,
                          w0: float, phi: float, rng: np.random.Generator,
                          move_size: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gibbs for every u_ik with n_{-i,k} > 0, a ``multi_feature_move`` of ``move_size`` of those features
    and, for the IBP, the singleton move, row by row (eqs. 2-8, Sec. 3.3).

    X, mask: the panel's rows (R x J); Z (R x K) their features; W (K x L) the side's weights;
    other (J x L); counts_rest (K,) the column counts of the rows outside the panel; n_rows = I.
    Only row i's likelihood changes with u_ik (paper 003, Sec. 3.1). A singleton dropped by the move keeps
    an all-zero column (the caller drops empty columns); new features are appended as columns of
    Z and rows of W. Returns (Z, W).
    """
    Z = Z.copy()
    G = W @ other.T
    counts = counts_rest + Z.sum(axis=0)
    for i in range(Z.shape[0]):
        x, obs = X[i], mask[i]
        m = Z[i] @ G
        current = model.row(x, obs, m)
        n_minus = counts - Z[i]
        for k in np.flatnonzero(n_minus > 0) if prior.infinite else range(Z.shape[1]):
            log_odds, flip, flipped = entry_log_odds(x, obs, m, G[k], bool(Z[i, k]),
                                                     prior.log_odds(n_minus[k], n_rows), model, current)
            new = bool(logit_uniform(rng) < log_odds)
            if new != Z[i, k]:
                Z[i, k], m, current = new, m + flip, flipped
        shared = np.flatnonzero(n_minus > 0) if prior.infinite else np.arange(n_minus.size)
        P = np.zeros((1, n_minus.size))
        P[0, shared] = expit(prior.log_odds(n_minus[shared], n_rows))
        Z[i:i + 1] = multi_feature_move(X[i:i + 1], mask[i:i + 1], Z[i:i + 1], G, P, shared, move_size, model, rng)
        m = Z[i] @ G
        if prior.infinite:
            single = np.flatnonzero((n_minus == 0) & Z[i])
            W_single = W[single]
            W_new = resample_singletons(x, obs, m - G[single].sum(axis=0), W_single, other,
                                        prior.new_feature_rate(n_rows), w0, phi, model, rng)
            if W_new is not W_single:
                Z[i, single] = False
                column = np.zeros((Z.shape[0], W_new.shape[0]), bool)
                column[i] = True
                Z, W = np.hstack([Z, column]), np.vstack([W, W_new])
                G = np.vstack([G, W_new @ other.T])
        counts = np.concatenate([n_minus, np.zeros(Z.shape[1] - n_minus.size, n_minus.dtype)]) + Z[i]
    return Z, W


def conditional_panel_sweep(X: np.ndarray, mask: np.ndarray, Z: np.ndarray, W: np.ndarray, other: np.ndarray,
                            pi: np.ndarray, active: np.ndarray, model: Observation,
                            rng: np.random.Generator, move_size: int = 0) -> np.ndarray:
    """Gibbs for u_ik, k in ``active``, given pi_k: rows are independent.

    Prior odds pi_k / (1 - pi_k) times row i's likelihood ratio; one pass over the active features,
    each vectorised over the panel's rows, then a ``multi_feature_move`` of ``move_size`` active
    features with P(u_ik = 1) = pi_k. Returns the new Z.
    """
    return conditional_sweep(X, mask, Z, W @ other.T, pi, active, model, rng, move_size)


def conditional_sweep(X: np.ndarray, mask: np.ndarray, Z: np.ndarray, G: np.ndarray, pi: np.ndarray,
                      active: np.ndarray, model: Observation, rng: np.random.Generator,
                      move_size: int = 0) -> np.ndarray:
    """``conditional_panel_sweep`` for rows whose linear predictor is Z G (G: K x J, e.g. (W V^T)).

    ``model`` needs only ``rows(X, mask, M)``, the log likelihood of each row's observed entries at
    linear predictor M, so any model whose rows see their features through z_i G can use it.
    """
    Z = Z.copy()
    M = Z @ G
    current = model.rows(X, mask, M)
    for k in np.flatnonzero(active):
        flip = np.where(Z[:, k], -1.0, 1.0)[:, None] * G[k]
        flipped = model.rows(X, mask, M + flip)
        delta = flipped - current
        log_odds = math.log(pi[k]) - math.log1p(-pi[k]) + np.where(Z[:, k], -delta, delta)
        new = logit_uniform(rng, Z.shape[0]) < log_odds
        changed = new != Z[:, k]
        M[changed] += flip[changed]
        current[changed] = flipped[changed]
        Z[:, k] = new
    P = np.broadcast_to(pi, Z.shape)
    return multi_feature_move(X, mask, Z, G, P, np.flatnonzero(active), move_size, model, rng)


class RowStreams:
    """Draws made row by row, to stand in for a Generator in ``conditional_sweep``: generator i makes every
    draw of row i (``random(size)`` with size[0] rows), so a row's draws do not depend on which other rows
    come with it or in what order; draws shared by all rows (``choice``) come from ``shared``."""

    def __init__(self, rows: list[np.random.Generator], shared: np.random.Generator):
        self.rows, self.shared = rows, shared

    def random(self, size: int | tuple[int, ...]) -> np.ndarray:
        shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        return np.array([g.random(shape[1:]) for g in self.rows], dtype=np.float64).reshape(shape)

    def choice(self, *args, **kwargs) -> np.ndarray:
        return self.shared.choice(*args, **kwargs)


def sample_new_rows(X: np.ndarray, mask: np.ndarray, G: np.ndarray, pi: np.ndarray, model: Observation,
                    sweeps: int, burn: int, rng: np.random.Generator | RowStreams,
                    move_size: int = 0) -> np.ndarray:
    """Samples of the binary features of new rows given fixed features G (K x J) and frequencies pi (K,).

    Under z_ik ~ Bern(pi_k) independently and x_i ~ p(x | z_i G) the new rows are independent, and
    ``conditional_sweep`` with every feature active is a Gibbs sweep of their posterior. Starting at
    z = 0, ``sweeps`` sweeps are run and the samples after the first ``burn`` returned,
    (sweeps - burn, n, K) bool; their mean estimates E[z_i | x_i] (for BMF's new rows; the
    IBP estimators use it with the features of one posterior sample). With ``RowStreams``
    each row's samples depend only on that row and its generator.
    """
    Z = np.zeros((X.shape[0], G.shape[0]), bool)
    active = np.ones(G.shape[0], bool)
    kept = []
    for sweep in range(sweeps):
        Z = conditional_sweep(X, mask, Z, G, pi, active, model, rng, move_size)
        if sweep >= burn:
            kept.append(Z)
    return np.stack(kept) if kept else np.zeros((0, *Z.shape), bool)


def linear_predictor(likelihood: str, mean: np.ndarray) -> np.ndarray:
    """The m with ``mean_of(likelihood, m)`` = mean (the inverse link; means at the boundary of the
    range are clipped to it within 1e-12), to score data under a predictive mean."""
    if likelihood == "gaussian":
        return mean
    if likelihood == "logistic":
        p = np.clip(mean, 1e-12, 1.0 - 1e-12)
        return np.log(p) - np.log1p(-p)
    return np.log(np.maximum(mean, 1e-12))


def heldout_scores(likelihood: str, predicted: np.ndarray, truth: np.ndarray) -> dict:
    """RMSE and MAE (Gaussian, Poisson) or AUC and log loss (logistic) of predictive means of held-out
    entries against their values."""
    if likelihood == "logistic":
        p = np.clip(predicted, 1e-12, 1 - 1e-12)
        return {"auc": auc(predicted, truth),
                "log_loss": float(-np.mean(truth * np.log(p) + (1 - truth) * np.log1p(-p)))}
    err = predicted - truth
    return {"rmse": float(np.sqrt(np.mean(err ** 2))), "mae": float(np.mean(np.abs(err)))}


# ----- W given U and V (paper 003, Sec. 3.1) -----

def weight_stats(X: np.ndarray, mask: np.ndarray, U: np.ndarray, V: np.ndarray) -> dict[str, np.ndarray]:
    """Sufficient statistics of the Gaussian W conditional from a panel of rows (paper 003, Sec. 3.1).

    With A's row for entry (i, j) equal to kron(v_j, u_i): A^T A = sum_j kron(v_j v_j^T, U^T D_j U)
    (D_j = diag of column j of the mask; kron(V^T V, U^T U) when all is observed) and
    A^T x = vec(U^T X V) over observed entries (vec stacks columns), plus x^T x and the entry count.
    """
    Uf, Vf = U.astype(np.float64), V.astype(np.float64)
    Xo = np.where(mask, X, 0.0)
    C = np.einsum("ik,ij,iq->jkq", Uf, mask.astype(np.float64), Uf)
    K, L = U.shape[1], V.shape[1]
    ata = np.einsum("jl,jm,jkq->lkmq", Vf, Vf, C).reshape(L * K, L * K)
    return {"ata": ata, "atx": (Uf.T @ Xo @ Vf).T.ravel(), "xx": np.float64(np.sum(Xo ** 2)),
            "n_obs": np.float64(mask.sum())}


def gaussian_w_conditional(stats: dict[str, np.ndarray], theta: float, phi: float,
                           w0: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean and precision of vec(W) | X, U, V: precision theta A^T A + phi I, mean its inverse times
    (theta A^T x + phi w0) (paper 003, Sec. 3.1). vec stacks W's columns."""
    precision = theta * stats["ata"] + phi * np.eye(stats["ata"].shape[0])
    mean = cho_solve(cho_factor(precision), theta * stats["atx"] + phi * w0)
    return mean, precision


def sample_gaussian_w(stats: dict[str, np.ndarray], theta: float, phi: float, w0: float, K: int, L: int,
                      rng: np.random.Generator) -> np.ndarray:
    """A draw of W (K x L) from ``gaussian_w_conditional``."""
    mean, precision = gaussian_w_conditional(stats, theta, phi, w0)
    chol = np.linalg.cholesky(precision)
    w = mean + solve_triangular(chol.T, rng.standard_normal(mean.size), lower=False)
    return w.reshape(L, K).T


def residual_sum_of_squares(stats: dict[str, np.ndarray], W: np.ndarray) -> float:
    """(x - A w)^T (x - A w) over observed entries from the statistics (the theta update)."""
    w = W.T.ravel()
    return float(stats["xx"] - 2.0 * w @ stats["atx"] + w @ stats["ata"] @ w)


def gaussian_log_lik(stats: dict[str, np.ndarray], W: np.ndarray, theta: float) -> float:
    """log p(X | U, V, W) of the Gaussian model over the observed entries, from ``weight_stats``."""
    rss = residual_sum_of_squares(stats, W)
    return 0.5 * float(stats["n_obs"]) * math.log(theta / (2.0 * math.pi)) - 0.5 * theta * rss


def weight_log_prior(W: np.ndarray, w0: float, phi: float) -> float:
    """log N(W; w0, 1/phi I) (paper 003, Sec. 2)."""
    return float(0.5 * W.size * math.log(phi / (2.0 * math.pi)) - 0.5 * phi * np.sum((W - w0) ** 2))


def elliptical_slice(f: np.ndarray, mean: np.ndarray | float, scale: float,
                     log_lik: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
                     current: float | None = None, batch: int = 1) -> tuple[np.ndarray, float]:
    """One elliptical slice sampling update (Murray, Adams & MacKay 2010) of f with prior N(mean, scale^2 I).

    Tuning-free sampler for W under the logistic and Poisson models. ``log_lik`` maps a
    stack of candidates (B, *f.shape) to their log likelihoods (B,). The angles tried while the
    bracket shrinks depend only on the random draws, never on the likelihood values, so ``batch``
    successive angles (those tried if the earlier ones fall below the slice) are evaluated in one
    call and the first above the slice is taken: the same transition as trying them one by one,
    with fewer calls (a distributed log likelihood costs one round of tasks per call). Returns the
    new f and its log likelihood.
    """
    current = float(log_lik(f[None])[0]) if current is None else current
    nu = scale * rng.standard_normal(np.shape(f))
    threshold = current + math.log(rng.random())
    angle = rng.uniform(0.0, 2.0 * math.pi)
    low, high = angle - 2.0 * math.pi, angle
    while True:
        angles = []
        for _ in range(batch):
            angles.append(angle)
            low, high = (angle, high) if angle < 0 else (low, angle)
            angle = rng.uniform(low, high)
        proposals = np.stack([mean + (f - mean) * math.cos(a) + nu * math.sin(a) for a in angles])
        values = np.asarray(log_lik(proposals))
        above = np.flatnonzero(values > threshold)
        if above.size:
            return proposals[above[0]], float(values[above[0]])


# ----- precisions (paper 003, Sec. 3.1) -----

def sample_phi(W: np.ndarray, w0: float, shape: float, rate: float, rng: np.random.Generator) -> float:
    """phi | W ~ Gamma(a_phi + KL/2, b_phi + |W - W0|^2 / 2) (rate parametrisation)."""
    return float(rng.gamma(shape + W.size / 2.0, 1.0 / (rate + 0.5 * np.sum((W - w0) ** 2))))


def sample_theta(rss: float, n_obs: float, shape: float, rate: float, rng: np.random.Generator) -> float:
    """theta | X, U, V, W ~ Gamma(a_theta + |Omega|/2, b_theta + RSS/2) over the observed entries."""
    return float(rng.gamma(shape + n_obs / 2.0, 1.0 / (rate + 0.5 * rss)))

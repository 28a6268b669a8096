"""Split-merge moves for one side of binary matrix factorization (paper 003, Sec. 3.3; Jain & Neal).

The move works on one side's binary matrix Z (U, or V with W^T) under its IBP prior, the weight rows
W_side of Z's features riding with them. An ordered pair of distinct nonzero entries (r1, c1), (r2, c2)
of Z is drawn by ``choose_pair``: the first uniformly, the second with probability 1/2 uniformly among
the other entries of its column, else among the entries of the other columns (the paper's uniform pair
proposes mostly merges of unrelated features, which are always refused). Entries in one column propose
splitting it, entries in two columns merging them; two columns in one row are left alone (the merge
would have no reverse split). A split assigns each row r of the support S of the column to one of the
states (1, 0), (0, 1), (1, 1) of the new pair of features (a, b), row r1 keeping a and row r2 keeping b;
a merge takes the union of the two columns.

The assignment comes from a restricted Gibbs scan started at a *launch* state: uniform random states,
then ``scans`` intermediate restricted scans, each a Gibbs pass over the rows of S given (w_a, w_b)
followed by a fresh draw of (w_a, w_b). The new weight rows ((w_a, w_b) of a split, w of a merge) are
drawn from a Gaussian q(w | Z_S) fitted to their conditional p(w | Z_S, rest, X) by Newton's method
(``weight_proposal``): for the Gaussian model this *is* the conditional (one Newton step is exact),
for the logistic and Poisson models an approximation, and in both cases its density is known and a
function of the assignment only, so the move stays exact. The Metropolis-Hastings ratio of a split
x -> y on the features as a set (the sampler's other moves ignore column order) is

    pi(y) P(pair | y) q(w_x | merged) / (pi(x) P(pair | x) P_scan(assignment | launch) q(w_a, w_b | y)),

with pi the posterior density (alpha per feature, the Beta integral f(n_k) of the two-parameter IBP,
the weights' prior and the rows' likelihood; all other factors cancel), N nonzero entries and feature
counts n: P(pair | x) = 1 / (2 N_x (n_c - 1)), P(pair | y) = 1 / (2 N_y (N_y - n_a)). A merge's ratio is
the inverse, with the probability that the scan from its own launch state reaches the current split
(Jain & Neal's construction, the parameters drawn from a density that can be evaluated). Only the rows
of S enter: the moved features are used nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.special import expit, gammaln

from buffet.kernels.bmf import BinaryPrior, Observation, weight_log_prior

STATES = np.array([[True, False], [False, True], [True, True]])  # a row's (a, b) in a split
NEWTON_STEPS = 12  # at most, for the non-Gaussian weight proposal (the Gaussian model needs one)
NEWTON_TOLERANCE = 1e-8  # Newton stops once no weight moves by more


@dataclass(frozen=True)
class MoveSettings:
    """What a move sees besides the data: the side's row count I (n_rows), its IBP prior, the observation
    model, the weights' prior N(w0, 1/phi) and the number of intermediate restricted scans of the launch."""

    n_rows: int
    prior: BinaryPrior
    model: Observation
    w0: float
    phi: float
    scans: int


@dataclass(frozen=True)
class Restricted:
    """The rows of S (the support of the split or merged column) and what they see.

    X, mask: S's rows of the data (R x J); base: their linear predictor without the moved features;
    other (J x L) the other side's binary matrix; anchors: the positions in S of rows r1 and r2.
    """

    X: np.ndarray
    mask: np.ndarray
    base: np.ndarray
    other: np.ndarray
    anchors: tuple[int, int]
    settings: MoveSettings

    @property
    def model(self) -> Observation:
        return self.settings.model

    def allowed(self) -> np.ndarray:
        """(R, 3): the states row r may take, the anchors keeping their own feature."""
        allowed = np.ones((self.X.shape[0], 3), bool)
        allowed[self.anchors[0], 1] = False
        allowed[self.anchors[1], 0] = False
        return allowed

    def predictor(self, Z: np.ndarray, W_rows: np.ndarray) -> np.ndarray:
        """Linear predictor of S's rows with features Z (R x F) of weight rows W_rows (F x L)."""
        return self.base + Z.astype(np.float64) @ W_rows @ self.other.T

    def log_lik(self, Z: np.ndarray, W_rows: np.ndarray) -> float:
        return float(self.model.rows(self.X, self.mask, self.predictor(Z, W_rows)).sum())

    def log_feature_terms(self, n: np.ndarray) -> np.ndarray:
        """log f(n) = log B(n, beta + I - n) of each feature's count (the IBP's per-feature factor)."""
        beta, rows = self.settings.prior.beta, self.settings.n_rows
        return gammaln(n) + gammaln(beta + rows - n) - gammaln(beta + rows)

    def log_target(self, Z: np.ndarray, W_rows: np.ndarray) -> float:
        """log pi of features Z (R x F) with weights W_rows, up to what splits and merges leave unchanged."""
        n = Z.sum(axis=0)
        return float(Z.shape[1] * math.log(self.settings.prior.alpha) + self.log_feature_terms(n).sum()
                     + weight_log_prior(W_rows, self.settings.w0, self.settings.phi) + self.log_lik(Z, W_rows))


# ----- the Gaussian proposal of new weight rows -----

def entry_derivatives(likelihood: str, X: np.ndarray, M: np.ndarray, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """First derivative and minus the second derivative of log f(x | m) in m, entry by entry."""
    if likelihood == "gaussian":
        return theta * (X - M), np.full(M.shape, theta)
    mean = expit(M) if likelihood == "logistic" else np.exp(M)
    return X - mean, mean * (1.0 - mean) if likelihood == "logistic" else mean


def weight_proposal(problem: Restricted, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean (F x L) and precision (FL x FL, row-major in W_rows) of q(W_rows | Z), the Laplace approximation
    of p(W_rows | Z, rest, X) under the prior N(w0, 1/phi): exact for the Gaussian model. Newton's method
    from w0 with step halving on the log posterior (concave for all three models), at most NEWTON_STEPS
    steps; deterministic, so q is a function of Z."""
    F, L = Z.shape[1], problem.other.shape[1]
    Zf, other = Z.astype(np.float64), problem.other.astype(np.float64)

    def log_post(w: np.ndarray) -> float:
        with np.errstate(over="ignore"):  # a Poisson trial step past the mode may overflow: -inf, then halved
            return problem.log_lik(Z, w) + weight_log_prior(w, problem.settings.w0, problem.settings.phi)

    def grad_precision(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d1, d2 = entry_derivatives(problem.model.likelihood, problem.X, problem.predictor(Z, w), problem.model.theta)
        d1, d2 = np.where(problem.mask, d1, 0.0), np.where(problem.mask, d2, 0.0)
        grad = Zf.T @ d1 @ other - problem.settings.phi * (w - problem.settings.w0)
        curvature = (d2[:, None, :] * other.T[None]) @ other                              # (R, L, L)
        pairs = (Zf[:, :, None] * Zf[:, None, :]).reshape(-1, F * F)
        precision = (pairs.T @ curvature.reshape(-1, L * L)).reshape(F, F, L, L).transpose(0, 2, 1, 3)
        precision = precision.reshape(F * L, F * L)
        return grad.ravel(), precision + problem.settings.phi * np.eye(F * L)

    w = np.full((F, L), problem.settings.w0)
    if L == 0:  # the other side has no features yet: nothing to draw
        return w, np.zeros((0, 0))
    for _ in range(NEWTON_STEPS):
        grad, precision = grad_precision(w)
        step = cho_solve(cho_factor(precision), grad).reshape(F, L)
        if problem.model.likelihood == "gaussian":  # a quadratic log posterior: one step reaches its mode
            return w + step, precision
        current = log_post(w)
        for _ in range(30):
            if log_post(w + step) >= current:
                break
            step = step / 2.0
        w = w + step
        if np.abs(step).max() < NEWTON_TOLERANCE:
            break
    return w, grad_precision(w)[1]


def gaussian_draw(mean: np.ndarray, precision: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    chol = np.linalg.cholesky(precision)
    return mean + solve_triangular(chol.T, rng.standard_normal(mean.size), lower=False).reshape(mean.shape)


def gaussian_log_density(w: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> float:
    chol = np.linalg.cholesky(precision)
    z = chol.T @ (w - mean).ravel()
    return float(np.log(np.diag(chol)).sum() - 0.5 * z.size * math.log(2.0 * math.pi) - 0.5 * z @ z)


# ----- restricted Gibbs scans -----

def state_log_lik(problem: Restricted, W2: np.ndarray) -> np.ndarray:
    """(R, 3): each row's log likelihood in each split state given weight rows W2 (2 x L), -inf where the
    state is not allowed. A row's likelihood does not depend on the other rows' states."""
    R, J = problem.X.shape
    M = problem.base[:, None, :] + (STATES.astype(np.float64) @ W2 @ problem.other.T.astype(np.float64))[None]
    lik = problem.model.rows(np.repeat(problem.X, 3, axis=0), np.repeat(problem.mask, 3, axis=0), M.reshape(R * 3, J))
    return np.where(problem.allowed(), lik.reshape(R, 3), -np.inf)


def restricted_scan(problem: Restricted, AB: np.ndarray, W2: np.ndarray, rng: np.random.Generator,
                    target: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """One Gibbs pass over S's rows of their split state (a, b) given weight rows W2 (2 x L), counts over S.

    Returns the new states (R x 2) and the log probability of the pass; with ``target`` the pass is not
    sampled but forced to ``target``, and its probability is that of reaching it (a merge's reverse).
    """
    AB, lik = AB.copy(), state_log_lik(problem, W2)
    terms = problem.log_feature_terms(np.arange(AB.shape[0] + 1)).tolist()   # index 0 is never used
    counts, log_q = [int(c) for c in AB.sum(axis=0)], 0.0
    for r in range(AB.shape[0]):
        n_a, n_b = counts[0] - int(AB[r, 0]), counts[1] - int(AB[r, 1])
        log_p = np.array([lik[r, 0] + terms[n_a + 1] + terms[n_b] if lik[r, 0] > -np.inf else -np.inf,
                          lik[r, 1] + terms[n_a] + terms[n_b + 1] if lik[r, 1] > -np.inf else -np.inf,
                          lik[r, 2] + terms[n_a + 1] + terms[n_b + 1]])
        log_p -= log_p.max()
        log_p -= math.log(np.exp(log_p).sum())
        if target is None:
            state = min(int(np.searchsorted(np.cumsum(np.exp(log_p)), rng.random())), 2)
            while log_p[state] == -np.inf:  # round-off past the last allowed state
                state -= 1
        else:
            state = int(np.flatnonzero((STATES == target[r]).all(axis=1))[0])
        log_q += float(log_p[state])
        AB[r] = STATES[state]
        counts = [n_a + int(AB[r, 0]), n_b + int(AB[r, 1])]
    return AB, log_q


def launch(problem: Restricted, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The launch state: uniform allowed states, weights from ``weight_proposal``, then ``settings.scans``
    restricted scans, each followed by new weights. Drawn alike for a split and for a merge's reverse."""
    allowed = problem.allowed()
    n_allowed = allowed.sum(axis=1)
    pick = np.floor(rng.random(n_allowed.size) * n_allowed).astype(int)
    AB = STATES[[np.flatnonzero(a)[p] for a, p in zip(allowed, pick)]]
    W2 = gaussian_draw(*weight_proposal(problem, AB), rng)
    for _ in range(problem.settings.scans):
        AB, _ = restricted_scan(problem, AB, W2, rng)
        W2 = gaussian_draw(*weight_proposal(problem, AB), rng)
    return AB, W2


# ----- the move -----

def log_split_ratio(problem: Restricted, split: tuple[np.ndarray, np.ndarray], merged_w: np.ndarray,
                    nonzero_rest: int, log_scan: float, log_q_split: float, log_q_merged: float) -> float:
    """log MH ratio of the split merged -> ``split`` = (states R x 2, weight rows 2 x L) (module docstring);
    a merge's is its negative. ``nonzero_rest``: nonzero entries of Z outside the moved columns."""
    AB, W2 = split
    merged = np.ones((AB.shape[0], 1), bool)
    n_split, n_merged = nonzero_rest + AB.sum(), nonzero_rest + AB.shape[0]
    log_pairs = (-math.log(n_split * (n_split - float(AB[:, 0].sum())))
                 + math.log(n_merged * (AB.shape[0] - 1.0)))
    return (problem.log_target(AB, W2) - problem.log_target(merged, merged_w) + log_pairs
            + log_q_merged - log_scan - log_q_split)


def split_merge_move(problem: Restricted, current: np.ndarray, W_current: np.ndarray, nonzero_rest: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
    """One split (``current`` R x 1: the merged column on S) or merge (R x 2: the anchors' columns, r1's
    first) with weight rows ``W_current``. Returns the columns on S and weight rows after the move and
    whether the proposal was accepted."""
    AB_launch, W_launch = launch(problem, rng)
    merged = np.ones((current.shape[0], 1), bool)
    if current.shape[1] == 1:
        AB, log_scan = restricted_scan(problem, AB_launch, W_launch, rng)
        mean, precision = weight_proposal(problem, AB)
        W2 = gaussian_draw(mean, precision, rng)
        log_ratio = log_split_ratio(problem, (AB, W2), W_current, nonzero_rest, log_scan,
                                    gaussian_log_density(W2, mean, precision),
                                    gaussian_log_density(W_current, *weight_proposal(problem, merged)))
        proposal = (AB, W2)
    else:
        _, log_scan = restricted_scan(problem, AB_launch, W_launch, rng, target=current)
        mean, precision = weight_proposal(problem, merged)
        w = gaussian_draw(mean, precision, rng)
        log_ratio = -log_split_ratio(problem, (current, W_current), w, nonzero_rest, log_scan,
                                     gaussian_log_density(W_current, *weight_proposal(problem, current)),
                                     gaussian_log_density(w, mean, precision))
        proposal = (merged, w)
    if math.log(rng.random()) < log_ratio:
        return proposal[0], proposal[1], True
    return current, W_current, False


# ----- on the whole side -----

@dataclass(frozen=True)
class Pair:
    """Two distinct nonzero entries (rows[0], cols[0]), (rows[1], cols[1]) of Z, in the order drawn."""

    rows: tuple[int, int]
    cols: tuple[int, int]

    @property
    def split(self) -> bool:
        return self.cols[0] == self.cols[1]

    def support(self, Z: np.ndarray) -> np.ndarray:
        """Rows of S: those using either column, in order."""
        return np.flatnonzero(Z[:, self.cols[0]] | Z[:, self.cols[1]])

    @property
    def columns(self) -> list[int]:
        """The columns moved: the split column, or the merged ones with r1's first."""
        return [self.cols[0]] if self.split else list(self.cols)


def choose_pair(Z: np.ndarray, rng: np.random.Generator) -> Pair | None:
    """An ordered pair of distinct nonzero entries (module docstring: the first uniform, the second in the
    same column or, with probability 1/2 each, in another), or None when no move applies (no such second
    entry, or two columns in one row)."""
    rows, cols = np.nonzero(Z)
    if rows.size < 2:
        return None
    first = int(rng.integers(rows.size))
    same = rng.random() < 0.5
    candidates = np.flatnonzero((cols == cols[first]) == same)
    candidates = candidates[candidates != first]
    if candidates.size == 0:
        return None
    second = int(candidates[rng.integers(candidates.size)])
    pair = Pair((int(rows[first]), int(rows[second])), (int(cols[first]), int(cols[second])))
    return None if pair.rows[0] == pair.rows[1] else pair


def move_on_rows(X: np.ndarray, mask: np.ndarray, Z_S: np.ndarray, W_side: np.ndarray, other: np.ndarray,
                 pair: Pair, support: np.ndarray, nonzero_rest: int, settings: MoveSettings,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
    """``split_merge_move`` for ``pair`` given S's data rows X, mask (R x J) and their features Z_S (R x K) of
    the whole side with its weights W_side (K x L); ``nonzero_rest``: Z's nonzero entries outside the
    pair's columns. Returns the moved columns on S, their weight rows and whether the move was accepted."""
    moved = pair.columns
    keep = np.setdiff1d(np.arange(Z_S.shape[1]), moved)
    base = Z_S[:, keep].astype(np.float64) @ W_side[keep] @ other.T.astype(np.float64)
    anchors = (int(np.searchsorted(support, pair.rows[0])), int(np.searchsorted(support, pair.rows[1])))
    problem = Restricted(X, mask, base, other, anchors, settings)
    return split_merge_move(problem, Z_S[:, moved], W_side[moved], nonzero_rest, rng)


def apply_move(Z: np.ndarray, W_side: np.ndarray, pair: Pair, support: np.ndarray, columns: np.ndarray,
               W_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Z and W_side after an accepted move: a split's first feature in the column's place and its second
    appended; a merge's feature in the first column's place, the second column removed."""
    Z, W_side = Z.copy(), W_side.copy()
    first = min(pair.cols)
    Z[:, first] = False
    Z[support, first] = columns[:, 0]
    W_side[first] = W_rows[0]
    if pair.split:
        column = np.zeros((Z.shape[0], 1), bool)
        column[support, 0] = columns[:, 1]
        return np.hstack([Z, column]), np.vstack([W_side, W_rows[1:]])
    second = max(pair.cols)
    return np.delete(Z, second, axis=1), np.delete(W_side, second, axis=0)

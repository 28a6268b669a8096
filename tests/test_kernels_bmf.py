"""Binary matrix factorization kernels against brute-force references (paper 003)."""

import math

import numpy as np
import pytest
from scipy.special import log_expit
from scipy.stats import multivariate_normal, norm, poisson

from buffet.kernels import bmf
from buffet.kernels.ibp_prior import ibp_log_prob

from oracles import enumerate_ibp_classes


def test_two_parameter_ibp_prior_is_paper_001_eq_2_at_beta_1_and_normalised():
    Z = np.array([[1, 0, 1, 1], [1, 1, 0, 1], [0, 0, 1, 0]], bool)
    assert bmf.BinaryPrior(0.7).log_prob(Z) == pytest.approx(ibp_log_prob(Z, 0.7))
    prior = bmf.BinaryPrior(0.5, beta=2.0)
    total = sum(math.exp(prior.log_prob(Z)) for Z in enumerate_ibp_classes(3, 5))
    assert total == pytest.approx(1.0, abs=1e-4)
    finite = bmf.BinaryPrior(1.3, beta=0.8, k=2)
    matrices = ((np.arange(16)[:, None] >> np.arange(4)) & 1).astype(bool).reshape(16, 2, 2)
    assert sum(math.exp(finite.log_prob(Z)) for Z in matrices) == pytest.approx(1.0)


@pytest.mark.parametrize("likelihood", bmf.LIKELIHOODS)
@pytest.mark.parametrize("finite", [False, True])
def test_entry_conditional_equals_the_ratio_of_enumerated_joints(likelihood, finite):
    """P(u_ik = 1 | rest) from eqs. 2-5 equals p(U^1, X | W, V) / (p(U^0, X | W, V) + p(U^1, X | W, V))."""
    rng = np.random.default_rng(3)
    U = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 0]], bool)    # columns distinct with u_00 = 0 or 1
    V = np.array([[1, 0], [1, 1], [0, 1]], bool)
    W = rng.normal(size=(3, 2))
    M = U @ W @ V.T
    X = {"gaussian": M + rng.normal(size=M.shape), "logistic": (rng.random(M.shape) < 0.5).astype(float),
         "poisson": rng.poisson(2.0, M.shape).astype(float)}[likelihood]
    mask = rng.random(X.shape) < 0.8
    prior = bmf.BinaryPrior(1.2, beta=1.5, k=3 if finite else None)
    model = bmf.Observation(likelihood, theta=0.7)
    for i, k in [(0, 0), (1, 2), (3, 1)]:
        joint = []
        for value in (0, 1):
            Uv = U.copy()
            Uv[i, k] = value
            joint.append(prior.log_prob(Uv) + bmf.log_likelihood(likelihood, X, mask, Uv @ W @ V.T, 0.7))
        n_minus = U[:, k].sum() - U[i, k]
        m = U[i] @ W @ V.T
        log_odds, _, _ = bmf.entry_log_odds(X[i], mask[i], m, (W @ V.T)[k], bool(U[i, k]), prior.log_odds(n_minus, 4),
                                            model, model.row(X[i], mask[i], m))
        assert log_odds == pytest.approx(joint[1] - joint[0])


def _dense_design(U, V, mask):
    """A with one row kron(v_j, u_i) per observed entry (i, j), in row-major entry order."""
    return np.array([np.kron(V[j], U[i]) for i in range(U.shape[0]) for j in range(V.shape[0]) if mask[i, j]], float)


def test_gaussian_w_conditional_is_the_dense_linear_regression_posterior():
    rng = np.random.default_rng(4)
    U, V = rng.random((7, 3)) < 0.5, rng.random((5, 2)) < 0.6
    X, mask = rng.normal(size=(7, 5)), rng.random((7, 5)) < 0.7
    theta, phi, w0 = 1.7, 0.6, 0.25
    stats = bmf.weight_stats(X, mask, U, V)
    A, x = _dense_design(U, V, mask), X[mask]
    np.testing.assert_allclose(stats["ata"], A.T @ A)
    np.testing.assert_allclose(stats["atx"], A.T @ x)
    cov = np.linalg.inv(theta * A.T @ A + phi * np.eye(6))
    mean, precision = bmf.gaussian_w_conditional(stats, theta, phi, w0)
    np.testing.assert_allclose(mean, cov @ (theta * A.T @ x + phi * w0))
    np.testing.assert_allclose(np.linalg.inv(precision), cov)
    W = np.stack([bmf.sample_gaussian_w(stats, theta, phi, w0, 3, 2, rng) for _ in range(4000)])
    # the mean, laid out as W (K x L; vec stacks W's columns), is where the gradient of the log posterior,
    # written with U, V and the mask directly, is zero
    M = mean.reshape(2, 3).T
    gradient = theta * U.T @ np.where(mask, X - U @ M @ V.T, 0.0) @ V - phi * (M - w0)
    np.testing.assert_allclose(gradient, 0.0, atol=1e-10)
    draws = W.transpose(0, 2, 1).reshape(4000, 6)
    np.testing.assert_allclose(draws.mean(axis=0), mean, atol=4 * np.sqrt(np.diag(cov).max() / 4000))
    np.testing.assert_allclose(np.cov(draws.T), cov, atol=0.1 * np.abs(cov).max())
    assert bmf.residual_sum_of_squares(stats, W[0]) == pytest.approx(np.sum((x - A @ W[0].T.ravel()) ** 2))
    assert bmf.gaussian_log_lik(stats, W[0], theta) == pytest.approx(
        bmf.log_likelihood("gaussian", X, mask, U @ W[0] @ V.T, theta))
    assert bmf.weight_log_prior(W[0], w0, phi) == pytest.approx(norm.logpdf(W[0], w0, phi ** -0.5).sum())
    full = bmf.weight_stats(X, np.ones_like(mask), U, V)
    Uf, Vf = U.astype(float), V.astype(float)
    np.testing.assert_allclose(full["ata"], np.kron(Vf.T @ Vf, Uf.T @ Uf))    # paper 003, Sec. 3.1, no mask


def test_singleton_move_leaves_the_exact_posterior_of_the_number_of_new_features_invariant():
    """Gaussian row: n_B | rest is Poisson(rate) N(x; m + n other w0, n/phi other other^T + I/theta) (eqs. 6-8)."""
    rng = np.random.default_rng(5)
    other = np.array([[1, 0], [1, 1], [0, 1]], float)
    x, obs = np.array([1.5, 2.5, 1.2]), np.ones(3, bool)
    m_base, rate, w0, phi, theta = np.array([0.2, -0.1, 0.0]), 0.8, 0.3, 1.5, 2.0
    model = bmf.Observation("gaussian", theta)
    W_single, counts = np.zeros((0, 2)), np.zeros(12)
    for _ in range(30000):
        W_single = bmf.resample_singletons(x, obs, m_base, W_single, other, rate, w0, phi, model, rng)
        counts[min(W_single.shape[0], 11)] += 1
    n = np.arange(12)
    log_p = np.array([poisson.logpmf(k, rate) + multivariate_normal.logpdf(
        x, m_base + k * other @ np.full(2, w0), k / phi * other @ other.T + np.eye(3) / theta) for k in n])
    exact = np.exp(log_p - log_p.max())
    exact /= exact.sum()
    assert 0.5 * np.abs(counts / counts.sum() - exact).sum() < 0.03


def _ess_moments(log_lik, mean, scale, steps, rng, batch):
    f, value, draws = np.array(mean, float), None, []
    for _ in range(steps):
        f, value = bmf.elliptical_slice(f, mean, scale, lambda F: [log_lik(c) for c in F], rng, value, batch)
        draws.append(f.copy())
    return np.array(draws)


@pytest.mark.parametrize("batch", [1, 6])
def test_elliptical_slice_sampling_matches_a_gaussian_posterior_in_two_dimensions(batch):
    rng = np.random.default_rng(6)
    mu, s = np.array([0.5, -1.0]), 1.3
    y, noise = np.array([1.2, 0.4]), np.array([[0.5, 0.2], [0.2, 0.8]])
    prec = np.linalg.inv(noise)
    draws = _ess_moments(lambda f: -0.5 * (y - f) @ prec @ (y - f), mu, s, 12000, rng, batch)
    cov = np.linalg.inv(np.eye(2) / s ** 2 + prec)
    mean = cov @ (mu / s ** 2 + prec @ y)
    np.testing.assert_allclose(draws.mean(axis=0), mean, atol=0.05)
    np.testing.assert_allclose(np.cov(draws.T), cov, atol=0.05)


@pytest.mark.parametrize("batch", [1, 6])
def test_elliptical_slice_sampling_matches_a_logistic_posterior_in_one_dimension(batch):
    rng = np.random.default_rng(7)
    labels = np.array([1.0, 1.0, 0.0, 1.0])
    def log_lik(f):
        return float(np.sum(labels * log_expit(f) + (1 - labels) * log_expit(-f)))
    draws = _ess_moments(log_lik, np.array([0.5]), 1.5, 12000, rng, batch)
    grid = np.linspace(-12, 12, 20001)
    log_post = np.array([log_lik(g) for g in grid]) - 0.5 * ((grid - 0.5) / 1.5) ** 2
    weights = np.exp(log_post - log_post.max())
    weights /= weights.sum()
    mean = weights @ grid
    var = weights @ (grid - mean) ** 2
    assert draws.mean() == pytest.approx(mean, abs=0.05)
    assert draws.var() == pytest.approx(var, abs=0.06)


def test_conditional_panel_sweep_draws_rows_from_their_pi_conditional():
    """With W = 0 the likelihood is flat, so every active entry is Bernoulli(pi_k); inactive ones stay."""
    rng = np.random.default_rng(8)
    Z = np.zeros((4000, 3), bool)
    Z[:, 2] = True
    model = bmf.Observation("logistic")
    out = bmf.conditional_panel_sweep(np.ones((4000, 2)), np.ones((4000, 2), bool), Z, np.zeros((3, 1)),
                                      np.ones((2, 1), bool), np.array([0.2, 0.7, 0.5]),
                                      np.array([True, True, False]), model, rng)
    np.testing.assert_allclose(out[:, :2].mean(axis=0), [0.2, 0.7], atol=0.03)
    assert out[:, 2].all()


@pytest.mark.parametrize("likelihood", ["gaussian", "poisson"])
def test_multi_feature_move_leaves_the_row_posterior_invariant(likelihood):
    """Rows drawn from p(z) prod Bern(z_k; P_k) p(x | z) stay so distributed after one move (paper 003, Sec. 3.3)."""
    rng = np.random.default_rng(9)
    G, x = rng.normal(size=(4, 3)), np.array([[0.8, 2.0, 1.0]])
    P, model = np.array([[0.3, 0.6, 0.5, 0.2]]), bmf.Observation(likelihood, 1.5)
    states = ((np.arange(16)[:, None] >> np.arange(4)) & 1).astype(bool)
    log_p = (states * np.log(P) + ~states * np.log1p(-P)).sum(axis=1) + model.rows(
        np.repeat(x, 16, axis=0), np.ones((16, 3), bool), states @ G)
    exact = np.exp(log_p - log_p.max())
    exact /= exact.sum()
    n = 40000
    Z = states[rng.choice(16, size=n, p=exact)]
    for _ in range(3):
        Z = bmf.multi_feature_move(np.repeat(x, n, axis=0), np.ones((n, 3), bool), Z, G, np.repeat(P, n, axis=0),
                                   np.array([0, 1, 3]), 2, model, rng)
    after = np.bincount(Z @ (1 << np.arange(4)), minlength=16) / n
    assert 0.5 * np.abs(after - exact).sum() < 0.02

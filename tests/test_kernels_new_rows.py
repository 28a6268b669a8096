"""Kernels for rows not in a fit (the estimators' transform/predict/score): the Gibbs scan over new rows'
binary features against the exact posterior by enumeration, the per-row streams, IMF's fixed-point row
fit against the logit formula written out, and the BMF inverse link."""

import itertools

import numpy as np
import pytest
from scipy.special import expit

from buffet.kernels import bmf, imf
from buffet.kernels.gibbs_noisy_or import NoisyORObservation
from buffet.kernels.pf_noisy_or import NoisyORParams


def _exact_mean(x, obs, G, pi, model):
    """E[z | x] by enumerating every z in {0,1}^K: prior prod Bern(pi_k) times the row likelihood."""
    states = np.array(list(itertools.product([0, 1], repeat=G.shape[0])), dtype=bool)
    log_p = (states * np.log(pi) + ~states * np.log1p(-pi)).sum(axis=1)
    log_p = log_p + model.rows(np.repeat(x[None], len(states), axis=0), np.repeat(obs[None], len(states), axis=0),
                               states @ G)
    weights = np.exp(log_p - log_p.max())
    return weights @ states / weights.sum()


@pytest.mark.parametrize("model", [bmf.Observation("gaussian", 2.0), bmf.Observation("logistic"),
                                   NoisyORObservation(NoisyORParams(0.3, 0.8, 0.05))])
def test_new_row_samples_match_the_exact_posterior(model):
    rng = np.random.default_rng(4)
    G = rng.random((3, 5)) if isinstance(model, NoisyORObservation) else rng.normal(size=(3, 5))
    pi = np.array([0.3, 0.6, 0.5])
    X = np.array([[1.0, 0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0, 1.0]])
    mask = np.array([[True] * 5, [True, True, False, True, True]])
    samples = bmf.sample_new_rows(np.repeat(X, 200, axis=0), np.repeat(mask, 200, axis=0), G, pi, model,
                                  sweeps=60, burn=10, rng=rng, move_size=1)
    means = samples.mean(axis=0).reshape(2, 200, 3).mean(axis=1)
    for row in range(2):
        np.testing.assert_allclose(means[row], _exact_mean(X[row], mask[row], G, pi, model), atol=0.03)


def test_row_streams_make_each_rows_draws_independent_of_the_others():
    G, pi, model = np.random.default_rng(0).normal(size=(4, 6)), np.full(4, 0.4), bmf.Observation("gaussian")
    X = np.random.default_rng(1).normal(size=(5, 6))
    mask = np.ones(X.shape, bool)

    def streams(rows):
        return bmf.RowStreams([np.random.default_rng(int(r)) for r in rows], np.random.default_rng(99))

    every = bmf.sample_new_rows(X, mask, G, pi, model, 8, 2, streams(range(5)), move_size=2)
    some = bmf.sample_new_rows(X[[3, 1]], mask[[3, 1]], G, pi, model, 8, 2, streams([3, 1]), move_size=2)
    np.testing.assert_array_equal(some, every[:, [3, 1]])


def _logit_by_hand(x, obs, nu, post, k):
    """The logit of nu_ik (paper 000, eq. (8)) written out as sums over the observed columns j."""
    m, t1, t2 = post["m"], post["t1"], post["t2"]
    lam = post["V"] + m[:, :, None] * m[:, None, :]
    log_pi, log_1mpi = imf.beta_log_means(t1, t2)
    eta = post["ax"] / post["bx"]
    total = 0.0
    for j in np.flatnonzero(obs):
        cross = sum(nu[r] * lam[j, r, k] for r in range(len(nu)) if r != k)
        total += lam[j, k, k] - 2.0 * x[j] * m[j, k] + 2.0 * cross
    return log_pi[k] - log_1mpi[k] - 0.5 * eta * total


def test_fit_rows_reaches_the_fixed_point_of_the_row_update():
    rng = np.random.default_rng(5)
    d, k = 6, 3
    A = rng.normal(size=(d, k))
    V = np.stack([np.eye(k) * 0.05] * d)
    post = {"m": A, "V": V, "t1": np.array([4.0, 2.0, 7.0]), "t2": np.array([6.0, 8.0, 3.0]),
            "ax": np.float64(20.0), "bx": np.float64(5.0)}
    X = (rng.random((4, k)) < 0.5) @ A.T + 0.3 * rng.normal(size=(4, d))
    mask = rng.random(X.shape) > 0.2
    nu = imf.fit_rows(np.where(mask, X, 0.0), mask, post)
    for i in range(X.shape[0]):
        for feature in range(k):
            assert nu[i, feature] == pytest.approx(expit(_logit_by_hand(X[i], mask[i], nu[i], post, feature)),
                                                   abs=1e-7)


@pytest.mark.parametrize("likelihood", bmf.LIKELIHOODS)
def test_linear_predictor_inverts_the_mean(likelihood):
    m = np.linspace(-3.0, 3.0, 13)
    np.testing.assert_allclose(bmf.linear_predictor(likelihood, bmf.mean_of(likelihood, m)), m, atol=1e-10)

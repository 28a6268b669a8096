"""Tests of the IMF kernels, the K+ search they make up (the engine's driver as the in-memory
reference, ``imf_reference``) and the IBP image data (paper 000, Sec. 4.1)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st
from scipy.special import digamma, expit

from buffet.data import ibp_images
from buffet.data.ibp_synthetic import planted_features
from buffet.kernels import imf
from imf_reference import reference_fit


def small_problem(seed: int, masked: bool, n: int = 12, d: int = 5,
                  k: int = 3) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """A random X (with a mask of ~25% missing entries when ``masked``) and a random q(Z)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, k)) @ rng.normal(size=(k, d)) + 0.5 * rng.normal(size=(n, d))
    mask = rng.random((n, d)) < 0.75 if masked else None
    if masked:
        x[~mask] = np.nan  # missing entries must never be read
    nu = rng.uniform(0.05, 0.95, size=(n, k))
    return x, mask, nu


def fitted_state(x: np.ndarray, mask: np.ndarray | None, nu: np.ndarray, hyper: imf.Hyper,
                 iterations: int = 3) -> tuple[np.ndarray, imf.Stats, imf.Post]:
    """A non-trivial state: a few alternations of column_update and row_step from ``nu``."""
    stats = imf.chunk_stats(x, mask, nu)
    post = imf.initial_post(imf.chunk_stats(x, mask, nu[:, :0]), hyper)
    for _ in range(iterations):
        post = imf.column_update(stats, hyper, post)
        nu, stats = imf.row_step(x, mask, nu, post)
    return nu, stats, post


def loop_row_step(x: np.ndarray, mask: np.ndarray | None, nu: np.ndarray, post: imf.Post) -> np.ndarray:
    """The q(z_ik) update of paper 000, eq. (8), written as plain loops over rows, features and observed columns."""
    nu = nu.copy()
    n, d = x.shape
    k_plus = nu.shape[1]
    e_log_pi = digamma(post["t1"]) - digamma(post["t1"] + post["t2"])
    e_log_1mpi = digamma(post["t2"]) - digamma(post["t1"] + post["t2"])
    eta_x = post["ax"] / post["bx"]
    for i in range(n):
        for k in range(k_plus):
            total = 0.0
            for j in range(d):
                if mask is not None and not mask[i, j]:
                    continue
                v = post["V"] if post["V"].ndim == 2 else post["V"][j]
                lam = v + np.outer(post["m"][j], post["m"][j])
                cross = sum(nu[i, r] * lam[r, k] for r in range(k_plus) if r != k)
                total += lam[k, k] - 2.0 * x[i, j] * post["m"][j, k] + 2.0 * cross
            nu[i, k] = expit(e_log_pi[k] - e_log_1mpi[k] - 0.5 * eta_x * total)
    return nu


@pytest.mark.parametrize("masked", [False, True])
def test_row_step_equals_per_row_loop(masked: bool) -> None:
    x, mask, nu = small_problem(0, masked)
    _, _, post = fitted_state(x, mask, nu, imf.Hyper())
    fast, _ = imf.row_step(x, mask, nu, post)
    np.testing.assert_allclose(fast, loop_row_step(x, mask, nu, post), rtol=0, atol=1e-10)


@pytest.mark.parametrize("masked", [False, True])
def test_swap_gain_is_the_change_of_the_evidence(masked: bool) -> None:
    """Exchanging two features' nu in one row changes L by ``swap_gains``; ``swap_rows`` takes each row's best
    exchange, so L rises by the sum of those gains."""
    x, mask, nu = small_problem(2, masked, n=30, d=6, k=4)
    hyper = imf.Hyper()
    _, _, post = fitted_state(x, mask, nu, hyper)
    b, g = imf.row_terms(x, mask, post)
    log_pi, log_1mpi = imf.beta_log_means(post["t1"], post["t2"])
    eta_x, _ = imf.gamma_means(post["ax"], post["bx"])

    def evidence(v: np.ndarray) -> float:
        return imf.evidence(imf.chunk_stats(x, mask, v), post, hyper)

    gains = imf.swap_gains(nu, b, g, log_pi - log_1mpi, eta_x)
    for k, l in ((0, 1), (1, 3), (3, 1)):
        swapped = nu.copy()
        swapped[7, [k, l]] = nu[7, [l, k]]
        assert evidence(swapped) - evidence(nu) == pytest.approx(gains[7, k, l], rel=1e-9, abs=1e-9)
    best = gains.max(axis=(1, 2))
    moved = imf.swap_rows(nu, b, g, log_pi - log_1mpi, eta_x)
    assert np.any(moved != nu)
    assert evidence(moved) - evidence(nu) == pytest.approx(np.sum(best[best > 1e-6]), rel=1e-9)


@pytest.mark.parametrize("masked", [False, True])
def test_chunk_stats_add_up_over_row_chunks(masked: bool) -> None:
    x, mask, nu = small_problem(1, masked)
    _, _, post = fitted_state(x, mask, nu, imf.Hyper())
    whole_nu, whole = imf.row_step(x, mask, nu, post)
    parts = [imf.row_step(x[s], None if mask is None else mask[s], nu[s], post) for s in (slice(0, 5), slice(5, None))]
    np.testing.assert_allclose(np.vstack([p[0] for p in parts]), whole_nu, atol=1e-12)
    for key, value in whole.items():
        np.testing.assert_allclose(parts[0][1][key] + parts[1][1][key], value, rtol=1e-12, atol=1e-12)
    assert whole["zz"].shape == ((5, 3, 3) if masked else (3, 3))


def separated_problem(seed: int, n: int = 300, d: int = 40,
                      k: int = 3) -> tuple[np.ndarray, np.ndarray, imf.Post]:
    """Planted binary features under little noise, with rows observed from 5% to 100% of their entries, and
    the column posteriors after two alternations from the planted q(z): the logits of q(z) then spread far
    past -LOGIT_BOUND (unbounded, some nu_ik underflow to 0 and some products nu_ir nu_ik are subnormal)."""
    rng = np.random.default_rng(seed)
    z = rng.random((n, k)) < 0.4
    x = z @ rng.normal(size=(k, d)) + 0.1 * rng.normal(size=(n, d))
    mask = rng.random((n, d)) < rng.uniform(0.05, 1.0, size=(n, 1))
    _, _, post = fitted_state(x, mask, np.where(z, 0.9, 0.1), imf.Hyper(), iterations=2)
    return x, mask, post


def row_update(x: np.ndarray, mask: np.ndarray, post: imf.Post, how: str) -> np.ndarray:
    """q(z) of the rows by the training row step (from the prior means) or by the fixed-point row fit."""
    if how == "fit_rows":
        return imf.fit_rows(x, mask, post)
    start = np.broadcast_to(post["t1"] / (post["t1"] + post["t2"]), (x.shape[0], post["m"].shape[1]))
    return imf.row_step(x, mask, start, post, swaps=True)[0]


@pytest.mark.parametrize("how", ["row_step", "fit_rows"])
def test_saturated_q_z_stays_above_the_bound_and_its_products_are_normal(how: str) -> None:
    """With ``LOGIT_BOUND``, q(z) on strongly separated data saturates, yet every nu_ik stays in
    [expit(-LOGIT_BOUND), 1] and no product nu_ir nu_ik that ``chunk_stats`` forms is subnormal or 0 (the
    unbounded update leaves about 180 of these 900 nu_ik at 0 and 12-15 of the products subnormal)."""
    x, mask, post = separated_problem(0)
    nu = row_update(x, mask, post, how)
    floor = expit(-imf.LOGIT_BOUND)
    assert np.mean(nu == floor) > 0.1, "the data do not saturate q(z): the test would not exercise the bound"
    assert nu.min() >= floor and nu.max() <= 1.0
    products = nu[:, :, None] * nu[:, None, :]
    assert products.min() >= np.finfo(float).tiny
    stats = imf.chunk_stats(x, mask, nu)
    assert all(np.all(np.isfinite(value)) for value in stats.values())


def test_the_bound_on_q_z_leaves_the_evidence_unchanged() -> None:
    """The nu_ik held at the bound count for nothing in L (``LOGIT_BOUND``): setting them to 0, the unbounded
    limit, moves L by less than 1e-15 of itself."""
    x, mask, post = separated_problem(1)
    hyper = imf.Hyper()
    nu = row_update(x, mask, post, "row_step")
    at_bound = nu == expit(-imf.LOGIT_BOUND)
    assert at_bound.any() and (nu == 1.0).any()
    bounded = imf.evidence(imf.chunk_stats(x, mask, nu), post, hyper)
    unbounded = imf.evidence(imf.chunk_stats(x, mask, np.where(at_bound, 0.0, nu)), post, hyper)
    assert np.isfinite(bounded)
    assert abs(bounded - unbounded) <= 1e-15 * abs(unbounded)


def test_expected_sq_error_matches_direct_sum() -> None:
    """sum_Omega E[(x - z a)^2] from the statistics equals the entry-by-entry expectation."""
    x, mask, nu = small_problem(2, True)
    nu, stats, post = fitted_state(x, mask, nu, imf.Hyper())
    lam = imf.second_moments(post)
    direct = 0.0
    for i, j in zip(*np.nonzero(mask)):
        ezz = np.outer(nu[i], nu[i]) + np.diag(nu[i] - nu[i] ** 2)
        direct += x[i, j] ** 2 - 2 * x[i, j] * nu[i] @ post["m"][j] + np.sum(ezz * lam[j])
    assert imf.expected_sq_error(stats, post) == pytest.approx(direct, rel=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("alpha", [1.5, None])
def test_every_coordinate_update_increases_evidence(masked: bool, alpha: float | None) -> None:
    hyper = imf.Hyper(alpha=alpha)
    steps = (imf.update_pi, imf.update_a, imf.update_eta_x, imf.update_eta_a, imf.update_alpha)
    for seed in range(3):
        x, mask, nu = small_problem(10 + seed, masked)
        nu, stats, post = fitted_state(x, mask, nu, hyper, iterations=1)
        post = imf.column_update(stats, hyper, post)
        value = imf.evidence(stats, post, hyper)
        for _ in range(4):
            nu, stats = imf.row_step(x, mask, nu, post)
            new = imf.evidence(stats, post, hyper)
            assert new >= value - 1e-9 * abs(value), "row sweep of q(z) lowered L"
            value = new
            for step in steps:
                post = step(stats, post, hyper)
                new = imf.evidence(stats, post, hyper)
                assert new >= value - 1e-9 * abs(value), f"{step.__name__} lowered L"
                value = new


def test_coordinate_updates_are_optimal() -> None:
    """Perturbing a freshly updated factor lowers L (the updates are maxima, not just ascent)."""
    hyper = imf.Hyper()
    x, mask, nu = small_problem(4, True)
    nu, stats, post = fitted_state(x, mask, nu, hyper)
    post = imf.column_update(stats, hyper, post)
    value = imf.evidence(stats, post, hyper)
    for key, factor in (("m", 1.01), ("t1", 1.01), ("bx", 1.01), ("ba", 0.99)):
        assert imf.evidence(stats, {**post, key: post[key] * factor}, hyper) < value


def sample_log_ratio(x: np.ndarray, mask: np.ndarray, nu: np.ndarray, post: imf.Post, hyper: imf.Hyper,
                     rng: np.random.Generator, size: int) -> np.ndarray:
    """Samples of ln p(X, Z, A, pi, eta[, alpha]) - ln q under q, with the joint of
    ``imf.ibp_terms``: sum_k [(m_k - 1) ln pi_k + (N - m_k) ln(1 - pi_k) + ln(alpha / k)] - alpha H_N."""
    n, d = x.shape
    k_plus = nu.shape[1]
    z = (rng.random((size, n, k_plus)) < nu).astype(np.float64)
    pi = rng.beta(post["t1"], post["t2"], size=(size, k_plus))
    a = np.stack([rng.multivariate_normal(post["m"][j], post["V"][j], size=size) for j in range(d)], axis=2)
    eta_x = rng.gamma(post["ax"], 1.0 / post["bx"], size=size)
    eta_a = rng.gamma(post["aa"], 1.0 / post["ba"], size=size)
    alpha = rng.gamma(post["alpha_a"], 1.0 / post["alpha_b"], size=size)
    mean = np.einsum("snk,skd->snd", z, a)
    loglik = st.norm.logpdf(np.where(mask, x, 0.0), mean, 1.0 / np.sqrt(eta_x)[:, None, None])
    m_k = z.sum(axis=1)
    h_n = np.sum(1.0 / np.arange(1, n + 1))
    log_p = (np.sum(np.where(mask, loglik, 0.0), axis=(1, 2))
             + np.sum(st.norm.logpdf(a, 0.0, 1.0 / np.sqrt(eta_a)[:, None, None]), axis=(1, 2))
             + np.sum((m_k - 1) * np.log(pi) + (n - m_k) * np.log1p(-pi), axis=1)
             + np.sum(np.log(alpha[:, None] / np.arange(1, k_plus + 1)), axis=1) - alpha * h_n
             + st.gamma.logpdf(eta_x, hyper.ax0, scale=1 / hyper.bx0)
             + st.gamma.logpdf(eta_a, hyper.aa0, scale=1 / hyper.ba0)
             + st.gamma.logpdf(alpha, hyper.alpha_a0, scale=1 / hyper.alpha_b0))
    log_q = (np.sum(z * np.log(nu) + (1 - z) * np.log1p(-nu), axis=(1, 2))
             + np.sum(st.beta.logpdf(pi, post["t1"], post["t2"]), axis=1)
             + sum(st.multivariate_normal(post["m"][j], post["V"][j]).logpdf(a[:, :, j]) for j in range(d))
             + st.gamma.logpdf(eta_x, post["ax"], scale=1 / post["bx"])
             + st.gamma.logpdf(eta_a, post["aa"], scale=1 / post["ba"])
             + st.gamma.logpdf(alpha, post["alpha_a"], scale=1 / post["alpha_b"]))
    return log_p - log_q


def test_evidence_matches_monte_carlo() -> None:
    hyper = imf.Hyper(alpha=None, alpha_a0=2.0, alpha_b0=1.5)
    x, mask, nu = small_problem(5, True, n=6, d=4, k=2)
    nu, stats, post = fitted_state(x, mask, nu, hyper)
    samples = sample_log_ratio(x, mask, nu, post, hyper, np.random.default_rng(7), 100_000)
    error = samples.std() / np.sqrt(samples.size)
    assert abs(samples.mean() - imf.evidence(stats, post, hyper)) < 4 * error
    assert error < 0.05  # the check is sharp enough to see a missing ln(alpha/k) or -1 in (m_k - 1)


def test_residual_initialisation_finds_a_planted_feature() -> None:
    rng = np.random.default_rng(3)
    z = (rng.random(40) < 0.4).astype(np.float64)
    a = rng.normal(size=8)
    x = np.outer(z, a) + 0.1 * rng.normal(size=(40, 8))
    r = imf.residual(x, None, np.zeros((40, 0)), np.zeros((8, 0)))
    [direction] = imf.residual_directions(r.T @ r, r.sum(axis=0), r.shape[0], 1).T
    p = r @ direction
    first = imf.new_feature_column(p, *imf.orient_and_split(p))
    np.testing.assert_array_equal(first > 0.5, z > 0.5)


def test_ica_unmixes_planted_binary_features() -> None:
    """Whitening gives identity covariance, and FastICA with the skewness contrast from the identity turns
    X = Z A + noise into one source per feature, each thresholded to its true column of Z (moments summed over
three chunks)."""
    data = planted_features(np.random.default_rng(4), 2000, 20, 4)
    x = data.X
    mean, white = imf.whitening(imf.gram_sums(x), 4)
    whitened = (x - mean) @ white
    np.testing.assert_allclose(np.cov(whitened.T, bias=True), np.eye(4), atol=1e-10)
    moments = [imf.ica_moments(part) for part in np.array_split(whitened, 3)]
    unmixing = imf.fastica({key: sum(m[key] for m in moments) for key in moments[0]}, x.shape[0])
    assert unmixing is not None
    y = whitened @ unmixing.T
    signs, thresholds = imf.binary_sources(y)
    z = imf.new_feature_column(y, signs, thresholds) > 0.5
    matched = [max(range(4), key=lambda k: np.mean(z[:, k] == data.Z[:, t])) for t in range(4)]
    assert sorted(matched) == [0, 1, 2, 3]
    assert all(np.mean(z[:, k] == data.Z[:, t]) > 0.999 for t, k in enumerate(matched))


def test_ica_step_gives_up_on_dependent_sources() -> None:
    """Whitened data with two identical columns (a binary matrix with duplicated columns, as role matrices have)
    make the updated unmixing rows dependent: the step says so (None) instead of taking the inverse square
    root of a singular W W^T, which gave NaN and then numpy's "Eigenvalues did not converge"."""
    rng = np.random.default_rng(0)
    column = rng.random((50, 1))
    whitened = np.hstack([column, column]) - column.mean()
    moments = imf.ica_moments(whitened)
    assert imf.ica_step(moments, np.eye(2), 50.0) is None
    nan_moments = {key: np.full_like(value, np.nan) for key, value in moments.items()}
    assert imf.ica_step(nan_moments, np.eye(2), 50.0) is None


def test_ica_step_from_moments_is_the_step_from_the_rows() -> None:
    """The FastICA step from the moment sums equals the textbook step computed on the rows themselves
    (sum_i y_ik^2 x_i and sum_i y_ik for sources y = x W^T), for a random unmixing matrix."""
    rng = np.random.default_rng(5)
    x = rng.exponential(size=(300, 4)) - 1.0
    unmixing = np.linalg.qr(rng.normal(size=(4, 4)))[0]
    y = x @ unmixing.T
    updated = (y * y).T @ x / 300.0 - 2.0 * (y.sum(axis=0) / 300.0)[:, None] * unmixing
    values, vectors = np.linalg.eigh(updated @ updated.T)
    expected = (vectors / np.sqrt(values)) @ vectors.T @ updated
    np.testing.assert_allclose(imf.ica_step(imf.ica_moments(x), unmixing, 300.0), expected, rtol=1e-12, atol=1e-12)


def test_pruning_keeps_the_selected_features() -> None:
    x, mask, nu = small_problem(6, True)
    _, stats, post = fitted_state(x, mask, nu, imf.Hyper())
    keep = imf.keep_features(np.array([3.0, 0.2, 1.0]), 0.5)
    np.testing.assert_array_equal(keep, [True, False, True])
    pruned = imf.select_features(post, keep)
    assert pruned["m"].shape == (5, 2) and pruned["V"].shape == (5, 2, 2) and pruned["t1"].shape == (2,)
    np.testing.assert_array_equal(pruned["V"][:, 1, 0], post["V"][:, 2, 0])


def test_fit_prefers_no_features_on_pure_noise() -> None:
    x = np.random.default_rng(0).normal(size=(30, 6))
    fit = reference_fit(x, max_k=3, patience=2)
    assert fit.k_plus == 0
    assert fit.state.history[0][0] == 0 and len(fit.state.history) >= 2


def test_fit_with_missing_entries_predicts_them() -> None:
    """20% of the entries held out (a mask): K+ = 4 is found and E[Z] E[A] predicts the
    noiseless held-out values far better than column means do."""
    x, z, a = ibp_images.make_images(n_rows=50, noise_var=0.25, variant="four", seed=0)
    mask = np.random.default_rng(0).random(x.shape) < 0.8
    fit = reference_fit(np.where(mask, x, np.nan), mask, max_k=8)
    truth = (z @ a)[~mask]
    error = np.sqrt(np.mean(((fit.expected_z() @ fit.state.post["m"].T)[~mask] - truth) ** 2))
    baseline = np.sqrt(np.mean((np.broadcast_to(np.nanmean(np.where(mask, x, np.nan), axis=0), x.shape)[~mask]
                                - truth) ** 2))
    assert fit.k_plus == 4
    assert error < 0.5 * baseline


# Seeds of the 4-image data (N = 50, noise variance 0.5) on which the evidence curve is tested. At this
# noise level the signal is weak: over seeds 0-11 the IMF bound peaks at K+ = 4 on ten (1 and 7 peak
# at K+ = 3).
PEAK_SEEDS = (0, 2, 4)


@pytest.mark.parametrize("seed", PEAK_SEEDS)
def test_evidence_peaks_at_four_on_ibp_images(seed: int) -> None:
    x, _, _ = ibp_images.make_images(n_rows=50, noise_var=0.5, variant="four", seed=seed)
    fit = reference_fit(x, max_k=8, patience=8)
    curve: dict[int, float] = {}
    for k_plus, value in fit.state.history:
        curve[k_plus] = max(curve.get(k_plus, -np.inf), value)
    assert fit.k_plus == 4
    assert set(range(1, 6)) <= set(curve)
    assert max(curve, key=curve.get) == 4


def test_ibp_images_generator() -> None:
    x, z, a = ibp_images.make_images(n_rows=30, noise_var=0.5, variant="four", seed=1)
    assert x.shape == (30, 36) and z.shape == (30, 4) and a.shape == (4, 36)
    assert set(np.unique(a)) == {0.0, 1.0} and set(np.unique(z)) <= {0.0, 1.0}
    assert np.var(x - z @ a) == pytest.approx(0.5, rel=0.15)
    _, _, first = ibp_images.make_images(variant="eight_ones", seed=2)
    _, _, second = ibp_images.make_images(variant="eight_ones", seed=3)
    np.testing.assert_array_equal(first.sum(axis=1), 8)
    assert not np.array_equal(first, second)
    with pytest.raises(ValueError, match="unknown IBP image variant"):
        ibp_images.make_images(variant="five")

"""The IBP prior kernels (paper 001, eq. 2 and Algorithm 1) and the IBP synthetic data."""

import numpy as np
import pytest
from scipy import stats

from buffet.data.ibp_synthetic import image_data, latent_images, noisy_or_data
from buffet.kernels.ibp_prior import (append_row, class_key, class_keys, feature_capacity, harmonic_number, ibp_log_prob,
                                      init_ibp_particles, left_order, new_feature_log_prior, sample_ibp,
                                      sample_ibp_conditional)
from buffet.kernels.metrics import base_error, zzt_error
from buffet.kernels.pf_noisy_or import NoisyORParams

from oracles import class_distribution, enumerate_ibp_classes, exact_class_posterior, total_variation


def _poisson_chi2_pvalue(counts: np.ndarray, rate: float) -> float:
    """Chi-square goodness of fit of integer draws to Poisson(rate); bins with expected < 5 merged."""
    n = counts.size
    top = int(stats.poisson.ppf(1 - 5.0 / n, rate))          # last bin k >= top has expected >= 5
    observed = np.bincount(np.minimum(counts, top), minlength=top + 1)
    expected = n * np.append(stats.poisson.pmf(np.arange(top), rate), stats.poisson.sf(top - 1, rate))
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.fixture(scope="module")
def ibp_draws():
    alpha, n_rows = 2.0, 8
    return alpha, n_rows, sample_ibp(n_rows, alpha, np.random.default_rng(12345), size=20000)


def test_features_per_row_are_poisson_alpha(ibp_draws):
    alpha, n_rows, block = ibp_draws
    per_row = block.Z.sum(axis=2)                         # (draws, rows)
    for i in (0, n_rows // 2, n_rows - 1):                # exchangeability: every row is Poisson(alpha)
        assert _poisson_chi2_pvalue(per_row[:, i], alpha) > 1e-3
    # the same test rejects a wrong rate, so it has power
    assert _poisson_chi2_pvalue(per_row[:, n_rows - 1], 1.1 * alpha) < 1e-6


def test_total_features_are_poisson_alpha_harmonic(ibp_draws):
    alpha, n_rows, block = ibp_draws
    k_plus = block.n_features
    assert _poisson_chi2_pvalue(k_plus, alpha * harmonic_number(n_rows)) > 1e-3
    assert _poisson_chi2_pvalue(k_plus, alpha * np.log(n_rows)) < 1e-6


def test_block_layout_counts_and_padding(ibp_draws):
    _, n_rows, block = ibp_draws
    assert block.n_rows == n_rows
    np.testing.assert_array_equal(block.m, block.Z.sum(axis=1))
    k = block.n_features
    # features occupy the first K_l columns, in order of appearance (first row with a one)
    cols = np.arange(block.m.shape[1])
    np.testing.assert_array_equal(block.m > 0, cols[None, :] < k[:, None])
    first_row = np.where(block.Z.any(axis=1), block.Z.argmax(axis=1), n_rows)
    assert np.all(np.diff(first_row, axis=1) >= 0)


@pytest.mark.parametrize("spare", [False, True])
def test_append_row_places_new_features_after_the_old_ones(spare):
    """Row i = (z, K_new): particle l's new features in columns K_l .. K_l + K_new_l - 1, by a loop per particle."""
    assert [feature_capacity(k) for k in range(10)] == [0, 1, 2, 4, 4, 8, 8, 8, 8, 16]
    rng = np.random.default_rng(2)
    block = init_ibp_particles(7, 5)
    for i in range(5):
        z = rng.random(block.m.shape) < 0.5
        z &= block.m > 0                                      # entries only for existing features
        k_new = rng.poisson(1.5, size=7)
        grown, new = append_row(block, z, k_new, spare)
        need = int((block.n_features + k_new).max())
        assert grown.m.shape[1] == max(block.m.shape[1], feature_capacity(need) if spare else need)
        for l in range(7):
            k = block.n_features[l]
            row = np.zeros(grown.m.shape[1], bool)
            row[:z.shape[1]] = z[l]
            row[k:k + k_new[l]] = True
            np.testing.assert_array_equal(grown.Z[l, i], row)
            np.testing.assert_array_equal(new[l], np.isin(np.arange(row.size), np.arange(k, k + k_new[l])))
            np.testing.assert_array_equal(grown.Z[l, :i, :block.m.shape[1]], block.Z[l, :i])
        np.testing.assert_array_equal(grown.m, grown.Z.sum(axis=1))
        assert not grown.Z[:, i + 1:].any()
        block = grown


def test_conditional_probabilities_are_m_over_i():
    rng = np.random.default_rng(7)
    m = np.tile(np.array([[1, 3, 5, 0]]), (40000, 1))
    z, k_new = sample_ibp_conditional(m, 6, 1.5, rng)
    p = m[0] / 6
    se = np.sqrt(p * (1 - p) / m.shape[0]) + 1e-12
    assert np.all(np.abs(z.mean(axis=0) - p) < 4 * se)
    assert not z[:, 3].any()
    assert abs(k_new.mean() - 1.5 / 6) < 4 * np.sqrt(1.5 / 6 / m.shape[0])


def test_ibp_log_prob_sums_to_poisson_cdf():
    """sum over classes with K+ <= K of eq. 2 equals P(K+ <= K) = Poisson cdf with mean alpha H_N."""
    alpha, n_rows, cap = 1.3, 3, 9
    total = sum(np.exp(ibp_log_prob(Z, alpha)) for Z in enumerate_ibp_classes(n_rows, cap))
    assert total == pytest.approx(stats.poisson.cdf(cap, alpha * harmonic_number(n_rows)), rel=1e-10)


def test_sampler_class_frequencies_match_eq2():
    alpha, n_rows = 0.8, 3
    exact = exact_class_posterior(n_rows, 8, alpha, lambda Z: 0.0)
    draws = sample_ibp(n_rows, alpha, np.random.default_rng(3), size=40000)
    freq = class_distribution(draws.Z, np.full(40000, 1 / 40000))
    assert total_variation(exact, freq) < 0.03


def test_class_key_is_the_left_ordered_form():
    Z = np.array([[0, 1, 0, 1], [1, 1, 0, 0], [1, 0, 0, 1]], bool)
    order = left_order(Z)
    np.testing.assert_array_equal(order, [1, 3, 0])     # columns 011, 110, 000, 101 -> 110, 101, 011
    perm = Z[:, [2, 0, 3, 1]]
    assert class_key(perm) == class_key(Z) == class_key(Z[:, order])
    assert class_key(np.pad(Z, [(0, 0), (0, 2)])) == class_key(Z)
    assert class_key(Z[:, [0, 1]]) != class_key(Z[:, [0, 3]])
    assert class_key(Z[:, [0, 0, 1]]) != class_key(Z[:, [0, 1, 1]])


def test_class_keys_of_a_stack_sort_columns_like_python():
    """The batched keys and left orders against Python's sort of the column tuples, largest first."""
    rng = np.random.default_rng(4)
    Z = rng.random((60, 11, 5)) < rng.random((60, 1, 1))
    Z[::3, :, 1] = Z[::3, :, 3]                           # repeated columns
    for (key, order), Zg in zip(class_keys(Z), Z):
        cols = sorted((tuple(Zg[:, k]) for k in range(5) if Zg[:, k].any()), reverse=True)
        assert [tuple(Zg[:, k]) for k in order] == cols
        assert key == b"".join(np.packbits(np.array(c, bool)).tobytes() for c in cols) == class_key(Zg)


def test_ibp_log_prob_counts_repeated_columns():
    """Two identical columns: eq. 2 divides by K_h! = 2."""
    alpha = 1.7
    one = np.array([[1], [0]], bool)
    lp_two = ibp_log_prob(np.hstack([one, one]), alpha)
    direct = 2 * np.log(alpha) - np.log(2) - alpha * 1.5 + 2 * np.log(1 / 2)
    assert lp_two == pytest.approx(direct, rel=1e-12)


def test_new_feature_prior_is_poisson():
    np.testing.assert_allclose(new_feature_log_prior(50, 3.0, 6), stats.poisson.logpmf(np.arange(7), 3.0 / 50))


# --- synthetic data of the IBP experiments ---------------------------------------------------------

def test_image_data_is_paper_figure3_data():
    data = image_data(np.random.default_rng(0))
    assert data.X.shape == (100, 36) and data.Z.shape == (100, 4)
    np.testing.assert_array_equal(latent_images().sum(axis=1), [8, 8, 8, 8])
    assert len({row.tobytes() for row in latent_images()}) == 4
    resid = data.X - data.Z @ data.A
    assert abs(resid.std() - 0.5) < 0.02 and abs(data.Z.mean() - 0.5) < 0.05


def test_noisy_or_data_follows_the_model():
    rng = np.random.default_rng(1)
    params = NoisyORParams(0.1, 0.9, 0.01)
    data = noisy_or_data(rng, params=params)
    assert data.Z.shape == (6, 4) and data.Z.any(axis=0).all() and data.A.shape == (4, 250)
    assert abs(data.A.mean() - 0.1) < 0.03
    eta = data.Z.astype(int) @ data.A
    for level in (0, 1):
        rate = data.X[eta == level].mean()
        expected = 1 - (1 - params.eps) * (1 - params.lam) ** level
        assert abs(rate - expected) < 4 * np.sqrt(expected * (1 - expected) / (eta == level).sum()) + 1e-3


def test_error_metrics():
    Z = np.array([[1, 0], [1, 1], [0, 1]])
    zzt = Z @ Z.T
    assert zzt_error(zzt.astype(float), Z) == 0.0
    off = zzt.astype(float)
    off[0, 2] += 0.5
    off[2, 0] += 7.0                               # below the diagonal: not counted
    off[1, 1] -= 1.0
    assert zzt_error(off, Z) == pytest.approx(1.5)
    A = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert base_error(A, A[::-1]) == 0.0
    assert base_error(A, np.array([[1.0, 0.5], [9.0, 9.0]])) == pytest.approx((0.125 + 0.625) / 2)

"""Bayesian NMF kernels against plain references (paper 002, Secs. 11.3.1 and 11.5)."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import digamma, gammaln, logsumexp

from buffet.data.synthetic import bnmf_corpus
from buffet.kernels import bnmf


def _corpus(seed=0, n_docs=60, n_words=40, n_topics=4):
    rng = np.random.default_rng(seed)
    X = bnmf_corpus(n_docs, n_words, n_topics, rng, tokens_per_doc=30).X
    X = X.tolil()
    X[3, :] = 0  # empty documents must be handled, inside a chunk and at its end
    X[-2:, :] = 0
    return sp.csr_matrix(X), rng


def _globals(X, n_topics, rng):
    hyper = bnmf.Hyper.paper_defaults(X.shape[1], n_topics)
    g, h = bnmf.initial_globals(X.shape[1], n_topics, X.sum(), X.shape[0], hyper, rng)
    return hyper, g, h


def _squarem_reference(x0, x1, x2, floor):
    """SQUAREM S3 for one document (Varadhan and Roland 2008), with the kernel's safeguards."""
    r, v = x1 - x0, x2 - x1 - (x1 - x0)
    alpha = -np.linalg.norm(r) / np.linalg.norm(v) if np.linalg.norm(v) > 0 else -1.0
    alpha = min(alpha, -1.0)
    out = np.maximum(x0 - 2 * alpha * r + alpha ** 2 * v, bnmf.SQUAREM_SHRINK_LIMIT * x2)
    return np.where(out <= floor, x2, out)


def _per_document_reference(X, view, hyper, tol, max_sweeps, accelerate=False, share_tol=0.0, means=False):
    """The local step written as a plain loop over documents (no grouping, no padding); with
    ``accelerate`` every third sweep starts from the SQUAREM point of the two before; a document
    also stops once less than ``share_tol`` of its tokens change topic (half the total change); with ``means``
    the document's weights are the means a / rate (the MAP estimate's EM) instead of exp(E ln theta)."""
    n_docs, n_topics = X.shape[0], view.exp_elog_beta.shape[1]
    rate = hyper.b0 + view.beta_sum
    A = np.zeros((n_docs, n_topics))
    S = np.zeros_like(view.exp_elog_beta)
    for d in range(n_docs):
        idx = X.indices[X.indptr[d]:X.indptr[d + 1]]
        x = X.data[X.indptr[d]:X.indptr[d + 1]]
        a = hyper.a0 + np.full(n_topics, x.sum() / n_topics)
        if len(idx) == 0:
            A[d] = a
            continue
        B = view.exp_elog_beta[idx]
        history = []
        for sweep in range(1, max_sweeps + 1):
            t = (a if means else np.exp(digamma(a))) / rate
            phi = B @ t
            a_new = hyper.a0 + t * (B.T @ (x / phi))
            change = np.abs(a_new - a)
            if change.mean() < tol or change.sum() / 2 < share_tol * x.sum():
                a = a_new
                break
            history = [a, a_new] if sweep % 3 == 1 else history
            extrapolate = accelerate and sweep % 3 == 2
            a = _squarem_reference(*history, a_new, hyper.a0) if extrapolate else a_new
        A[d] = a
        S[idx] += B * t[None, :] * (x / phi)[:, None]
    return A, S


@pytest.mark.parametrize("means", [False, True])
@pytest.mark.parametrize("accelerate", [False, True])
@pytest.mark.parametrize("max_sweeps", [3, 200])
def test_vectorised_local_step_equals_per_document_loop(max_sweeps, accelerate, means):
    X, rng = _corpus()
    hyper, g, h = _globals(X, 4, rng)
    view = bnmf.TopicView.from_params(g, h, means=means)
    np.testing.assert_array_equal(view.exp_elog_beta, g / h if means else np.exp(digamma(g) - np.log(h)))
    res = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper,
                          bnmf.LocalSettings(1e-4, max_sweeps, accelerate, means=means))
    A, S = _per_document_reference(X, view, hyper, tol=1e-4, max_sweeps=max_sweeps, accelerate=accelerate,
                                   means=means)
    # Both run the same fixed-point sweeps, so they differ by rounding (<= 4e-12 here, SQUAREM steps
    # included), which the sweeps do not amplify. Unlike a line search, the only decision (stop when the
    # mean |change| < 1e-4) is made on numbers ~1e10 times their rounding: it falls the same way on any CPU.
    np.testing.assert_allclose(res.a, A, rtol=0, atol=1e-10)
    np.testing.assert_allclose(res.S, S, rtol=0, atol=1e-10)
    assert res.sweeps.max() <= max_sweeps
    # a_d = a0 + sum_v X_dv p^(vd): the statistics and the shapes come from the same p
    np.testing.assert_allclose(res.S.sum(), (res.a - hyper.a0).sum(), rtol=1e-10)


def test_share_tolerance_stops_each_document_when_few_of_its_tokens_move():
    """With an absolute tolerance no document meets, ``share_tol`` alone stops the documents, each at the first
    sweep where less than that share of its tokens changes topic (as the per-document loop says), long ones
    no later than they would stop by the share alone and sooner than by the cap."""
    X, rng = _corpus(seed=3, n_docs=50, n_words=60, n_topics=6)
    X = sp.vstack([X, 20 * X[:10]]).tocsr()  # long documents too: the same words, 20 times the counts
    hyper, g, h = _globals(X, 6, rng)
    view = bnmf.TopicView.from_params(g, h)
    settings = bnmf.LocalSettings(0.0, 300, share_tol=0.01)
    res = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper, settings)
    A, S = _per_document_reference(X, view, hyper, tol=0.0, max_sweeps=300, share_tol=0.01)
    np.testing.assert_allclose(res.a, A, rtol=0, atol=1e-10)
    np.testing.assert_allclose(res.S, S, rtol=0, atol=1e-10)
    capped = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper, bnmf.LocalSettings(0.0, 300))
    has_words = np.diff(X.indptr) > 0
    assert (capped.sweeps[has_words] == 300).all() and res.sweeps[has_words].max() < 60
    # each document stopped at the first sweep where fewer than 1% of its tokens moved: one sweep fewer
    # leaves a document that moved at least that share in its last sweep
    n_tokens = np.asarray(X.sum(axis=1)).ravel()
    for d in np.flatnonzero(has_words & (res.sweeps > 1))[:12]:
        row = X[d]
        before = bnmf.local_step(row.indptr, row.indices, row.data, view, hyper,
                                 bnmf.LocalSettings(0.0, int(res.sweeps[d]) - 2)).a[0] if res.sweeps[d] > 2 else \
            bnmf.initial_shapes(row.indptr, row.data, 6, hyper)[0]
        last = bnmf.local_step(row.indptr, row.indices, row.data, view, hyper,
                               bnmf.LocalSettings(0.0, int(res.sweeps[d]) - 1)).a[0]
        assert np.abs(last - before).sum() / 2 >= 0.01 * n_tokens[d]
        assert np.abs(res.a[d] - last).sum() / 2 < 0.01 * n_tokens[d]


def test_accelerated_sweeps_reach_a_fixed_point_in_fewer_sweeps():
    """SQUAREM changes the path, not the fixed-point equations: at a tight tolerance every
    accelerated document satisfies a = F(a) and needs fewer sweeps than plain iteration."""
    X, rng = _corpus(seed=6, n_docs=40, n_words=60, n_topics=8)
    hyper, g, h = _globals(X, 8, rng)
    view = bnmf.TopicView.from_params(g, h)
    plain = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper, bnmf.LocalSettings(1e-9, 2000))
    fast = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper, bnmf.LocalSettings(1e-9, 2000, True))
    assert fast.sweeps.max() < 2000 and fast.sweeps.sum() < 0.7 * plain.sweeps.sum()
    again = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper, bnmf.LocalSettings(0.0, 1), a_start=fast.a)
    np.testing.assert_allclose(again.a, fast.a, rtol=1e-6, atol=1e-7)


def test_small_groups_give_the_same_answer(monkeypatch):
    X, rng = _corpus(seed=1)
    hyper, g, h = _globals(X, 4, rng)
    view = bnmf.TopicView.from_params(g, h)
    big = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper)
    monkeypatch.setattr(bnmf, "GROUP_BYTES", 1)  # one document per group
    small = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper)
    np.testing.assert_allclose(big.a, small.a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(big.S, small.S, rtol=0, atol=1e-12)


def _bound_with_p(X, g, h, A, rate, hyper, P):
    """The ELBO with explicit auxiliary p (eq. 11.23) on a dense tiny problem."""
    elog_beta = digamma(g) - np.log(h)
    elog_theta = digamma(A) - np.log(rate)
    Xd = X.toarray()
    total = 0.0
    for d, v in zip(*np.nonzero(Xd)):
        p = P[(d, v)]
        total += Xd[d, v] * (p @ (elog_beta[v] + elog_theta[d]) - p @ np.log(p))
    total -= ((g / h).sum(axis=0) * (A / rate).sum(axis=0)).sum()
    total -= gammaln(Xd + 1).sum()
    total += bnmf.gamma_kl_terms(A, rate[None, :], hyper.a0, hyper.b0).sum()
    return total + bnmf.global_elbo(g, h, hyper)


def test_local_elbo_is_the_bound_at_the_optimal_p():
    X, rng = _corpus(seed=2, n_docs=8, n_words=10, n_topics=3)
    hyper, g, h = _globals(X, 3, rng)
    view = bnmf.TopicView.from_params(g, h)
    A = rng.gamma(2.0, 1.0, size=(X.shape[0], 3))
    rate = bnmf.theta_rate(view, hyper)
    elog = (digamma(g) - np.log(h))[None, :, :] + (digamma(A) - np.log(rate))[:, None, :]
    optimal = {(d, v): np.exp(elog[d, v] - logsumexp(elog[d, v])) for d, v in zip(*X.nonzero())}
    best = _bound_with_p(X, g, h, A, rate, hyper, optimal)
    got = bnmf.local_elbo(X.indptr, X.indices, X.data, view, hyper, A) + bnmf.global_elbo(g, h, hyper)
    assert got == pytest.approx(best, rel=1e-12)
    other = {key: rng.dirichlet(np.ones(3)) for key in optimal}
    assert _bound_with_p(X, g, h, A, rate, hyper, other) < best


def test_map_objective_is_the_log_posterior_density_at_the_means():
    """``map_local_objective`` + ``map_global_objective`` = ln p(X | beta, theta) + ln p(beta) + ln p(theta) with
    Poisson counts and the priors' shapes one larger, at beta = g / h and theta = a / rate, summed entry by
    entry."""
    from scipy.stats import gamma, poisson

    X, rng = _corpus(seed=2, n_docs=8, n_words=10, n_topics=3)
    hyper, g, h = _globals(X, 3, rng)
    view = bnmf.TopicView.from_params(g, h, means=True)
    A = rng.gamma(2.0, 1.0, size=(X.shape[0], 3))
    beta, theta = g / h, A / bnmf.theta_rate(view, hyper)
    counts = X.toarray()
    expected = (poisson.logpmf(counts, theta @ beta.T).sum()
                + gamma.logpdf(beta, hyper.c0 / hyper.n_words + 1, scale=1 / hyper.c0).sum()
                + gamma.logpdf(theta, hyper.a0 + 1, scale=1 / hyper.b0).sum())
    got = (bnmf.map_local_objective(X.indptr, X.indices, X.data, view, hyper, A)
           + bnmf.map_global_objective(g, h, hyper))
    assert got == pytest.approx(expected, rel=1e-12)


def _batch_run(X, n_topics, n_iter, seed=0, means=False):
    """Batch VB in memory with the kernels, recording the ELBO after every iteration; with ``means``, the MAP
    estimate's EM and its objective."""
    rng = np.random.default_rng(seed)
    hyper, g, h = _globals(X, n_topics, rng)
    local, topics = (bnmf.map_local_objective, bnmf.map_global_objective) if means else (bnmf.local_elbo,
                                                                                         bnmf.global_elbo)
    a, trace = None, []
    for _ in range(n_iter):
        view = bnmf.TopicView.from_params(g, h, means=means)
        if a is not None:
            trace.append(local(X.indptr, X.indices, X.data, view, hyper, a) + topics(g, h, hyper))
        res = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper, bnmf.LocalSettings(1e-6, 50, means=means),
                              a_start=a)
        a = res.a
        g, h = bnmf.batch_update(res.S, res.theta_sum, hyper)
    return np.array(trace), g, h


@pytest.mark.parametrize("means", [False, True])
def test_batch_objective_never_decreases(means):
    """The ELBO of batch VB, and the log posterior density of the MAP estimate's EM (``means``)."""
    X, _ = _corpus(seed=3, n_docs=80, n_words=50, n_topics=5)
    trace, _, _ = _batch_run(X, 5, 40, means=means)
    steps = np.diff(trace)
    assert (steps >= -1e-9 * np.abs(trace[1:])).all(), steps.min()
    assert trace[-1] > trace[0]


def test_svi_step_with_rho_one_on_the_whole_corpus_equals_a_batch_step():
    X, rng = _corpus(seed=4)
    hyper, g, h = _globals(X, 4, rng)
    view = bnmf.TopicView.from_params(g, h)
    res = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper)
    g_batch, h_batch = bnmf.batch_update(res.S, res.theta_sum, hyper)
    g_svi, h_svi = bnmf.stochastic_update(g, h, res.S, res.theta_sum, hyper, scale=1.0, rho=1.0)
    np.testing.assert_allclose(g_svi, g_batch, rtol=1e-15)
    np.testing.assert_allclose(h_svi, h_batch, rtol=1e-15)


def test_topic_tokens_are_the_tokens_the_local_step_gave_each_topic():
    """After a batch update, a topic's tokens (``topic_tokens``) are the sum over words of X_dv p_k^(vd): each
    topic's share of the corpus's tokens, summing to all of them."""
    X, rng = _corpus(seed=6)
    hyper, g, h = _globals(X, 4, rng)
    res = bnmf.local_step(X.indptr, X.indices, X.data, bnmf.TopicView.from_params(g, h), hyper)
    g_batch, h_batch = bnmf.batch_update(res.S, res.theta_sum, hyper)
    tokens = bnmf.topic_tokens(g_batch, hyper.c0)
    np.testing.assert_allclose(tokens, res.S.sum(axis=0), rtol=1e-10)
    np.testing.assert_allclose(tokens.sum(), X.sum(), rtol=1e-10)


def test_completion_loglik_matches_dense_computation():
    X, rng = _corpus(seed=5, n_docs=10, n_words=12, n_topics=3)
    hyper, g, h = _globals(X, 3, rng)
    view = bnmf.TopicView.from_params(g, h)
    folds = bnmf.split_thirds(X.data, rng)
    assert (folds.sum(axis=1) == X.data).all()
    observed, held = folds[:, 0] + folds[:, 1], folds[:, 2].astype(float)
    ll, n = bnmf.completion_loglik(X.indptr, X.indices, observed.astype(float), held, view, g / h, hyper,
                                   bnmf.LocalSettings(1e-6, 100))
    fit = bnmf.local_step(X.indptr, X.indices, observed.astype(float), view, hyper, bnmf.LocalSettings(1e-6, 100))
    theta = fit.a / bnmf.theta_rate(view, hyper)
    word_probs = theta @ (g / h).T
    word_probs /= word_probs.sum(axis=1, keepdims=True)
    H = sp.csr_matrix((held, X.indices, X.indptr), shape=X.shape).toarray()
    assert n == H.sum()
    assert ll == pytest.approx((H * np.log(np.where(H > 0, word_probs, 1.0))).sum(), rel=1e-10)


def test_step_size_schedule():
    assert bnmf.step_size(0, 1.0, 0.5) == 1.0
    assert bnmf.step_size(3, 1.0, 0.5) == pytest.approx(0.5)


def test_document_square_sum_is_the_sum_of_each_documents_own_statistics_squared():
    """sum_d |S^(d)|^2 against S^(d) computed one document at a time by the local step itself."""
    X, rng = _corpus(seed=4)
    hyper, g, h = _globals(X, 4, rng)
    view = bnmf.TopicView.from_params(g, h)
    whole = bnmf.local_step(X.indptr, X.indices, X.data, view, hyper, with_spread=True)
    expected = 0.0
    for d in range(X.shape[0]):
        row = X[d:d + 1]
        one = bnmf.local_step(row.indptr, row.indices, row.data, view, hyper)
        expected += float(np.sum(one.S ** 2))
    assert expected > 0
    assert whole.square_sum == pytest.approx(expected, rel=1e-12)
    assert bnmf.local_step(X.indptr, X.indices, X.data, view, hyper).square_sum == 0.0  # not asked for


def test_minibatch_noise_is_the_variance_of_the_scaled_sum_of_a_draw_without_replacement():
    """tr Var(scale S) for minibatches drawn without replacement from a corpus of 400 documents, a quarter at a
    time (as a pass draws them): the formula from one draw's sums against the spread of the estimate over many
    draws. Without the finite-population correction the formula is a third too large; a minibatch of the whole
    corpus has no noise."""
    rng = np.random.default_rng(8)
    population = rng.gamma(0.5, 2.0, (400, 6, 3))  # each document's statistics, 6 words x 3 topics
    size, scale = 100, 400 / 100
    estimates, noises = [], []
    for _ in range(4000):
        batch = population[rng.choice(400, size, replace=False)]
        S = batch.sum(axis=0)
        estimates.append(scale * S)
        noises.append(bnmf.minibatch_noise(S, float(np.sum(batch ** 2)), size, scale))
    spread = float(np.sum(np.var(np.array(estimates), axis=0)))
    assert np.mean(noises) == pytest.approx(spread, rel=0.05)
    assert bnmf.minibatch_noise(S, 1.0, 1.0, scale) == 0.0  # one document: no spread to measure
    whole = population.sum(axis=0)
    assert bnmf.minibatch_noise(whole, float(np.sum(population ** 2)), 400, 1.0) == 0.0


@pytest.mark.parametrize("distance, noise, floor, ceiling, expected", [
    (10.0, 2.0, 0.1, 1.0, 0.8),     # mostly signal: 1 - noise / distance
    (10.0, 9.9, 0.1, 1.0, 0.1),     # mostly noise: the schedule's floor
    (10.0, 20.0, 0.05, 1.0, 0.05),  # noise estimated above the distance: the floor
    (0.0, 0.0, 0.3, 1.0, 0.3),      # no gradient: the floor
    (10.0, 2.0, 0.1, 0.5, 0.5),     # mostly signal, held at the ceiling
    (10.0, 6.0, 0.1, 0.5, 0.4),     # inside the band: as without one
    (10.0, 2.0, 0.3, 0.2, 0.3),     # a ceiling below the floor: the floor
    (10.0, 2.0, 1.2, 1.5, 1.0),     # a floor above 1 (t0 < 1 at the first step): 1
])
def test_adaptive_step_size_is_one_minus_the_noise_share_within_the_floor_the_ceiling_and_one(
        distance, noise, floor, ceiling, expected):
    assert bnmf.adaptive_step_size(distance, noise, floor, ceiling) == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_topic_view_on_threads_is_the_same_bit_for_bit(dtype):
    rng = np.random.default_rng(4)
    g, h = rng.gamma(0.5, 2.0, (301, 7)) + 1e-3, rng.gamma(5.0, 1.0, (301, 7))
    one = bnmf.TopicView.from_params(g, h, dtype=dtype)
    single = dtype == np.float32  # float32 rounds the tiniest values to zero
    np.testing.assert_allclose(one.exp_elog_beta, np.exp(digamma(g) - np.log(h)), rtol=1e-6 if single else 1e-15,
                               atol=1e-37 if single else 0.0)
    for threads in (2, 3):
        many = bnmf.TopicView.from_params(g, h, dtype=dtype, threads=threads)
        assert many.exp_elog_beta.dtype == dtype
        np.testing.assert_array_equal(many.exp_elog_beta, one.exp_elog_beta)
        np.testing.assert_array_equal(many.beta_sum, one.beta_sum)


def test_stochastic_update_blends_the_batch_update_of_the_scaled_statistics():
    """Eqs. 11.33-11.34: (1 - rho) q + rho q_hat, q_hat the batch update of D/|C_t| times the statistics."""
    X, rng = _corpus(seed=2)
    hyper, g, h = _globals(X, 4, rng)
    S, theta_sum = rng.gamma(1.0, 1.0, g.shape), rng.gamma(1.0, 1.0, 4)
    for rho in (1.0, 0.37):
        g_hat, h_hat = bnmf.batch_update(25.0 * S, 25.0 * theta_sum, hyper)
        g_new, h_new = bnmf.stochastic_update(g, h, S, theta_sum, hyper, 25.0, rho)
        np.testing.assert_array_equal(g_new, (1 - rho) * g + rho * g_hat)
        np.testing.assert_array_equal(h_new, (1 - rho) * h + rho * h_hat)


@pytest.mark.parametrize("n_words, n", [(300, 10), (6, 10), (6, 0)])
def test_top_words_are_those_of_the_whole_sorted_topic_word_matrix(n_words, n):
    """One topic at a time, the words of the largest E[beta] first, as a full sort of the normalised K x V
    matrix gives them; rates per topic or per entry; equal means ordered by word id."""
    rng = np.random.default_rng(2)
    g, h = rng.gamma(1.0, size=(n_words, 4)), rng.gamma(2.0, size=4)
    g[[1, 4], 2] = g[0, 2] = g.max() + 1.0  # three equal best words in topic 2
    expected = [[f"w{v}" for v in row] for row in np.argsort(-bnmf.topic_word(g, h), axis=1, kind="stable")[:, :n]]
    assert bnmf.top_words(g, h, None, n) == expected
    assert bnmf.top_words(g, np.tile(h, (n_words, 1)), None, n) == expected
    vocab = [f"word{v}" for v in range(n_words)]
    assert bnmf.top_words(g, h, vocab, n)[2][:3] == ["word0", "word1", "word4"][:n]


def test_a_spread_start_draws_the_priors_part_around_the_same_mean():
    """With ``spread_prior`` each g_vk's prior part c0/V is c0/V times Uniform(0, 2): with almost no pseudo-counts
    (the noise's share) g / (c0/V) then has mean 1 and standard deviation 1/sqrt(3) over the entries, where
    without it every entry is c0/V; h is the same either way."""
    hyper = bnmf.Hyper.paper_defaults(400, 30)
    plain = bnmf.initial_globals(400, 30, 1e-9, 50, hyper, np.random.default_rng(0))
    spread = bnmf.initial_globals(400, 30, 1e-9, 50, hyper, np.random.default_rng(0), spread_prior=True)
    ratio = spread[0] / (hyper.c0 / 400)
    assert np.allclose(plain[0], hyper.c0 / 400) and np.array_equal(plain[1], spread[1])
    assert abs(ratio.mean() - 1.0) < 0.01 and abs(ratio.std() - 3 ** -0.5) < 0.01 and ratio.max() < 2.0

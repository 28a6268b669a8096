"""Bayesian NMF's SVI step in the touched words (``kernels.bnmf_sparse``) against the eager V x K step."""

import numpy as np
import pytest
import scipy.sparse as sp

from buffet.data.synthetic import bnmf_corpus
from buffet.kernels import bnmf, bnmf_sparse

# After t steps the lazy shapes and topic sums agree with the eager ones to about t x 1e-16, relatively
# (the kernel's docstring): every term is positive, so rounding does not cancel.
RTOL = 1e-12


def _globals(n_words: int, n_topics: int, seed: int = 0):
    hyper = bnmf.Hyper(c0=0.5 * n_words, a0=1.0 / n_topics, b0=1.0 / n_topics, n_words=n_words)
    g, h = bnmf.initial_globals(n_words, n_topics, 5000.0, 400, hyper, np.random.default_rng(seed))
    return hyper, g, h


def _eager_and_lazy(hyper, g, h, steps):
    """Both updates over ``steps`` of (words, S, theta_sum, scale, rho)."""
    lazy = bnmf_sparse.LazyTopics.of(g, h)
    for words, S, theta_sum, scale, rho in steps:
        dense = np.zeros_like(g)
        dense[words] = S
        g, h = bnmf.stochastic_update(g, h, dense, theta_sum, hyper, scale, rho)
        lazy.update(words, S, theta_sum, hyper, scale, rho)
    return (g, h), lazy


def _random_steps(rng, n_words, n_topics, rhos, rare=()):
    """Steps touching a random half of the words, never the ``rare`` ones."""
    common = np.setdiff1d(np.arange(n_words), rare)
    for rho in rhos:
        words = np.sort(rng.choice(common, size=len(common) // 2, replace=False))
        yield words, rng.gamma(0.3, 4.0, (len(words), n_topics)), rng.gamma(2.0, 10.0, n_topics), 7.5, rho


@pytest.mark.parametrize("rhos", [
    [bnmf.step_size(t, 1.0, 0.51) for t in range(40)],   # rho_0 = 1: every shape starts again from the prior
    [bnmf.step_size(t, 10.0, 0.6) for t in range(40)],
    [0.9] * 130,                                          # P falls below RESCALE_BELOW and is folded into E
])
def test_lazy_update_equals_the_eager_update_with_words_untouched_for_many_steps(rhos):
    n_words, n_topics = 60, 5
    hyper, g, h = _globals(n_words, n_topics)
    rare = np.arange(50, 60)
    rng = np.random.default_rng(1)
    steps = list(_random_steps(rng, n_words, n_topics, rhos, rare))
    steps.append((rare, rng.gamma(0.3, 4.0, (len(rare), n_topics)), np.ones(n_topics), 7.5, 0.3))
    (g_eager, h_eager), lazy = _eager_and_lazy(hyper, g, h, steps)
    np.testing.assert_allclose(lazy.shapes(), g_eager, rtol=RTOL, atol=0)
    np.testing.assert_allclose(lazy.shapes(np.array([3, 51])), g_eager[[3, 51]], rtol=RTOL, atol=0)
    np.testing.assert_array_equal(np.broadcast_to(lazy.rate, h_eager.shape), h_eager)
    np.testing.assert_allclose(lazy.mean_sums(), (g_eager / h_eager).sum(axis=0), rtol=RTOL, atol=0)
    view, eager_view = lazy.view(np.array([0, 51, 59])), bnmf.TopicView.from_params(g_eager, h_eager)
    np.testing.assert_allclose(view.exp_elog_beta, eager_view.exp_elog_beta[[0, 51, 59]], rtol=RTOL, atol=0)
    np.testing.assert_allclose(view.beta_sum, eager_view.beta_sum, rtol=RTOL, atol=0)


def test_words_never_touched_decay_towards_the_prior_shape():
    """A word no minibatch holds still moves: g - c0/V shrinks by (1 - rho) every step (eq. 11.33 with S = 0),
    and the topic sums the local steps read include that decay."""
    hyper, g, h = _globals(30, 3)
    prior = hyper.c0 / hyper.n_words
    lazy = bnmf_sparse.LazyTopics.of(g, h)
    rhos = [0.5, 0.2, 0.1]
    for rho in rhos:
        lazy.update(np.array([0]), np.full((1, 3), 4.0), np.ones(3), hyper, 10.0, rho)
    kept = np.prod([1 - rho for rho in rhos])
    np.testing.assert_allclose(lazy.shapes(np.arange(1, 30)), prior + kept * (g[1:] - prior), rtol=RTOL)
    assert (np.abs(lazy.shapes(np.arange(1, 30)) - g[1:]) > 0.1 * np.abs(g[1:] - prior)).all()
    decayed = np.vstack([lazy.shapes(np.array([0])), prior + kept * (g[1:] - prior)])
    np.testing.assert_allclose(lazy.mean_sums(), (decayed / lazy.rate).sum(axis=0), rtol=RTOL)


def test_a_fresh_state_is_its_shapes_digit_for_digit():
    hyper, g, h = _globals(20, 4)
    lazy = bnmf_sparse.LazyTopics.of(g, h)
    np.testing.assert_array_equal(lazy.shapes(), g)
    np.testing.assert_array_equal(lazy.view(np.arange(20)).exp_elog_beta, bnmf.TopicView.from_params(g, h).exp_elog_beta)
    g[0, 0] = -1.0  # the state owns a copy
    assert lazy.shapes()[0, 0] > 0


def test_block_statistics_in_their_own_words_merge_to_the_dense_sums_bit_for_bit():
    """A block's local step on its words' rows gives the rows of the dense statistics, and merging blocks in
    order gives the dense sum's rows: so the reduction does not depend on which words a block holds."""
    rng = np.random.default_rng(3)
    n_words, n_topics = 200, 4
    X = sp.csr_matrix(bnmf_corpus(90, n_words, n_topics, rng, tokens_per_doc=12).X)
    hyper, g, h = _globals(n_words, n_topics, seed=3)
    full = bnmf.TopicView.from_params(g, h)
    dense_total, sparse_total = np.zeros((n_words, n_topics)), None
    for lo, hi in ((0, 30), (30, 75), (75, 90)):
        rows = X[lo:hi]
        words, local = bnmf_sparse.block_words(rows.indices)
        assert len(words) < n_words
        view = bnmf_sparse.words_view(full, np.arange(n_words), words)
        part = bnmf.local_step(rows.indptr, local, rows.data, view, hyper)
        dense = bnmf.local_step(rows.indptr, rows.indices, rows.data, full, hyper)
        np.testing.assert_array_equal(part.a, dense.a)
        np.testing.assert_array_equal(part.S, dense.S[words])
        assert not dense.S[np.setdiff1d(np.arange(n_words), words)].any()
        stats = {bnmf_sparse.WORDS: words, "S": part.S, "docs": float(hi - lo)}
        dense_total = dense_total + dense.S
        sparse_total = stats if sparse_total is None else bnmf_sparse.add_word_stats(sparse_total, stats)
    np.testing.assert_array_equal(sparse_total["S"], dense_total[sparse_total[bnmf_sparse.WORDS]])
    assert sparse_total["docs"] == 90.0


def _state(lazy):
    return lazy.E.copy(), lazy.P, lazy.prior, lazy.column_sums.copy(), lazy.squares, lazy.rate.copy()


def test_a_mark_restores_the_topics_bit_for_bit_and_folded_topics_equal_fresh_ones():
    """``restore`` undoes the updates since ``mark`` (a fold among them); ``fold`` leaves the topics as ``of``
    makes them from their shapes, which is what a fit resumed from a checkpoint starts from."""
    hyper, g, h = _globals(40, 3)
    rng = np.random.default_rng(5)
    lazy = bnmf_sparse.LazyTopics.of(g, h)
    steps = list(_random_steps(rng, 40, 3, [0.6, 0.3, 0.2, 1.0, 0.4]))
    for step in steps[:2]:
        lazy.update(*step[:3], hyper, *step[3:])
    before = _state(lazy)
    mark = lazy.mark()
    for step in steps[2:]:   # rho = 1 folds
        lazy.update(*step[:3], hyper, *step[3:])
    assert not np.array_equal(lazy.E, before[0])
    restored = mark.restore()
    assert restored is lazy
    for now, then in zip(_state(restored), before):
        np.testing.assert_array_equal(now, then)
    shapes = lazy.shapes()
    lazy.fold()
    fresh = bnmf_sparse.LazyTopics.of(shapes, np.broadcast_to(lazy.rate, shapes.shape))
    assert lazy.P == fresh.P == 1.0
    np.testing.assert_array_equal(lazy.E, fresh.E)
    np.testing.assert_array_equal(lazy.column_sums, fresh.column_sums)
    np.testing.assert_array_equal(lazy.shapes(), shapes)


def _dense_distance(lazy, words, S, scale, prior):
    """|g_hat - g|^2 written out over the whole V x K shapes."""
    target = np.full(lazy.E.shape, prior)
    target[words] += scale * S
    return float(np.sum((target - lazy.shapes()) ** 2))


def test_distance_to_the_minibatch_estimate_equals_the_dense_one_through_updates_folds_and_marks():
    """``distance`` reads the untouched rows through the kept sum of squares of E: it must equal the V x K
    computation after lazy updates (P < 1), a fold (rho = 1) and a restore, or the step size drifts."""
    n_words, n_topics = 50, 3
    hyper, g, h = _globals(n_words, n_topics, seed=6)
    prior = hyper.c0 / hyper.n_words
    rng = np.random.default_rng(6)
    lazy = bnmf_sparse.LazyTopics.of(g, h)
    probes = list(_random_steps(rng, n_words, n_topics, [0.5] * 3))
    steps = list(_random_steps(rng, n_words, n_topics, [0.7, 0.4, 1.0, 0.3, 0.2, 0.25], rare=[0, 1, 2]))
    mark = None
    for i, step in enumerate(steps):
        for words, S, _, scale, _ in probes:
            assert lazy.distance(words, S, scale, prior) == pytest.approx(
                _dense_distance(lazy, words, S, scale, prior), rel=1e-10)
        if i == 4:
            mark = lazy.mark()
        lazy.update(step[0], step[1].copy(), step[2], hyper, step[3], step[4])
    assert lazy.P < 1.0
    words, S, _, scale, _ = probes[0]
    assert lazy.distance(words, S, scale, prior) == pytest.approx(_dense_distance(lazy, words, S, scale, prior),
                                                                  rel=1e-10)
    mark.restore()
    assert lazy.distance(words, S, scale, prior) == pytest.approx(_dense_distance(lazy, words, S, scale, prior),
                                                                  rel=1e-10)

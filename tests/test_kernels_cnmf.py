"""Correlated NMF kernels against plain references."""

from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import gammaln, logsumexp

from buffet.kernels import bnmf, cnmf

from helpers import cnmf_corpus


def _setup(seed=0, n_docs=40, n_words=30, n_topics=4, m=3):
    rng = np.random.default_rng(seed)
    X, _ = cnmf_corpus(n_docs, n_words, rng.normal(size=(n_topics, m)), rng)
    X = X.tolil()
    X[5, :] = 0  # an empty document
    X = sp.csr_matrix(X)
    hyper = bnmf.Hyper.paper_defaults(n_words, n_topics)
    g, h = bnmf.initial_globals(n_words, n_topics, X.sum(), n_docs, hyper, rng)
    prior = cnmf.Prior.with_dims(m)
    return X, hyper, g, h, cnmf.initial_topics(n_topics, prior, rng), prior, rng


def _doc(X, d):
    return X.indices[X.indptr[d]:X.indptr[d + 1]], X.data[X.indptr[d]:X.indptr[d + 1]]


def _doc_objective(x_idx, x, view, L, u):
    """f_d(u) for one document, written directly: alpha and p at their optima."""
    n = x.sum()
    lw = L @ u
    alpha = np.log(n) - logsumexp(lw, b=view.beta_sum) if n > 0 else -np.inf
    value = -0.5 * u @ u - 0.5 * len(u) * np.log(2 * np.pi) - gammaln(x + 1).sum()
    if n > 0:
        value += x @ logsumexp(np.log(view.exp_elog_beta[x_idx]) + alpha + lw, axis=1)
        value -= view.beta_sum @ np.exp(alpha + lw)
    return value


def _profiled_bound(x_idx, x, view, L, u, P):
    """The bound of eq. (11.23) at fixed p^(vd) (rows of P) with alpha at its optimum, as a function of u."""
    lw = L @ u
    n = x.sum()
    value = (x[:, None] * P * (np.log(view.exp_elog_beta[x_idx]) + lw - np.log(P))).sum() - 0.5 * u @ u
    return value - n * logsumexp(lw, b=view.beta_sum) if n > 0 else value


def _weights(x_idx, view, L, u):
    """p^(vd) (rows) and q_k propto B_k exp(l_k . u)."""
    lw = L @ u
    logit = np.log(view.exp_elog_beta[x_idx]) + lw
    q = view.beta_sum * np.exp(lw - lw.max())
    return np.exp(logit - logsumexp(logit, axis=1, keepdims=True)), q / q.sum()


def _cov(L, p):
    """Covariance of l_k under the weights p."""
    mean = p @ L
    return (L.T * p) @ L - np.outer(mean, mean)


def _reference_direction(x_idx, x, view, L, u, exact=True, overrelax=1.0):
    """Gradient and step direction of f_d at u, written per document in covariance form: with ``exact``, the
    Newton direction of the exact minus Hessian I + N Cov_q(l) - sum_v x_v Cov_{p_v}(l), or of the first of
    cnmf.EXACTNESS's fractions of the last term that leaves it positive definite; else ``overrelax`` times
    that of the bound's I + N Cov_q(l)."""
    P, q = _weights(x_idx, view, L, u)
    n = x.sum()
    grad = (x @ P - n * q) @ L - u
    bound = np.eye(len(u)) + n * _cov(L, q)
    if not exact:
        return grad, overrelax * np.linalg.solve(bound, grad)
    missing = sum((xv * _cov(L, pv) for xv, pv in zip(x, P)), np.zeros_like(bound))
    for c in cnmf.EXACTNESS:
        if np.linalg.eigvalsh(bound - c * missing).min() > 0:
            return grad, np.linalg.solve(bound - c * missing, grad)
    raise AssertionError("the bound's curvature is positive definite")


def _reference_local_step(X, view, L, settings):
    """The local step as a plain per-document loop: the bound's steps until one moves less than
    settings.exact_below, exact ones until one moves less than settings.tol. Returns u and the steps taken."""
    U, steps = np.zeros((X.shape[0], L.shape[1])), np.zeros(X.shape[0], dtype=int)
    for d in range(X.shape[0]):
        idx, x = _doc(X, d)
        u, exact = U[d], settings.exact_below == np.inf
        for _ in range(settings.max_steps):
            grad, step = _reference_direction(idx, x, view, L, u, exact, settings.overrelax)
            f0, size, new = _doc_objective(idx, x, view, L, u), 1.0, u
            flat = grad @ step <= cnmf.FLAT * max(1.0, abs(f0))
            for _ in range(settings.max_halvings + 1):
                if flat or _doc_objective(idx, x, view, L, u + size * step) >= f0 + cnmf.ARMIJO * size * grad @ step:
                    new = u + size * step
                    break
                size /= 2
            moved = np.abs(new - u).max()
            u = new
            steps[d] += 1
            if exact and moved < settings.tol:
                break
            exact = exact or moved < settings.exact_below
        U[d] = u
    return U, steps


@pytest.mark.parametrize("exact_below", [np.inf, cnmf.LocalSettings.exact_below])
def test_vectorised_local_step_equals_per_document_loop(exact_below):
    """Both solvers take the same steps, exact ones from the start (exact_below infinite) or the bound's first
    (the default), so they agree to rounding, u at atol = tol (measured difference here: 3e-15), and so must the
    steps each document took: the stopping tests cannot fall the other way on rounding, as quadratic steps near
    the optimum move from about 1e-6 to far below tol = 1e-10, and the steps there are taken whole (cnmf.FLAT),
    so rounding in f_d does not decide their size. The steps catch what u cannot: the bound's phase changes the
    path, not the end, so a kernel that skipped it or never left it would end at the same u in other numbers of
    steps (measured 5-7 exact steps per document, 6-10 with the bound's phase).

    The statistics are compared with the loop's formulas evaluated at the returned u (the kernel promises
    statistics of its returned locals), so they agree to rounding."""
    X, hyper, g, h, L, prior, _ = _setup()
    view = bnmf.TopicView.from_params(g, h)
    settings = cnmf.LocalSettings(tol=1e-10, max_steps=60, exact_below=exact_below)
    res = cnmf.local_step(X.indptr, X.indices, X.data, view, L, settings)
    U, steps = _reference_local_step(X, view, L, settings)
    np.testing.assert_allclose(res.u, U, rtol=0, atol=settings.tol)
    np.testing.assert_array_equal(res.steps, steps)
    # statistics from p^(vd) and w at the returned u
    lw = res.u @ L.T
    lengths = np.asarray(X.sum(axis=1)).ravel()
    with np.errstate(divide="ignore"):
        alpha = np.log(lengths) - logsumexp(lw, b=view.beta_sum, axis=1)
    np.testing.assert_allclose(res.alpha, alpha, rtol=0, atol=1e-10)
    W = np.exp(alpha[:, None] + lw)
    S, N = np.zeros_like(g), np.zeros_like(W)
    for d in range(X.shape[0]):
        idx, x = _doc(X, d)
        P = view.exp_elog_beta[idx] * W[d]
        P /= P.sum(axis=1, keepdims=True)
        S[idx] += x[:, None] * P
        N[d] = x @ P
    np.testing.assert_allclose(res.S, S, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.w_sum, W.sum(axis=0), rtol=1e-10)
    np.testing.assert_allclose(res.nu, N.T @ res.u, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.wu, W.T @ res.u, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.wuu, np.einsum("dk,dm,dj->kmj", W, res.u, res.u), rtol=1e-10, atol=1e-12)


def _docs(X, view, L):
    return cnmf.Docs.of(X.indptr, X.indices, X.data, view, L.shape[1])


def _second_differences(fun, u, eps):
    """Central second differences of ``fun`` at ``u``, step ``eps``."""
    steps = np.eye(len(u)) * eps
    return np.array([[(fun(u + a + b) - fun(u + a - b) - fun(u - a + b) + fun(u - a - b)) / (4 * eps * eps)
                      for b in steps] for a in steps])


def test_document_gradient_and_hessians_equal_finite_differences():
    """The gradient and the exact Hessian of f_d, and the curvature of the bound at fixed p^(vd) with alpha_d
    profiled out, against central differences, at random u_d where f_d is concave and where it is not."""
    X, hyper, g, h, L, prior, rng = _setup(seed=1)
    view = bnmf.TopicView.from_params(g, h)
    L = 2 * L  # where the exact Hessian is indefinite at some documents
    U = rng.normal(scale=1.0, size=(X.shape[0], L.shape[1]))
    docs = _docs(X, view, L)
    state = cnmf._doc_state(docs, view, L, U)
    grad = cnmf.doc_gradient(state, view, L, U)
    bound = cnmf.bound_precision(state, view, L)
    precision = cnmf.exact_precision(docs, state, view, L)  # minus the exact Hessian
    assert (np.linalg.eigvalsh(precision)[:, 0] < 0).any() and (np.linalg.eigvalsh(precision)[:, 0] > 0).any()
    # Central differences: step 1e-5 for the gradient (rounding |f| ulp / eps ~ 1e-9); 1e-4 for the second
    # differences, whose rounding |f| ulp / eps^2 would be ~1e-4 at 1e-5 (truncation ~1e-7 at 1e-4).
    eps, eps_h = 1e-5, 1e-4
    for d in range(12):
        idx, x = _doc(X, d)
        f = lambda u: _doc_objective(idx, x, view, L, u)  # noqa: E731
        np.testing.assert_allclose(state.f[d], f(U[d]), rtol=1e-12)
        fd = [(f(U[d] + e) - f(U[d] - e)) / (2 * eps) for e in np.eye(L.shape[1]) * eps]
        np.testing.assert_allclose(grad[d], fd, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(-precision[d], _second_differences(f, U[d], eps_h), rtol=1e-4, atol=1e-4)
        P, _ = _weights(idx, view, L, U[d])
        fixed = lambda u: _profiled_bound(idx, x, view, L, u, P)  # noqa: E731
        np.testing.assert_allclose(-bound[d], _second_differences(fixed, U[d], eps_h), rtol=1e-4, atol=1e-4)
    assert (np.linalg.eigvalsh(bound)[:, 0] >= 1 - 1e-12).all()  # I + N Cov_q(l)


def _fixed_p_bound(x_idx, x, view, L, u, alpha, P):
    """The bound of eq. (11.23) at fixed p^(vd) (rows of P) and alpha, as a function of u."""
    lw = alpha + L @ u
    return (x[:, None] * P * (np.log(view.exp_elog_beta[x_idx]) + lw - np.log(P))).sum() \
        - view.beta_sum @ np.exp(lw) - 0.5 * u @ u


def _global_objective(X, view, L, U, alpha, P_all, prior):
    """The bound at fixed p^(vd), u_d and alpha_d as a function of L (terms with L, plus constants)."""
    total = -0.5 * (L * L).sum() / prior.sigma2
    for d in range(X.shape[0]):
        if not np.isfinite(alpha[d]):
            continue
        idx, x = X.indices[X.indptr[d]:X.indptr[d + 1]], X.data[X.indptr[d]:X.indptr[d + 1]]
        total += _fixed_p_bound(idx, x, view, L, U[d], alpha[d], P_all[d]) + 0.5 * U[d] @ U[d]
    return total


def test_topic_gradient_equals_finite_differences_and_batch_step_ascends():
    X, hyper, g, h, L, prior, rng = _setup(seed=2)
    view = bnmf.TopicView.from_params(g, h)
    res = cnmf.local_step(X.indptr, X.indices, X.data, view, L, cnmf.LocalSettings(1e-6, 20))
    P_all = []
    for d in range(X.shape[0]):
        idx = X.indices[X.indptr[d]:X.indptr[d + 1]]
        P = view.exp_elog_beta[idx] * np.exp(L @ res.u[d])
        P_all.append(P / P.sum(axis=1, keepdims=True))
    objective = lambda M: _global_objective(X, view, M, res.u, res.alpha, P_all, prior)  # noqa: E731
    direction, grad = cnmf.topic_direction(L, res.statistics(), view.beta_sum, prior)
    eps = 1e-6
    for k, j in [(0, 0), (1, 2), (3, 1)]:
        E = np.zeros_like(L)
        E[k, j] = eps
        np.testing.assert_allclose(grad[k, j], (objective(L + E) - objective(L - E)) / (2 * eps), rtol=1e-6, atol=1e-5)
    sums = cnmf.candidate_exp_sums(res.u, res.alpha, L, direction)
    new = cnmf.batch_topic_step(L, res.statistics(), direction, grad, sums, view.beta_sum, prior)
    assert objective(new) > objective(L)
    # with a scale of 1 and rho = 1 the stochastic step is the full Newton step
    np.testing.assert_allclose(cnmf.stochastic_topic_step(L, res.statistics(), view.beta_sum, prior, 1.0, 1.0), L + direction)


def test_step_directions_equal_the_per_document_reference():
    """Each document's direction is the reference's: the exact Newton direction (or a fraction of the missing
    information) where the mask says exact, overrelax times the bound's Newton direction elsewhere, at points
    where many exact Hessians are indefinite (a planted bug that dropped the over-relaxation, or gave the bound's
    documents the exact directions, fails here)."""
    X, hyper, g, h, L, prior, rng = _setup(seed=5)
    view = bnmf.TopicView.from_params(g, h)
    L = 3 * L
    U = rng.normal(size=(X.shape[0], L.shape[1]))
    docs = _docs(X, view, L)
    state = cnmf._doc_state(docs, view, L, U)
    grad = cnmf.doc_gradient(state, view, L, U)
    exact = rng.random(X.shape[0]) < 0.5
    got = cnmf.step_directions(docs, state, view, L, grad, exact, 1.7)
    indefinite = 0
    for d in range(X.shape[0]):
        idx, x = _doc(X, d)
        ref_grad, ref = _reference_direction(idx, x, view, L, U[d], exact[d], 1.7)
        np.testing.assert_allclose(grad[d], ref_grad, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got[d], ref, rtol=1e-8, atol=1e-10)
        precision = cnmf.exact_precision(docs, state, view, L, np.array([d]))
        indefinite += exact[d] and not cnmf.positive_definite(precision)[0]
    assert indefinite >= 3 and (~exact).sum() >= 10


def test_each_newton_step_does_not_decrease_the_document_objective():
    """Every step rises by the Armijo condition, except the steps taken whole where f_d cannot resolve
    the rise (cnmf.FLAT): those may lower f_d by its rounding (measured: at most 4 ulp), allowed here as
    1e-14 |f_d|."""
    X, hyper, g, h, L, prior, rng = _setup(seed=3)
    view = bnmf.TopicView.from_params(g, h)
    L = 3 * L  # large steps and indefinite Hessians, so the line search and the fallbacks have work to do
    U = rng.normal(size=(X.shape[0], L.shape[1]))
    docs, rises = _docs(X, view, L), []
    exact = np.arange(X.shape[0]) % 2 == 0  # half the documents take the bound's over-relaxed steps
    for _ in range(8):
        state = cnmf._doc_state(docs, view, L, U)
        U, returned = cnmf.newton_step(docs, view, L, U, state, exact, cnmf.LocalSettings())
        recomputed = cnmf._doc_state(docs, view, L, U)  # the returned state is put together from the trials'
        for name in ("f", "scaled", "phi", "ratio", "w", "n"):
            np.testing.assert_array_equal(getattr(returned, name), getattr(recomputed, name), err_msg=name)
        after = recomputed.f
        assert (after >= state.f - 1e-14 * np.abs(state.f)).all()
        rises.append(after - state.f)
    assert (rises[0] > 1e-3).sum() >= 30


def _iterates(X, view, L, n_steps):
    """u after 1, ..., n_steps exact Newton steps of every document (no bound's phase: exact_below infinite),
    one ``local_step`` of one step at a time (a step depends on u only, so this is the path of a single run)."""
    path, u = [], None
    for _ in range(n_steps):
        u = cnmf.local_step(X.indptr, X.indices, X.data, view, L, cnmf.LocalSettings(0.0, 1, exact_below=np.inf),
                            u_start=u, with_stats=False).u
        path.append(u)
    return path


def test_local_newton_steps_converge_quadratically(monkeypatch):
    """Per document, the error e_t = |u_t - u*| (max norm; u* after 40 steps) of the local steps falls as
    e_{t+1} <= 20 e_t^2 once below 0.1 (measured: at most 5.0 e_t^2, over 87 steps) and reaches 1e-9 in 5-9
    steps. Newton steps with the bound's curvature at fixed p^(vd) alone (EXACTNESS = (0,): the steps
    before this change, with alpha_d profiled) converge linearly: after 12 steps their median error is
    still 2e-3 (measured)."""
    rng = np.random.default_rng(7)
    X, beta = cnmf_corpus(30, 40, rng.normal(size=(6, 4)), rng, length=120)
    view = bnmf.TopicView.from_params(0.05 + 500 * beta, np.full_like(beta, 500.0))
    L = cnmf.initial_topics(6, cnmf.Prior.with_dims(4), rng) * 3
    exact = _iterates(X, view, L, 40)
    errors = np.array([np.abs(u - exact[-1]).max(axis=1) for u in exact])  # (steps, docs)
    now, after = errors[:-1], errors[1:]
    close = (now < 0.1) & (now > 1e-7)  # below 1e-7 the next error is rounding
    assert close.sum() >= 30
    assert (after[close] <= 20 * now[close] ** 2).all(), (after[close] / now[close] ** 2).max()
    to_1e9 = (errors < 1e-9).argmax(axis=0) + 1
    assert np.median(to_1e9) <= 8 and to_1e9.max() <= 12, to_1e9

    monkeypatch.setattr(cnmf, "EXACTNESS", (0.0,))
    linear = _iterates(X, view, L, 12)
    assert np.median(np.abs(linear[-1] - exact[-1]).max(axis=1)) > 1e-4


def _batch_objectives(X, n_topics, m, n_iter, seed=0, settings=cnmf.LocalSettings(1e-4, 30)):
    """Batch inference in memory with the kernels; the objective F after every iteration."""
    rng = np.random.default_rng(seed)
    hyper = bnmf.Hyper.paper_defaults(X.shape[1], n_topics)
    prior = cnmf.Prior.with_dims(m)
    g, h = bnmf.initial_globals(X.shape[1], n_topics, X.sum(), X.shape[0], hyper, rng)
    L, U, trace = cnmf.initial_topics(n_topics, prior, rng), None, []
    for _ in range(n_iter):
        res = cnmf.local_step(X.indptr, X.indices, X.data, bnmf.TopicView.from_params(g, h), L, settings, U)
        U = res.u
        g, h = bnmf.batch_update(res.S, res.w_sum, hyper)
        beta_sum = (g / h).sum(axis=0)
        direction, grad = cnmf.topic_direction(L, res.statistics(), beta_sum, prior)
        sums = cnmf.candidate_exp_sums(U, res.alpha, L, direction)
        L = cnmf.batch_topic_step(L, res.statistics(), direction, grad, sums, beta_sum, prior)
        view = bnmf.TopicView.from_params(g, h)
        trace.append(cnmf.local_objective(X.indptr, X.indices, X.data, view, L, U)
                     + cnmf.topic_prior(L, prior) + bnmf.global_elbo(g, h, hyper))
    return np.array(trace), g, h, L


def test_batch_objective_never_decreases():
    rng = np.random.default_rng(4)
    X, _ = cnmf_corpus(120, 40, rng.normal(size=(4, 3)), rng)
    trace, _, _, _ = _batch_objectives(X, 4, 3, 25)
    assert (np.diff(trace) >= -1e-9 * np.abs(trace[1:])).all(), np.diff(trace).min()
    assert trace[-1] > trace[0]


def test_batch_recovers_topics_and_the_sign_of_correlations():
    """Four topics in two strongly correlated pairs (true corr 0.96 within, -0.96 to -1 across)."""
    rng = np.random.default_rng(5)
    true_L = np.array([[2.0, 0.0], [1.8, 0.5], [-2.0, 0.0], [-1.8, -0.5]])
    X, beta = cnmf_corpus(600, 60, true_L, rng, length=50)
    _, g, h, L = _batch_objectives(X, 4, 2, 40)
    t, ell = beta / np.linalg.norm(beta, axis=0), (g / h) / np.linalg.norm(g / h, axis=0)
    cos = t.T @ ell
    match = cos.argmax(axis=1)
    assert len(set(match)) == 4 and cos.max(axis=1).mean() >= 0.9, cos.max(axis=1)
    corr = cnmf.correlation(L)[np.ix_(match, match)]
    assert corr[0, 1] > 0 and corr[2, 3] > 0 and corr[0, 2] < 0 and corr[1, 3] < 0, corr


def test_completion_scores_held_thirds_with_the_fitted_weights():
    X, hyper, g, h, L, prior, rng = _setup(seed=6)
    view = bnmf.TopicView.from_params(g, h)
    settings = cnmf.LocalSettings(1e-8, 60)
    ll, tokens = cnmf.threefold_completion(X.indptr, X.indices, X.data, view, g / h, L, settings,
                                           np.random.default_rng(0))
    folds = bnmf.split_thirds(X.data, np.random.default_rng(0)).astype(float)
    expected = 0.0
    for f in range(3):
        observed = folds.sum(axis=1) - folds[:, f]
        U = cnmf.local_step(X.indptr, X.indices, observed, view, L, settings, with_stats=False).u
        probs = np.exp(U @ L.T) @ (g / h).T
        probs /= probs.sum(axis=1, keepdims=True)
        H = sp.csr_matrix((folds[:, f], X.indices, X.indptr), shape=X.shape).toarray()
        expected += (H * np.log(np.where(H > 0, probs, 1.0))).sum()
    assert tokens == X.data.sum()
    np.testing.assert_allclose(ll, expected, rtol=1e-10)


def _loop_half_the_documents(monkeypatch, X, n_topics):
    """Set cnmf.LOOP_ENTRIES so that about half of the documents of X sum phi by their own product."""
    monkeypatch.setattr(cnmf, "LOOP_ENTRIES", int(np.median(np.diff(X.indptr))) * n_topics)


def test_word_sums_are_the_same_per_document_or_shared(monkeypatch):
    """phi_v, the ratios X_dv / phi_v and their sums over the words' rows, against plain sums, for documents
    summed by their own products, by the shared ones, and a mix."""
    X, hyper, g, h, L, prior, rng = _setup(seed=10)
    view = bnmf.TopicView.from_params(g, h)
    docs, scaled = _docs(X, view, L), rng.random((X.shape[0], L.shape[0]))
    expected = np.array([view.exp_elog_beta[X.indices[i]] @ scaled[d]
                         for d in range(X.shape[0]) for i in range(X.indptr[d], X.indptr[d + 1])])
    for entries in (0, None, 10**9):  # every document by its own product, about half, none
        if entries is None:
            _loop_half_the_documents(monkeypatch, X, L.shape[0])
        else:
            monkeypatch.setattr(cnmf, "LOOP_ENTRIES", entries)
        phi, ratio, sums = cnmf.word_sums(docs, scaled)
        np.testing.assert_allclose(phi, expected, rtol=1e-14)
        np.testing.assert_allclose(ratio, X.data / expected, rtol=1e-14)
        ratios = sp.csr_matrix((X.data / expected, X.indices, X.indptr), shape=X.shape)
        np.testing.assert_allclose(sums, ratios @ view.exp_elog_beta, rtol=1e-13)


def test_locations_do_not_depend_on_how_the_documents_are_grouped(monkeypatch):
    """u_d and the steps taken are the same bit for bit whether a document is fitted in one chunk, in a chunk
    cut elsewhere, or in slices of another size (the engine's chunking and workers must not change fits), with
    some documents summing phi by their own product and some by the shared one (``cnmf.word_sums``)."""
    X, hyper, g, h, L, prior, _ = _setup(seed=8, n_docs=60)
    view = bnmf.TopicView.from_params(g, h)
    settings = cnmf.LocalSettings(1e-6, 30)
    _loop_half_the_documents(monkeypatch, X, L.shape[0])
    whole = cnmf.local_step(X.indptr, X.indices, X.data, view, 2 * L, settings, with_stats=False)
    monkeypatch.setattr(cnmf, "SLICE_DOCS", 7)
    parts = [cnmf.local_step(Y.indptr, Y.indices, Y.data, view, 2 * L, settings, with_stats=False)
             for Y in (X[:13], X[13:50], X[50:])]
    assert np.array_equal(whole.u, np.concatenate([p.u for p in parts]))
    assert np.array_equal(whole.steps, np.concatenate([p.steps for p in parts]))


def test_word_information_is_the_same_through_locations_or_topics():
    """The two orders of the product behind the exact Hessian's last term agree, and each shape takes the one
    with fewer flops: at 30 words, K = 100 and m = 50 through the locations (225 against 1,050 kflop);
    K = 20, m = 50 through the topics (82 against 105 kflop)."""
    rng = np.random.default_rng(9)
    for K, m, cheaper in ((100, 50, cnmf._information_through_locations), (20, 50, cnmf._information_through_topics)):
        words, scaled, weight, L = rng.random((30, K)), rng.random(K), rng.random(30), rng.normal(size=(K, m))
        through_locations = cnmf._information_through_locations(words, scaled, weight, L)
        np.testing.assert_allclose(cnmf._information_through_topics(words, scaled, weight, L), through_locations,
                                   rtol=1e-12, atol=1e-12 * np.abs(through_locations).max())
        np.testing.assert_array_equal(cnmf.word_information(words, scaled, weight, L),
                                      cheaper(words, scaled, weight, L))


def test_the_words_term_in_single_precision_is_the_double_one_to_its_rounding():
    """With ``docs.single`` the words' term's product through the locations is formed in single precision: it
    differs from the double one (so the single path runs) by its rounding, about 1e-7 of the term; through the
    topics (K small beside m) it stays in double; and a local step to tolerance 0.01 with it ends where the double
    one does, to within the tolerance's square."""
    rng = np.random.default_rng(11)
    X, beta = cnmf_corpus(60, 200, rng.normal(size=(30, 8)), rng, length=150)
    view = bnmf.TopicView.from_params(0.05 + 500 * beta, np.full_like(beta, 500.0))
    L = cnmf.initial_topics(30, cnmf.Prior.with_dims(8), rng) * 2
    docs = _docs(X, view, L)
    single = replace(docs, single=docs.table.astype(np.float32))
    U = rng.normal(size=(X.shape[0], 8))
    state = cnmf._doc_state(docs, view, L, U)
    which = np.arange(X.shape[0])
    double, rounded = cnmf.word_informations(docs, state, L, which), cnmf.word_informations(single, state, L, which)
    scale = np.abs(double).max(axis=(1, 2))
    gap = np.abs(rounded - double).max(axis=(1, 2)) / scale
    assert (gap > 1e-12).all() and gap.max() < 1e-5, (gap.min(), gap.max())
    wide = cnmf_corpus(20, 200, rng.normal(size=(4, 20)), rng, length=150)[0]
    L4 = cnmf.initial_topics(4, cnmf.Prior.with_dims(20), rng)
    hyper = bnmf.Hyper.paper_defaults(200, 4)
    view4 = bnmf.TopicView.from_params(*bnmf.initial_globals(200, 4, wide.sum(), 20, hyper, rng))
    wide_docs = _docs(wide, view4, L4)
    wide_state = cnmf._doc_state(wide_docs, view4, L4, rng.normal(size=(20, 20)))
    np.testing.assert_array_equal(
        cnmf.word_informations(replace(wide_docs, single=wide_docs.table.astype(np.float32)), wide_state, L4,
                               np.arange(20)), cnmf.word_informations(wide_docs, wide_state, L4, np.arange(20)))
    fits = [cnmf.local_step(X.indptr, X.indices, X.data, view, L, cnmf.LocalSettings(1e-2, 50, single_words=flag),
                            with_stats=False).u for flag in (False, True)]
    assert 0 < np.abs(fits[0] - fits[1]).max() < 1e-4
    assert cnmf.single_words_suffice(1e-2) and not cnmf.single_words_suffice(1e-6)

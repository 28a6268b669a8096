"""Correlated NMF kernels against plain references (SPEC 3.6)."""

import numpy as np
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


def _fixed_p_bound(x_idx, x, view, L, u, alpha, P):
    """The bound of eq. (11.23) at fixed p^(vd) (rows of P) and alpha, as a function of u."""
    lw = alpha + L @ u
    return (x[:, None] * P * (np.log(view.exp_elog_beta[x_idx]) + lw - np.log(P))).sum() \
        - view.beta_sum @ np.exp(lw) - 0.5 * u @ u


def _reference_local_step(X, view, L, settings):
    """The local step as a plain per-document loop."""
    U = np.zeros((X.shape[0], L.shape[1]))
    for d in range(X.shape[0]):
        idx, x = X.indices[X.indptr[d]:X.indptr[d + 1]], X.data[X.indptr[d]:X.indptr[d + 1]]
        u = U[d]
        for _ in range(settings.max_steps):
            n = x.sum()
            lw = L @ u
            w = n * np.exp(lw - logsumexp(lw, b=view.beta_sum)) if n > 0 else np.zeros(len(L))
            logit = np.log(view.exp_elog_beta[idx]) + lw
            P = np.exp(logit - logsumexp(logit, axis=1, keepdims=True))
            n_k = x @ P
            grad = (n_k - view.beta_sum * w) @ L - u
            H = (L.T * (view.beta_sum * w)) @ L + np.eye(len(u))
            step = np.linalg.solve(H, grad)
            f0, size, new = _doc_objective(idx, x, view, L, u), 1.0, u
            for _ in range(settings.max_halvings + 1):
                if _doc_objective(idx, x, view, L, u + size * step) >= f0 + cnmf.ARMIJO * size * grad @ step:
                    new = u + size * step
                    break
                size /= 2
            moved = np.abs(new - u).max()
            u = new
            if moved < settings.tol:
                break
        U[d] = u
    return U


def test_vectorised_local_step_equals_per_document_loop():
    """Both solvers take the same Newton steps, so they agree to rounding except where a stopping test
    (step moved < tol) falls the other way on rounding; then one of them has taken one more step, and that
    step moved less than tol. So u is compared at atol = tol (measured difference here: 3e-15).

    tol must stay above what the Armijo line search can resolve: near the optimum a step of size s
    raises f_d (~ -70 here) by ~ H s^2 (H ~ 40), which falls to a few ulps of f_d (~1e-14) at
    s ~ 5e-8; below that, whether a step is accepted or halved is decided by rounding, and at tol = 1e-8
    the two solvers stopped 1.9e-8 apart on another CPU. At tol = 1e-6 the last steps still gain
    ~1e-11, a thousand times the rounding of f_d. max_steps = 60 leaves most documents mid-path, so the
    comparison follows their Newton iterates step by step.

    The statistics are compared with the loop's formulas evaluated at the returned u (the kernel promises
    statistics of its returned locals), so they agree to rounding."""
    X, hyper, g, h, L, prior, _ = _setup()
    view = bnmf.TopicView.from_params(g, h)
    settings = cnmf.LocalSettings(tol=1e-6, max_steps=60)
    res = cnmf.local_step(X.indptr, X.indices, X.data, view, L, settings)
    U = _reference_local_step(X, view, L, settings)
    np.testing.assert_allclose(res.u, U, rtol=0, atol=settings.tol)
    # statistics from p^(vd) and w at the returned u
    lw = res.u @ L.T
    lengths = np.asarray(X.sum(axis=1)).ravel()
    with np.errstate(divide="ignore"):
        alpha = np.log(lengths) - logsumexp(lw, b=view.beta_sum, axis=1)
    np.testing.assert_allclose(res.alpha, alpha, rtol=0, atol=1e-10)
    W = np.exp(alpha[:, None] + lw)
    S, N = np.zeros_like(g), np.zeros_like(W)
    for d in range(X.shape[0]):
        idx, x = X.indices[X.indptr[d]:X.indptr[d + 1]], X.data[X.indptr[d]:X.indptr[d + 1]]
        P = view.exp_elog_beta[idx] * W[d]
        P /= P.sum(axis=1, keepdims=True)
        S[idx] += x[:, None] * P
        N[d] = x @ P
    np.testing.assert_allclose(res.S, S, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.w_sum, W.sum(axis=0), rtol=1e-10)
    np.testing.assert_allclose(res.nu, N.T @ res.u, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.wu, W.T @ res.u, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.wuu, np.einsum("dk,dm,dj->kmj", W, res.u, res.u), rtol=1e-10, atol=1e-12)


def test_document_gradient_and_hessian_equal_finite_differences():
    X, hyper, g, h, L, prior, rng = _setup(seed=1)
    view = bnmf.TopicView.from_params(g, h)
    U = rng.normal(scale=0.5, size=(X.shape[0], L.shape[1]))
    state = cnmf._doc_state(X.indptr, X.indices, X.data, view, L, U)
    grad = cnmf.doc_gradient(state, view, L, U)
    precision = cnmf.doc_precision(state, view, L)
    alpha = cnmf.alpha_of(X.indptr, X.data, view, L, U)
    # Central differences: step 1e-5 for the gradient (rounding |f| ulp / eps ~ 1e-9); 1e-4 for the second
    # differences of the Hessian, whose rounding |f| ulp / eps^2 would be ~1e-4 at 1e-5 (truncation ~1e-7 at 1e-4).
    eps, eps_h = 1e-5, 1e-4
    for d in (0, 3, 5, 17):
        idx, x = X.indices[X.indptr[d]:X.indptr[d + 1]], X.data[X.indptr[d]:X.indptr[d + 1]]
        np.testing.assert_allclose(state.f[d], _doc_objective(idx, x, view, L, U[d]), rtol=1e-12)
        basis = np.eye(L.shape[1]) * eps
        fd = [(_doc_objective(idx, x, view, L, U[d] + e) - _doc_objective(idx, x, view, L, U[d] - e)) / (2 * eps)
              for e in basis]
        np.testing.assert_allclose(grad[d], fd, rtol=1e-6, atol=1e-6)
        # the Hessian is that of the bound at fixed p^(vd) and alpha_d (its gradient is the same at u_d)
        P = view.exp_elog_beta[idx] * np.exp(L @ U[d])
        P /= P.sum(axis=1, keepdims=True)
        bound = lambda u: _fixed_p_bound(idx, x, view, L, u, alpha[d] if x.sum() > 0 else -np.inf, P)  # noqa: E731
        steps = np.eye(L.shape[1]) * eps_h
        hess = np.array([[(bound(U[d] + a + b) - bound(U[d] + a - b) - bound(U[d] - a + b) + bound(U[d] - a - b))
                          / (4 * eps_h * eps_h) for b in steps] for a in steps])
        np.testing.assert_allclose(-precision[d], hess, rtol=1e-4, atol=1e-4)


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


def test_each_newton_step_does_not_decrease_the_document_objective():
    X, hyper, g, h, L, prior, rng = _setup(seed=3)
    view = bnmf.TopicView.from_params(g, h)
    L = 3 * L  # large steps, so the line search has work to do
    U = rng.normal(size=(X.shape[0], L.shape[1]))
    for _ in range(8):
        state = cnmf._doc_state(X.indptr, X.indices, X.data, view, L, U)
        U, f_new = cnmf.newton_step(X.indptr, X.indices, X.data, view, L, U, state, 30)
        after = cnmf._doc_state(X.indptr, X.indices, X.data, view, L, U).f
        np.testing.assert_allclose(after, f_new, rtol=1e-12)
        assert (after >= state.f).all()


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

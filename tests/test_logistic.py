"""The small L2 logistic regression of kernels/logistic.py against scikit-learn's, and its cross-validation."""

import numpy as np
from scipy.optimize import check_grad
from sklearn.linear_model import LogisticRegression

from buffet.kernels import logistic


def labelled(seed: int = 0, n: int = 80, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = (X @ np.array([1.5, -1.0, 0.0, 0.5])[:d] + 0.3 + rng.standard_normal(n) > 0).astype(np.float64)
    return X, y


def test_gradient_matches_finite_differences():
    X, y = labelled()
    point = np.array([0.3, -0.2, 0.1, 0.4, -0.5])
    error = check_grad(lambda p: logistic.penalised_loss(p, X, y, 2.0)[0],
                       lambda p: logistic.penalised_loss(p, X, y, 2.0)[1], point)
    assert error < 1e-5


def test_fit_matches_scikit_learn_with_an_unpenalised_intercept():
    X, y = labelled()
    for l2 in (0.5, 4.0):
        params = logistic.fit_logistic(X, y, l2)
        reference = LogisticRegression(C=1.0 / l2, tol=1e-10, max_iter=10_000).fit(X, y)
        np.testing.assert_allclose(params[:-1], reference.coef_[0], atol=1e-4)
        np.testing.assert_allclose(params[-1], reference.intercept_[0], atol=1e-4)


def test_folds_are_stratified_and_scores_never_see_their_own_labels():
    X, y = labelled(n=72)
    folds = logistic.stratified_folds(y, 6, np.random.default_rng(1))
    for fold in range(6):
        assert abs(y[folds == fold].sum() - y.sum() / 6) <= 1 and (folds == fold).sum() == 12
    scores = logistic.cross_validated_scores(X, y, folds, 1.0)
    flipped = y.copy()
    flipped[folds == 0] = 1 - flipped[folds == 0]
    again = logistic.cross_validated_scores(X, flipped, folds, 1.0)
    np.testing.assert_array_equal(scores[folds == 0], again[folds == 0])
    assert not np.allclose(scores[folds != 0], again[folds != 0])
    assert np.all((scores > 0) & (scores < 1))

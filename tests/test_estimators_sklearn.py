"""scikit-learn's estimator checks on every estimator, small and fast settings.

The checks fit on scikit-learn's own random data: real values, mostly in [0, 1) and some negative.
The count models (Bayesian and correlated NMF) accept only non-negative integer counts and the noisy-OR
models only 0/1 data (anything else is refused with a one-line error), so every check that fits
such data fails for them before it tests anything; each is listed below with the reason and the exception it
raises, as a strict xfail, and the properties those checks test are tested on valid data at the end. Estimators
with ``predict`` (IMF, INMF, BinaryMF) predict every entry of a row, an n x D matrix, where the sparse
checks expect one value per row. The same list is in the README ("Using it from Python").

One check is left out rather than run: ``check_array_api_input`` tests scikit-learn's array-API
dispatch, which buffet does not use, and it runs only with ``SCIPY_ARRAY_API`` set before SciPy is
imported, a switch that would change SciPy for the whole suite; otherwise scikit-learn skips it.
"""

import pickle
from functools import partial

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.utils.estimator_checks import estimator_checks_generator

from buffet.data.errors import InputError

from helpers import FAST

COUNTS_ONLY = "fits scikit-learn's real-valued data; count models take only non-negative integer counts"
BINARY_ONLY = "fits scikit-learn's real-valued data; noisy-OR models take only 0/1 data"
# Checks that fit the real-valued data themselves: the refusal (an InputError) is what they meet.
DATA_CHECKS = (
    "check_fit_score_takes_y", "check_estimators_overwrite_params", "check_dont_overwrite_parameters",
    "check_estimators_fit_returns_self", "check_readonly_memmap_input", "check_n_features_in_after_fitting",
    "check_estimators_dtypes", "check_dtype_object", "check_pipeline_consistency",
    "check_estimators_pickle", "check_f_contiguous_array_estimator", "check_transformer_data_not_an_array",
    "check_transformer_general", "check_transformer_preserve_dtypes", "check_methods_sample_order_invariance",
    "check_methods_subset_invariance", "check_dict_unchanged", "check_fit_idempotent", "check_fit_check_is_fitted",
    "check_n_features_in", "check_fit2d_predict1d",
)
# Checks that expect a failure with scikit-learn's own wording: the check asserts on the message and fails.
MESSAGE_CHECKS = ("check_estimator_sparse_tag", "check_estimator_sparse_array", "check_estimator_sparse_matrix",
                  "check_fit2d_1sample", "check_fit2d_1feature")
POSITIVE_MESSAGE = ("check_positive_only_tag_during_fit",
                    "expects the words 'Negative values in data'; the refusal names the first bad value, here "
                    "a non-integer (or non-0/1) one")
MATRIX_PREDICT = "predict gives every entry of a row (n x D); the check expects one value per row"


def _refusals(reason: str) -> dict[str, tuple[str, type[Exception]]]:
    """The expected failures of a model that refuses scikit-learn's real-valued data, with their exceptions."""
    return {**dict.fromkeys(DATA_CHECKS, (reason, InputError)),
            **dict.fromkeys(MESSAGE_CHECKS, (reason, AssertionError)),
            POSITIVE_MESSAGE[0]: (POSITIVE_MESSAGE[1], AssertionError)}


EXPECTED = {
    "counts": {**_refusals(COUNTS_ONLY), **dict.fromkeys(("check_transformer_n_iter", "check_estimators_nan_inf"),
                                                         (COUNTS_ONLY, InputError))},
    "binary": _refusals(BINARY_ONLY),
    "predict": dict.fromkeys(("check_estimator_sparse_array", "check_estimator_sparse_matrix"),
                             (MATRIX_PREDICT, AssertionError)),
}


def _expected_failures(estimator) -> dict[str, tuple[str, type[Exception]]]:
    kind = FAST[type(estimator).__name__][1]
    if kind in ("counts", "binary"):
        return EXPECTED[kind]
    return EXPECTED["predict"] if hasattr(estimator, "predict") else {}


LEFT_OUT = {"check_array_api_input"}


def _function_name(check) -> str:
    while isinstance(check, partial):
        check = check.func
    return check.__name__


def _check_name(case) -> str:
    """The name of the check function in a generated (estimator, check) pair."""
    return _function_name(case[1])


def _cases() -> list:
    """scikit-learn's checks for every estimator, ``LEFT_OUT`` dropped."""
    return [pytest.param(*case) for make, _ in FAST.values() for case in estimator_checks_generator(make())
            if _check_name(case) not in LEFT_OUT]


@pytest.mark.parametrize("estimator, check", _cases(),
                         ids=lambda value: _function_name(value) if callable(value) else type(value).__name__)
def test_scikit_learn_checks(estimator, check):
    """An expected failure must fail with its own exception and is then reported as an xfail with its reason,
    so a check that starts passing, or fails otherwise, fails. (The test raises it rather than marking the case
    ``xfail(strict=True, raises=...)``: pytest would then format the check's whole traceback, deep in
    scikit-learn, for every one of them, a quarter of this module's time.)"""
    expected = _expected_failures(estimator).get(_function_name(check))
    if expected is None:
        check(estimator)
        return
    reason, error = expected
    with pytest.raises(error):
        check(estimator)
    pytest.xfail(reason)


def _fitted_signature(model) -> np.ndarray:
    """What a fit leaves that pins it down: the topic-word matrix, or the posterior E[ZZ^T]."""
    return model.components_ if hasattr(model, "g_") else model.zzt_


def _read_only_copy(X, folder):
    """``X`` (dense) as a read-only memory map of a file, as scikit-learn's read-only check gives it."""
    np.save(folder / "X.npy", X.toarray() if sp.issparse(X) else X)
    return np.load(folder / "X.npy", mmap_mode="r")


@pytest.mark.parametrize("name", ["BayesianNMF", "CorrelatedNMF", "NoisyORParticleFilter", "NoisyORGibbs"])
def test_checks_refused_above_hold_on_valid_data(name, data, tmp_path):
    """What scikit-learn's pickling, idempotent-fit, read-only-input, subset- and order-invariance checks test,
    on the counts or 0/1 data these models take: a pickled model transforms as the original, a second fit on
    the same data gives the same model, a fit on a read-only memory map gives the same model, and ``transform``
    of a subset of rows or of the rows reordered is the same subset or reordering of ``transform`` of all."""
    make, kind = FAST[name]
    X = data[kind][0]
    model = make().fit(X)
    signature, out = _fitted_signature(model), model.transform(X)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(model)).transform(X), out)
    np.testing.assert_array_equal(_fitted_signature(model.fit(X)), signature)
    np.testing.assert_array_equal(model.transform(X), out)
    read_only = _read_only_copy(X, tmp_path)
    np.testing.assert_array_equal(_fitted_signature(make().fit(read_only)), signature)
    np.testing.assert_array_equal(model.transform(read_only), out)
    order = np.random.default_rng(0).permutation(X.shape[0])
    np.testing.assert_allclose(model.transform(X[order]), out[order], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.transform(X[order[:3]]), out[order[:3]], rtol=1e-10, atol=1e-12)

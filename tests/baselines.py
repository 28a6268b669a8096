"""Scores of guesses that learn nothing, computed by the tests from the data they fit, so that a quality bound
is set against them rather than against a number copied from a run: a model that learned nothing scores about
as well as these, and the bounds ask for a margin past them.

* ``unigram_heldout_loglik``: the held-out documents' tokens scored by the training documents' word frequencies
  (a topic model with no topics), per word, as ``buffet evaluate`` reports a topic model's held-out score;
* ``constant_zzt_error`` (``buffet.kernels.metrics``): the ZZ^T error of the best constant guess of E[ZZ^T];
* ``shared_feature_zzt_error``: the ZZ^T error of "every row has the same one feature" (E[ZZ^T] all ones);
* ``prior_zzt_error``: the ZZ^T error of the IBP(alpha) prior's E[ZZ^T], what a sampler or filter whose
  weights never looked at the data would estimate.
"""

from __future__ import annotations

import numpy as np

from buffet.data.store import Dataset
from buffet.kernels.metrics import constant_zzt_error, zzt_error

__all__ = ["constant_zzt_error", "prior_zzt_error", "shared_feature_zzt_error", "unigram_heldout_loglik"]


def unigram_heldout_loglik(path: str, split: str = "heldout", smoothing: float = 0.5) -> float:
    """Per-word log likelihood of the held-out rows' counts (the split's ``test_rows``) under the word
    frequencies of the other rows, with ``smoothing`` added to every word's count."""
    ds = Dataset(path)
    X = ds.read_rows(0, ds.n_rows).to_scipy()
    test = np.zeros(ds.n_rows, bool)
    test[ds.split(split)["test_rows"]] = True
    counts = np.asarray(X[~test].sum(axis=0)).ravel() + smoothing
    held = np.asarray(X[test].sum(axis=0)).ravel()
    return float(held @ np.log(counts / counts.sum()) / held.sum())


def shared_feature_zzt_error(Z: np.ndarray) -> float:
    """ZZ^T error of E[ZZ^T] = 1 everywhere: every row holding the same single feature."""
    return zzt_error(np.ones((len(Z), len(Z))), Z)


def prior_zzt_error(Z: np.ndarray, alpha: float) -> float:
    """ZZ^T error of E[ZZ^T] under the IBP(alpha) prior: a row holds Poisson(alpha) features, alpha on the
    diagonal, and two rows share alpha / 2 features on average (the second customer takes each of the first
    one's dishes with probability 1/2), alpha / 2 off it."""
    guess = np.full((len(Z), len(Z)), alpha / 2)
    np.fill_diagonal(guess, alpha)
    return zzt_error(guess, Z)

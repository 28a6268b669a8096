"""kernels.metrics: the rank-sum AUC against its definition, and the average ranks against SciPy's."""

import numpy as np
import pytest
from scipy.stats import rankdata

from buffet.kernels.metrics import auc, average_ranks


@pytest.mark.parametrize("n", [1, 2, 7, 500])
def test_average_ranks_match_scipy_with_and_without_ties(n):
    rng = np.random.default_rng(n)
    for values in (rng.integers(0, 4, n).astype(float), rng.normal(size=n)):
        np.testing.assert_array_equal(average_ranks(values), rankdata(values))


def test_auc_is_the_share_of_correctly_ordered_pairs_ties_counting_half():
    rng = np.random.default_rng(3)
    scores, labels = rng.integers(0, 6, 300).astype(float), rng.integers(0, 2, 300)
    pos, neg = scores[labels == 1], scores[labels == 0]
    by_pairs = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert auc(scores, labels) == pytest.approx(by_pairs, abs=1e-12)
    assert np.isnan(auc(scores, np.ones(300)))

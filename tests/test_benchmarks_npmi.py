"""The topic coherence the benchmarks report (``benchmarks/common.py``'s ``topic_npmi``), against NPMI worked
out by hand on four documents."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import topic_npmi  # noqa: E402

# documents x words (5 words): d0 = {0, 1}, d1 = {0, 1, 2} (word 1 twice), d2 = {2}, d3 = {0, 3}
DOCS = sp.csr_matrix(np.array([[1, 1, 0, 0, 0], [3, 2, 1, 0, 0], [0, 0, 4, 0, 0], [1, 0, 0, 1, 0]], dtype=float))


def test_npmi_matches_hand_computed_pairs():
    # p0 = 3/4, p1 = p2 = 1/2, p3 = 1/4; p01 = 1/2, p02 = p12 = 1/4, p13 = p23 = 0
    npmi_01 = math.log(0.5 / (0.75 * 0.5)) / -math.log(0.5)  # log(4/3) / log 2
    npmi_02 = math.log(0.25 / (0.75 * 0.5)) / -math.log(0.25)  # log(2/3) / log 4
    npmi_12 = 0.0  # p12 = p1 p2: independent
    got = topic_npmi(np.array([[0, 1, 2], [1, 3, 2]]), DOCS)
    assert got[0] == pytest.approx((npmi_01 + npmi_02 + npmi_12) / 3)
    assert got[1] == pytest.approx((-1.0 + npmi_12 - 1.0) / 3)  # pairs (1, 3) and (3, 2) never meet


def test_npmi_of_words_in_every_document_is_one_and_counts_ignore_repeats():
    docs = sp.csr_matrix(np.array([[2, 1, 0, 1, 0], [1, 5, 0, 0, 0]], dtype=float))
    assert topic_npmi(np.array([[0, 1]]), docs)[0] == pytest.approx(1.0)
    assert topic_npmi(np.array([[0, 4]]), docs)[0] == pytest.approx(-1.0)  # word 4 is in no document

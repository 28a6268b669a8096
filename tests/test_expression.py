"""Expression preprocessing (data/expression.py) against element-by-element references written with loops,
on tables with missing (NaN) cells."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from buffet.data import expression
from buffet.data.errors import InputError


def levels_with_gaps(seed: int = 3, shape: tuple[int, int] = (9, 7)) -> np.ndarray:
    """Affymetrix-like levels (negatives included) with a few NaN cells and one all-NaN row."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.lognormal(6.0, 1.5, size=shape)) - 150.0
    x[rng.random(shape) < 0.15] = np.nan
    x[4] = np.nan
    return x


def observed(line: list[float]) -> list[float]:
    return [v for v in line if not math.isnan(v)]


def same(a: np.ndarray, b: np.ndarray) -> None:
    """Equal up to rounding, with NaN exactly where the other has NaN."""
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-12, atol=1e-12)


def test_clip_levels_matches_a_loop_and_keeps_nan() -> None:
    x = levels_with_gaps()
    want = np.empty_like(x)
    for i, row in enumerate(x):
        for j, v in enumerate(row):
            want[i, j] = v if math.isnan(v) else min(max(v, 100.0), 16000.0)
    same(expression.clip_levels(x, 100.0, 16000.0), want)
    same(expression.clip_levels(x, floor=100.0), np.where(x < 100.0, 100.0, x))
    with pytest.raises(InputError, match="floor 5.0 is above ceiling 1.0"):
        expression.clip_levels(x, 5.0, 1.0)


def test_row_filters_match_loops() -> None:
    x = expression.clip_levels(levels_with_gaps(), 100.0, 16000.0)
    fold, spread = [], []
    for row in x.tolist():
        seen = observed(row)
        fold.append(bool(seen) and max(seen) / min(seen) > 5.0)
        spread.append(bool(seen) and max(seen) - min(seen) > 500.0)
    np.testing.assert_array_equal(expression.fold_change_rows(x, 5.0), fold)
    np.testing.assert_array_equal(expression.range_rows(x, 500.0), spread)
    assert not expression.fold_change_rows(x, 5.0)[4] and 0 < sum(fold) < x.shape[0]


def test_fold_change_refuses_non_positive_levels() -> None:
    with pytest.raises(InputError, match="row 1 has a value <= 0.*floor the levels"):
        expression.fold_change_rows(np.array([[1.0, 2.0], [np.nan, -3.0]]), 5.0)


@pytest.mark.parametrize("base,log", [("2", math.log2), ("10", math.log10), ("e", math.log)])
def test_log_levels_matches_math_log(base: str, log) -> None:
    x = expression.clip_levels(levels_with_gaps(), floor=100.0)
    want = np.array([[v if math.isnan(v) else log(v) for v in row] for row in x.tolist()])
    same(expression.log_levels(x, base), want)


def test_log_levels_refuses_bad_input() -> None:
    with pytest.raises(InputError, match="values <= 0"):
        expression.log_levels(np.array([[1.0, 0.0]]))
    with pytest.raises(InputError, match="unknown log base '3'"):
        expression.log_levels(np.array([[1.0]]), "3")


def loop_centre(x: np.ndarray, along: str, statistic: str) -> np.ndarray:
    """Subtract each line's mean or median, computed from a sorted list of its observed values."""
    lines = x.tolist() if along == "row" else x.T.tolist()
    out = []
    for line in lines:
        seen = sorted(observed(line))
        if not seen:
            out.append(line)
            continue
        n = len(seen)
        if statistic == "mean":
            middle = sum(seen) / n
        else:
            middle = seen[n // 2] if n % 2 else (seen[n // 2 - 1] + seen[n // 2]) / 2
        out.append([v - middle for v in line])
    out = np.array(out)
    return out if along == "row" else out.T


@pytest.mark.parametrize("along", ["row", "column"])
@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_centre_matches_a_loop(along: str, statistic: str) -> None:
    x = levels_with_gaps()
    got = expression.centre(x, along, statistic)
    same(got, loop_centre(x, along, statistic))


def test_scale_matches_a_loop_and_refuses_constant_lines() -> None:
    x = levels_with_gaps()
    kept = x[~np.all(np.isnan(x), axis=1)]
    for along in ("row", "column"):
        lines = kept.tolist() if along == "row" else kept.T.tolist()
        out = []
        for line in lines:
            seen = observed(line)
            mean = sum(seen) / len(seen)
            sd = math.sqrt(sum((v - mean) ** 2 for v in seen) / (len(seen) - 1))
            out.append([v / sd for v in line])
        want = np.array(out) if along == "row" else np.array(out).T
        same(expression.scale(kept, along), want)
    with pytest.raises(InputError, match="row 1 has fewer than two distinct observed values"):
        expression.scale(np.array([[1.0, 2.0], [3.0, 3.0]]), "row")
    with pytest.raises(InputError, match="unknown direction 'rows'"):
        expression.scale(kept, "rows")


def test_standard_affymetrix_composes_the_steps_and_records_them() -> None:
    x = levels_with_gaps(seed=11, shape=(40, 8)) * 4.0
    applied = expression.Applied()
    out, keep = expression.standard_affymetrix(x, applied)
    clipped = expression.clip_levels(x, 100.0, 16000.0)
    want_keep = expression.fold_change_rows(clipped, 5.0) & expression.range_rows(clipped, 500.0)
    np.testing.assert_array_equal(keep, want_keep)
    assert 0 < keep.sum() < keep.size
    same(out, np.log10(clipped[keep]))
    attrs = applied.as_attrs()
    assert json.loads(json.dumps(attrs)) == attrs
    assert [step["step"] for step in attrs["preprocessing"]] == ["clip", "filter_rows", "log"]
    assert attrs["preprocessing"][1]["kept"] == int(keep.sum())

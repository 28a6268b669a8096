"""The particle-filter reproductions' --quick versions: tables and PNGs written, errors against guesses
that use no data; and the curve comparison."""

import numpy as np
import pytest

from buffet.data.ibp_synthetic import image_data, noisy_or_data
from buffet.pipeline.experiments.particles import PF, Point, comparison_rows, error_at, time_to_reach
from buffet.pipeline.registry import run_experiment

from baselines import constant_zzt_error, prior_zzt_error
from helpers import read_csv

GIBBS = [Point("Gibbs", s, (t,), (e,)) for s, t, e in [(1, 1.0, 100.0), (10, 10.0, 50.0), (100, 100.0, 10.0)]]


def test_time_to_reach_and_error_at_interpolate_the_gibbs_curve_in_log_time():
    assert time_to_reach(GIBBS, 75.0) == ("=", pytest.approx(10 ** 0.5))
    assert time_to_reach(GIBBS, 200.0) == ("<=", 1.0)
    assert time_to_reach(GIBBS, 5.0) == (">", 100.0)
    assert error_at(GIBBS, 10 ** 1.5) == pytest.approx(30.0)
    assert error_at(GIBBS, 0.5) is None


def test_comparison_says_whether_the_filter_is_ten_times_faster():
    pf = [Point("particle filter", 100, (0.5,), (50.0,)), Point("particle filter", 1000, (5.0,), (40.0,))]
    rows = comparison_rows(pf, GIBBS)
    assert rows[0][4:8] == ["20x", "yes", "no Gibbs result this fast", ""]
    assert rows[1][5] == "no" and rows[1][7] == "yes"


def _errors(name: str, stem: str, out) -> dict[tuple[str, int], float]:
    """Run the quick reproduction (2 runs per point), check its files; mean error by (method, setting)."""
    files = run_experiment(name, out, 2, True)
    assert {f.name for f in files} == {f"{stem}.md", f"{stem}.png", f"{stem}.csv"}
    table = (out / f"{stem}.md").read_text()
    assert "| particle filter | 10 |" in table and "| Gibbs | 5 |" in table and ">= 10x faster?" in table
    assert (out / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
    rows = read_csv(out / f"{stem}.csv")
    assert all(r["runs"] == "2" for r in rows)
    return {(r["method"], int(r["setting"])): float(r["error mean"]) for r in rows}


def test_quick_pf_images_errors_are_below_guesses_without_data(tmp_path):
    """30 rows of the four images (the experiment's data): Gibbs (20 sweeps) finds Z Z^T far better than the best
    constant guess (223). The filters (no resample-move, as in the paper) use the data, so they come well below
    the IBP(1) prior's E[ZZ^T] (alpha on the diagonal, alpha / 2 off it: 299.5), which is what a filter whose weights
    ignored the rows would estimate; on 30 rows with at most 100 particles they do not beat the best constant
    (measured 218, 250, 220 for P = 1, 10, 100; P = 1000 gives 135-170). Measured Gibbs: 189, 139, 34 for 2, 5,
    20 sweeps."""
    errors = _errors("pf-images", "pf_images", tmp_path)
    Z = image_data(np.random.default_rng(0), n_rows=30, noise_sd=0.5).Z
    best, prior = constant_zzt_error(Z), prior_zzt_error(Z, alpha=1.0)
    assert errors[("Gibbs", 20)] < 0.3 * best, (errors, best)
    assert all(errors[(PF, p)] < 0.9 * prior for p in (1, 10, 100)), (errors, prior)


def test_quick_pf_noisy_or_errors_are_below_the_best_constant_guess(tmp_path):
    """Noisy-OR data (Z 6 x 4): with 50 particles the filter's E[ZZ^T] is well below the best constant guess
    (10; E[ZZ^T] = 0 gives 40), and 20 Gibbs sweeps too. Measured: filter 21.0, 11.0, 1.48 for P = 1, 10,
    50; Gibbs 0.75, 0.40, 0.11 for 2, 5, 20 sweeps."""
    errors = _errors("pf-noisy-or", "pf_noisy_or", tmp_path)
    best = constant_zzt_error(noisy_or_data(np.random.default_rng(0)).Z)
    assert errors[(PF, 50)] < 0.5 * best and errors[("Gibbs", 20)] < 0.2 * best, (errors, best)


def test_quick_ibp_speed_errors_are_below_a_featureless_guess(tmp_path):
    """Base error of E[A] on 20 rows of four random images with eight ones each: IMF and INMF come below the
    best constant image (a base of 8/36 everywhere: 0.173) and Gibbs (20 sweeps) below an all-zero base
    (0.222). The filter's most probable class on 20 rows is often wrong (measured 0.206 and 0.236 for
    P = 10 and 50, the paper's "PF fluctuates heavily"), so only its presence is checked. VFMF and TVIMF
    (T = 4 and 6, one start each) come below an all-zero base too. Measured: IMF 0.118, INMF 0.140, Gibbs
    0.153; VFMF 0.102 and 0.119, TVIMF 0.112 and 0.116."""
    errors = _errors("ibp-speed", "ibp_speed", tmp_path)
    ones = 8 / 36
    assert errors[("IMF", 0)] < ones * (1 - ones) and errors[("INMF", 0)] < ones * (1 - ones), errors
    assert errors[("Gibbs", 20)] < ones, errors
    assert np.isfinite([errors[(PF, 10)], errors[(PF, 50)]]).all()
    assert all(errors[(m, t)] < ones for m in ("VFMF", "TVIMF") for t in (4, 6)), errors


def test_pf_images_takes_the_filters_proposal_as_an_option(tmp_path):
    run_experiment("pf-images", tmp_path, 1, True, {"proposal": "guided"})
    assert "the filter's proposal: guided" in (tmp_path / "pf_images.md").read_text()

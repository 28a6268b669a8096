"""The particle-filter reproductions' --quick versions (issue 4: tables and PNGs written), and the curve comparison."""

import pytest

from buffet.pipeline.experiments.registry import run_experiment
from buffet.pipeline.experiments.particles import Point, comparison_rows, error_at, time_to_reach

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


@pytest.mark.parametrize("name, stem", [("pf-images", "pf_images"), ("pf-noisy-or", "pf_noisy_or"),
                                        ("ibp-speed", "ibp_speed")])
def test_quick_reproduction_writes_its_table_and_figure(tmp_path, name, stem):
    files = run_experiment(name, tmp_path, 2, True)
    assert {f.name for f in files} == {f"{stem}.md", f"{stem}.png", f"{stem}.csv"}
    table = (tmp_path / f"{stem}.md").read_text()
    assert "| particle filter | 10 |" in table and "| Gibbs | 5 |" in table
    assert ">= 10x faster?" in table
    assert (tmp_path / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / f"{stem}.csv").read_text().startswith("method,setting,runs")


def test_pf_images_takes_the_filters_proposal_as_an_option(tmp_path):
    run_experiment("pf-images", tmp_path, 1, True, {"proposal": "guided"})
    assert "the filter's proposal: guided" in (tmp_path / "pf_images.md").read_text()

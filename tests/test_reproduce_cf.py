"""`buffet reproduce collaborative-filtering --jester FILE` (paper 000, Sec. 4.2) on
Jester-layout files the tests write: count column, then 100 joke columns, 99 = unrated."""

import csv
from pathlib import Path

import numpy as np
import pytest

from buffet.pipeline.cli import main
from buffet.pipeline.engine.seeds import stream
from buffet.pipeline.experiments import collaborative_filtering as cf
from buffet.pipeline.experiments.common import method_family

from helpers import read_csv


def write_jester(path: Path, n_users: int = 60, n_jokes: int = 100, seed: int = 0) -> np.ndarray:
    """A Jester-layout CSV of low-rank ratings in [-10, 10] (2 decimals), each user rating min(50, n_jokes)..n_jokes jokes;
    returns the ratings table with 99 where unrated."""
    rng = np.random.default_rng(seed)
    ratings = np.clip(rng.normal(0, 2, (n_users, 2)) @ rng.normal(0, 2, (2, n_jokes))
                      + rng.normal(0, 1, (n_users, n_jokes)), -10, 10).round(2)
    for row in ratings:
        row[rng.permutation(n_jokes)[:n_jokes - rng.integers(min(50, n_jokes), n_jokes + 1)]] = 99.0
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        for row in ratings:
            writer.writerow([int((row != 99).sum()), *(f"{v:g}" for v in row)])
    return ratings


def test_quick_jester_reproduction_learns_the_low_rank_ratings(tmp_path, capsys):
    """The file's ratings are rank 2 with signed factors plus noise of sd 1 (NMAE floor ~0.04): IMF and the
    SVD must predict held-out ratings far better than the best constant (the training median, 0.182 NMAE;
    the biases can do no better here, 0.183); INMF, whose features are nonnegative, still better than it.
    Measured (repeat 0): SVD 0.116, NMF 0.120, IMF 0.127, INMF 0.166."""
    jester = tmp_path / "jester-data-1.csv"
    write_jester(jester)
    out = tmp_path / "out"
    assert main(["reproduce", "collaborative-filtering", "--jester", str(jester), "--out", str(out), "--seeds", "1",
                 "--quick"]) == 0
    nmae = {method_family(r["method"]): float(r["NMAE"])
            for r in read_csv(out / "collaborative_filtering_repeats.csv")}
    assert nmae.keys() == {"User + item biases", "SVD (item-mean fill)", "NMF (masked)", "IMF", "INMF"}
    data = cf.load_jester(jester, tmp_path / "work", cf.Settings.of(True).n_users)
    x, observed = data.repeat(0)
    test = cf.per_user_holdout(observed, stream(0, "cf-test"), data.held_out, data.held_out_divisor)
    constant = np.abs(x[test] - np.median(x[observed & ~test])).mean() / data.value_range
    for method in ("IMF", "SVD (item-mean fill)", "NMF (masked)"):
        assert nmae[method] < 0.8 * constant, (constant, nmae)
    assert nmae["INMF"] < constant, (constant, nmae)
    report = (out / "collaborative_filtering.md").read_text()
    assert "Jester file jester-data-1.csv: 60 users" in report and "MAE / 20" in report
    assert (out / "collaborative_filtering_nmae.png").read_bytes()[:4] == b"\x89PNG"
    assert "paper" in capsys.readouterr().out


def run_cli_error(args: list[str], capsys) -> str:
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("buffet: error:") and err.count("\n") == 1
    return err


@pytest.mark.parametrize("problem, expected", [
    ("columns", "not the Jester layout: expected a count column and 100 or 150 joke columns, found 41 columns"),
    ("range", "data row 3, joke 5: rating 12.5 is outside [-10, 10] and not 99"),
    ("count", "the first column says"),
    ("few", "no user has at least 50 ratings"),
])
def test_bad_jester_files_get_one_line_errors_naming_the_file(tmp_path, capsys, problem, expected):
    path = tmp_path / "bad.csv"
    ratings = write_jester(path, n_jokes=40 if problem == "columns" else 100)
    if problem in ("range", "count", "few"):
        if problem == "range":
            ratings[2, 4] = 12.5
        if problem == "few":
            ratings[:, 49:] = 99.0
        counts = (ratings != 99).sum(axis=1) + (problem == "count")
        path.write_text("".join(f"{c}," + ",".join(f"{v:g}" for v in row) + "\n" for c, row in zip(counts, ratings)))
    err = run_cli_error(["reproduce", "collaborative-filtering", "--jester", str(path), "--out",
                         str(tmp_path / "out"), "--seeds", "1", "--quick"], capsys)
    assert str(path) in err and expected in err


def test_jester_option_is_only_for_collaborative_filtering(tmp_path, capsys):
    err = run_cli_error(["reproduce", "ibp-evidence", "--jester", str(tmp_path / "x.csv"), "--out", str(tmp_path),
                         "--quick"], capsys)
    assert "--jester does not apply to the experiment 'ibp-evidence'" in err

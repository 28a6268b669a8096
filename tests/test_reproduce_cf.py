"""`buffet reproduce collaborative-filtering --jester FILE` (issue 3 item 4; SPEC 4 collaborative filtering) on
Jester-layout files the tests write: count column, then 100 joke columns, 99 = unrated."""

import csv
from pathlib import Path

import numpy as np
import pytest

from buffet.pipeline.cli import main


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


def test_quick_jester_reproduction_writes_finite_nmaes(tmp_path, capsys):
    jester = tmp_path / "jester-data-1.csv"
    write_jester(jester)
    out = tmp_path / "out"
    assert main(["reproduce", "collaborative-filtering", "--jester", str(jester), "--out", str(out), "--seeds", "1",
                 "--quick"]) == 0
    with (out / "collaborative_filtering_repeats.csv").open() as f:
        repeats = list(csv.DictReader(f))
    methods = {r["method"].replace(" + offsets", "") for r in repeats}
    assert {"User + item biases", "SVD (item-mean fill)", "NMF (masked)", "IMF", "INMF"} <= methods
    nmae = np.array([float(r["NMAE"]) for r in repeats])
    assert np.all(np.isfinite(nmae)) and np.all((nmae > 0) & (nmae < 0.5))
    report = (out / "collaborative_filtering.md").read_text()
    assert "Jester file jester-data-1.csv: 60 users" in report and "MAE / 20" in report
    assert (out / "collaborative_filtering_nmae.png").read_bytes()[:4] == b"\x89PNG"
    assert "paper" in capsys.readouterr().out


def run_cli_error(args: list[str], capsys) -> str:
    assert main(args) == 2
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

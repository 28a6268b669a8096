"""Structural settings chosen on validation entries of the training entries
(``engine.selection``): the held-out entries are never used, the choice is recorded in the run, and the
reproduction experiments take the same path."""

import json
from pathlib import Path

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.splits import EntrySample, add_split, holdout_entries
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run, resume_run
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.engine.selection import (candidate_record, choose_on_validation, fit_fold,
                                              one_standard_error_choice, validation_folds)
from buffet.pipeline.models.imf import IMFConfig, structural_candidates
from buffet.pipeline.registry import spec_for
from buffet.pipeline.reports.outputs import evaluate_run, export_run

from helpers import buffet


def planted_binary(seed: int = 0, n: int = 60, d: int = 24) -> np.ndarray:
    """Rows that switch on blocks of columns (3 planted features) over row and column densities."""
    rng = np.random.default_rng(seed)
    z = rng.random((n, 3)) < 0.35
    a = np.zeros((3, d))
    for k in range(3):
        a[k, 8 * k:8 * k + 8] = 1.0
    p = np.clip(0.05 + 0.8 * (z @ a > 0) + 0.1 * rng.random((n, 1)), 0, 1)
    return (rng.random((n, d)) < p).astype(np.float64)


def write(x: np.ndarray, path: Path, heldout: np.ndarray | None):
    ds = from_array(x, path, "binary", rows_per_chunk=16)
    if heldout is not None:
        add_split(ds, "heldout", {"test_mask": heldout}, {"kind": "entries"})
    return source_of(path)


CONFIG = IMFConfig(max_k=4, chunk_rows=16, n_candidates=1, tol=1e-5)


def test_entry_samples_do_not_depend_on_the_row_blocks_and_folds_are_disjoint():
    sample = EntrySample(seed=5, low=0.2, high=0.4)
    whole = sample.rows(0, 100, 37)
    pieces = np.vstack([sample.rows(r0, min(r0 + 13, 100), 37) for r0 in range(0, 100, 13)])
    np.testing.assert_array_equal(whole, pieces)
    other = EntrySample(seed=5, low=0.4, high=0.6).rows(0, 100, 37)
    assert not (whole & other).any()
    assert abs(whole.mean() - 0.2) < 0.02 and abs(other.mean() - 0.2) < 0.02  # 3700 entries: sd 0.007
    assert (EntrySample(seed=6, low=0.2, high=0.4).rows(0, 100, 37) != whole).mean() > 0.2


def test_one_standard_error_rule_keeps_the_preferred_candidate_within_noise():
    close = [{"score": 0.906, "fold_scores": [0.89, 0.906, 0.92]}, {"score": 0.91, "fold_scores": [0.90, 0.91, 0.92]}]
    assert one_standard_error_choice(close) == (0, pytest.approx(0.01 / np.sqrt(3)))
    apart = [{"score": 0.80, "fold_scores": [0.80, 0.80, 0.80]}, {"score": 0.91, "fold_scores": [0.90, 0.91, 0.92]}]
    assert one_standard_error_choice(apart)[0] == 1
    single = [{"score": 0.90, "fold_scores": [0.90]}, {"score": 0.9001, "fold_scores": [0.9001]}]
    assert one_standard_error_choice(single) == (1, 0.0)


def test_the_choice_is_recorded_and_never_reads_the_held_out_entries(tmp_path):
    x = planted_binary()
    heldout = holdout_entries(np.ones(x.shape, bool), 0.2, 0)
    flipped = np.where(heldout, 1.0 - x, x)   # the same training entries, every held-out value changed
    runs = [fit_run("imf", write(data, tmp_path / f"{name}.zarr", heldout), tmp_path / name, CONFIG, ProcessEngine(),
                    quiet=True) for name, data in (("real", x), ("flipped", flipped))]
    records = [run.selection for run in runs]
    assert records[0] == records[1]
    assert records[0]["metric"] == "auc" and records[0]["folds"] == 3
    labels = [c["label"] for c in records[0]["candidates"]]
    assert labels == ["K+ <= 4", "K+ <= 2", "K+ <= 4, offsets", "K+ <= 2, offsets"]
    assert all(len(c["fold_scores"]) == 3 and 0.5 < c["score"] <= 1 for c in records[0]["candidates"])
    chosen = next(c for c in records[0]["candidates"] if c["label"] == records[0]["chosen"])
    assert runs[0].params["max_k"] == chosen["settings"]["max_k"]
    assert runs[0].params["offset_reg"] == chosen["settings"]["offset_reg"]
    # ~20% of the 80% training entries in each fold, never a held-out one
    assert abs(records[0]["entries"] - 3 * 0.2 * 0.8 * x.size) < 0.1 * records[0]["entries"]
    results = [evaluate_run(run, ProcessEngine()) for run in runs]
    assert results[0]["selected"] == records[0]["chosen"]
    assert results[0]["auc"] > 0.8 and results[1]["auc"] < 0.2  # the held-out values do matter to evaluation


def test_select_none_and_stores_without_held_out_entries_fit_the_given_settings(tmp_path):
    x = planted_binary(1)
    heldout = holdout_entries(np.ones(x.shape, bool), 0.2, 1)
    none = fit_run("imf", write(x, tmp_path / "a.zarr", heldout), tmp_path / "a", CONFIG.__class__(
        **{**CONFIG.__dict__, "select": "none"}), ProcessEngine(), quiet=True)
    plain = fit_run("imf", write(x, tmp_path / "b.zarr", None), tmp_path / "b", CONFIG, ProcessEngine(), quiet=True)
    for run in (none, plain):
        assert run.selection is None and run.params["max_k"] == 4 and run.params["offset_reg"] is None


def test_a_run_stopped_after_its_choice_resumes_without_choosing_again(tmp_path):
    x = planted_binary(2)
    store = write(x, tmp_path / "s.zarr", holdout_entries(np.ones(x.shape, bool), 0.2, 2))
    whole = fit_run("imf", store, tmp_path / "whole", CONFIG, ProcessEngine(), quiet=True)
    part = fit_run("imf", store, tmp_path / "part", CONFIG, ProcessEngine(), stop_after=2, quiet=True)
    assert part.status == "interrupted" and part.selection == whole.selection
    resume_run(str(tmp_path / "part"), ProcessEngine(), quiet=True)
    a, b = (export_run(RunStore(tmp_path / name), ProcessEngine()) for name in ("whole", "part"))
    np.testing.assert_allclose(a["A_mean"], b["A_mean"], rtol=0, atol=1e-12)  # same process, same order


def test_cli_fit_evaluate_and_report_show_the_choice(tmp_path):
    x = planted_binary(3)
    store = write(x, tmp_path / "s.zarr", holdout_entries(np.ones(x.shape, bool), 0.2, 3))

    fit = buffet("fit", "inmf", store, "--out", tmp_path / "run", "--max-k", 3, "--n-candidates", 1, "--tol", 1e-3,
                 "--validation-folds", 2, "--workers", 1, "--worker-kind", "threads")
    assert "chosen on validation:" in fit.stderr and "validation 4/4:" in fit.stderr
    result = json.loads(buffet("evaluate", tmp_path / "run", "--json", "--workers", 1, "--worker-kind", "threads",
                               "--quiet").stdout)
    labels = [c["label"] for c in RunStore(tmp_path / "run").selection["candidates"]]
    assert result["selected"] in labels and result["auc"] > 0.8
    buffet("report", tmp_path / "run", "--out", tmp_path / "report")
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "## Settings chosen on validation" in summary and f"| {result['selected']} (chosen) |" in summary


class CountingEngine(ProcessEngine):
    """The in-process executor, counting the validation fits it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.fits = 0

    def batch(self, fn, args):
        self.fits += len(args)
        return [fn(*a) for a in args]


def test_lower_caps_are_read_off_the_fit_under_the_highest_cap(tmp_path):
    """A candidate that only lowers the cap on K+ is not fitted: the fit under the highest cap gives its
    result, where that fit's search first held the lower cap or, if it never did, at its end. The record is
    the one fitting every candidate gives, with one fit per fold for each setting of the offsets."""
    source = write(planted_binary(2), tmp_path / "x.zarr", None)
    config = IMFConfig(select="validation", max_k=20, n_candidates=1, chunk_rows=16, tol=1e-3, max_iter=60)
    candidates = structural_candidates(config)
    engine = CountingEngine()
    _, record = choose_on_validation(candidates, spec_for("imf").make_driver, config, source, engine)
    every = [candidate_record(c, [fit_fold(c.config(config), spec_for("imf").make_driver, source, fold, "binary")[0]
                                  for fold in validation_folds(config)]) for c in candidates]
    assert record["candidates"] == every
    capped = [r for r, c in zip(every, candidates) if c.settings["max_k"] < config.max_k]
    assert any(k == c["settings"]["max_k"] for c in capped for k in c["k_plus"])  # a cap the search held
    assert any(k < c["settings"]["max_k"] for c in capped for k in c["k_plus"])  # and one it never met
    assert engine.fits == 2 * config.validation_folds

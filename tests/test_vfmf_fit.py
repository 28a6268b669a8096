"""VFMF and TVIMF through the engine: the bound over a fit, recovery of planted features, the same
numbers on 1 and 2 workers and other chunkings, resume, and the command line (fit, evaluate, export, report)."""

import json
from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from buffet.data.arrays import from_array
from buffet.data.ibp_images import make_images
from buffet.data.splits import add_split, holdout_entries
from buffet.pipeline.engine.dataset import ArrayRows, source_of
from buffet.pipeline.engine.executor_choice import engine_on
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run, resume_run
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.vfmf import TVIMFConfig, VFMFConfig, fit_to_end
from buffet.pipeline.reports.outputs import evaluate_run, export_run

from helpers import assert_same, checkpoint, exported, run_main

CONFIGS = {"vfmf": VFMFConfig, "tvimf": TVIMFConfig}


@pytest.fixture(scope="module")
def image_store(tmp_path_factory):
    """The 4-image data (N = 60, noise variance 0.5) with 10% of the entries held out, in 16-row chunks."""
    x, _, _ = make_images(n_rows=60, noise_var=0.5, variant="four", seed=0)
    path = tmp_path_factory.mktemp("vfmf") / "images.zarr"
    ds = from_array(x, path, "real", rows_per_chunk=16)
    add_split(ds, "heldout", {"test_mask": holdout_entries(np.ones(x.shape, bool), 0.1, 0)}, {"kind": "entries"})
    return str(path)


def _trace(run) -> dict[str, np.ndarray]:
    return export_run(RunStore(run.path), ProcessEngine())


@pytest.mark.parametrize("name", CONFIGS)
def test_bound_never_decreases_within_a_restart_and_the_best_restart_is_kept(tmp_path, image_store, name):
    config = CONFIGS[name](truncation=5, restarts=3, tol=1e-7, chunk_rows=16)
    arrays = _trace(fit_run(name, source_of(image_store), tmp_path / "run", config, ProcessEngine(), quiet=True))
    bound, restart = arrays["trace_evidence"], arrays["trace_restart"]
    assert set(restart) == {1, 2, 3}
    same = restart[1:] == restart[:-1]
    steps = np.diff(bound)[same]
    assert np.all(steps >= -1e-10 * np.abs(bound[1:][same])), steps.min()
    finished = arrays["bound_by_restart"]
    np.testing.assert_array_equal(finished[:, 0], [1, 2, 3])
    np.testing.assert_array_equal(finished[:, 1], bound[~np.isnan(arrays["trace_converged_restart"])])
    assert len(set(finished[:, 1])) == 3  # the restarts started apart
    result = evaluate_run(RunStore(tmp_path / "run"), ProcessEngine())
    assert result["evidence"] == pytest.approx(finished[:, 1].max(), rel=1e-12)


@pytest.mark.parametrize("name", CONFIGS)
def test_recovers_the_planted_images(name):
    """1000 rows of the 4-image data with noise sd 0.5 (the images are 0/1), truncation 6, 3 restarts: every
    true image is matched by its own feature to within 0.2 in every pixel, and E[Z] E[A] is within 0.1 RMSE of
    Z A (measured: pixel errors <= 0.10, RMSE 0.06 for both models). Extra features end unused (sum_i nu_ik ~ 3)
    or nearly flat (TVIMF can keep features with max |E a_kj| ~ 0.2 used by about half the rows)."""
    x, z, a = make_images(n_rows=1000, noise_var=0.25, variant="four", seed=0)
    fit = fit_to_end(CONFIGS[name](truncation=6, restarts=3, chunk_rows=250, split=None), ArrayRows(x))
    learned = fit.state.post["m"].T
    error = np.abs(a[:, None, :] - learned[None]).max(axis=2)
    rows, cols = linear_sum_assignment(error)
    assert np.all(error[rows, cols] < 0.2)
    assert np.sqrt(np.mean((fit.expected_z() @ learned - z @ a) ** 2)) < 0.1
    assert 4 <= fit.k_used <= 6


def test_same_numbers_on_1_and_2_workers_and_other_chunkings(tmp_path, image_store, clients):
    """TVIMF in process and on 2 Dask workers with the same 16-row chunks (bit for bit), and on 1 worker with
    25-row chunks (the random starts are the same; regrouped sums change only rounding). At most 40 steps per
    restart keep it short."""
    config = TVIMFConfig(truncation=4, restarts=2, tol=1e-4, max_iter=40, chunk_rows=16, seed=3)
    runs = {label: fit_run("tvimf", source_of(image_store), tmp_path / label, cfg, engine, quiet=True)
            for label, cfg, engine in (("here", config, ProcessEngine()), ("2", config, engine_on(clients[2])),
                                       ("1", replace(config, chunk_rows=25), engine_on(clients[1])))}
    assert_same(checkpoint(runs["here"]), checkpoint(runs["2"]))
    reference, other = _trace(runs["here"]), _trace(runs["1"])
    np.testing.assert_allclose(other["trace_evidence"], reference["trace_evidence"], rtol=1e-10)
    for key in ("A_mean", "Z_mean", "tau1", "tau2", "qy", "bound_by_restart"):
        np.testing.assert_allclose(other[key], reference[key], rtol=1e-8, atol=1e-8, err_msg=key)


def test_a_resumed_run_ends_like_an_uninterrupted_run(tmp_path, image_store):
    """VFMF stopped in its second restart: the stopped run reports its first restart, and the resumed run ends
    with the uninterrupted run's numbers."""
    config = VFMFConfig(truncation=4, restarts=3, tol=1e-5, chunk_rows=20, checkpoint_every=7)
    whole = fit_run("vfmf", source_of(image_store), tmp_path / "whole", config, ProcessEngine(), quiet=True)
    reference = _trace(whole)
    first_end = int(reference["trace_step"][~np.isnan(reference["trace_converged_restart"])][0])
    part = fit_run("vfmf", source_of(image_store), tmp_path / "part", config, ProcessEngine(), stop_after=first_end + 3,
                   quiet=True)
    stopped = evaluate_run(RunStore(part.path), ProcessEngine())
    assert stopped["restarts_done"] == 1 and stopped["evidence"] == reference["bound_by_restart"][0, 1]
    resumed = _trace(resume_run(str(part.path), ProcessEngine(), quiet=True))
    np.testing.assert_array_equal(resumed["trace_step"], reference["trace_step"])
    for key in ("trace_evidence", "A_mean", "Z_mean", "tau1", "bound_by_restart"):
        np.testing.assert_allclose(resumed[key], reference[key], rtol=1e-12, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("name", CONFIGS)
def test_cli_fit_evaluate_export_report(tmp_path, image_store, capsys, name):
    """``buffet fit NAME`` with the truncation and restarts as options, on an embedded cluster of threads, then
    evaluate, export and report through the command line."""
    run = tmp_path / "run"
    run_main(capsys, "fit", name, image_store, "--out", run, "--truncation", 6, "--restarts", 2, "--tol", 1e-5,
             "--workers", 1, "--worker-kind", "threads", "--quiet")
    result = json.loads(run_main(capsys, "evaluate", run, "--json", "--workers", 1, "--worker-kind", "threads",
                                 "--quiet"))
    assert result["truncation"] == 6 and result["restarts_done"] == 2 and result["heldout_entries"] == 216
    assert result["k_used"] <= 6
    # between the true Z A (0.75; noise sd 0.71) and the featureless column means (0.91)
    assert result["rmse"] < 0.87
    arrays = exported(capsys, run, tmp_path / "out.npz")
    assert arrays["A_mean"].shape == (6, 36) and arrays["Z_mean"].shape == (60, 6)
    assert arrays["bound_by_restart"].shape == (2, 2) and ("qy" in arrays) == (name == "tvimf")
    files = run_main(capsys, "report", run, "--out", tmp_path / "report").split()
    for file in ("bound.png", "bases.png", "feature_usage.png", "summary.md"):
        assert str(tmp_path / "report" / file) in files
    assert (tmp_path / "report" / "bound.png").read_bytes()[:4] == b"\x89PNG"
    assert "| restart | bound |" in (tmp_path / "report" / "summary.md").read_text()

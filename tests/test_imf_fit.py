"""IMF/INMF through the engine (driver, determinism, resume, CLI; the search's states as
named block states, the in-memory reference being the same driver in process)."""

import json
from dataclasses import replace

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.splits import add_split, holdout_entries
from buffet.data.ibp_images import make_images
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.executor_choice import engine_on
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run, resume_run
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.imf import IMFConfig, INMFConfig
from buffet.pipeline.reports.outputs import evaluate_run, export_run

from helpers import assert_same, buffet, checkpoint, run_main
from imf_reference import reference_fit


@pytest.fixture(scope="module")
def images():
    return make_images(n_rows=60, noise_var=0.5, variant="four", seed=0)


@pytest.fixture(scope="module")
def image_store(tmp_path_factory, images):
    path = tmp_path_factory.mktemp("imf") / "images.zarr"
    ds = from_array(images[0], path, "real", rows_per_chunk=16)
    add_split(ds, "heldout", {"test_mask": holdout_entries(np.ones(images[0].shape, bool), 0.1, 0)},
              {"kind": "entries"})
    return str(path)


@pytest.fixture(scope="module")
def plain_store(tmp_path_factory, images):
    return str(from_array(images[0], tmp_path_factory.mktemp("imf") / "plain.zarr", "real", rows_per_chunk=16).path)


def _result(run):
    """A run's export (the best state of the search) and the evidence of every step."""
    arrays = export_run(RunStore(run.path), ProcessEngine())
    return arrays, arrays["trace_evidence"]


def _states(run) -> set[str]:
    """The named block states the run's newest checkpoint holds."""
    return set(RunStore(run.path).read_checkpoint().blocks)


@pytest.mark.parametrize("candidates", [1, 3])
@pytest.mark.parametrize("name, config_cls", [("imf", IMFConfig), ("inmf", INMFConfig)])
def test_store_driver_in_row_blocks_equals_the_in_memory_reference(tmp_path, images, plain_store, name, config_cls,
                                                                   candidates):
    """The driver on a store in blocks of 17 rows against the same driver on the array as one block."""
    x = images[0]
    settings = dict(max_k=6, tol=1e-7, max_iter=400, alpha=1.0, n_candidates=candidates)
    run = fit_run(name, source_of(plain_store), tmp_path / "run", config_cls(chunk_rows=17, **settings), ProcessEngine(),
                  quiet=True)
    arrays, _ = _result(run)
    # The same updates in the same order (chunked sums only regroup rounding, ~1e-12 on L ~ -2800); every
    # decision is on much larger numbers: the stop on |dL| <= 1e-7 |L| ~ 3e-4 and the best of 3 growth
    # candidates, whose L differ by >= 1e-5 even when they reach the same optimum. So 1e-8 is not tight.
    reference = reference_fit(x, config_cls=config_cls, **settings)
    assert arrays["A_mean"].shape[0] == reference.k_plus
    np.testing.assert_allclose(arrays["A_mean"], reference.state.post["m"].T, atol=1e-8)
    np.testing.assert_allclose(arrays["evidence_by_k"], np.array(reference.state.history), rtol=1e-9)
    assert _states(run) == {"nu"}  # the saved search states are dropped once the search is done


def test_same_evidence_and_posteriors_on_1_and_2_workers_and_other_chunkings(tmp_path, image_store, clients):
    """In process, on 2 Dask workers with the same 16-row chunks (bit for bit: same kernels, sums tree-reduced
    in block order) and on 1 worker with 25-row chunks (the regrouped sums change only rounding, far below the
    stopping and growth decisions, see the test above). Growth to K+ = 3 with 2 candidates per step and the ICA
    restart at tol 1e-3 (44 steps; the defaults take 414 steps of ~80 ms on Dask)."""
    config = IMFConfig(max_k=3, n_candidates=2, tol=1e-3, chunk_rows=16, seed=5, select="none")
    runs = {name: fit_run("imf", source_of(image_store), tmp_path / name, cfg, engine, quiet=True)
            for name, cfg, engine in (("here", config, ProcessEngine()), ("2", config, engine_on(clients[2])),
                                      ("1", replace(config, chunk_rows=25), engine_on(clients[1])))}
    assert_same(checkpoint(runs["here"]), checkpoint(runs["2"]))
    (ref_arrays, ref_trace), (arrays, trace) = _result(runs["here"]), _result(runs["1"])
    # the search ran to its end on both: K+ at max_k, and the last step's evidence change within the tolerance
    assert arrays["Z_mean"].shape == (60, 3) and len(trace) == len(ref_trace)
    assert abs(trace[-1] - trace[-2]) <= config.tol * abs(trace[-1]), trace[-2:]
    np.testing.assert_allclose(trace, ref_trace, rtol=1e-10)
    for key in ("A_mean", "Z_mean", "evidence_by_k"):
        np.testing.assert_allclose(arrays[key], ref_arrays[key], atol=1e-8)


def test_resumed_imf_run_ends_like_an_uninterrupted_run(tmp_path, image_store):
    """Stopped at step 30 of 97, in the middle of growth with 2 candidates and the restart per step."""
    config = IMFConfig(max_k=5, n_candidates=2, tol=1e-4, chunk_rows=20, checkpoint_every=7, select="none")
    whole = fit_run("imf", source_of(image_store), tmp_path / "whole", config, ProcessEngine(), quiet=True)
    part = fit_run("imf", source_of(image_store), tmp_path / "part", config, ProcessEngine(), stop_after=30, quiet=True)
    resumed = resume_run(str(part.path), ProcessEngine(), quiet=True)
    (a, trace_a), (b, trace_b) = _result(whole), _result(resumed)
    np.testing.assert_allclose(trace_b, trace_a, rtol=1e-12)
    np.testing.assert_array_equal(b["trace_step"], np.arange(1, len(trace_a) + 1))
    for key in ("A_mean", "Z_mean", "evidence_by_k"):
        np.testing.assert_allclose(b[key], a[key], atol=1e-12)


def test_cli_fit_evaluate_report(tmp_path, image_store, capsys):
    """``buffet fit imf`` in its own interpreter on an embedded cluster (one worker of 2 threads; worker processes
    are covered by the test above), then evaluate and report through the command line in this process. One
    candidate per growth step and tol 1e-3 take 37 steps (the defaults 414) and end at the 4 true images."""
    buffet("fit", "imf", image_store, "--out", tmp_path / "run", "--select", "none", "--max-k", 6, "--n-candidates", 1,
           "--tol", 1e-3, "--workers", 2, "--worker-kind", "threads", "--quiet")
    result = json.loads(run_main(capsys, "evaluate", tmp_path / "run", "--json", "--workers", 1, "--worker-kind",
                                 "threads", "--quiet"))
    assert result["k_plus"] == 4 and result["heldout_entries"] == 216
    # between the true Z A (0.75; noise sd 0.71) and the featureless column means (0.91); measured 0.809
    assert result["rmse"] < 0.85
    files = run_main(capsys, "report", tmp_path / "run", "--out", tmp_path / "report").split()
    for name in ("evidence_by_k.png", "bases.png", "feature_usage.png"):
        assert str(tmp_path / "report" / name) in files
        assert (tmp_path / "report" / name).read_bytes()[:4] == b"\x89PNG"


def test_a_run_stopped_as_growth_starts_evaluates_its_best_state(tmp_path, image_store):
    """Stopping at a converging step leaves q(z) with the next candidate's extra column; outputs use
    the best converged state (the named state "best_nu") instead."""
    config = IMFConfig(max_k=4, chunk_rows=20, select="none")
    whole = fit_run("imf", source_of(image_store), tmp_path / "whole", config, ProcessEngine(), quiet=True)
    trace = _result(whole)[0]
    converged = trace["trace_step"][~np.isnan(trace["trace_converged_k"])]
    stop = int(converged[2])  # a growth candidate converges here
    part = fit_run("imf", source_of(image_store), tmp_path / "part", config, ProcessEngine(), stop_after=stop, quiet=True)
    assert {"nu", "best_nu", "base_nu"} <= _states(part)
    result = evaluate_run(RunStore(part.path), ProcessEngine())
    arrays = export_run(RunStore(part.path), ProcessEngine())
    assert np.isfinite(result["rmse"]) and result["evidence"] == arrays["evidence_by_k"][:, 1].max()
    assert arrays["Z_mean"].shape[1] == arrays["A_mean"].shape[0] == result["k_plus"]

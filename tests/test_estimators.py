"""The Python API: every estimator fits small planted problems from every input kind
with the same numbers, in process and on a cluster, as ``buffet fit`` does; save/load, parameters,
clone, not-fitted errors, partial_fit on the fit's own update path, and no matplotlib at import."""

import subprocess
import sys

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.utils.validation import check_is_fitted

from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.reports.outputs import export_run
from buffet.pipeline.estimators import (IMF, INMF, BayesianNMF, CorrelatedNMF, InvalidParameterError, NoisyORGibbs,
                                        NotFittedError)
from helpers import FAST, RowReads

NAMES = list(FAST)
# The fitted array that pins each fit down (compared between input kinds, engines and `buffet fit`).
SIGNATURE = {"BayesianNMF": "g_", "CorrelatedNMF": "L_", "IMF": "components_", "INMF": "components_",
             "BinaryMF": "predictive_mean_", "LinearGaussianParticleFilter": "zzt_", "NoisyORParticleFilter": "zzt_",
             "LinearGaussianGibbs": "zzt_", "NoisyORGibbs": "zzt_"}


def _fit(name, data, **options):
    make, kind = FAST[name]
    X, mask, _, _, _ = data[kind]
    return make().fit(X, mask=mask, **options), kind


def _outputs(model, X, mask):
    """Everything a fitted model says about new rows: transform, predict (if any) and score."""
    kw = {} if mask is None else {"mask": mask}
    out = [model.transform(X, **kw), model.score(X, **kw)]
    if hasattr(model, "predict"):
        out.append(model.predict(X, **kw))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_fit_save_load_round_trip_gives_identical_outputs(name, data, tmp_path):
    model, kind = _fit(name, data)
    _, _, _, X_new, mask_new = data[kind]
    expected = _outputs(model, X_new, mask_new)
    assert np.isfinite(expected[1])
    for target in (tmp_path / "model.npz", tmp_path / "model-folder"):
        loaded = type(model).load(model.save(target))
        assert loaded.get_params() == model.get_params()
        for got, want in zip(_outputs(loaded, X_new, mask_new), expected):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(Exception, match="holds a saved"):
        (IMF if name != "IMF" else INMF).load(tmp_path / "model.npz")


@pytest.mark.parametrize("name", NAMES)
def test_params_round_trip_clone_and_not_fitted(name, data):
    model = FAST[name][0]()
    params = model.get_params()
    assert clone(model).get_params() == params and repr(model).startswith(name)
    first = next(iter(params))
    assert type(model)(**params).set_params(**{first: params[first]}).get_params() == params
    with pytest.raises(InvalidParameterError, match="no_such"):
        model.set_params(no_such=1)
    _, _, _, X_new, _ = data[FAST[name][1]]
    for method in ("transform", "score"):
        with pytest.raises(NotFittedError, match="not fitted") as info:
            getattr(model, method)(X_new)
        assert isinstance(info.value, ValueError) and isinstance(info.value, AttributeError)
    assert not hasattr(model, "components_")
    fitted, _ = _fit(name, data)
    check_is_fitted(fitted)
    assert fitted.n_features_in_ == X_new.shape[1]


@pytest.mark.parametrize("name", NAMES)
def test_every_input_kind_gives_the_same_fit(name, data):
    """A store path, the array (with its mask), a dask array and, for counts, a SciPy matrix."""
    make, kind = FAST[name]
    X, mask, store, _, _ = data[kind]
    dense = X.toarray() if sp.issparse(X) else X
    inputs = [(store, None), (dense, mask), (da.from_array(dense, chunks=(7, -1)), mask)]
    if kind == "counts":
        inputs.append((da.from_array(sp.csr_matrix(X), chunks=(50, -1), asarray=False), None))
        inputs.append((sp.coo_matrix(X), None))
    results = [getattr(make().fit(x, mask=m), SIGNATURE[name]) for x, m in inputs]
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])


@pytest.mark.parametrize("name", ["BayesianNMF", "IMF"])
def test_a_dask_array_is_read_a_chunk_at_a_time_with_the_numpy_fit(name, data, clients):
    """In this process and on a cluster; its chunks (7 rows) differ from the fit's row blocks."""
    make, kind = FAST[name]
    X, mask, _, _, _ = data[kind]
    expected = getattr(make().fit(X, mask=mask), SIGNATURE[name])
    reads = RowReads(X, 7)
    lazy = da.from_array(reads, chunks=(7, -1), asarray=False)
    np.testing.assert_array_equal(getattr(make().fit(lazy, mask=mask), SIGNATURE[name]), expected)
    assert reads.reads >= X.shape[0] / 7
    there = make().fit(lazy, mask=mask, client=clients[2])
    np.testing.assert_allclose(getattr(there, SIGNATURE[name]), expected, rtol=0, atol=1e-10)


def test_a_dask_array_s_values_are_checked_as_its_blocks_are_read(data):
    X = data["counts"][0].toarray()
    X[150, 3] = -1.0
    with pytest.raises(ValueError, match="negative count"):
        BayesianNMF(3, chunk_rows=60).fit(da.from_array(X, chunks=(50, 20)))
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        BayesianNMF(3).fit(da.from_array(X, chunks=(50, -1))[da.from_array(X[:, 0] >= 0, chunks=50)])


@pytest.mark.parametrize("name", NAMES)
def test_a_cluster_fit_gives_the_in_process_numbers(name, data, clients):
    here, _ = _fit(name, data)
    there, _ = _fit(name, data, client=clients[2])
    np.testing.assert_allclose(getattr(there, SIGNATURE[name]), getattr(here, SIGNATURE[name]), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name, model, ours, theirs", [("BayesianNMF", "bnmf", "g_", "g"),
                                                       ("IMF", "imf", "components_", "A_mean"),
                                                       ("BinaryMF", "bmf", "predictive_mean_", "predictive_mean"),
                                                       ("LinearGaussianParticleFilter", "pf-linear-gaussian", "zzt_", "zzt")])
def test_same_seed_as_buffet_fit_on_the_same_store(name, model, ours, theirs, data, tmp_path):
    """The estimator on the array and ``buffet fit`` (``fit_run``) on its store, compared through the export."""
    estimator, kind = _fit(name, data)
    config = estimator.config_cls(**estimator.get_params())
    run = fit_run(model, source_of(data[kind][2]), tmp_path / "run", config, ProcessEngine(), quiet=True)
    np.testing.assert_array_equal(export_run(run, ProcessEngine())[theirs], getattr(estimator, ours))


def test_in_memory_fit_into_a_run_folder_is_a_resumable_buffet_run(data, tmp_path):
    X, mask, _, _, _ = data["real"]
    model = FAST["IMF"][0]().fit(X, mask=mask, run_dir=tmp_path / "run")
    run = RunStore(tmp_path / "run")
    assert run.status == "finished" and run.meta["dataset"].endswith("data.zarr")
    np.testing.assert_array_equal(export_run(run, ProcessEngine())["A_mean"], model.components_)


@pytest.mark.parametrize("make", [lambda: BayesianNMF(3, chunk_rows=60, eval_every=1000),
                                  lambda: CorrelatedNMF(3, n_dims=2, chunk_rows=60, eval_every=1000, max_steps=20)])
def test_partial_fit_takes_the_svi_step_fit_takes(make, data):
    """Two passes over one minibatch holding the whole corpus, by ``fit`` and by two ``partial_fit`` calls."""
    X = data["counts"][0]
    n = X.shape[0]
    whole = make().set_params(batch_size=n, passes=2).fit(X)
    streamed = make().partial_fit(X, total_docs=n).partial_fit(X, total_docs=n)
    assert streamed.n_steps_ == 2
    for name in ("g_", "h_", "components_"):
        np.testing.assert_array_equal(getattr(streamed, name), getattr(whole, name))


def test_particle_filter_partial_fit_continues_and_score_changes_nothing(data):
    X, mask, _, X_new, mask_new = data["real"]
    make = FAST["LinearGaussianParticleFilter"][0]
    whole = make().set_params(ess_threshold=0.0).fit(X, mask=mask)   # no resampling: rows processed alike
    halves = make().set_params(ess_threshold=0.0).fit(X[:12], mask=mask[:12]).partial_fit(X[12:], mask=mask[12:])
    assert halves.n_rows_ == X.shape[0] and halves.zzt_.shape == (X.shape[0],) * 2
    np.testing.assert_allclose(halves.zzt_, whole.zzt_, rtol=0, atol=1e-12)
    assert halves.log_evidence_ == pytest.approx(whole.log_evidence_, rel=1e-12)
    model = make().fit(X, mask=mask)
    before = {k: v.copy() for k, v in model.particles_.items()}
    score = model.score(X_new, mask=mask_new)
    assert np.isfinite(score) and model.score(X_new, mask=mask_new) == score
    for key, value in before.items():
        np.testing.assert_array_equal(model.particles_[key], value)


def test_particle_filter_continues_without_moves(data):
    """Resample-move re-reads the rows seen, which a continued filter does not keep, so ``partial_fit``
    continues a filter fitted with moves as plain resampling: the same as setting moves to 0 first."""
    X, _, _, X_new, _ = data["binary"]
    make = FAST["NoisyORParticleFilter"][0]
    fitted = {moves: make().set_params(moves=2, ess_threshold=1.0).fit(X).set_params(moves=moves).partial_fit(X_new)
              for moves in (0, 2)}
    assert fitted[2].trace_[X.shape[0]]["resampled"]      # a resampling in the continuation, which moves would follow
    np.testing.assert_array_equal(fitted[2].zzt_, fitted[0].zzt_)


def test_bad_input_is_refused_with_a_value_error(data):
    X, mask, _, X_new, _ = data["real"]
    with pytest.raises(ValueError, match="negative count"):
        BayesianNMF(3).fit(-np.ones((4, 3)))
    with pytest.raises(ValueError, match="0 or 1"):
        NoisyORGibbs(sweeps=2).fit(X, mask=mask)
    model = FAST["IMF"][0]().fit(X, mask=mask)
    with pytest.raises(ValueError, match="X has 3 features, but IMF is expecting"):
        model.predict(X_new[:, :3])
    with pytest.raises(Exception, match="n_topics"):
        BayesianNMF(0).fit(data["counts"][0])


def test_importing_the_api_and_the_cli_imports_neither_matplotlib_nor_sklearn():
    code = ("import sys, buffet.pipeline.estimators, buffet.pipeline.cli, buffet.pipeline.registry as r; r.models(); "
            "assert 'matplotlib' not in sys.modules, 'matplotlib'; assert 'sklearn' not in sys.modules, 'sklearn'")
    subprocess.run([sys.executable, "-c", code], check=True)

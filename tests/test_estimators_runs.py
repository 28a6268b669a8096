"""A run of ``buffet fit`` (on a LocalCluster) opened in Python as its model's estimator (``from_run``,
``buffet.load_run``) gives what the estimator fitted in this process gives; and ``buffet`` is the public API.
The LocalCluster of ``buffet fit`` runs one thread worker: a cluster of processes gives the same numbers
(tests/test_estimators.py), and starts slower."""

import dataclasses
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import buffet
from buffet.data.errors import StoreError, UserError
from helpers import FAST, run_main


def _options(estimator) -> list[str]:
    """The ``buffet fit`` options of the estimator's parameters that differ from its config's defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(estimator.config_cls)}
    options = []
    for name, value in estimator.get_params().items():
        flag = name.replace("_", "-")
        if value != defaults[name]:
            options += [f"--{flag}" if value is True else f"--no-{flag}"] if isinstance(value, bool) \
                else [f"--{flag}", str(value)]
    return options


@pytest.mark.parametrize("name", list(FAST))
def test_a_run_of_buffet_fit_opens_as_the_estimator_fitted_in_process(name, data, tmp_path, capsys):
    make, kind = FAST[name]
    X, mask, store, X_new, mask_new = data[kind]
    ours = make().fit(X, mask=mask)
    run = tmp_path / "run"
    run_main(capsys, "fit", ours.model_name, store, "--out", run, "--workers", "1", "--worker-kind", "threads",
             "--quiet", *_options(ours))
    theirs = type(ours).from_run(run)
    assert theirs.get_params() == ours.get_params()
    assert theirs.n_iter_ == ours.n_iter_ and theirs.n_features_in_ == ours.n_features_in_
    kw = {} if mask_new is None else {"mask": mask_new}
    np.testing.assert_array_equal(theirs.transform(X_new, **kw), ours.transform(X_new, **kw))
    assert theirs.score(X_new, **kw) == ours.score(X_new, **kw)
    loaded = buffet.load_run(run)
    assert type(loaded) is type(ours)
    saved = type(ours).load(loaded.save(tmp_path / "saved.npz"))
    np.testing.assert_array_equal(saved.transform(X_new, **kw), ours.transform(X_new, **kw))
    other = buffet.INMF if name != "INMF" else buffet.IMF
    with pytest.raises(StoreError, match=f"holds a {ours.model_name} run, not one of {other.__name__}"):
        other.from_run(run)


def test_load_run_refuses_a_model_without_an_estimator_and_a_folder_without_a_run(data, tmp_path, capsys):
    run = tmp_path / "run"
    run_main(capsys, "fit", "vfmf", data["real"][2], "--out", run, "--truncation", "2", "--restarts", "1",
             "--max-iter", "2", "--workers", "1", "--worker-kind", "threads", "--quiet")
    with pytest.raises(UserError, match="a vfmf run has no Python estimator"):
        buffet.load_run(run)
    with pytest.raises(StoreError, match="not a buffet run"):
        buffet.load_run(tmp_path)


def test_the_top_level_package_is_the_public_api_and_loads_the_models_only_when_asked():
    code = ("import sys, buffet; assert 'buffet.pipeline.estimators' not in sys.modules; "
            "import buffet.pipeline.cli; assert 'buffet.pipeline.estimators' not in sys.modules; "
            "from buffet import BayesianNMF, IMF, INMF, BinaryMF, NoisyORGibbs, load_run; "
            "import buffet.pipeline.estimators as e; assert (BayesianNMF, load_run) == (e.BayesianNMF, e.load_run); "
            "print(buffet.__version__)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == importlib.metadata.version("buffet") == buffet.__version__
    assert set(dir(buffet)) == set(buffet.__all__)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchModel'"):
        buffet.NoSuchModel
    script = shutil.which("buffet", path=str(Path(sys.executable).parent))
    assert "fit a model to a dataset store" in subprocess.run([script, "--help"], check=True, capture_output=True,
                                                              text=True).stdout

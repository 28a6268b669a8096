"""Binary matrix factorization on the engine: exact posteriors of tiny problems, bars
recovery, same numbers on 1 and 2 workers, resume, the CLI and bad input."""

import itertools
import json
import math

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.bmf_data import bars_data
from buffet.data.errors import UserError
from buffet.data.splits import add_split
from buffet.data.store import Dataset
from buffet.pipeline.engine.blas import single_threaded_blas
from buffet.pipeline.engine.dataset import ArrayRows, source_of
from buffet.pipeline.engine.executor_choice import engine_on
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.loop import Position, run_loop
from buffet.pipeline.engine.runs import fit_run, resume_run
from buffet.pipeline.engine.selection import validation_folds
from buffet.pipeline.experiments.bmf import nearest_bottom
from buffet.pipeline.models.bmf import BMFConfig, BMFDriver
from buffet.pipeline.reports.bmf import feature_spread
from buffet.pipeline.reports.outputs import evaluate_run, export_run

from helpers import assert_same, buffet, checkpoint, run_main
from oracles import bmf_log_marginal, enumerate_ibp_classes


def _fit(model_store, out, config, engine, **options):
    return fit_run("bmf", source_of(model_store), out, config, engine, quiet=True, **options)


def _samples(config, X, mask, burn=100):
    """(U, V) after each sweep past ``burn`` of the driver on an in-memory matrix, under the one-thread BLAS a
    command holds for all its work (else every block task would set and restore the limit)."""
    driver = BMFDriver(config, source_of(ArrayRows(X, mask)), ProcessEngine())
    out = []
    with single_threaded_blas():
        driver.start()
        for s in range(config.sweeps):
            driver.step(s)
            if s >= burn:
                out.append((driver.full("u"), driver.full("v")))
    return out


def test_designated_panel_ibp_sampler_matches_the_enumerated_posterior():
    """IBP on both sides, three row panels and two column panels (rotating designated panel, the others
    given pi; multi-feature moves on): E[UU^T], E[VV^T] and P(K+) equal enumeration over classes with
    K+, L+ <= 3 (W integrated). Over 10 sampler seeds at 6000 sweeps the largest moment error is 0.032 +- 0.014
    (max 0.052) and the largest P(K+) error 0.013 +- 0.007 (max 0.029): the bounds are ~5 standard deviations
    above. Tried by editing the kernel: prior odds with I - n_{-i,k} for I - 1 - n_{-i,k} give moment errors
    0.13-0.19, a new-feature rate alpha / (beta + I) gives 0.16 and P(K+) errors 0.07."""
    X = np.array([[1.8, 0.1], [2.1, -0.3], [0.2, 0.3]])
    mask = np.ones(X.shape, bool)
    mask[2, 1] = False
    config = BMFConfig(sweeps=6000, alpha=0.8, lam=0.8, theta=2.0, phi=1.0, learn_hyper=False, move_size=2,
                       panel_rows=1, panel_cols=1, seed=1)
    prior_u, prior_v = config.priors(0.8, 0.8)
    states = [(U, V) for U in enumerate_ibp_classes(3, 3) for V in enumerate_ibp_classes(2, 3)]
    log_p = np.array([prior_u.log_prob(U) + prior_v.log_prob(V) + bmf_log_marginal(X, mask, U, V, 2.0, 1.0, 0.0)
                      for U, V in states])
    p = np.exp(log_p - log_p.max())
    p /= p.sum()
    kept = [(U, V) for U, V in _samples(config, X, mask) if U.shape[1] <= 3 and V.shape[1] <= 3]
    for side in (0, 1):
        exact = sum(w * (s[side].astype(int) @ s[side].T) for w, s in zip(p, states))
        sampled = np.mean([s[side].astype(int) @ s[side].T for s in kept], axis=0)
        np.testing.assert_allclose(sampled, exact, atol=0.1)
    exact_k = np.bincount([U.shape[1] for U, _ in states], weights=p, minlength=4)
    sampled_k = np.bincount([U.shape[1] for U, _ in kept], minlength=4) / len(kept)
    np.testing.assert_allclose(sampled_k, exact_k, atol=0.05)


def test_finite_sampler_matches_the_enumerated_posterior_in_total_variation():
    """Finite Beta-Bernoulli priors (K = 2, L = 1), every row and column its own panel, multi-feature moves on:
    the law of (U, V). With 3000 sweeps after burn-in the TV over 10 sampler seeds is 0.058 +- 0.007 (max
    0.069); prior odds with I - n_{-i,k} for I - 1 - n_{-i,k} (tried by editing the kernel) give 0.21."""
    X = np.array([[1.5, 0.2], [1.1, -0.4]])
    mask = np.ones(X.shape, bool)
    config = BMFConfig(sweeps=3100, finite_k=2, finite_l=1, theta=2.0, phi=1.0, w0=0.2, learn_hyper=False,
                       move_size=2, panel_rows=1, panel_cols=1, seed=3)
    prior_u, prior_v = config.priors(1.0, 1.0)
    exact = {}
    for bits in itertools.product([False, True], repeat=6):
        U, V = np.array(bits[:4]).reshape(2, 2), np.array(bits[4:]).reshape(2, 1)
        exact[U.tobytes() + V.tobytes()] = (prior_u.log_prob(U) + prior_v.log_prob(V)
                                            + bmf_log_marginal(X, mask, U, V, 2.0, 1.0, 0.2))
    top = max(exact.values())
    norm = sum(math.exp(v - top) for v in exact.values())
    samples = _samples(config, X, mask)
    counts = {}
    for U, V in samples:
        counts[U.tobytes() + V.tobytes()] = counts.get(U.tobytes() + V.tobytes(), 0) + 1
    tv = 0.5 * sum(abs(math.exp(v - top) / norm - counts.get(k, 0) / len(samples)) for k, v in exact.items())
    assert tv < 0.09


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Bars (150 images, bottom halves of a quarter held out), small binary, count and real stores."""
    folder = tmp_path_factory.mktemp("bmf")
    bars = bars_data(150, np.random.default_rng(0), alpha=2.0)
    paths = {name: folder / f"{name}.zarr" for name in ("bars", "binary", "counts-ok", "counts", "real")}
    ds = from_array(bars.X, paths["bars"], "real", rows_per_chunk=64)
    add_split(ds, "heldout", {"test_mask": bars.missing}, {"kind": "entries"})
    rng = np.random.default_rng(1)
    U, V = rng.random((60, 3)) < 0.5, rng.random((20, 2)) < 0.5
    M = U @ rng.normal(0, 4, (3, 2)) @ V.T - 1.0         # held-out AUC of the true M: 0.79
    binary = from_array((rng.random(M.shape) < 1 / (1 + np.exp(-M))).astype(float), paths["binary"], "binary")
    add_split(binary, "heldout", {"test_mask": rng.random(M.shape) < 0.2}, {"kind": "entries"})
    rate = np.exp(0.4 * M)
    counts = rng.poisson(rate).astype(float)
    valid = from_array(counts, paths["counts-ok"], "counts")
    add_split(valid, "heldout", {"test_mask": rng.random(M.shape) < 0.2}, {"kind": "entries"})
    counts[0, 0] = -1.0
    from_array(counts, paths["counts"], "real")
    real = from_array(M + rng.normal(size=M.shape), paths["real"], "real")
    add_split(real, "heldout", {"test_mask": rng.random(M.shape) < 0.2}, {"kind": "entries"})
    return {"bars_data": bars, "rate": rate, **{k: str(v) for k, v in paths.items()}}


def test_bars_missing_halves_are_reconstructed(tmp_path, stores):
    """The bars of paper 003, Sec. 4.1: the posterior predictive mean of the held-out bottom halves is close to
    the noise-free images (much closer than the prior mean 0 and than the top-half nearest neighbour's bottom half)."""
    bars = stores["bars_data"]
    run = _fit(stores["bars"], tmp_path / "run", BMFConfig(sweeps=150, burn_in=75, alpha=2.0, lam=4.0, select="none",
                                                           panel_rows=50), ProcessEngine())
    pred = export_run(run, ProcessEngine())["predictive_mean"]
    missing = bars.missing
    rmse = np.sqrt(np.mean((pred[missing] - bars.clean[missing]) ** 2))
    zero = np.sqrt(np.mean(bars.clean[missing] ** 2))
    cut = missing.any(axis=1)
    nn = np.sqrt(np.mean((nearest_bottom(bars.X, missing) - bars.clean[cut][:, 32:]) ** 2))
    assert rmse < 0.65 * zero and rmse < 0.8 * nn, (rmse, zero, nn)       # measured 1.46, 2.66, 2.08
    result = evaluate_run(run, ProcessEngine())
    assert result["heldout_entries"] == missing.sum() and result["rmse"] < 2.2   # noise sd is sqrt(2)


def test_logistic_and_poisson_fits_predict_held_out_entries(tmp_path, stores):
    config = BMFConfig(likelihood="logistic", sweeps=60, burn_in=20, panel_rows=16, seed=2, select="none")
    result = evaluate_run(_fit(stores["binary"], tmp_path / "logistic", config, ProcessEngine()), ProcessEngine())
    assert result["heldout_entries"] > 200 and result["auc"] > 0.65 and result["log_loss"] < 0.62
    config = BMFConfig(likelihood="poisson", sweeps=60, burn_in=20, panel_rows=16, seed=2, select="none")
    result = evaluate_run(_fit(stores["counts-ok"], tmp_path / "poisson", config, ProcessEngine()), ProcessEngine())
    ds = Dataset(stores["counts-ok"])
    X, test = ds.read_rows(0, 60).X, ds.split("heldout")["test_mask"]
    oracle = np.sqrt(np.mean((X[test] - stores["rate"][test]) ** 2))                 # the true rates' error
    mean_only = np.sqrt(np.mean((X[test] - X[~test].mean()) ** 2))
    assert result["rmse"] < 1.1 * oracle and result["rmse"] < 0.95 * mean_only           # measured 0.93, 0.89, 1.06


def test_validation_entries_are_left_out_of_training_and_scored(tmp_path, stores):
    """A fit given a validation fold trains on neither the fold's nor the split's entries, and
    ``predictions`` scores exactly the fold's entries that training could otherwise see."""
    config = BMFConfig(likelihood="logistic", sweeps=4, burn_in=1, panel_rows=16, seed=3, select="validation",
                       validation_folds=2)
    fold = validation_folds(config)[0]
    driver = BMFDriver(config, source_of(stores["binary"]), ProcessEngine(), validation=fold)
    driver.start()
    run_loop(driver, None, Position(), quiet=True)
    ds = Dataset(stores["binary"])
    X, test = ds.read_rows(0, 60).X, ds.split("heldout")["test_mask"]
    target = ~test & fold.rows(0, 60, 20)
    predicted, truth = driver.predictions()
    np.testing.assert_array_equal(truth, X[target])
    np.testing.assert_array_equal(predicted, driver.predictive_mean()[target])
    seen = np.vstack([rows.mask for rows in driver.engine.collect(driver.rows)])
    np.testing.assert_array_equal(seen, ~test & ~target)
    run = _fit(stores["binary"], tmp_path / "chosen", config, ProcessEngine())
    labels = [c["label"] for c in run.selection["candidates"]]
    assert labels[0] == "IBP priors" and len(labels) == 4 and run.selection["chosen"] in labels
    assert evaluate_run(run, ProcessEngine())["selected"] == run.selection["chosen"]


def test_same_seed_gives_the_same_chain_on_1_and_2_workers_and_resumes(tmp_path, stores, clients):
    """Split-merge moves on: each move's task takes its support's rows from several panels."""
    config = BMFConfig(likelihood="logistic", sweeps=6, burn_in=2, panel_rows=16, panel_cols=5, ess_steps=1,
                       select="none", seed=5, checkpoint_every=2, split_merge=2)
    results = {name: checkpoint(_fit(stores["binary"], tmp_path / name, config, engine))
               for name, engine in (("here", ProcessEngine()), ("1", engine_on(clients[1])), ("2", engine_on(clients[2])))}
    assert_same(results["here"], results["1"])
    assert_same(results["here"], results["2"])
    assert sum(r["split_merge_accepted"] for r in results["here"][1]) > 0
    part = _fit(stores["binary"], tmp_path / "part", config, engine_on(clients[2]), stop_after=3)
    assert part.status == "interrupted"
    assert_same(results["here"], checkpoint(resume_run(str(part.path), ProcessEngine(), quiet=True)))


def test_cli_fit_evaluate_export_report(tmp_path, stores, capsys):
    """``buffet fit`` in its own interpreter on an embedded cluster (2 threads); evaluate, export and report
    through the command line in this process."""
    buffet("fit", "bmf", stores["real"], "--out", tmp_path / "run", "--select", "none", "--sweeps", 20, "--burn-in", 5,
           "--seed", 2, "--panel-rows", 16, "--workers", 2, "--worker-kind", "threads", "--quiet")
    result = json.loads(run_main(capsys, "evaluate", tmp_path / "run", "--json", "--workers", 1, "--worker-kind",
                                 "threads", "--quiet"))
    assert result["likelihood"] == "gaussian" and result["retained_sweeps"] == 15 and result["steps"] == 20
    assert result["rmse"] < 1.5 and result["k_plus"] >= 1 and result["l_plus"] >= 1    # noise sd 1, signal sd ~4
    run_main(capsys, "export", tmp_path / "run", "--out", tmp_path / "post.npz")
    with np.load(tmp_path / "post.npz") as post:
        assert post["predictive_mean"].shape == (60, 20)
        assert post["U"].shape[0] == 60 and post["V"].shape[0] == 20 and post["trace_k_plus"].shape == (20,)
        np.testing.assert_array_equal(post["trace_step"], np.arange(1, 21))
        retained = {key: post[f"trace_{key}"][5:] for key in ("k_plus", "l_plus")}  # after the 5 burn-in sweeps
    files = run_main(capsys, "report", tmp_path / "run", "--out", tmp_path / "report").split()
    text = (tmp_path / "report" / "summary.md").read_text()
    assert "| retained_sweeps | 15 |" in text
    moved = False
    for key, name in (("k_plus", "K+"), ("l_plus", "L+")):
        kept = retained[key]
        n = np.unique(kept).size
        assert f"- {name} over the 15 retained sweeps: {kept.min():g} to {kept.max():g} " \
               f"({n} distinct value{'' if n == 1 else 's'})" in text
        moved |= kept.min() < kept.max()
    assert ("did not move after the burn-in" in text) == (not moved)
    for name in ("trace.png", "trace_features.png", "features.png"):
        assert str(tmp_path / "report" / name) in files
        assert (tmp_path / "report" / name).read_bytes()[:4] == b"\x89PNG"


def test_the_summary_cautions_only_when_neither_feature_count_moved():
    """``feature_spread`` reads the retained sweeps alone, and cautions when K+ and L+ both stayed put."""
    trace = [{"retained": step >= 2, "k_plus": 3.0 if step else 5.0, "l_plus": 4.0} for step in range(6)]
    lines = feature_spread(trace)
    assert lines[:2] == ["- K+ over the 4 retained sweeps: 3 to 3 (1 distinct value)",
                         "- L+ over the 4 retained sweeps: 4 to 4 (1 distinct value)"]
    assert len(lines) == 3 and "did not move after the burn-in" in lines[2]
    trace[-1]["l_plus"] = 6.0
    assert feature_spread(trace) == ["- K+ over the 4 retained sweeps: 3 to 3 (1 distinct value)",
                                     "- L+ over the 4 retained sweeps: 4 to 6 (2 distinct values)"]
    assert feature_spread([{"retained": False, "k_plus": 1.0, "l_plus": 1.0}]) == []


def test_bad_input_gets_a_one_line_error(tmp_path, stores):
    proc = buffet("fit", "bmf", stores["real"], "--out", tmp_path / "run", "--likelihood", "logistic", "--workers", 1,
                  "--worker-kind", "threads", "--quiet", check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "not 0 or 1" in proc.stderr
    with pytest.raises(UserError, match="negative count"):
        BMFDriver(BMFConfig(likelihood="poisson"), source_of(stores["counts"]), ProcessEngine())
    with pytest.raises(UserError, match="likelihood must be one of"):
        BMFDriver(BMFConfig(likelihood="probit"), source_of(stores["counts"]), ProcessEngine())

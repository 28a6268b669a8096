"""The buffet command line end to end on a LocalCluster (issue 2 CLI contract)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from buffet.data.synthetic import write_uci_corpus


def buffet(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"buffet {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


def exported(run, path):
    buffet("export", run, "--out", path)
    return np.load(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    write_uci_corpus(folder / "docword.toy.txt.gz", n_docs=1200, n_words=400, n_topics=8, mean_length=80,
                     seed=1, vocab_path=folder / "vocab.toy.txt")
    out = folder / "toy.zarr"
    buffet("ingest", "uci", folder / "docword.toy.txt.gz", folder / "vocab.toy.txt", "--out", out,
           "--holdout", 0.1, "--seed", 0)
    return out


def test_fit_evaluate_export_report(tmp_path, store):
    info = json.loads(buffet("info", store).stdout)
    assert info["rows"] == 1200 and info["columns"] == 400 and "heldout" in info["splits"]
    run = tmp_path / "run"
    fit = buffet("fit", "bnmf", store, "--out", run, "--k", 8, "--batch-size", 200, "--passes", 2,
                 "--workers", 2, "--seed", 4, "--eval-every", 2)
    assert "finished" in fit.stdout and "topic" in fit.stdout
    assert "[bnmf] step" in fit.stderr  # progress lines
    result = json.loads(buffet("evaluate", run, "--json", "--workers", 1, "--quiet").stdout)
    assert result["heldout_docs"] == 120 and result["steps"] == 12
    assert -np.log(400) < result["heldout_loglik_per_word"] < 0  # better than uniform over words
    arrays = exported(run, tmp_path / "fit.npz")
    assert arrays["topic_word"].shape == (8, 400)
    np.testing.assert_allclose(arrays["topic_word"].sum(axis=1), 1.0)
    assert arrays["vocab"][0] == "word0" and len(arrays["trace_step"]) == 12
    files = buffet("report", run, "--out", tmp_path / "report").stdout.split()
    for name in ("heldout_loglik.png", "local_sweeps.png", "topics.png"):
        path = tmp_path / "report" / name
        assert str(path) in files and path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.count("word") >= 8 * 10 and "final heldout_ll" in summary


def test_killed_fit_resumes_to_the_uninterrupted_result(tmp_path, store):
    common = ["--k", 6, "--batch-size", 100, "--passes", 3, "--seed", 2, "--checkpoint-every", 2,
              "--workers", 1, "--eval-every", 100]
    buffet("fit", "bnmf", store, "--out", tmp_path / "whole", *common)
    proc = subprocess.Popen([sys.executable, "-m", "buffet.pipeline.cli", "fit", "bnmf", str(store), "--out",
                             str(tmp_path / "killed"), *map(str, common)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while not list((tmp_path / "killed").glob("ckpt-*/manifest.json")) and time.time() < deadline \
            and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    status = json.loads((tmp_path / "killed" / "run.json").read_text())["status"]
    assert status == "running", "the fit finished before it could be killed; make the corpus larger"
    buffet("resume", tmp_path / "killed", "--workers", 2)
    a = exported(tmp_path / "whole", tmp_path / "a.npz")
    b = exported(tmp_path / "killed", tmp_path / "b.npz")
    assert np.abs(a["topic_word"] - b["topic_word"]).max() <= 1e-10


def test_user_errors_are_one_line_without_traceback(tmp_path, store):
    cases = [("fit", "bnmf", tmp_path / "missing.zarr", "--out", tmp_path / "r1", "--k", 3),
             ("fit", "bnmf", store, "--out", tmp_path / "r2", "--k", 0),
             ("fit", "bnmf", store, "--out", tmp_path / "r3", "--mode", "gibbs"),
             ("evaluate", tmp_path / "nothing", "--json"),
             ("ingest", "uci", tmp_path / "absent.txt", "--out", tmp_path / "s.zarr")]
    for args in cases:
        proc = buffet(*args, check=False)
        assert proc.returncode == 1, args
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("buffet: error:"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_existing_run_is_not_overwritten(tmp_path, store):
    run = tmp_path / "run"
    buffet("fit", "bnmf", store, "--out", run, "--k", 3, "--batch-size", 600, "--workers", 1)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = buffet("fit", "bnmf", store, "--out", run, "--k", 4, "--workers", 1, check=False)
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_accelerated_local_sweeps_are_a_switch_of_fit(tmp_path, store):
    """``--accelerate`` (BNMFConfig.accelerate, SQUAREM local sweeps) reaches held-out quality
    close to the plain sweeps' with fewer sweeps per document."""
    results = {}
    for flag in ("--no-accelerate", "--accelerate"):
        run = tmp_path / flag
        buffet("fit", "bnmf", store, "--out", run, "--k", 8, "--batch-size", 300, "--passes", 1,
               "--workers", 1, "--seed", 2, "--eval-every", 4, flag, "--quiet")
        arrays = exported(run, tmp_path / f"{flag}.npz")
        results[flag] = (arrays["trace_mean_sweeps"].mean(), arrays["trace_heldout_ll"][-1])
    (plain_sweeps, plain_ll), (fast_sweeps, fast_ll) = results["--no-accelerate"], results["--accelerate"]
    assert fast_sweeps < 0.9 * plain_sweeps
    assert abs(fast_ll - plain_ll) < 0.01 * abs(plain_ll)

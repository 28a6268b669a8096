"""The buffet command line end to end on a LocalCluster."""

import fcntl
import json
import os
import signal
import subprocess

import numpy as np
import pytest

from buffet.data.synthetic import write_uci_corpus
from buffet.pipeline.cli import main
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.models.bnmf import BNMFConfig

from baselines import unigram_heldout_loglik
from helpers import (CLI, assert_same, buffet, buffet_side_by_side, checkpoint, ctrl_c_as_in_a_terminal, exported,
                     run_main)

MARGIN = 0.25  # nats per word past the unigram score; measured: unigram -5.20, the fit -4.65


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    write_uci_corpus(folder / "docword.toy.txt.gz", n_docs=1200, n_words=400, n_topics=8, mean_length=80,
                     seed=1, vocab_path=folder / "vocab.toy.txt")
    out = folder / "toy.zarr"
    assert main(["ingest", "uci", str(folder / "docword.toy.txt.gz"), str(folder / "vocab.toy.txt"), "--out", str(out),
                 "--holdout", "0.1", "--seed", "0"]) == 0
    return out


def test_fit_evaluate_export_report(tmp_path, store, capsys):
    """``buffet fit`` in its own interpreter on an embedded cluster (2 threads, with progress and the top words);
    info, evaluate, export and report through the command line in this process."""
    info = json.loads(run_main(capsys, "info", store))
    assert info["rows"] == 1200 and info["columns"] == 400 and "heldout" in info["splits"]
    run = tmp_path / "run"
    fit = buffet("fit", "bnmf", store, "--out", run, "--k", 8, "--batch-size", 200, "--passes", 2,
                 "--workers", 2, "--seed", 4, "--eval-every", 2)
    assert "finished" in fit.stdout and "topic" in fit.stdout
    assert "[bnmf] step" in fit.stderr  # progress lines
    result = json.loads(run_main(capsys, "evaluate", run, "--json", "--workers", 1, "--quiet"))
    assert result["heldout_docs"] == 120 and result["steps"] == 12
    unigram = unigram_heldout_loglik(str(store))   # topics must explain more than word frequencies
    assert unigram + MARGIN < result["heldout_loglik_per_word"] < 0, (result, unigram)
    arrays = exported(capsys, run, tmp_path / "fit.npz")
    assert arrays["topic_word"].shape == (8, 400)
    np.testing.assert_allclose(arrays["topic_word"].sum(axis=1), 1.0)
    assert arrays["vocab"][0] == "word0" and len(arrays["trace_step"]) == 12
    files = run_main(capsys, "report", run, "--out", tmp_path / "report").split()
    for name in ("trace.png", "heldout_loglik.png", "topics.png"):
        path = tmp_path / "report" / name
        assert str(path) in files and path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.count("word") >= 8 * 10 and "final heldout_ll" in summary
    share = arrays["topic_tokens"] / arrays["topic_tokens"].sum()  # the report's order and count: by tokens
    listed = [int(line.split()[2]) for line in summary.splitlines() if line.split(". topic ")[0].isdigit()]
    assert listed == list(np.argsort(-share, kind="stable"))
    assert f"(left at their prior): {int(np.sum(share < 0.005))} of 8" in summary


def test_map_estimate_end_to_end(tmp_path, store, capsys):
    """``--estimate map`` through fit, evaluate and export in this process: topics that explain more than the
    word frequencies, with the MAP estimate's topic prior (c0 = 0.2 V) in the export's token counts."""
    run = tmp_path / "run"
    run_main(capsys, "fit", "bnmf", store, "--out", run, "--k", 8, "--batch-size", 200, "--passes", 2, "--seed", 4,
             "--estimate", "map", "--quiet", "--executor", "process")
    result = json.loads(run_main(capsys, "evaluate", run, "--json", "--quiet", "--executor", "process"))
    assert unigram_heldout_loglik(str(store)) + MARGIN < result["heldout_loglik_per_word"] < 0, result
    arrays = exported(capsys, run, tmp_path / "fit.npz")
    np.testing.assert_allclose(arrays["topic_tokens"], arrays["g"].sum(axis=0) - 0.2 * 400)
    batch = tmp_path / "batch"  # in batch mode the report names the objective for what it is
    run_main(capsys, "fit", "bnmf", store, "--out", batch, "--k", 8, "--mode", "batch", "--max-iter", 3,
             "--estimate", "map", "--quiet", "--executor", "process")
    trace = checkpoint(RunStore(batch))[1]  # the trace, and so the progress lines, name it too
    assert all("log_posterior" in r and "elbo" not in r for r in trace)
    run_main(capsys, "report", batch, "--out", tmp_path / "report")
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "- final log posterior density: " in summary and "elbo" not in summary


MIN_PROGRESS_LINE = 66  # bytes of a bnmf progress line past step 9: "[bnmf] step 10/84  pass=1  docs_seen=..."


def _interrupt_after_checkpoint(args: list, checkpoint_step: int,
                                sig: int = signal.SIGINT) -> subprocess.CompletedProcess:
    """Run ``buffet ARGS`` (a fit or resume printing one progress line per step on stderr) and send it
    ``sig`` once the checkpoint of step ``checkpoint_step`` is committed; returns the ended process.

    The loop commits a step's checkpoint before it computes the next step, so reading the progress line
    of step ``checkpoint_step + 1`` proves the checkpoint is there. The stderr pipe is cut to one page
    and read unbuffered (byte by byte, so nothing past that line leaves the pipe), then left unread: the
    run can print at most 4096 / MIN_PROGRESS_LINE = 62 more lines before it blocks, so a run with more
    steps than that left is still running when the signal comes, however fast the machine."""
    proc = subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            bufsize=0, start_new_session=True, preexec_fn=ctrl_c_as_in_a_terminal)
    try:
        fcntl.fcntl(proc.stderr.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        marker = f"] step {checkpoint_step + 1}/".encode()
        for line in proc.stderr:
            if marker in line:
                break
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, None, err.decode())


def test_stopped_and_interrupted_fit_resumes_to_the_uninterrupted_result(tmp_path, store, capsys):
    """``--stop-after 2`` leaves an "interrupted" run; its resume gets SIGINT (Ctrl-C) after the checkpoint
    of step 4 and is marked "interrupted" again, with a checkpoint; a second resume finishes it with the numbers of an
    uninterrupted fit (same seed). 84 steps: 79 after the signal's cue, more than the 62 that fit in the
    pipe (``_interrupt_after_checkpoint``)."""
    config = BNMFConfig(n_topics=6, batch_size=100, passes=7, seed=2, checkpoint_every=2, eval_every=1000)
    flags = ["--k", 6, "--batch-size", 100, "--passes", 7, "--seed", 2, "--checkpoint-every", 2,
             "--eval-every", 1000, "--workers", 1, "--quiet"]
    run = tmp_path / "run"
    run_main(capsys, "fit", "bnmf", store, "--out", run, *flags, "--stop-after", 2)
    assert RunStore(run).status == "interrupted" and RunStore(run).read_checkpoint().step == 2

    stopped = _interrupt_after_checkpoint(["resume", run, "--workers", 2], checkpoint_step=4)
    assert stopped.returncode == 130 and "buffet: interrupted;" in stopped.stderr, stopped.stderr
    reached = RunStore(run).read_checkpoint().step
    assert RunStore(run).status == "interrupted" and 4 <= reached <= 4 + 4096 // MIN_PROGRESS_LINE

    run_main(capsys, "resume", run, "--workers", 1, "--quiet")
    whole = fit_run("bnmf", source_of(store), tmp_path / "whole", config, ProcessEngine(), quiet=True)
    assert RunStore(run).status == "finished" and RunStore(run).read_checkpoint().step == 84
    assert_same(checkpoint(RunStore(run)), checkpoint(whole))


def test_sigterm_stops_a_fit_as_ctrl_c_does_and_says_so(tmp_path, store):
    """A job scheduler ends a job with SIGTERM: the fit stops with one line naming it and how to resume
    (status 143, no traceback), and the run is marked interrupted with its checkpoint."""
    run = tmp_path / "run"
    stopped = _interrupt_after_checkpoint(["fit", "bnmf", store, "--out", run, "--k", 6, "--batch-size", 100,
                                           "--passes", 7, "--seed", 2, "--checkpoint-every", 2, "--eval-every",
                                           1000, "--workers", 1], checkpoint_step=4, sig=signal.SIGTERM)
    assert stopped.returncode == 143, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith("buffet: stopped by SIGTERM") and "buffet resume" in last, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert RunStore(run).status == "interrupted" and RunStore(run).read_checkpoint().step >= 4


def test_user_errors_are_one_line_without_traceback(tmp_path, store):
    cases = [("fit", "bnmf", tmp_path / "missing.zarr", "--out", tmp_path / "r1", "--k", 3),
             ("fit", "bnmf", store, "--out", tmp_path / "r2", "--k", 0),
             ("fit", "bnmf", store, "--out", tmp_path / "r3", "--mode", "gibbs"),
             ("evaluate", tmp_path / "nothing", "--json"),
             ("ingest", "uci", tmp_path / "absent.txt", "--out", tmp_path / "s.zarr")]
    for args, proc in zip(cases, buffet_side_by_side(cases)):
        assert proc.returncode == 1, args
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("buffet: error:"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_existing_run_is_not_overwritten(tmp_path, store, capsys):
    run = tmp_path / "run"
    run_main(capsys, "fit", "bnmf", store, "--out", run, "--k", 3, "--batch-size", 600, "--workers", 1)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = buffet("fit", "bnmf", store, "--out", run, "--k", 4, "--workers", 1, check=False)
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_accelerated_local_sweeps_are_a_switch_of_fit(tmp_path, store, capsys):
    """``--accelerate`` (BNMFConfig.accelerate, SQUAREM local sweeps) reaches held-out quality
    close to the plain sweeps' with fewer sweeps per document."""
    results = {}
    for flag in ("--no-accelerate", "--accelerate"):
        run = tmp_path / flag
        run_main(capsys, "fit", "bnmf", store, "--out", run, "--k", 8, "--batch-size", 300, "--passes", 1,
                 "--workers", 1, "--seed", 2, "--eval-every", 4, "--max-sweeps", 50, flag, "--quiet")
        arrays = exported(capsys, run, tmp_path / f"{flag}.npz")
        results[flag] = (arrays["trace_mean_sweeps"].mean(), arrays["trace_heldout_ll"][-1])
    (plain_sweeps, plain_ll), (fast_sweeps, fast_ll) = results["--no-accelerate"], results["--accelerate"]
    assert fast_sweeps < 0.9 * plain_sweeps
    assert abs(fast_ll - plain_ll) < 0.01 * abs(plain_ll)

"""The two executors of the engine contract and the choice between them: a fit in this process
(``ProcessEngine``) and the same fit on a Dask cluster (``DaskEngine``) end with the same checkpoint, bit for
bit, for every model family; validation fits run as one batch on either; ``--executor auto`` runs a small job
in this process and says so."""

from pathlib import Path

import pytest

from buffet.data.errors import UserError
from buffet.pipeline.cli import build_parser, config_from_args, main
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.executor_choice import choose, engine_on
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run
from buffet.pipeline.registry import models
from buffet.pipeline.engine.runstore import RunStore

from helpers import assert_same, checkpoint
from worker_loss import FAMILIES
from test_selection import planted_binary, write


def fitted(tmp_path: Path, name: str, argv: list, engine) -> tuple[dict, list[dict]]:
    """The newest checkpoint of the fit ``argv`` (a ``buffet fit`` command line without --out) on ``engine``."""
    args = build_parser().parse_args([*map(str, argv), "--out", str(tmp_path / name)])
    run = fit_run(args.model, source_of(args.store), args.out, config_from_args(args), engine,
                  stop_after=args.stop_after, quiet=True)
    return checkpoint(RunStore(run.path))


def test_every_model_family_is_covered():
    """A model added to the registry must be added to the families these tests (and the worker-loss tests)
    fit, or its executors go unchecked."""
    assert set(FAMILIES) == set(models())


@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_same_checkpoint_in_process_and_on_a_cluster(tmp_path, loss_stores, clients, model):
    store, options = FAMILIES[model]
    argv = ["fit", model, loss_stores[store], "--seed", 5, "--checkpoint-every", 3, *options]
    here = fitted(tmp_path, "here", argv, ProcessEngine())
    assert_same(here, fitted(tmp_path, "cluster", argv, engine_on(clients[2])))


def test_validation_batch_chooses_the_same_on_either_executor(tmp_path, clients):
    """The validation fits of the K+ cap and offsets run as one batch: forked processes here, tasks on the
    cluster; the record of every candidate's fold scores and the first 6 steps of the final fit agree to the
    last digit (whole fits on either executor: the test above)."""
    x = planted_binary(3, n=40, d=16)
    source = write(x, tmp_path / "x.zarr", None)
    argv = ["fit", "inmf", source.url, "--select", "validation", "--max-k", 4, "--n-candidates", 1,
            "--chunk-rows", 16, "--tol", 1e-3, "--max-iter", 40, "--stop-after", 6]
    here = fitted(tmp_path, "here", argv, ProcessEngine())
    there = fitted(tmp_path, "there", argv, engine_on(clients[2]))
    assert RunStore(tmp_path / "here").selection == RunStore(tmp_path / "there").selection
    assert len(RunStore(tmp_path / "here").selection["candidates"]) > 1
    assert_same(here, there)


@pytest.mark.parametrize("requested, named, size, expected", [
    ("auto", None, 1000, "process"), ("auto", None, 10_001, "cluster"), ("auto", "--workers", 10, "cluster"),
    ("auto", None, None, "cluster"), ("cluster", None, 10, "cluster"), ("process", None, 10 ** 9, "process")])
def test_executor_rule(requested, named, size, expected):
    choice = choose(requested, named, lambda: size, 10_000)
    assert choice.executor == expected
    assert choice.reason


def test_executor_process_with_a_named_cluster_is_refused():
    with pytest.raises(UserError, match="give only one"):
        choose("process", "--scheduler", lambda: 10, 10_000)


def test_cli_says_which_executor_and_why(tmp_path, capsys):
    source = write(planted_binary(1, n=30, d=12), tmp_path / "x.zarr", None)
    fit = ["fit", "imf", source.url, "--select", "none", "--max-k", "2", "--max-iter", "5", "--chunk-rows", "15"]
    assert main([*fit, "--out", str(tmp_path / "auto")]) == 0
    assert "executor: this process (360 stored entries <= 2,000,000: a small job)" in capsys.readouterr().err
    assert main([*fit, "--out", str(tmp_path / "forced"), "--executor", "cluster", "--workers", "1"]) == 0
    assert "executor: Dask cluster (--executor cluster)" in capsys.readouterr().err
    assert_same(checkpoint(RunStore(tmp_path / "auto")), checkpoint(RunStore(tmp_path / "forced")))


def test_batch_jobs_started_afresh_give_the_numbers_of_this_process(tmp_path):
    """With another thread running, the batch's job processes are started afresh (spawned) instead of forked;
    they pin BLAS to one thread as this process does, so their validation fits match the fits made here."""
    import threading

    from buffet.pipeline.engine.process_executor import ProcessEngine
    from buffet.pipeline.engine.selection import fit_fold, validation_folds
    from buffet.pipeline.models.imf import IMFConfig
    from buffet.pipeline.registry import spec_for

    source = write(planted_binary(4, n=40, d=16), tmp_path / "x.zarr", None)
    config = IMFConfig(select="validation", max_k=3, n_candidates=1, chunk_rows=16, tol=1e-3, max_iter=40)
    jobs = [(config, spec_for("imf").make_driver, source, fold, "binary") for fold in validation_folds(config)]
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        spawned = ProcessEngine().batch(fit_fold, jobs)
    finally:
        stop.set()
        other.join()
    assert spawned == [fit_fold(*job) for job in jobs]

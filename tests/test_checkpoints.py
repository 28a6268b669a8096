"""Checkpoints under new names with a manifest written last: a reader trusts only
manifests, a damaged or half-written newest checkpoint falls back to the one before with a warning, a run
whose checkpoints are all unreadable says so in one line, and a finished run whose final checkpoint is lost
is not reported as finished. On local disk and in a bucket of the local S3 API server."""

import logging
import subprocess
import sys
import zlib

import numpy as np
import pytest

from buffet.data.errors import StoreError
from buffet.data.urls import filesystem, join
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.executor_choice import engine_on
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import fit_run, resume_run
from buffet.pipeline.engine.runstore import FileArrays, RunStore, read_block_file, write_arrays, write_block_file
from buffet.pipeline.models.bnmf import BNMFConfig

from helpers import assert_same, checkpoint


def checkpointed_run(where: str) -> RunStore:
    """A run with checkpoints of steps 1, 2 and 3 (two are kept), each with three block files."""
    run = RunStore.create(where, "bnmf", None, {})
    for step in (1, 2, 3):
        writer = run.begin_checkpoint(step)
        blocks = [write_block_file(writer.block_url("theta", i), {"a": np.full((2, 3), 10.0 * step + i)})
                  for i in range(3)]
        run.save_checkpoint(writer, step, {"g": np.arange(4.0) * step}, {"trace": [{"step": s} for s in range(step)]},
                            {"theta": blocks})
    return run


def damage(run: RunStore, folder: str, file: str, how: str) -> bytes:
    """Damage a file of a checkpoint folder (``truncate``, ``flip`` a byte, ``delete``); the original bytes."""
    fs, root = filesystem(join(run.path, folder, file))
    original = fs.cat_file(root)
    if how == "delete":
        fs.rm_file(root)
    else:
        middle = len(original) // 2
        fs.pipe_file(root, original[:middle] if how == "truncate" else
                     original[:middle] + bytes([original[middle] ^ 0xFF]) + original[middle + 1:])
    return original


def restore(run: RunStore, folder: str, file: str, original: bytes) -> None:
    fs, root = filesystem(join(run.path, folder, file))
    fs.pipe_file(root, original)


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    return str(tmp_path / "run") if request.param == "local" else request.getfixturevalue("s3").url("run")


def test_the_newest_checkpoint_is_read_back_and_two_are_kept(where):
    run = checkpointed_run(where)
    folders = run._folders()
    assert len(folders) == 2 and folders[0].startswith("ckpt-00000002-") and folders[1].startswith("ckpt-00000003-")
    checkpoint = RunStore(where).read_checkpoint()
    assert checkpoint.step == 3 and np.array_equal(checkpoint.globals["g"], np.arange(4.0) * 3)
    assert checkpoint.state == {"step": 3, "trace": [{"step": 0}, {"step": 1}, {"step": 2}]}
    records = checkpoint.blocks["theta"]
    assert [read_block_file(r.path, expected=r)["a"][0, 0] for r in records] == [30.0, 31.0, 32.0]


@pytest.mark.parametrize("file, how", [("globals.npz", "truncate"), ("blocks/theta/000001.npz", "flip"),
                                       ("manifest.json", "delete"), ("state.json", "flip")])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(where, caplog, file, how):
    run = checkpointed_run(where)
    newest = run._folders()[-1]
    original = damage(run, newest, file, how)
    with caplog.at_level(logging.WARNING, logger="buffet"):
        assert RunStore(where).read_checkpoint().step == 2
    assert f"checkpoint {newest} is unreadable" in caplog.text
    assert "falling back to the checkpoint of step 2" in caplog.text
    restore(run, newest, file, original)
    assert RunStore(where).read_checkpoint().step == 3


def test_the_next_commit_after_a_fallback_removes_the_damaged_checkpoint(tmp_path):
    run = checkpointed_run(str(tmp_path / "run"))
    older, newest = run._folders()
    damage(run, newest, "globals.npz", "truncate")
    resumed = RunStore(run.path)
    assert resumed.read_checkpoint().step == 2
    writer = resumed.begin_checkpoint(2)  # a checkpoint of the replay that sorts before the damaged one
    resumed.save_checkpoint(writer, 2, {"g": np.zeros(1)}, {"trace": []}, {})
    assert resumed._folders() == [older, writer.name]
    assert RunStore(run.path).read_checkpoint().url.endswith(writer.name)


def test_a_stray_pointer_file_changes_nothing(where):
    run = checkpointed_run(where)
    fs, root = filesystem(join(run.path, "checkpoint.json"))
    fs.pipe_file(root, b"\x00garbage{")
    assert RunStore(where).read_checkpoint().step == 3


def test_all_checkpoints_unreadable_is_one_error(where):
    run = checkpointed_run(where)
    older, newest = run._folders()
    damage(run, older, "globals.npz", "truncate")
    damage(run, newest, "blocks/theta/000000.npz", "delete")
    with pytest.raises(StoreError) as caught:
        RunStore(where).read_checkpoint()
    message = str(caught.value)
    assert message.startswith(f"{run.path}: all 2 checkpoints are unreadable (") and "\n" not in message
    assert f"{newest}: blocks/theta/000000.npz: missing" in message


def test_a_block_file_that_differs_from_its_record_is_refused(tmp_path):
    run = checkpointed_run(str(tmp_path / "run"))
    record = run.read_checkpoint().blocks["theta"][2]
    damage(run, run._folders()[-1], "blocks/theta/000002.npz", "flip")
    with pytest.raises(StoreError, match="000002.npz: checkpoint file is damaged"):
        read_block_file(record.path, expected=record)


@pytest.fixture
def batch_run(tmp_path, corpus_store):
    """A finished batch Bayesian NMF run (its q(theta) blocks, the named state "theta", in block files of each
    checkpoint) and everything its final checkpoint holds (``helpers.checkpoint``)."""
    config = BNMFConfig(n_topics=3, mode="batch", max_iter=4, tol=0.0, chunk_rows=700, checkpoint_every=2,
                        eval_every=100)
    run = fit_run("bnmf", source_of(corpus_store), tmp_path / "run", config, ProcessEngine(), quiet=True)
    return run, checkpoint(run)


def buffet(*args):
    return subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("workers", [None, 2])
def test_a_finished_run_whose_final_checkpoint_is_lost_resumes_to_the_same_end(batch_run, caplog, clients, workers):
    """A block file of the final checkpoint damaged: the run is no longer finished, and resuming it (in this
    process, or on workers that check the block files themselves) replays the lost steps to the same end."""
    run, final = batch_run
    older, newest = run._folders()
    damage(run, newest, next(p for p in _files(run, newest) if p.startswith("blocks/theta/")), "flip")
    reopened = RunStore(run.path)
    assert reopened.status == "finished"
    reopened.read_checkpoint()
    assert reopened.status == "interrupted"  # what was read is not the final checkpoint
    with caplog.at_level(logging.WARNING, logger="buffet"):
        resumed = resume_run(run.path, engine_on(clients[workers] if workers else None), quiet=True)
    assert "recorded as finished, but its final checkpoint (step 4) is unreadable" in caplog.text
    assert resumed.status == "finished"
    assert_same(checkpoint(RunStore(run.path)), final)


def _files(run: RunStore, folder: str) -> list[str]:
    """Paths of the files of a checkpoint folder, relative to the folder."""
    fs, root = filesystem(join(run.path, folder))
    return [p[len(root) + 1:] for p in fs.find(root)]


def test_commands_on_a_run_whose_checkpoints_are_all_unreadable_say_so_in_one_line(batch_run, tmp_path):
    run, _ = batch_run
    for folder in run._folders():
        damage(run, folder, "globals.npz", "truncate")
    for args in (("export", run.path, "--out", tmp_path / "x.npz"), ("resume", run.path, "--workers", 1, "--quiet")):
        proc = buffet(*args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"buffet: error: {run.path}: all 2 checkpoints are unreadable (")
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.npz").exists()


def test_arrays_written_straight_to_disk_have_the_record_of_their_bytes_and_are_never_half_written(tmp_path):
    """``write_arrays`` on local disk saves into the file and reads its record back: the same size and CRC-32
    as the bytes of the same arrays, and the same arrays read back. A save that fails part-way leaves neither
    the file nor its temporary beside it."""
    arrays = {"E": np.arange(12.0).reshape(3, 4), "rate": np.ones(4)}
    target = tmp_path / "ckpt" / "globals.npz"
    record = write_arrays(str(target), arrays)
    data = target.read_bytes()
    assert (record.size, record.crc32) == (len(data), zlib.crc32(data))
    assert record.mismatch(data) is None and record.mismatch(data[:-1]) is not None
    read = dict(FileArrays(str(target), "here"))
    assert read.keys() == arrays.keys() and all(np.array_equal(read[k], arrays[k]) for k in arrays)

    class Unsaveable:
        def __array__(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_arrays(str(tmp_path / "ckpt" / "other.npz"), {"E": arrays["E"], "bad": Unsaveable()})
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["globals.npz"]


def test_a_local_file_s_arrays_are_read_when_asked_for(tmp_path):
    """``FileArrays`` lists a local .npz file's arrays and reads one when it is asked for, with the values
    that were written; a name it does not hold is a KeyError, a file that is not an .npz a StoreError."""
    arrays = {"g": np.arange(6.0).reshape(2, 3), "E": np.eye(3)}
    write_arrays(str(tmp_path / "globals.npz"), arrays)
    lazy = FileArrays(str(tmp_path / "globals.npz"), "here")
    assert sorted(lazy) == ["E", "g"] and len(lazy) == 2
    np.testing.assert_array_equal(lazy["g"], arrays["g"])
    with pytest.raises(KeyError):
        lazy["h"]
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    with pytest.raises(StoreError, match="not a readable .npz"):
        FileArrays(str(tmp_path / "bad.npz"), "bad.npz")

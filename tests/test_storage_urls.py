"""Stores and runs on URLs: ingest straight into a bucket of a local S3 API server, read it
back bit for bit, and fit, evaluate and export with the store and the run in the bucket."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

from buffet.data.arrays import from_array
from buffet.data.errors import StoreError, UserError
from buffet.data.splits import add_split, holdout_entries
from buffet.data.store import Dataset, StoreWriter, write_dense
from buffet.data.synthetic import write_uci_corpus
from buffet.data.urls import OPTIONS_VARIABLE, is_url, normalise, zarr_store
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import config_from, fit_run
from buffet.pipeline.engine.runstore import RunStore
from buffet.pipeline.registry import spec_for
from buffet.pipeline.reports.outputs import evaluate_run, export_run

from processes import HandStartedCluster


def buffet(*args, check=True, env=None):
    proc = subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"buffet {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


def arrays_of(location: str) -> dict[str, np.ndarray]:
    """Every array of a store, read with zarr itself, by path."""
    group = zarr.open_group(store=zarr_store(location), mode="r")
    return {name: np.asarray(node[...]) for name, node in group.members(max_depth=None)
            if isinstance(node, zarr.Array)}


def assert_same_store(a: str, b: str) -> None:
    """Two stores hold the same arrays, bit for bit, and the same attributes."""
    left, right = arrays_of(a), arrays_of(b)
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype and np.array_equal(left[name], right[name]), name
    assert dict(Dataset(a).attrs) == dict(Dataset(b).attrs)


def test_locations_are_made_absolute_on_the_client(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalise("x.zarr") == str(tmp_path / "x.zarr")
    assert normalise(f"file://{tmp_path}/y.zarr") == str(tmp_path / "y.zarr")
    assert normalise("s3://bucket/runs/r1/") == "s3://bucket/runs/r1"
    assert is_url("gs://b/x") and is_url("abfs://c/x") and not is_url("file:///tmp/x") and not is_url("rel/x")


@pytest.fixture(scope="module")
def uci_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uci")
    write_uci_corpus(folder / "docword.txt", n_docs=300, n_words=120, n_topics=4, mean_length=40, seed=3,
                     vocab_path=folder / "vocab.txt")
    return folder / "docword.txt", folder / "vocab.txt"


@pytest.fixture(scope="module")
def uci_stores(uci_files, s3, tmp_path_factory):
    """The UCI corpus ingested by the command line onto local disk and into the bucket."""
    local, remote = str(tmp_path_factory.mktemp("local") / "corpus.zarr"), s3.url("corpus.zarr")
    for out in (local, remote):
        buffet("ingest", "uci", *uci_files, "--out", out, "--holdout", 0.1, "--rows-per-chunk", 64)
    return local, remote


def test_uci_ingest_into_s3_reads_back_as_the_local_store(uci_stores):
    local, remote = uci_stores
    assert_same_store(local, remote)
    info = json.loads(buffet("info", remote, "--verify").stdout)
    assert info["path"] == remote and info["rows"] == 300
    assert info["verified_chunks"] == 6  # one chunk in each of 6 arrays
    ds = Dataset(remote)
    assert ds.strings("vocab") == Dataset(local).strings("vocab")
    a, b = Dataset(local).read_rows(50, 200), ds.read_rows(50, 200)
    for part in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(a, part), getattr(b, part))


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_from_array_into_s3_reads_back_as_the_local_store(tmp_path, s3, layout):
    rng = np.random.default_rng(1)
    if layout == "dense":
        X, mask, kind = rng.normal(size=(70, 9)), rng.random((70, 9)) < 0.8, "real"
    else:
        X = sp.random(90, 40, density=0.2, format="csr", random_state=2, data_rvs=lambda n: rng.integers(1, 5, n))
        mask, kind = None, "counts"
    labels = {"row_labels": [f"r{i}" for i in range(X.shape[0])]}
    local = from_array(X, tmp_path / "a.zarr", kind, mask=mask, rows_per_chunk=16, **labels)
    remote = from_array(X, s3.url("a.zarr"), kind, mask=mask, rows_per_chunk=16, **labels)
    assert_same_store(local.path, remote.path)
    assert remote.verify() == local.verify()


def test_a_store_whose_upload_stopped_is_refused(s3):
    url = s3.url("partial.zarr")
    writer = StoreWriter(url).__enter__()  # an ingest that dies before its commit: no marker is ever written
    write_dense(writer.group, np.ones((5, 3)), None, 2)
    with pytest.raises(StoreError, match="partial store.*re-run the ingest"):
        Dataset(url)


def test_overwrite_replaces_a_store_in_a_bucket(s3):
    url = s3.url("again.zarr")
    from_array(np.ones((4, 3)), url, "real")
    with pytest.raises(UserError, match="already exists"):
        from_array(np.zeros((2, 2)), url, "real")
    ds = from_array(np.zeros((2, 2)), url, "real", overwrite=True)
    assert ds.shape == (2, 2) and not ds.read_rows(0, 2).X.any()
    assert not any("X/c/3" in p for p in s3.fs.find(url))  # nothing of the old store is left


def test_storage_options_reach_the_filesystem(uci_stores, s3):
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", OPTIONS_VARIABLE)}
    options = json.dumps({"client_kwargs": {"endpoint_url": s3.endpoint}})
    info = json.loads(buffet("info", uci_stores[1], "--storage-options", options, env=env).stdout)
    assert info["rows"] == 300
    bad = buffet("--storage-options", "{not json", "info", uci_stores[1], check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("buffet: error: --storage-options is not valid JSON")


def local_reference(model: str, store: str, run: str, **params) -> tuple[dict, dict]:
    """Evaluation and export of the same fit with the store and run on local disk, in this process."""
    spec = spec_for(model)
    fit_run(model, source_of(store), run, config_from(spec, params), ProcessEngine(), quiet=True)
    return evaluate_run(RunStore(run), ProcessEngine()), export_run(RunStore(run), ProcessEngine())


def without_endpoint() -> dict[str, str]:
    """This environment without the S3 endpoint: a process started with it reaches the bucket only through
    the storage options it is given."""
    return {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", OPTIONS_VARIABLE)}


@pytest.fixture(scope="module")
def bucket_cluster(s3, tmp_path_factory):
    """A scheduler and two workers started by hand, each in a folder of its own (tests/processes.py),
    without the S3 endpoint in their environment: the workers reach the bucket only through the storage
    options of the command they work for."""
    cluster = HandStartedCluster(tmp_path_factory.mktemp("cluster"), env=without_endpoint())
    cluster.add_worker()
    cluster.add_worker()
    cluster.wait_for_workers(2)
    yield cluster
    cluster.close()


def options_of(s3) -> str:
    return json.dumps({"client_kwargs": {"endpoint_url": s3.endpoint}})


def bucket_fit(s3, cluster, model: str, store: str, *options) -> tuple[dict, dict]:
    """Fit, evaluate and export through the command line with the store and the run in the bucket, on the
    hand-started cluster: its workers read the store's chunks from the bucket and write their parts of
    each checkpoint there, with the command's --storage-options."""
    run, out = s3.url("run"), s3.url("fit.npz")
    on_cluster = ("--scheduler", cluster.address, "--quiet")
    fit = buffet("--storage-options", options_of(s3), "fit", model, store, "--out", run, *options, *on_cluster)
    assert f"run {run}: finished" in fit.stdout
    scores = json.loads(buffet("--storage-options", options_of(s3), "evaluate", run, "--json", *on_cluster).stdout)
    buffet("export", run, "--out", out)  # the .npz goes straight into the bucket
    with np.load(io.BytesIO(s3.fs.cat_file(out))) as npz:
        return scores, {k: npz[k] for k in npz.files}


def assert_same_exports(a: dict, b: dict) -> None:
    """Equal exports, bit for bit, but for the clock."""
    assert sorted(a) == sorted(b)
    for key in set(a) - {"trace_seconds"}:
        assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key


def test_bnmf_fit_with_store_and_run_in_a_bucket_equals_the_local_fit(tmp_path, uci_stores, s3, bucket_cluster):
    local, remote = uci_stores
    params = {"n_topics": 4, "batch_size": 100, "passes": 2, "seed": 1, "eval_every": 3, "checkpoint_every": 2}
    scores, arrays = bucket_fit(s3, bucket_cluster, "bnmf", remote, *(f"--{k.replace('_', '-')}={v}" for k, v in params.items()))
    expected_scores, expected = local_reference("bnmf", local, str(tmp_path / "run"), **params)
    assert scores["heldout_loglik_per_word"] == expected_scores["heldout_loglik_per_word"]
    assert_same_exports(arrays, expected)


def test_imf_fit_with_store_and_run_in_a_bucket_equals_the_local_fit(tmp_path, s3, bucket_cluster):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 2)) @ rng.normal(size=(2, 12)) + 0.3 * rng.normal(size=(40, 12))
    stores = [from_array(X, where, "real", rows_per_chunk=10) for where in (tmp_path / "x.zarr", s3.url("x.zarr"))]
    for ds in stores:
        add_split(ds, "heldout", {"test_mask": holdout_entries(np.ones(X.shape, bool), 0.1, 0)}, {"kind": "entries"})
    params = {"select": "none", "max_k": 2, "n_candidates": 1, "chunk_rows": 10, "max_iter": 3, "tol": 1e-3,
              "checkpoint_every": 5}
    scores, arrays = bucket_fit(s3, bucket_cluster, "imf", stores[1].path, *(f"--{k.replace('_', '-')}={v}" for k, v in params.items()))
    expected_scores, expected = local_reference("imf", stores[0].path, str(tmp_path / "run"), **params)
    assert (scores["rmse"], scores["k_plus"]) == (expected_scores["rmse"], expected_scores["k_plus"])
    assert_same_exports(arrays, expected)


def test_a_run_given_as_a_relative_path_is_written_where_the_command_runs(tmp_path, uci_stores, s3, bucket_cluster):
    """The workers of the hand-started cluster, in folders of their own, write their parts of each
    checkpoint into a run folder given to the command as a relative path: it is made absolute on the
    client, so nothing lands in the workers' folders."""
    client = tmp_path / "client"
    client.mkdir()
    fit = subprocess.run([sys.executable, "-m", "buffet.pipeline.cli", "--storage-options", options_of(s3), "fit",
                          "bnmf", uci_stores[1], "--out", "run", "--k", "3", "--mode", "batch", "--max-iter", "2",
                          "--checkpoint-every", "1", "--scheduler", bucket_cluster.address, "--quiet"],
                         cwd=client, env=without_endpoint(), capture_output=True, text=True, timeout=300)
    assert fit.returncode == 0, fit.stderr
    groups = list((client / "run").glob("ckpt-*/blocks/theta"))  # the two checkpoints kept
    assert len(groups) == 2 and all(list(g.glob("*.npz")) for g in groups)  # q(theta) blocks, written by the workers
    for worker in bucket_cluster.root.glob("worker-*"):
        assert not [p for p in worker.rglob("*") if "dask-scratch-space" not in p.parts and p.name != "log.txt"]

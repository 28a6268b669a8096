"""Shared fixtures: small corpora written to stores, the estimators' small problems, Dask LocalClusters
started once, and a bucket on a local S3 API server."""

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import dask
import numpy as np
import pytest
import scipy.sparse as sp

from buffet.data.arrays import from_array
from buffet.data.ibp_synthetic import image_data, noisy_or_data
from buffet.data.splits import add_split, holdout_rows
from buffet.data.synthetic import bnmf_corpus
from helpers import unused_port

# Dask's own background sampling, for a dashboard nobody watches here: each worker's profiler samples its
# threads every 10 ms, every process reads its CPU and memory use every 0.5 s, every nanny and worker its
# memory every 0.1 s. The suite keeps a few clusters open for its whole run (``clients`` below) while other
# tests run beside them; this cuts their CPU use when idle by about a third. Set in the environment, so the
# commands and the hand-started `dask worker` processes of the tests get it too; nothing a test checks
# depends on it.
QUIET_DASK = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
              "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s",
              "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "1s"}
for _name, _value in QUIET_DASK.items():
    os.environ.setdefault(_name, _value)
dask.config.refresh()


@pytest.fixture(scope="session")
def model_corpus():
    """A corpus drawn from Bayesian NMF with K = 10 at the model's own prior shapes."""
    return bnmf_corpus(2000, 300, 10, np.random.default_rng(7), topic_shape=0.05, doc_shape=0.1,
                       tokens_per_doc=100)


@pytest.fixture(scope="session")
def corpus_store(tmp_path_factory, model_corpus):
    """The model corpus as a dataset store with 5% of the documents held out."""
    path = tmp_path_factory.mktemp("stores") / "corpus.zarr"
    ds = from_array(model_corpus.X, path, "counts", rows_per_chunk=256)
    add_split(ds, "heldout", {"test_rows": holdout_rows(ds.n_rows, 0.05, 0)}, {"kind": "rows"})
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The estimators' small problems (``helpers.FAST``), per data kind: (X, mask or None, store path of the
    same data, new rows, their mask)."""
    folder = tmp_path_factory.mktemp("estimators")
    counts = bnmf_corpus(240, 60, 3, np.random.default_rng(0), tokens_per_doc=50).X
    images = image_data(np.random.default_rng(1), n_rows=24, noise_sd=0.5).X
    mask = np.random.default_rng(2).random(images.shape) > 0.1
    binary = noisy_or_data(np.random.default_rng(3), n_rows=12, n_cols=30).X.astype(np.float64)
    out = {"counts": (sp.csr_matrix(counts[:200]), None, counts[200:], None),
           "real": (np.where(mask, images, 0.0)[:20], mask[:20], images[20:], mask[20:]),
           "binary": (binary[:10], None, binary[10:], None)}
    stores = {}
    for kind, (X, m, _, _) in out.items():
        stores[kind] = str(folder / f"{kind}.zarr")
        from_array(X, stores[kind], kind, mask=m, rows_per_chunk=7)
    return {kind: (X, m, stores[kind], X_new, m_new) for kind, (X, m, X_new, m_new) in out.items()}


def _client(workers, kind="processes"):
    from distributed import Client

    from buffet.pipeline.engine.cluster import local_cluster, prompt_messages

    cluster = local_cluster(workers, kind, dashboard=True)
    client = Client(cluster)
    prompt_messages(client)  # as the commands' clusters
    return cluster, client


@pytest.fixture(scope="session")
def clients():
    """Clients of a 1-worker and a 2-worker LocalCluster of processes, keyed by the number of workers, and
    of one in-process worker with 2 threads, keyed "threads"."""
    made = {1: _client(1), 2: _client(2), "threads": _client(2, "threads")}
    yield {n: client for n, (_, client) in made.items()}
    for cluster, client in made.values():
        client.close()
        cluster.close()


@dataclass(frozen=True)
class Bucket:
    """A bucket on the local S3 API server; ``url`` gives a fresh location in it."""

    name: str
    endpoint: str

    def url(self, stem: str) -> str:
        """A new ``s3://`` location, unique per call, ending in ``stem``."""
        return f"s3://{self.name}/{uuid.uuid4().hex[:8]}/{stem}"

    @property
    def fs(self):
        import s3fs

        return s3fs.S3FileSystem()


def _wait_for(port: int, proc: subprocess.Popen, seconds: float = 60.0) -> None:
    """Until something accepts connections on 127.0.0.1:port (the server has started)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the S3 API server (python -m moto.server) exited at start"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the S3 API server did not listen on port {port} within {seconds:.0f} s")


@pytest.fixture(scope="session")
def s3():
    """A bucket on an S3 API server (moto's server mode) on 127.0.0.1, run as its own process for the
    session. The AWS_* variables that point s3fs and botocore at it are set for this process and so for
    the commands and Dask workers it starts."""
    port = unused_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port, server)
        endpoint = f"http://127.0.0.1:{port}"
        with pytest.MonkeyPatch.context() as env:
            for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                                ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ENDPOINT_URL", endpoint)):
                env.setenv(name, value)
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
                env.delenv(name, raising=False)
            bucket = Bucket("buffet-tests", endpoint)
            bucket.fs.mkdir(bucket.name)
            yield bucket
    finally:
        server.terminate()
        server.wait(timeout=30)


# Worker-loss tests (tests/worker_loss.py): per test module, one scheduler started by hand, its workers'
# step gate (tests/step_gate.py) and the stores.
@pytest.fixture(scope="module")
def loss_stores(tmp_path_factory):
    from worker_loss import write_stores

    return write_stores(tmp_path_factory.mktemp("loss"))


# Dask's connect timeout for the hand-started clusters of the worker-loss tests and the commands they run:
# the time a transfer to a worker that has just died may wait before it fails (30 s unless set).
CONNECT_TIMEOUT = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "5s"}


@pytest.fixture(scope="module")
def hand_scheduler(tmp_path_factory):
    """A scheduler started by hand; the workers a test adds load the step gate whose file is ``gate.json`` in
    the cluster's folder."""
    import step_gate
    from processes import HandStartedCluster

    root = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, step_gate.GATE_VARIABLE: str(root / "gate.json"), **CONNECT_TIMEOUT}
    cluster = HandStartedCluster(root, env, worker_options=["--preload", step_gate.__file__])
    yield cluster
    cluster.close()


@pytest.fixture
def hand_cluster(hand_scheduler):
    """The module's scheduler; the workers a test starts are killed after it."""
    yield hand_scheduler
    hand_scheduler.close_workers()


@pytest.fixture
def gate(hand_scheduler):
    """The step gate of the module's workers, open again after the test."""
    from step_gate import GATE_VARIABLE, StepGate

    gate = StepGate(Path(hand_scheduler.env[GATE_VARIABLE]))
    yield gate
    gate.open()

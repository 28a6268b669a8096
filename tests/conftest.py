"""Shared fixtures: small corpora written to stores, and Dask LocalClusters started once."""

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.splits import add_split, holdout_rows
from buffet.data.synthetic import bnmf_corpus


@pytest.fixture(scope="session")
def model_corpus():
    """A corpus drawn from Bayesian NMF with K = 10 at the model's own prior shapes (SPEC 3.5)."""
    return bnmf_corpus(2000, 300, 10, np.random.default_rng(7), topic_shape=0.05, doc_shape=0.1,
                       tokens_per_doc=100)


@pytest.fixture(scope="session")
def corpus_store(tmp_path_factory, model_corpus):
    """The model corpus as a dataset store with 5% of the documents held out."""
    path = tmp_path_factory.mktemp("stores") / "corpus.zarr"
    ds = from_array(model_corpus.X, path, "counts", rows_per_chunk=256)
    add_split(ds, "heldout", {"test_rows": holdout_rows(ds.n_rows, 0.05, 0)}, {"kind": "rows"})
    return str(path)


def _client(workers, kind="processes"):
    from distributed import Client

    from buffet.pipeline.engine.cluster import local_cluster

    cluster = local_cluster(workers, kind, dashboard=True)
    return cluster, Client(cluster)


@pytest.fixture(scope="session")
def clients():
    """Clients of a 1-worker and a 2-worker LocalCluster of processes, keyed by the number of workers, and
    of one in-process worker with 2 threads, keyed "threads"."""
    made = {1: _client(1), 2: _client(2), "threads": _client(2, "threads")}
    yield {n: client for n, (_, client) in made.items()}
    for cluster, client in made.values():
        client.close()
        cluster.close()

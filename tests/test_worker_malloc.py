"""Worker processes serve large temporary arrays from glibc's heap instead of mapping each afresh
(``WORKER_MALLOC`` in pipeline/engine/cluster.py), and every way buffet starts workers gives them that
setting: the embedded LocalCluster, ``--cluster kube``, the SLURM script and the Kubernetes manifests."""

from __future__ import annotations

import ast
import json
import resource

import numpy as np
import yaml

from buffet.pipeline.engine.cluster import NANNY_ENVIRON, kube_cluster_spec
from slurm_setup import deploy_module
from test_kubernetes import objects

ALLOCATIONS = 40
ARRAY_BYTES = 1 << 20  # 1 MiB: above the 128 KiB mmap threshold that a malloc setting in the environment pins
PAGES = ARRAY_BYTES // resource.getpagesize()


def page_faults_of_fresh_arrays() -> int:
    """Minor page faults of this process while it fills and frees ALLOCATIONS arrays of ARRAY_BYTES: one per
    page of each array when each is mapped afresh, about one array's pages when freed memory is reused."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(ALLOCATIONS):
        array = np.ones(ARRAY_BYTES // 8)
        del array
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_the_local_clusters_worker_processes_reuse_freed_memory_for_large_arrays(clients):
    faults = clients[2].run(page_faults_of_fresh_arrays)
    assert len(faults) == 2
    mapped_afresh = ALLOCATIONS * PAGES
    for worker, count in faults.items():
        assert count < mapped_afresh / 4, (worker, count, mapped_afresh)


def test_the_cluster_kube_workers_get_the_malloc_setting():
    spec = kube_cluster_spec("buffet-test", "image:tag", workers=2, threads=1)
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    environ = {e["name"]: e["value"] for e in worker["env"]}
    assert json.loads(environ["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"]) == NANNY_ENVIRON


def test_the_slurm_script_gives_its_workers_the_engines_nanny_environment():
    assert ast.literal_eval(deploy_module("start_cluster").NANNY_ENVIRON) == NANNY_ENVIRON


def test_the_manifests_give_their_workers_the_engines_nanny_environment():
    jobs = objects("DaskJob")
    assert len(jobs) == 2
    for job in jobs:
        container = job["spec"]["cluster"]["spec"]["worker"]["spec"]["containers"][0]
        environ = {e["name"]: e.get("value") for e in container["env"]}
        assert yaml.safe_load(environ["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"]) == NANNY_ENVIRON

"""Connecting to Dask: an embedded LocalCluster by default, or an existing scheduler."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import dask_kubernetes.operator
    import distributed

from buffet.data.errors import UserError
from buffet.data.urls import storage_options
from buffet.pipeline.engine.blas import single_threaded_blas
from buffet.pipeline.engine.messages import logger

# glibc's malloc as Dask's worker processes should have it. Dask's nanny starts them with
# MALLOC_TRIM_THRESHOLD_=65536, and setting any malloc threshold also stops glibc from raising its mmap
# threshold as a process frees large blocks: it stays at 128 KiB, so every temporary array above that is
# mapped afresh and page-faults on first use. Block kernels allocate such arrays by the thousand per task (a
# correlated-NMF local step took 1.3-1.4x its CPU time so; docs/performance.md, "Start-up and small fits"). The
# workers keep freed memory mapped (trim threshold 256 MiB) and take arrays of up to 32 MiB, the most glibc's
# own rising threshold reaches, from the heap.
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
# The whole environment a nanny gives its worker: the malloc settings and a one-thread BLAS per task thread.
NANNY_ENVIRON = {**WORKER_MALLOC, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

# How the embedded LocalCluster runs block tasks: "processes" are single-threaded worker
# processes (right for kernels that hold the GIL in Python loops: the samplers, the particle
# filters); "threads" are threads of this process (right for kernels that spend their time in
# NumPy calls, which release the GIL: globals are then shared, not serialised to every worker).
WORKER_KINDS = ("processes", "threads")
LOCAL_HTTP_ADDRESS = "127.0.0.1:0"  # this machine only, a free port
DASHBOARD_ADDRESS = LOCAL_HTTP_ADDRESS  # the default: no one else reaches the cluster's dashboard

# Where a command's workers run: the embedded LocalCluster (or the scheduler --scheduler or the environment
# names), or a cluster the Dask Kubernetes operator starts for the command and deletes after it.
CLUSTER_KINDS = ("local", "kube")
KUBE_THREADS_PER_WORKER = 4  # threads of each worker pod for the threaded (topic) models; the others get 1
KUBE_DEFAULT_WORKERS = 2  # worker pods when --workers is not given
KUBE_IMAGE_SETTING = "kubernetes.image"  # Dask's setting (DASK_KUBERNETES__IMAGE) naming the pods' image


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, dashboard: bool = True,
                quiet: bool = False, worker_kind: str = "processes", cluster: str = "local",
                dashboard_address: str = DASHBOARD_ADDRESS) -> Iterator["distributed.Client"]:
    """A ``distributed.Client``: on ``scheduler`` if given (or configured: ``configured_scheduler``; reaching it
    may take Dask's ``distributed.comm.timeouts.connect``, 30 s unless set otherwise); with ``cluster="kube"``
    on a cluster of ``workers`` pods that the Dask Kubernetes operator starts (``kube_cluster``) and deletes
    when the client closes; else on a new LocalCluster with ``workers`` single-threaded worker processes or,
    with ``worker_kind="threads"``, one worker of ``workers`` threads inside this process (default: one per
    core), its dashboard on ``dashboard_address``. Prints the dashboard address so a user can watch the
    tasks. The workers get this process's storage options (``data.urls``)."""
    import dask
    from distributed import Client

    if worker_kind not in WORKER_KINDS:
        raise UserError(f"worker kind must be one of {', '.join(WORKER_KINDS)}, got {worker_kind!r}")
    if cluster not in CLUSTER_KINDS:
        raise UserError(f"cluster must be one of {', '.join(CLUSTER_KINDS)}, got {cluster!r}")
    if cluster == "kube" and scheduler:
        raise UserError("--cluster kube starts a cluster and --scheduler names one: give only one of them")
    scheduler = scheduler or (None if cluster == "kube" else configured_scheduler())
    with contextlib.ExitStack() as stack:
        if cluster == "kube":
            client = Client(stack.enter_context(kube_cluster(workers, worker_kind)))
        elif scheduler:
            try:
                client = Client(scheduler, timeout=dask.config.get("distributed.comm.timeouts.connect"))
            except OSError as exc:
                raise UserError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
            except TypeError:  # what distributed raises for a tls:// address without TLS settings
                if not scheduler.startswith("tls://"):
                    raise
                raise UserError(f"the Dask scheduler at {scheduler} takes TLS connections only: give this command "
                                "the cluster's credentials (Dask's DASK_DISTRIBUTED__COMM__TLS__CA_FILE, "
                                "..._TLS__CLIENT__CERT and ..._TLS__CLIENT__KEY settings)") from None
        else:
            if workers is not None and workers < 1:
                raise UserError(f"--workers must be >= 1, got {workers}")
            if worker_kind == "threads":
                stack.enter_context(single_threaded_blas())
            client = Client(stack.enter_context(
                local_cluster(workers, worker_kind, dashboard, dashboard_address)))
        stack.callback(client.close)
        prompt_messages(client)
        if storage_options():
            from buffet.pipeline.engine.worker_setup import StorageOptions

            client.register_plugin(StorageOptions(storage_options()))
        if not quiet and client.dashboard_link:
            logger("cluster").info("Dask dashboard: %s",
                                   dashboard_link(client, None if scheduler or cluster == "kube" else dashboard_address))
        yield client


def prompt_messages(client: "distributed.Client") -> None:
    """Shorten the waits of the message streams from ``client`` and from its scheduler to the workers (the
    ``worker_setup`` module docstring): this client's always, the scheduler's when it runs in this process (a
    LocalCluster), for its present workers and, by a plugin, for those that join later. A remote scheduler
    is left as it is: it may not have buffet to run the plugin."""
    from distributed import LocalCluster

    from buffet.pipeline.engine.worker_setup import PromptScheduler, prompt

    prompt(client.scheduler_comm)
    if isinstance(client.cluster, LocalCluster):
        scheduler = client.cluster.scheduler
        scheduler.add_plugin(PromptScheduler())
        for stream in list(getattr(scheduler, "stream_comms", {}).values()):
            prompt(stream)


def dashboard_link(client: "distributed.Client", bound: str | None) -> str:
    """The address of ``client``'s dashboard, on the host the LocalCluster bound it to (``bound``, e.g.
    127.0.0.1:0) when that is one host: Dask's own link names the machine's network address for a cluster
    of threads, where a dashboard bound to 127.0.0.1 does not answer."""
    from urllib.parse import urlsplit

    link = urlsplit(client.dashboard_link)
    host = bound.rsplit(":", 1)[0].strip("[]") if bound and ":" in bound else ""
    if host in ("", "0.0.0.0", "::"):
        return client.dashboard_link
    return link._replace(netloc=f"{host}:{link.port}").geturl()


def configured_scheduler() -> str | None:
    """The scheduler the environment names, as Dask itself reads it: Dask's ``scheduler-address``
    setting, which the DASK_SCHEDULER_ADDRESS environment variable sets."""
    import dask

    return dask.config.get("scheduler-address", None) or os.environ.get("DASK_SCHEDULER_ADDRESS") or None


def local_cluster(workers: int | None, worker_kind: str, dashboard: bool,
                  dashboard_address: str = DASHBOARD_ADDRESS) -> "distributed.LocalCluster":
    """The embedded LocalCluster: ``workers`` worker processes of one thread, or one in-process
    worker of ``workers`` threads (``worker_kind``); ``None`` means one per core. Its scheduler and
    workers listen on 127.0.0.1 only (processes) or on no network port (threads); its dashboard on
    ``dashboard_address`` if ``dashboard``."""
    import dask
    from distributed import LocalCluster

    # A failed task reaches the client, which reports it in one line (its traceback with --debug); the
    # workers' own "Compute Failed" log of it would print that traceback on every failure.
    common = {"dashboard_address": dashboard_address if dashboard else None, "silence_logs": logging.CRITICAL}
    if worker_kind == "threads":
        # the in-process worker has no network address to take its HTTP server's host from: without one,
        # that server (/health, /metrics) would listen on all interfaces
        return LocalCluster(n_workers=1, threads_per_worker=workers or os.cpu_count() or 1, processes=False,
                            worker_dashboard_address=LOCAL_HTTP_ADDRESS, **common)
    environ = {f"distributed.nanny.pre-spawn-environ.{name}": value for name, value in WORKER_MALLOC.items()}
    with dask.config.set(environ):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                            preload=["buffet.pipeline.engine.worker_setup"], **common)


def kube_cluster(workers: int | None, worker_kind: str) -> "dask_kubernetes.operator.KubeCluster":
    """A cluster that the Dask Kubernetes operator runs for this command: ``workers`` worker pods (default
    ``KUBE_DEFAULT_WORKERS``) of ``KUBE_THREADS_PER_WORKER`` threads for ``worker_kind="threads"``, else of one
    thread, in the namespace of the current kube context, from the image Dask's ``kubernetes.image`` setting
    names. Closing it deletes its DaskCluster resource. A missing package, image setting or kube config is
    a ``UserError``."""
    operator = _kube_operator()
    image = _kube_image()
    _check_kube_config()
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    threads = KUBE_THREADS_PER_WORKER if worker_kind == "threads" else 1
    spec = kube_cluster_spec(f"buffet-{uuid.uuid4().hex[:8]}", image, workers or KUBE_DEFAULT_WORKERS, threads)
    import httpx
    import kr8s

    try:
        return operator.KubeCluster(custom_cluster_spec=spec, shutdown_on_close=True, quiet=True)
    except (httpx.HTTPError, kr8s.ServerError, RuntimeError, TimeoutError) as exc:
        raise UserError(f"could not start a Dask cluster on Kubernetes ({type(exc).__name__}: {exc}): check "
                        f"`kubectl get pods` and that the Dask operator is installed (deploy/README.md)") from None


def _kube_operator() -> Any:
    """The module ``dask_kubernetes.operator``, imported only when a command asks for a Kubernetes cluster."""
    try:
        import dask_kubernetes.operator
    except ImportError:
        raise UserError('--cluster kube needs the package dask-kubernetes: pip install "buffet[deploy]"') from None
    return dask_kubernetes.operator


def _kube_image() -> str:
    """The image of the worker and scheduler pods: Dask's ``kubernetes.image`` setting, which must be set
    (dask-kubernetes' own default image has no buffet in it)."""
    import dask

    image = dask.config.get(KUBE_IMAGE_SETTING, None)
    if not image or image.startswith("ghcr.io/dask/dask"):
        raise UserError("--cluster kube needs an image with buffet installed (deploy/docker/Dockerfile): set "
                        "DASK_KUBERNETES__IMAGE=REGISTRY/buffet:TAG")
    return image


def _check_kube_config() -> None:
    """Refuse to go on without Kubernetes credentials (a kubeconfig, or a pod's service account) or without
    an API server that answers (kr8s asks it for its version)."""
    import httpx
    import kr8s

    try:
        kr8s.api()
    except ValueError as exc:
        raise UserError(f"--cluster kube found no Kubernetes configuration ({exc}): set KUBECONFIG or "
                        f"run it in a pod with a service account") from None
    except httpx.HTTPError as exc:
        raise UserError(f"--cluster kube cannot reach the Kubernetes API server ({exc}): check "
                        f"`kubectl cluster-info`") from None


def kube_cluster_spec(name: str, image: str, workers: int, threads: int) -> dict[str, Any]:
    """A DaskCluster resource (kubernetes.dask.org/v1) of one scheduler and ``workers`` worker pods of
    ``threads`` threads and CPUs each, with readiness probes on the scheduler's and workers' /health and
    the nanny environment of the embedded cluster's workers."""
    worker = {
        "name": "worker", "image": image,
        "args": ["dask", "worker", "--name", "$(DASK_WORKER_NAME)", "--nthreads", str(threads),
                 "--dashboard-address", "8788"],
        "env": [{"name": "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON", "value": json.dumps(NANNY_ENVIRON)}],
        "ports": [{"name": "http-dashboard", "containerPort": 8788, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": str(threads)}, "limits": {"cpu": str(threads)}},
        "readinessProbe": _health_probe("http-dashboard"),
    }
    scheduler = {
        "name": "scheduler", "image": image, "args": ["dask", "scheduler"],
        "ports": [{"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"},
                  {"name": "http-dashboard", "containerPort": 8787, "protocol": "TCP"}],
        "readinessProbe": _health_probe("http-dashboard"),
    }
    service = {"type": "ClusterIP",
               "selector": {"dask.org/cluster-name": name, "dask.org/component": "scheduler"},
               "ports": [{"name": port, "protocol": "TCP", "port": number, "targetPort": port}
                         for port, number in (("tcp-comm", 8786), ("http-dashboard", 8787))]}
    return {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskCluster", "metadata": {"name": name},
            "spec": {"worker": {"replicas": workers, "spec": {"containers": [worker]}},
                     "scheduler": {"spec": {"containers": [scheduler]}, "service": service}}}


def _health_probe(port: str) -> dict[str, Any]:
    """A readiness probe on the /health page that Dask's schedulers and workers serve on their HTTP port."""
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 2, "failureThreshold": 3}

"""The embedded LocalCluster listens on this machine only: its dashboard on 127.0.0.1 unless the global
--dashboard-address says otherwise, its scheduler and workers on 127.0.0.1."""

import os
from urllib.parse import urlsplit

import psutil

from buffet.pipeline.cli import engine_for, parse_args
from buffet.pipeline.engine.cluster import dashboard_link

FIT = ["fit", "bnmf", "store.zarr", "--out", "run", "--workers", "1", "--quiet"]


def listening() -> dict[tuple[int, int], str]:
    """The TCP sockets this process and its child processes listen on, as {(pid, port): address}."""
    pids = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    return {(c.pid, c.laddr.port): c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


def cluster_sockets(argv: list[str]) -> tuple[dict[int, str], int, str]:
    """Start the LocalCluster the command line ``argv`` would fit on; return the sockets it listens on (in
    this process and its worker processes, as {port: address}; sockets other tests left open are left
    out), the dashboard's port and the scheduler's address. The dashboard link the command prints must
    name the dashboard's socket."""
    args, _ = parse_args(argv)
    before = listening()
    with engine_for(args, args.model) as engine:
        client = engine.client
        opened = {port: ip for key, ip in listening().items() if key not in before for port in [key[1]]}
        shown = urlsplit(dashboard_link(client, args.dashboard_address))
        assert opened[shown.port] in (shown.hostname, "0.0.0.0")
        return opened, shown.port, client.scheduler.address


def test_dashboard_and_scheduler_listen_on_localhost_by_default():
    sockets, dashboard_port, scheduler = cluster_sockets([*FIT, "--worker-kind", "processes"])
    assert sockets[dashboard_port] == "127.0.0.1"
    assert urlsplit(scheduler).hostname == "127.0.0.1"
    assert sockets[urlsplit(scheduler).port] == "127.0.0.1"
    assert set(sockets.values()) == {"127.0.0.1"}  # the worker process's sockets too


def test_dashboard_address_option_moves_the_dashboard_only():
    sockets, dashboard_port, scheduler = cluster_sockets(["--dashboard-address", "0.0.0.0:0", *FIT,
                                                          "--worker-kind", "processes"])
    assert sockets[dashboard_port] == "0.0.0.0"
    assert {ip for port, ip in sockets.items() if port != dashboard_port} == {"127.0.0.1"}
    assert sockets[urlsplit(scheduler).port] == "127.0.0.1"


def test_threaded_cluster_listens_on_localhost_only():
    sockets, dashboard_port, scheduler = cluster_sockets(FIT)  # bnmf: worker threads in this process
    assert scheduler.startswith("inproc://")  # no scheduler port at all
    assert sockets[dashboard_port] == "127.0.0.1"
    assert set(sockets.values()) == {"127.0.0.1"}  # the worker's HTTP server too

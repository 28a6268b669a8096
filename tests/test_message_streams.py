"""The message streams of a cluster the commands start wait ``worker_setup.MESSAGE_INTERVAL`` to batch messages,
not Dask's 10 ms from the client and 5 ms from the scheduler to a worker; for workers that join later too. (A
worker's own stream waits that long already.)"""

from buffet.pipeline.engine.cluster import dask_client
from buffet.pipeline.engine.worker_setup import MESSAGE_INTERVAL


def worker_stream_interval(dask_worker) -> float:
    return dask_worker.batched_stream.interval


def test_every_stream_of_a_local_cluster_is_prompt_for_present_and_later_workers():
    with dask_client(1, dashboard=False, quiet=True, worker_kind="processes") as client:
        assert client.scheduler_comm.interval == MESSAGE_INTERVAL
        client.cluster.scale(2)
        client.wait_for_workers(2)
        streams = client.cluster.scheduler.stream_comms
        assert len(streams) == 2 and {s.interval for s in streams.values()} == {MESSAGE_INTERVAL}
        assert set(client.run(worker_stream_interval).values()) == {MESSAGE_INTERVAL}

"""The Ray worker group: start, run, fail loudly, and leave nothing behind."""

from __future__ import annotations

import time

import pytest
import torch

from tests.helpers import resources_back, wait_until

pytestmark = pytest.mark.ray


def _describe(ctx, tag):
    """Each rank's view, plus a ring exchange over the communicator and a counter kept in ctx.state."""
    ctx.state["runs"] = ctx.state.get("runs", 0) + 1
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    incoming = torch.zeros(3)
    sent = ctx.comm.isend(torch.full((3,), float(ctx.rank)), right)
    ctx.comm.irecv(incoming, left).wait()
    sent.wait()
    return {"rank": ctx.rank, "world_size": ctx.world_size, "device": ctx.device, "tag": tag,
            "runs": ctx.state["runs"], "from_left": incoming.tolist(), "bytes_sent": ctx.comm.counters().bytes_sent}


def _raise_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 fails on purpose")
    ctx.comm.recv(torch.zeros(1), 1)  # would wait for rank 1 until the communicator's timeout


def assert_nothing_left(ray, resources_before: dict, pids: list[int], port: int) -> None:
    """The placement group's resources are back, the actor processes are gone, nothing listens on the port."""
    import psutil  # vendored by Ray

    assert wait_until(lambda: resources_back(ray, resources_before)), \
        f"resources not returned: {ray.available_resources()}"
    alive = lambda: [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]  # noqa: E731
    assert wait_until(lambda: not alive()), f"actor processes still running: {alive()}"

    def listening():  # the rendezvous store's port (another process may reuse it as a client port)
        return [c for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port
                and c.status == psutil.CONN_LISTEN]

    assert wait_until(lambda: not listening()), f"port {port} still listened on: {listening()}"


def test_group_starts_runs_and_stops_twice_leaving_nothing(ray_session):
    """A second group starts where the first one stopped (its actors, placement group and store port gone)."""
    from experiments.cluster.group import WorkerGroup

    ray = ray_session
    before = ray.available_resources()
    for attempt in range(2):
        with WorkerGroup(2, timeout=20) as group:
            first = group.run(_describe, attempt)
            second = group.run(_describe, attempt)
            pids, port = [info["pid"] for info in group.info], group.port
        assert [r["rank"] for r in first] == [0, 1]
        assert all(r["world_size"] == 2 and r["device"] == "cpu" and r["tag"] == attempt for r in first)
        assert [r["from_left"] for r in first] == [[1.0] * 3, [0.0] * 3]
        assert [r["runs"] for r in second] == [2, 2]  # state persists across run() calls
        assert [r["bytes_sent"] for r in second] == [12, 12]  # a fresh communicator per run()
        assert_nothing_left(ray, before, pids, port)


@pytest.mark.timing
def test_a_failing_rank_raises_group_error_naming_it_and_shutdown_cleans_up(ray_session):
    from experiments.cluster.group import GroupError, WorkerGroup

    ray = ray_session
    before = ray.available_resources()
    group = WorkerGroup(2, timeout=60)
    pids, port = [info["pid"] for info in group.info], group.port
    start = time.monotonic()
    with pytest.raises(GroupError) as err:
        group.run(_raise_on_rank_1)
    assert time.monotonic() - start < 20  # not rank 0's 60 s communicator timeout
    assert err.value.ranks == [1]
    assert "failed on rank 1" in str(err.value) and "ValueError: rank 1 fails on purpose" in str(err.value)
    assert group.broken
    with pytest.raises(GroupError, match="broken"):
        group.run(_describe, 0)
    group.shutdown()
    assert_nothing_left(ray, before, pids, port)

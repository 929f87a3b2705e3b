"""A node's link down for t seconds on the kernel-shaped network (root, iproute2): every rank of a ring over real TCP
stalls at least the outage, and nothing is left behind, even when the run inside fails."""

from __future__ import annotations

import subprocess

import pytest

from experiments.cluster import netns
from experiments.cluster.outages import kernel_outage_run, shaped_network
from strategies.faults import LinkOutage
from strategies.transport.link import parse_bandwidth

PROBLEM = netns.support_problem()

pytestmark = [pytest.mark.netns, pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces here: {PROBLEM}")]
NAME = "sbtout"


def left_behind() -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (namespaces + links).splitlines() if f"sbc-{NAME}-" in line or f"sb-{NAME}" in line]


def test_a_ring_over_tcp_stalls_by_at_least_the_outage_and_everything_is_removed():
    bandwidth = parse_bandwidth("100Mbit")
    base = kernel_outage_run("ring", {}, 4, 5, 100_000, None, bandwidth, timeout=30, name=NAME)
    out = kernel_outage_run("ring", {}, 4, 5, 100_000, LinkOutage(step=3, rank=1, seconds=0.5), bandwidth,
                            timeout=30, name=NAME)
    late = {rank: out[rank][-1] - base[rank][-1] for rank in base}
    assert all(d > 0.45 for d in late.values()), late  # TCP's retransmission backoff may add to it, never less
    assert left_behind() == []


def test_the_network_is_removed_when_the_run_inside_fails():
    with pytest.raises(RuntimeError, match="planted"), shaped_network(NAME, 2, parse_bandwidth("10Mbit")) as c:
        assert len(left_behind()) >= 2 and c.nodes[1].namespace == f"sbc-{NAME}-n1"
        raise RuntimeError("planted")
    assert left_behind() == []
    assert netns.Cluster.load(NAME) is None  # its state file is gone too

"""A node's link down for t seconds on the kernel-shaped network (root, iproute2): every rank of a ring over real TCP
stalls at least the outage, and nothing is left behind, even when the run inside fails."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.cluster import netns
from experiments.cluster.outages import kernel_outage_run, shaped_network
from strategies.faults import LinkOutage
from strategies.transport.link import parse_bandwidth
from tests.helpers import netns_left_behind

PROBLEM = netns.support_problem()

pytestmark = [pytest.mark.netns, pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces here: {PROBLEM}")]
NAME = "sbtout"


def left_behind() -> list[str]:
    return netns_left_behind(NAME)


def test_a_ring_over_tcp_stalls_by_at_least_the_outage_and_everything_is_removed():
    """One run (its ranks' start-up is most of the cost): the outage's step against the others' median."""
    probe = []
    out = kernel_outage_run("ring", {}, 4, 6, 100_000, LinkOutage(step=3, rank=1, seconds=0.5),
                            parse_bandwidth("100Mbit"), timeout=30, name=NAME, probe=probe)
    for rank, ends in out.items():
        steps = np.diff([0.0, *ends])
        usual = float(np.median(np.delete(steps, 3)))
        assert steps[3] - usual > 0.45, (rank, steps)  # TCP's retransmission backoff may add to it, never less
    # the TCP probe: the link down for the outage, and the connections into and out of rank 1 retransmitting,
    # their RTO at least Linux's 200 ms floor
    [seen] = probe
    assert 0.45 < seen["up"] - seen["down"] < 1.0, seen
    retransmitting = [c for c in seen["tcp"] if c.get("timer") == "on" and c["unacked"]]
    assert {c["rank"] for c in retransmitting} & {0, 1}, seen["tcp"]  # rank 0 sends to 1, rank 1 to 2
    assert all(c["rto"] >= 0.2 for c in retransmitting), retransmitting
    assert left_behind() == []


def test_the_network_is_removed_when_the_run_inside_fails():
    with pytest.raises(RuntimeError, match="planted"), shaped_network(NAME, 2, parse_bandwidth("10Mbit")) as c:
        assert len(left_behind()) >= 2 and c.nodes[1].namespace == f"sbc-{NAME}-n1"
        raise RuntimeError("planted")
    assert left_behind() == []
    assert netns.Cluster.load(NAME) is None  # its state file is gone too

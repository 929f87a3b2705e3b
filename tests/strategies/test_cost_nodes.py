"""node_parameter_server's price on nodes where a node finishes its ring reduce-scatter before another: the early
node's pushes share the later node's ports with its ring (strategies.cost_nodes.reduced_under_pushes), worked by
hand and against a step-by-step fluid reference. No simulation: the SimGrid cells are in
tests/experiments/test_validate.py."""

from __future__ import annotations

import random

import pytest

import strategies
from strategies import cost
from strategies.cost_nodes import reduced_under_pushes


def _fluid_reference(rings, flows, ranks, nic, intra, dt=1e-3):
    """Time-stepped: each node's ring at the whole port, or at (1 - share) of it while pushes of nodes that ended
    earlier are still queued at its NIC in (drained at nic); nodes in the order their rings end alone."""
    ends = {}
    for dst in sorted(rings, key=lambda j: (rings[j], j)):
        early = sorted((ends[src], b) for (src, d), b in flows.items() if d == dst and src != dst
                       and rings[src] < rings[dst])
        share = min(nic / ranks[dst], intra / 2) / intra
        t, done, queued, i = 0.0, 0.0, 0.0, 0
        while done < rings[dst] - 1e-12:
            while i < len(early) and early[i][0] <= t + 1e-12:
                queued += early[i][1]
                i += 1
            rate = 1 - share if queued > 1e-9 else 1.0
            step = min(dt, (rings[dst] - done) / rate)
            done += step * rate
            queued = max(0.0, queued - nic * step)
            t += step
        ends[dst] = t
    return ends


def test_pushes_slow_the_ring_only_while_they_flow():
    # node 1 (2 ranks) reduces for 10 s alone; node 0 ends at 2 s and pushes 3 s of NIC time (NIC 1 B/s, ports 4):
    # each port gives 1/2 B/s of 4 to the pushes from 2 to 5 s, the ring goes at 7/8 there: 2 + 2.625 s of its
    # 10 by 5 s, the 5.375 s left after: 10.375 s
    ends = reduced_under_pushes({0: 2.0, 1: 10.0}, {(0, 1): 3}, {0: 1, 1: 2}, 1.0, 4.0)
    assert ends == {0: 2.0, 1: pytest.approx(10.375, rel=1e-12)}
    # a NIC faster than twice the port: the pushes take half of it (beside one ring flow), the ring all the way
    ends = reduced_under_pushes({0: 0.0, 1: 10.0}, {(0, 1): 1000}, {0: 1, 1: 2}, 10.0, 4.0)
    assert ends[1] == pytest.approx(20.0, rel=1e-12)
    # equal rings, a push into a node that has ended, a node's flow to itself: nothing slows
    assert reduced_under_pushes({0: 5.0, 1: 5.0}, {(0, 1): 9, (1, 0): 9}, {0: 3, 1: 3}, 1.0, 4.0) == {0: 5.0, 1: 5.0}
    assert reduced_under_pushes({0: 5.0, 1: 1.0}, {(0, 1): 9, (0, 0): 9}, {0: 3, 1: 3}, 1.0, 4.0) == {0: 5.0, 1: 1.0}


def test_pushes_slow_the_ring_as_the_fluid_reference_says():
    rnd = random.Random(7)
    for _ in range(30):
        m = rnd.randint(2, 4)
        rings = {j: rnd.choice([0.0, 0.5, 1.0, 2.0, 3.0]) for j in range(m)}
        flows = {(s, d): rnd.randint(1, 4) for s in range(m) for d in range(m) if s != d and rnd.random() < 0.7}
        ranks = {j: rnd.randint(1, 4) for j in range(m)}
        nic, intra = rnd.choice([1.0, 2.0, 5.0]), rnd.choice([2.0, 4.0])
        ends = reduced_under_pushes(rings, flows, ranks, nic, intra)
        reference = _fluid_reference(rings, flows, ranks, nic, intra)
        assert ends == pytest.approx(reference, abs=3e-3), (rings, flows, ranks, nic, intra)
        assert all(ends[j] >= rings[j] for j in rings)


def test_a_short_nodes_pushes_slow_the_hosts_ring_at_the_ports_speed():
    """node_parameter_server, colocated, 4 workers in nodes of 3, NIC 100 Gbit/s, 0 us, ports 100 Gbit/s, 2 us
    (validate's cell), ResNet-50's 25,557,032 floats: rank 3, alone in node 1, pushes its 102.2 MB into node 0 from
    t = 0, the NIC's 12.5 GB/s spread over the 3 host ranks (4.17 GB/s of each download), so node 0's ring
    reduce-scatter (2 rounds of a 34.08 MB slice + 2 us: 5.456 ms alone) goes at 2/3 of the port while the pushes
    flow (8.178 ms: 5.452 ms of the ring's) and ends at 8.182 ms (SimGrid's message log: 8.17 ms); the hosts
    answer after it: 102.2 MB out of node 0's NIC, 8.178 ms; then node 0's
    all-gather, 2 x 2.728 ms; 27 messages between the nodes x 2 us: 21.87 ms (SimGrid 21.83 ms). The model once
    started the pushes at the ring's end and left the ring at full speed: 20.1 ms (SimGrid 1.088x)."""
    ring_round = 2e-6 + 8_519_011 * 4 / 12.5e9
    pushes = 102_228_128 / 12.5e9
    reduced = pushes + (2 * ring_round - pushes * 2 / 3)
    assert reduced == pytest.approx(8.182e-3, abs=1e-6)
    hand = reduced + pushes + 2 * ring_round + 27 * 2e-6
    assert hand == pytest.approx(0.021871, abs=1e-6)
    config = strategies.make("node_parameter_server", ranks_per_node=3)
    assert config.node_pushes(4, 25_557_032) == {(1, 0): 102_228_128}
    assert cost.node_seconds(config, 4, 25_557_032, 3, 12.5e9, 12.5e9, 0.0, 2e-6) == pytest.approx(hand, rel=1e-9)


def test_a_hosts_replies_wait_for_the_last_owners_first_partitions():
    """The same at 16 workers (five nodes of 3, rank 15 alone), every chunk hosted in node 0: rank 15 pushes from
    t = 0, the four full nodes from their rings' end (5.456 ms); node 0 answers a partition only once all five
    owners' pushes of it are in, so its 511 MB of replies (40.89 ms on its NIC) start once the full nodes' first
    partition round is in (5.456 ms + 56.8 MB at 12.5 GB/s, the fill's mirror: 9.999 ms), not at its ring's end
    (8.182 ms, slowed by rank 15's pushes; 1.032x SimGrid's 56.4 ms without this); then node 0's all-gather;
    45 pushes into a host rank x 2 us: 56.44 ms. SimGrid's message log: node 0's ring ends at 8.18 ms, its first
    replies leave at 10.00 ms, the last push is in at 40.91 ms, the last reply at 50.91 ms, all done at 56.37 ms."""
    ring_round = 2e-6 + 8_519_011 * 4 / 12.5e9
    config = strategies.make("node_parameter_server", ranks_per_node=3)
    assert config.node_pushes(16, 25_557_032) == {(j, 0): 102_228_128 for j in range(1, 6)}
    fill = config.reply_fill(16, 25_557_032)
    assert fill == 5 * 3 * 946_556 * 4
    hand = 2 * ring_round + fill / 12.5e9 + 5 * 102_228_128 / 12.5e9 + 2 * ring_round + 45 * 2e-6
    assert hand == pytest.approx(0.056437, abs=1e-6)
    assert cost.node_seconds(config, 16, 25_557_032, 3, 12.5e9, 12.5e9, 0.0, 2e-6) == pytest.approx(hand, rel=1e-9)

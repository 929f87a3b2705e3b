"""`--network tcp`: the one price on SimGrid's LV08 corrections (strategies.cost.lv08_fabric), worked by hand, and
the refusal of a network model the price does not know. SimGrid's own side is in
tests/experiments/test_validate_tcp.py."""

from __future__ import annotations

import math

import pytest

import strategies
from reports.model import model_table
from strategies import cost

GBIT10 = 10e9 / 8  # bytes/s
NUMEL = 1_000_000  # 4 MB of fp32


def _tcp(bandwidth=GBIT10, latency=5e-6, **kw) -> cost.Fabric:
    return cost.Fabric(bandwidth, latency, network="tcp", **kw)


def test_ring_pays_13_times_the_latency_and_97_percent_of_the_link_less_the_acks():
    # ring at 2 ranks: 2 rounds, 4 MB through each NIC, sending while it receives: each NIC's outgoing link also
    # carries 5% of the incoming flow's rate (ACKs): 2 x 13.01 x 5 us + 4 MB x 1.05 / (0.97 x 1.25 GB/s)
    hand = 2 * 13.01 * 5e-6 + 4e6 * 1.05 / (0.97 * GBIT10)
    assert hand == pytest.approx(3.5941e-3, rel=1e-4)
    ring = strategies.make("ring")
    assert cost.sync_seconds(ring, 2, NUMEL, _tcp()) == pytest.approx(hand, rel=1e-12)
    # the same ring on alpha_beta (the default) is untouched: 2 x 5 us + 4 MB / 1.25 GB/s
    assert cost.sync_seconds(ring, 2, NUMEL, cost.Fabric(GBIT10, 5e-6)) == pytest.approx(2 * 5e-6 + 4e6 / GBIT10)


def test_reduce_then_broadcast_carries_no_acks_against_its_own_sends():
    # binomial reduce then broadcast at 2 ranks: 2 rounds, 8 MB through rank 0's NIC, one way at a time
    hand = 2 * 13.01 * 5e-6 + 8e6 / (0.97 * GBIT10)
    assert cost.sync_seconds(strategies.make("reduce_broadcast"), 2, NUMEL, _tcp()) == pytest.approx(hand, rel=1e-12)


def test_the_tcp_window_bounds_a_flow_on_a_long_route():
    # 5 ms between ranks: one flow moves at most TCP-gamma / (2 x 5 ms) = 4,194,304 / 0.01 = 419.4 MB/s, a third of
    # the 10 Gbit/s link; then x 0.97, / 1.05 for the ACKs
    rate = 0.97 * 4194304 / (2 * 5e-3) / 1.05
    hand = 2 * 13.01 * 5e-3 + 4e6 / rate
    assert cost.sync_seconds(strategies.make("ring"), 2, NUMEL, _tcp(latency=5e-3)) == pytest.approx(hand, rel=1e-12)
    assert cost.tcp_window_bound(0.0) == math.inf  # SimGrid bounds no flow on a route without latency


def test_on_nodes_each_route_has_its_own_window_and_latency():
    # nodes of 2: the NIC route crosses two ports and two NICs (latency + intra latency = 5 ms + 1 ms), the intra
    # route two ports (1 ms); every latency x 13.01
    fabric = _tcp(latency=5e-3, ranks_per_node=2, intra_bandwidth=100e9 / 8, intra_latency=1e-3)
    priced = fabric.priced(strategies.make("ring"))
    assert priced.network is cost.NetworkModel.ALPHA_BETA
    assert priced.bandwidth == pytest.approx(0.97 * 4194304 / (2 * 6e-3) / 1.05)
    assert priced.intra_bandwidth == pytest.approx(0.97 * 4194304 / (2 * 1e-3) / 1.05)
    assert priced.latency == pytest.approx(13.01 * 5e-3) and priced.intra_latency == pytest.approx(13.01 * 1e-3)
    ring = strategies.make("ring")
    assert cost.sync_seconds(ring, 4, NUMEL, fabric) == pytest.approx(
        cost.sync_seconds(ring, 4, NUMEL, priced), rel=1e-12)


def test_a_wrapped_strategy_is_priced_as_the_strategy_it_runs():
    from strategies.local_sgd import LocalSgd, local_sgd

    # reduce_broadcast every 4 steps: its sync on one step in 4, no ACK load (the wrapper's class says nothing)
    wrapped = local_sgd(strategies.make("reduce_broadcast"), LocalSgd(sync_every=4))
    assert wrapped is not wrapped.unwrapped() and not cost.sends_while_receiving(wrapped)
    hand = (2 * 13.01 * 5e-6 + 8e6 / (0.97 * GBIT10)) / 4
    assert cost.sync_seconds(wrapped, 2, NUMEL, _tcp()) == pytest.approx(hand, rel=1e-12)


def test_the_model_table_prices_tcp_and_says_so():
    from reports.model import format_model_table

    plain = model_table(model=None, model_bytes=4e6, workers=2, bandwidth=GBIT10, step_time=1.0, latency=5e-6,
                        strategies=["ring"])
    tcp = model_table(model=None, model_bytes=4e6, workers=2, bandwidth=GBIT10, step_time=1.0, latency=5e-6,
                      strategies=["ring"], network="tcp")
    assert tcp["comm_s"].iloc[0] == pytest.approx(2 * 13.01 * 5e-6 + 4e6 * 1.05 / (0.97 * GBIT10), rel=1e-9)
    assert tcp["comm_s"].iloc[0] > plain["comm_s"].iloc[0]
    assert "network tcp" in format_model_table(tcp) and "network tcp" not in format_model_table(plain)
    # S for P, fed back on tcp, gives P
    s = tcp["bandwidth_needed"].iloc[0]
    again = model_table(model=None, model_bytes=4e6, workers=2, bandwidth=s, step_time=1.0, latency=5e-6,
                        strategies=["ring"], network="tcp")
    assert again["efficiency"].iloc[0] == pytest.approx(0.9, abs=1e-6)


@pytest.mark.parametrize("bad", ["udp", "TCP", "", None, 3])
def test_a_network_model_the_price_does_not_know_is_refused_naming_the_accepted(bad):
    with pytest.raises(ValueError, match=r"bad network model .*accepted are alpha_beta, tcp"):
        cost.Fabric(GBIT10, network=bad)
    with pytest.raises(ValueError, match=r"accepted are alpha_beta, tcp"):
        model_table(model=None, model_bytes=4e6, workers=2, bandwidth=GBIT10, step_time=1.0, network=bad)


def test_the_model_command_refuses_a_bad_network_before_any_work(capsys):
    from experiments.cli.main import main

    code = main(["model", "--model-bytes", "4MB", "--workers", "2", "--bandwidth", "10Gbit", "--network", "udp"])
    assert code != 0
    err = capsys.readouterr().err
    assert "--network" in err and "'udp'" in err and "alpha_beta, tcp" in err
    main(["model", "--model-bytes", "4MB", "--workers", "2", "--bandwidth", "10Gbit", "--latency", "5us",
          "--network", "tcp", "--strategy", "ring"])
    out = capsys.readouterr().out
    assert "network tcp" in out and f"{2 * 13.01 * 5e-6 + 4e6 * 1.05 / (0.97 * GBIT10):.3f}" in out


def test_the_map_prices_tcp_and_refuses_spot_checks_it_cannot_run(capsys):
    import reports.strategy_map as sm
    from experiments.cli.main import main

    plain = sm.strategy_map(sm.Workload(NUMEL), (2,), (GBIT10,), 5e-6, strategies=["ring", "reduce_broadcast"])
    tcp = sm.strategy_map(sm.Workload(NUMEL), (2,), (GBIT10,), 5e-6, strategies=["ring", "reduce_broadcast"],
                          network="tcp")
    assert tcp.meta["network"] == "tcp" and plain.meta["network"] == "alpha_beta"
    assert tcp.cells["winner"].iloc[0] == "ring"
    assert tcp.cells["time_s"].iloc[0] == pytest.approx(2 * 13.01 * 5e-6 + 4e6 * 1.05 / (0.97 * GBIT10), rel=1e-9)
    with pytest.raises(ValueError, match="accepted are alpha_beta, tcp"):
        sm.strategy_map(sm.Workload(NUMEL), (2,), (GBIT10,), 5e-6, network="udp")
    assert main(["map", "--model-bytes", "4MB", "--workers", "2", "--network", "tcp", "--check", "1"]) == 2
    assert "--check runs its spot checks on SimGrid alpha_beta" in capsys.readouterr().err

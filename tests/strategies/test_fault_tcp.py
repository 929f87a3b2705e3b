"""TCP's retransmission backoff in the price of a link outage (strategies/fault_tcp.py), on hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pytest

import strategies
from strategies.fault_cost import outage_price
from strategies.fault_tcp import (
    give_up_s,
    linux_rto,
    retransmissions,
    tcp_expected_stall_s,
    tcp_resume_s,
    tcp_stall_s,
)
from strategies.faults import FAILURE, STALL, LinkOutage


def test_linux_rto_is_the_smoothed_rtt_plus_four_deviations_floored_at_rto_min():
    assert linux_rto(0.014494, 0.005998) == pytest.approx(0.214494)  # ss on the kernel network showed rto:216 (ticks)
    assert linux_rto(0.0, 0.0) == pytest.approx(0.2)
    assert linux_rto(0.1, 0.08) == pytest.approx(0.42)  # the deviation above the floor
    assert linux_rto(500.0, 0.0) == 120.0  # TCP_RTO_MAX
    with pytest.raises(ValueError, match=r"rttvar_s = -1"):
        linux_rto(0.01, -1)


def test_the_retransmissions_double_from_one_rto_and_are_capped_at_rto_max():
    assert retransmissions(0.2, 1.0) == pytest.approx([0.2, 0.6, 1.4])
    assert retransmissions(100.0, 500.0) == pytest.approx([100, 220, 340, 460, 580])  # 200 capped at 120
    assert retransmissions(0.2, 1.0, first_s=0.05) == pytest.approx([0.05, 0.45, 1.25])
    assert give_up_s() == pytest.approx(924.6)  # tcp_retries2 = 15 (ip-sysctl.rst)


def test_the_data_resumes_at_the_first_retransmission_after_the_link_is_back():
    assert tcp_resume_s(1.0, 0.2) == pytest.approx(1.4)  # 0.2, 0.6 lost; 1.4 gets through
    assert tcp_resume_s(0.5, 0.2) == pytest.approx(0.6)
    assert tcp_resume_s(0.6, 0.2) == pytest.approx(0.6)  # a retransmission just as the link is back goes
    assert tcp_resume_s(2.0, 0.216) == pytest.approx(3.24)
    # the transfer's first send 0.3 s into the outage (after compute): its own timer, 0.3 + 1.4
    assert tcp_resume_s(1.0, 0.2, sent_s=0.3) == pytest.approx(1.7)
    assert tcp_stall_s(1.0, 0.2, idle_s=0.3) == pytest.approx(1.4)  # against 0.7 without the backoff
    assert tcp_resume_s(1.0, 0.2, sent_s=1.5) == 1.5 and tcp_stall_s(1.0, 0.2, idle_s=1.5) == 0.0
    with pytest.raises(ValueError, match=r"rto_s = 0"):
        tcp_resume_s(1.0, 0.0)
    with pytest.raises(ValueError, match=r"outage_s = -1"):
        tcp_stall_s(-1.0, 0.2)


def test_the_expected_stall_over_a_uniform_start_is_the_staircase_integrated():
    # all transfer: the data in flight is lost at once, the stall is c(1) = 1.4
    assert tcp_expected_stall_s(1.0, 0.2, step_s=0.5) == pytest.approx(1.4)
    # all compute (idle 0.5 of a 0.5 s step): remaining outage r = 1 - u over [0.5, 1): c = 0.6 on (0.5, 0.6],
    # 1.4 on (0.6, 1] -> (0.1 x 0.6 + 0.4 x 1.4) / 0.5 = 1.24
    assert tcp_expected_stall_s(1.0, 0.2, step_s=0.5, idle_s=0.5) == pytest.approx(1.24)
    # half and half over a 1 s step: (0.5 x 1.4 + 0.62) / 1
    assert tcp_expected_stall_s(1.0, 0.2, step_s=1.0, idle_s=0.5) == pytest.approx(1.32)
    # compute longer than the outage: a start more than 1 s before the transfer costs nothing
    assert tcp_expected_stall_s(1.0, 0.2, step_s=3.0, idle_s=2.0) == pytest.approx(
        (1.0 * 1.4 + 0.2 * 0.2 + 0.4 * 0.6 + 0.4 * 1.4) / 3.0)
    with pytest.raises(ValueError, match=r"idle_s = 2"):
        tcp_expected_stall_s(1.0, 0.2, step_s=1.0, idle_s=2.0)


@pytest.mark.parametrize("outage_s, rto_s, step_s, idle_s", [(1.0, 0.2, 0.5, 0.3), (2.5, 0.216, 1.7, 1.1),
                                                             (0.3, 0.2, 4.0, 3.9), (7.0, 0.5, 10.0, 9.0)])
def test_the_exact_expectation_matches_the_mean_over_start_points(outage_s, rto_s, step_s, idle_s):
    """The reference: the known-point stall averaged over 200,001 evenly spread start points x of the step."""
    xs = (np.arange(200_001) + 0.5) / 200_001 * step_s
    stalls = [tcp_stall_s(outage_s, rto_s, idle_s - x) if x < idle_s else tcp_stall_s(outage_s, rto_s)
              for x in xs[::50]]  # a coarser grid is enough against the staircase's few steps
    assert tcp_expected_stall_s(outage_s, rto_s, step_s, idle_s) == pytest.approx(np.mean(stalls), abs=2e-3)


def test_the_outage_price_over_tcp_is_the_backoff_and_a_late_resumption_is_a_failure():
    ring = strategies.make("ring")
    outage = LinkOutage(step=5, rank=2, seconds=1.0)
    plain = outage_price(ring, 4, outage, 8, timeout_s=10.0)
    tcp = outage_price(ring, 4, outage, 8, timeout_s=10.0, rto_s=0.2)
    assert (plain.outcome, plain.stall_s) == (STALL, 1.0)
    assert tcp.outcome == STALL and tcp.stalled == (0, 1, 2, 3) and tcp.stall_s == pytest.approx(1.4)
    assert outage_price(ring, 4, outage, 8, timeout_s=10.0, idle_s=0.3, rto_s=0.2).stall_s == pytest.approx(1.4)
    # 1 s is shorter than a 1.2 s timeout, but the retransmission that gets through comes at 1.4 s
    assert outage_price(ring, 4, outage, 8, timeout_s=1.2).outcome == STALL
    late = outage_price(ring, 4, outage, 8, timeout_s=1.2, rto_s=0.2)
    assert late.outcome == FAILURE and math.isnan(late.stall_s)

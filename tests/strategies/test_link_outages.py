"""A link down for t seconds on thread ranks: the stall it costs each strategy, the same result as without it, and
past the communicator's timeout a failure that the recovery mode handles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from strategies.fault_outages import run_with_outages
from strategies.fault_runs import run_with_failures
from strategies.faults import (
    FAILURE,
    OUTAGE_MAX_S,
    STALL,
    Failure,
    FaultSettingError,
    LinkOutage,
    Recovery,
    check_outages,
    outage_outcome,
)

T = 0.3  # seconds the link is down
STEPS = 5


def gradient(slot, step, x):  # whole numbers: any order of adding them up gives the same sum, exactly
    return np.full(x.shape, float(slot + 1 + step))


def run(name, outages, **kw):
    return run_with_outages(name, 4, STEPS, outages, np.zeros(6), gradient, 0.5, **kw)


def baseline(name, **kw):
    """The run without an outage, its first (cold: imports, first allocations) left out; and each slot's least
    time to step STEPS over three such runs (a loaded machine only ever makes a run slower)."""
    run(name, [], **kw)
    runs = [run(name, [], **kw) for _ in range(3)]
    return runs[0], {slot: min(r.time_to_step(STEPS)[slot] for r in runs) for slot in range(4)}


def later(out, fastest) -> dict[int, float]:
    return {slot: t - fastest[slot] for slot, t in out.time_to_step(STEPS).items()}


@pytest.mark.timing
@pytest.mark.parametrize("name, params", [("ring", {}), ("halving_doubling", {}), ("parameter_server", {})])
def test_a_synchronous_strategy_stalls_everyone_by_the_outage_and_ends_where_it_would(name, params):
    base, fastest = baseline(name, **params)
    out = run(name, [LinkOutage(step=2, rank=2, seconds=T)], **params)
    late = later(out, fastest)
    assert all(T - 0.02 < d < T + 0.3 for d in late.values()), late
    assert [(o.step, o.rank, o.outcome) for o in out.outages] == [(2, 2, STALL)]
    assert out.outages[0].held_s == pytest.approx(T, abs=0.05)
    assert not out.run.failures and out.run.completed_steps == STEPS
    for slot, x in base.run.params.items():
        np.testing.assert_array_equal(out.run.params[slot], x)


@pytest.mark.timing
def test_a_barrier_free_server_stalls_only_the_worker_whose_link_is_down():
    params = {"staleness": "async"}
    base, fastest = baseline("parameter_server", **params)
    out = run("parameter_server", [LinkOutage(step=1, rank=2, seconds=T)], **params)
    late = later(out, fastest)
    assert T - 0.02 < late[2] < T + 0.3, late
    assert all(late[slot] < T / 2 for slot in (0, 1, 3)), late  # they never wait for worker 2
    assert [(o.step, o.rank, o.outcome) for o in out.outages] == [(1, 2, STALL)]
    np.testing.assert_array_equal(out.run.params["server"], base.run.params["server"])
    assert out.run.pushes == {slot: STEPS for slot in range(4)}


def test_an_outage_shorter_than_the_timeout_is_a_stall_and_nothing_is_recovered():
    out = run("ring", [LinkOutage(step=1, rank=3, seconds=0.1)], timeout=1.0,
              recovery=Recovery("elastic"))
    assert [o.outcome for o in out.outages] == [STALL]
    assert not out.run.failures and sorted(out.run.params) == [0, 1, 2, 3]


@pytest.mark.parametrize("recovery", [Recovery("elastic"), Recovery("checkpoint_restart", checkpoint_every=2)])
def test_an_outage_past_the_timeout_is_the_rank_failing_there_and_its_mode_recovers(recovery):
    out = run("ring", [LinkOutage(step=3, rank=2, seconds=0.6)], timeout=0.3, recovery=recovery)
    want = run_with_failures("ring", 4, STEPS, [Failure(3, 2)], recovery, np.zeros(6), gradient, 0.5, timeout=5)
    [record] = out.outages
    assert (record.step, record.rank, record.outcome) == (3, 2, FAILURE)
    assert "timed out after 0.3 s" in record.error
    assert record.held_s < 0.55  # the hold ends once its peers gave the rank up
    assert [(f.step, f.rank, f.steps_lost) for f in out.run.failures] == \
        [(f.step, f.rank, f.steps_lost) for f in want.failures]
    assert sorted(out.run.params) == sorted(want.params) and out.run.completed_steps == STEPS
    for slot, x in want.params.items():
        np.testing.assert_array_equal(out.run.params[slot], x)


def test_an_outage_past_the_timeout_without_recovery_ends_the_run_with_its_cause():
    out = run("ring", [LinkOutage(step=2, rank=1, seconds=0.6)], timeout=0.3)
    assert [o.outcome for o in out.outages] == [FAILURE]
    assert out.run.ended is not None and out.run.ended.completed_steps == 2
    assert "rank(s) [1] failed during step 2" in out.run.ended.cause


def test_outage_outcome_is_a_stall_below_the_timeout_and_a_failure_from_it():
    assert outage_outcome(0.99, 1.0) == STALL
    assert outage_outcome(1.0, 1.0) == FAILURE


@pytest.mark.parametrize("outage, fragment", [
    (LinkOutage(1, 4, 1.0), "link = 4: the run has ranks 0..3"),
    (LinkOutage(5, 1, 1.0), "step = 5: the run has steps 0..4"),
    (LinkOutage(1, 1, 0), "seconds = 0: accepted are seconds > 0"),
    (LinkOutage(1, 1, -1.5), "seconds = -1.5"),
    (LinkOutage(1, 1, math.nan), "seconds = nan"),
    (LinkOutage(1, 1, OUTAGE_MAX_S + 1), f"at most {OUTAGE_MAX_S:g}"),
    (LinkOutage(1, 1, True), "seconds = True"),
    (LinkOutage(1, 1, "2s"), "seconds = '2s'"),
])
def test_bad_outages_are_refused_naming_the_value(outage, fragment):
    with pytest.raises(FaultSettingError) as info:
        check_outages([outage], workers=4, steps=5)
    assert fragment in str(info.value), str(info.value)


def test_refusals_come_before_any_work():
    with pytest.raises(FaultSettingError, match="a link listed twice at one step"):
        check_outages([LinkOutage(1, 1, 1.0), LinkOutage(1, 1, 2.0)], workers=4, steps=5)
    with pytest.raises(FaultSettingError, match="link = 9"):
        run("ring", [LinkOutage(1, 9, 0.1)])
    with pytest.raises(FaultSettingError, match="outlast its server's wait"):
        run("parameter_server", [LinkOutage(1, 1, 0.5)], timeout=0.5, staleness="async")
    with pytest.raises(FaultSettingError, match="server rank 4"):
        run("parameter_server", [LinkOutage(1, 4, 0.1)], staleness="async")
    assert check_outages([LinkOutage(1, 4, 0.5)], workers=4, steps=5, servers=1) == (LinkOutage(1, 4, 0.5),)


# -- the model's price ---------------------------------------------------------------------------------------

def _price(name, steps, outage=None, timeout=60.0, **params):
    import strategies
    from strategies.fault_cost import outage_price

    return outage_price(strategies.make(name, **params), 8, outage or LinkOutage(5, 2, 1.0), steps, timeout)


def test_the_model_stalls_everyone_of_a_synchronous_strategy_and_one_worker_of_a_barrier_free_server():
    for name in ("ring", "halving_doubling", "parameter_server"):
        assert _price(name, 10) == type(_price(name, 10))(STALL, tuple(range(8)), 1.0)
    assert _price("parameter_server", 10, staleness="async").stalled == (2,)
    assert _price("parameter_server", 10, staleness="async", mode="summation").stalled == (2,)
    assert _price("parameter_server", 10, LinkOutage(5, 8, 1.0), staleness="async").stalled == tuple(range(8))


def test_the_model_spreads_a_gossip_stall_one_hop_a_step():
    assert _price("decentralized", 6).stalled == (1, 2, 3)  # step S = s + 1: rank 2 and its ring neighbours
    assert _price("decentralized", 7).stalled == (0, 1, 2, 3, 4)
    assert _price("decentralized", 10).stalled == tuple(range(8))
    # one peer a round: in round 5 of 8 ranks the hop is 2^(5 mod 3) = 4, so rank 6 receives from rank 2
    assert _price("decentralized", 6, topology="one_peer_exponential").stalled == (2, 6)


def test_the_model_prices_an_outage_past_the_timeout_as_a_failure():
    price = _price("ring", 10, LinkOutage(5, 2, 60.0), timeout=60.0)
    assert price.outcome == FAILURE and price.stalled == () and math.isnan(price.stall_s)
    with pytest.raises(FaultSettingError, match="link = 9"):
        _price("ring", 10, LinkOutage(5, 9, 1.0))


@pytest.mark.timing
def test_the_harness_stalls_the_ranks_the_model_says_for_a_barrier_free_server():
    import strategies
    from strategies.fault_cost import outage_price

    outage = LinkOutage(step=1, rank=1, seconds=T)
    _, fastest = baseline("parameter_server", staleness="async")
    out = run("parameter_server", [outage], staleness="async")
    measured = tuple(slot for slot, d in later(out, fastest).items() if d > T / 2)
    assert measured == outage_price(strategies.make("parameter_server", staleness="async"), 4, outage, STEPS,
                                    20.0).stalled == (1,)


def test_the_models_stall_leaves_out_the_compute_the_outage_overlaps():
    import strategies
    from strategies.fault_cost import outage_price

    ring = strategies.make("ring")
    assert outage_price(ring, 4, LinkOutage(1, 1, 1.0), 4, 60.0, idle_s=0.25).stall_s == 0.75
    assert outage_price(ring, 4, LinkOutage(1, 1, 1.0), 4, 60.0, idle_s=2.0).stall_s == 0.0
    with pytest.raises(FaultSettingError, match="idle_s = -1"):
        outage_price(ring, 4, LinkOutage(1, 1, 1.0), 4, 60.0, idle_s=-1)

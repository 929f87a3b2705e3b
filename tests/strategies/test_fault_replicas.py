"""Chain-replicated parameter servers on thread ranks: a server's failure covered by its replica, by hand."""

from __future__ import annotations

import numpy as np
import pytest

import strategies
from strategies.fault_replicas import chains, run_replicated_ps
from strategies.fault_runs import run_with_failures
from strategies.faults import Failure, FaultSettingError, Recovery, check_fits

# Three workers with constant gradients 1, 2 and 6 (lr 1, x0 = 0), four steps: every step moves x by the mean of
# the live workers' gradients (3 for all three). Servers are ranks 3, 4 (, 5): server s is rank 3 + s.
C = {0: 1.0, 1: 2.0, 2: 6.0}


def constant(slot, step, x):
    return np.full_like(x, C[slot])


def replicated(failures, servers=2, replicas=1, **kwargs):
    return run_with_failures("parameter_server", 3, 4, failures, Recovery("ps_shrink", replicas=replicas),
                             np.zeros(servers), constant, 1.0, servers=servers, **kwargs)


def test_a_server_failure_is_covered_by_its_replica():
    # server 1 (rank 4) dies during step 2: shard 1's replica on server 0 holds x after step 1 (-6), server 0
    # becomes its primary and the step in flight is redone: -6 - 3 - 3 = -12 everywhere, no step lost. Had the
    # chain not carried the updates, server 0's copy would be x0 = 0 and shard 1 would end at -6.
    run = replicated([Failure(step=2, rank=4)])
    assert {slot: x.tolist() for slot, x in run.params.items() if slot != "servers"} == \
        {0: [-12.0, -12.0], 1: [-12.0, -12.0], 2: [-12.0, -12.0]}
    assert {s: {j: v.tolist() for j, v in held.items()} for s, held in run.params["servers"].items()} == \
        {0: {0: [-12.0], 1: [-12.0]}}
    assert (run.completed_steps, run.steps_run, run.ended) == (4, 4, None)
    [record] = run.failures
    assert (record.step, record.rank, record.steps_lost, record.survivors) == (2, 4, 0, 3)
    assert 0 <= record.recovery_s < 10


def test_a_worker_and_a_server_fail():
    # worker 2 dies in step 1 (the barrier shrinks: (1 + 2) / 2 = 1.5 a step), server 0 (rank 3) in step 2:
    # -3 - 1.5 - 1.5 - 1.5 = -7.5 on the two survivors; server 1 holds both shards
    run = replicated([Failure(step=1, rank=2), Failure(step=2, rank=3)])
    assert {slot: x.tolist() for slot, x in run.params.items() if slot != "servers"} == \
        {0: [-7.5, -7.5], 1: [-7.5, -7.5]}
    assert sorted(run.params["servers"]) == [1] and sorted(run.params["servers"][1]) == [0, 1]
    assert [(r.step, r.rank, r.steps_lost, r.survivors) for r in run.failures] == [(1, 2, 0, 2), (2, 3, 0, 2)]


def test_a_replacement_server_chain_and_a_rejoining_worker():
    # three servers, one replica each: server 1 dies in step 1, server 2 in step 2 (after the chains re-formed
    # and server 0 took a copy of the shards it had no replica of): -12 on every shard; worker 1 dies in step 1
    # and its replacement joins at step 3 with x fetched from a peer: steps 1-2 at (1 + 6) / 2 = 3.5
    run = run_replicated_ps(3, 3, 1, 4, [Failure(1, 4), Failure(1, 1), Failure(2, 5)], np.zeros(3), constant, 1.0,
                            rejoin_steps=2)
    want = -3 - 3.5 - 3.5 - 3
    assert {slot: x.tolist() for slot, x in run.params.items() if slot != "servers"} == \
        {0: [want] * 3, 1: [want] * 3, 2: [want] * 3}
    assert {j: v.tolist() for j, v in run.params["servers"][0].items()} == {0: [want], 1: [want], 2: [want]}


def test_a_shard_whose_whole_chain_dies_ends_the_run():
    run = replicated([Failure(step=2, rank=3), Failure(step=2, rank=4)])
    assert run.ended is not None and run.completed_steps == 2
    assert "shard 0 lost its primary and all 1 replica(s) at once" in run.ended.cause
    assert [(r.step, r.rank) for r in run.failures] == [(2, 3), (2, 4)]


def test_chains_follow_the_live_servers():
    assert chains([0, 1, 2], 3, {0: 0, 1: 1, 2: 2}, 1) == {0: [0, 1], 1: [1, 2], 2: [2, 0]}
    assert chains([0, 2], 3, {0: 0, 1: 2, 2: 2}, 1) == {0: [0, 2], 1: [2, 0], 2: [2, 0]}
    assert chains([0], 2, {0: 0, 1: 0}, 1) == {0: [0], 1: [0]}  # one server left: no replica


def test_replicas_are_refused_where_they_do_not_fit():
    ps = strategies.make("parameter_server", servers=2)
    with pytest.raises(FaultSettingError, match="replicas = 1: server replicas belong to .* not 'elastic'"):
        Recovery("elastic", replicas=1)
    with pytest.raises(FaultSettingError, match="replicas = -1: accepted are whole numbers >= 0"):
        Recovery("ps_shrink", replicas=-1)
    with pytest.raises(FaultSettingError, match="replicas = 2 with servers = 2: .* accepted are 1 to 1"):
        check_fits("ps_shrink", ps, 3, (), replicas=2)
    with pytest.raises(FaultSettingError, match="servers = 1: a replica is another server; accepted .* servers >= 2"):
        check_fits("ps_shrink", strategies.make("parameter_server"), 3, (), replicas=1)
    with pytest.raises(FaultSettingError, match="does not fit strategy 'ring'"):
        check_fits("ps_shrink", strategies.make("ring"), 3, (), replicas=1)
    with pytest.raises(FaultSettingError, match="barrier-free parameter server"):
        check_fits("ps_shrink", strategies.make("parameter_server", servers=2, staleness="async"), 3, (), 1)
    # without a replica a server's failure is refused before any work, naming the way out
    with pytest.raises(FaultSettingError, match=r"server rank 4 .* needs a replica \(recovery.replicas >= 1\)"):
        replicated([Failure(step=2, rank=4)], replicas=0)

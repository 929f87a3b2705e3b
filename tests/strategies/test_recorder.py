"""The message recorder: what the real strategies post on thread ranks, message for message, equals the counters."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import torch

import strategies
from strategies.transport.communicator import Communicator
from strategies.transport.recorder import Direction, MessageEvent, MessageRecorder, RecorderFull
from strategies.transport.threads import run_threads


def _recorded_run(name: str, workers: int, numel: int, recorder: MessageRecorder | None, op: str = "sum",
                  **params):
    """One sync of `name` on thread ranks with `recorder` on every rank; each rank's counters."""
    config = strategies.make(name, **params)
    inputs = [torch.arange(numel, dtype=torch.float32) * (r + 1) for r in range(workers)]

    def body(comm):
        comm.recorder = recorder
        runtime = config.bind(comm, workers)
        if runtime.is_server:
            runtime.serve(numel, torch.float32, op)
        else:
            runtime.sync(inputs[comm.rank].clone(), op)
        return comm.counters()

    return run_threads(config.world_size(workers), body, timeout=20)


@pytest.mark.parametrize("name,workers,params", [
    ("ring", 4, {}), ("ring", 5, {}), ("halving_doubling", 5, {}), ("parameter_server", 3, {"servers": 2}),
    ("decentralized", 5, {"op": "mean"}), ("double_binary_tree", 6, {}),
])
def test_recorded_messages_equal_the_counters(name, workers, params):
    recorder = MessageRecorder()
    counters = _recorded_run(name, workers, 1001, recorder, **params)
    events = recorder.events()
    sent, recv = Counter(), Counter()
    sent_msgs, recv_msgs = Counter(), Counter()
    for e in events:
        assert e.posted <= e.finished and e.nbytes > 0 and e.peer != e.rank
        if e.direction is Direction.SEND:
            sent[e.rank, e.peer] += e.nbytes
            sent_msgs[e.rank, e.peer] += 1
        else:
            recv[e.rank, e.peer] += e.nbytes
            recv_msgs[e.rank, e.peer] += 1
    expected_sent = {(r, p): c.bytes_sent for r, snap in enumerate(counters) for p, c in snap.per_peer.items()
                     if c.bytes_sent}
    expected_recv = {(r, p): c.bytes_recv for r, snap in enumerate(counters) for p, c in snap.per_peer.items()
                     if c.bytes_recv}
    assert dict(sent) == expected_sent and dict(recv) == expected_recv
    assert {k: v for k, v in sent_msgs.items()} == {(r, p): c.msgs_sent for r, snap in enumerate(counters)
                                                    for p, c in snap.per_peer.items() if c.msgs_sent}
    assert {k: v for k, v in recv_msgs.items()} == {(r, p): c.msgs_recv for r, snap in enumerate(counters)
                                                    for p, c in snap.per_peer.items() if c.msgs_recv}
    # every message's two sides: what one rank sent to a peer, the peer received, message for message
    assert sorted((e.rank, e.peer, e.nbytes) for e in events if e.direction is Direction.SEND) == \
        sorted((e.peer, e.rank, e.nbytes) for e in events if e.direction is Direction.RECV)
    # seq: each rank's posting order, 0..k-1 without gaps
    for rank in {e.rank for e in events}:
        assert sorted(e.seq for e in events if e.rank == rank) == list(range(sum(e.rank == rank for e in events)))


def test_ring_at_four_posts_each_chunk_send_before_its_receive_completes():
    """Ring's 2(n-1) = 6 rounds on 4 ranks: every rank sends 6 chunks to rank+1 and receives 6 from rank-1."""
    recorder = MessageRecorder()
    _recorded_run("ring", 4, 400, recorder)
    events = recorder.events()
    assert len(events) == 4 * 6 * 2
    assert {(e.rank, e.peer) for e in events if e.direction is Direction.SEND} == {(r, (r + 1) % 4) for r in range(4)}
    assert all(e.nbytes == 100 * 4 for e in events)


def test_off_records_nothing_and_is_the_default():
    assert Communicator.recorder is None
    counters = _recorded_run("ring", 3, 10, None)
    assert sum(c.bytes_sent for c in counters) > 0


def test_the_limit_is_refused_when_posted_naming_it():
    recorder = MessageRecorder(limit=5)
    with pytest.raises(RecorderFull, match="limit = 5"):
        _recorded_run("ring", 3, 30, recorder)
    assert len(recorder.events()) <= 5


@pytest.mark.parametrize("limit", [0, -1, 2.5, True, "10"])
def test_a_bad_limit_is_refused(limit):
    with pytest.raises(ValueError, match="limit"):
        MessageRecorder(limit=limit)


def test_threads_posting_side_by_side_get_unique_seqs_and_clear_restarts_the_count():
    recorder = MessageRecorder(limit=4000)
    clock = iter(np.arange(1e6)).__next__

    def loop(rank):
        for _ in range(500):
            recorder.start(rank % 2, 9, Direction.SEND, 8, clock)()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = recorder.events()
    assert len(events) == 4000
    for rank in (0, 1):
        assert sorted(e.seq for e in events if e.rank == rank) == list(range(2000))
    with pytest.raises(RecorderFull):
        recorder.start(0, 1, Direction.RECV, 8, clock)
    recorder.clear()
    assert recorder.events() == []
    recorder.start(0, 1, Direction.RECV, 8, lambda: 1.0)()
    assert recorder.events() == [MessageEvent(0, 1, Direction.RECV, 8, 2000, 1.0, 1.0)]

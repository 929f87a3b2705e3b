"""The schedule replay (strategies/cost_replay.py) on programs small enough to work by hand, and the double binary
tree's price through it: max-min sharing of a port, one FIFO connection per pair, a step that waits for its own
sends, and the size limit beyond which the slots' sum stands."""

from __future__ import annotations

import math
import time

import pytest

import strategies
from strategies import cost
from strategies.cost_replay import Message, Step, replay

UP, DOWN = 0, 1  # link ids: rank r's upload 2r, download 2r + 1


def link(rank: int, way: int) -> int:
    return 2 * rank + way


def test_two_senders_into_one_download_share_it():
    """Ranks 1 and 2 each send 1 byte to rank 0 (every port 1 byte/s): rank 0's download is shared, both arrive
    at 2 s (not 1 s and 2 s)."""
    messages = [Message(1, 0, 1, (link(1, UP), link(0, DOWN))), Message(2, 0, 1, (link(2, UP), link(0, DOWN)))]
    programs = [[Step((0, 1), ())], [Step((), (0,))], [Step((), (1,))]]
    assert replay(programs, messages, [1.0] * 6) == pytest.approx(2.0)


def test_one_connection_per_pair_and_the_rest_max_min():
    """Rank 0 sends 2 bytes to rank 1 twice (one connection: the second leaves when the first has arrived) and 2
    bytes to rank 2, all posted at once, ports at 1 byte/s: rank 0's upload is shared by two flows (the pair's head
    and the one to rank 2), each at 1/2: both arrive at 4 s; then the pair's second message alone: 6 s."""
    messages = [Message(0, 1, 2, (link(0, UP), link(1, DOWN))), Message(0, 1, 2, (link(0, UP), link(1, DOWN))),
                Message(0, 2, 2, (link(0, UP), link(2, DOWN)))]
    programs = [[Step((), (0, 1, 2))], [Step((0, 1), ())], [Step((2,), ())]]
    assert replay(programs, messages, [1.0] * 6) == pytest.approx(6.0)


def test_a_bottleneck_elsewhere_leaves_the_share_to_the_others():
    """Max-min, not equal split: rank 1 sends to rank 0 and rank 2 (3 bytes each); rank 3 also sends 3 bytes to
    rank 2. Rank 1's upload and rank 2's download both carry two flows (1/2 each): all three flows run at 1/2, the
    one into rank 0 too (its download is free, the sender's upload bounds it): 6 s."""
    messages = [Message(1, 0, 3, (link(1, UP), link(0, DOWN))), Message(1, 2, 3, (link(1, UP), link(2, DOWN))),
                Message(3, 2, 3, (link(3, UP), link(2, DOWN)))]
    programs = [[Step((0,), ())], [Step((), (0, 1))], [Step((1, 2), ())], [Step((), (2,))]]
    assert replay(programs, messages, [1.0] * 8) == pytest.approx(6.0)
    # rank 3's upload at 1/3 byte/s: its flow gets 1/3; rank 2's download could give rank 1's flow 2/3, but rank
    # 1's upload still bounds both of its flows at 1/2: they arrive at 6 s, rank 3's at 9 s
    slow = [1.0] * 8
    slow[link(3, UP)] = 1 / 3
    assert replay(programs, messages, slow) == pytest.approx(9.0)


def test_a_step_may_wait_for_its_own_sends():
    """Rank 0 sends 1 byte to rank 1, then (waiting for that send) 1 byte to rank 2; rank 1 passes 1 byte on to
    rank 3 once its byte is in. Waited: rank 1's byte arrives at 1 s, rank 2's and rank 3's at 2 s. Posted at
    once, rank 0's two bytes share its upload and both arrive at 2 s: rank 3's at 3 s."""
    messages = [Message(0, 1, 1, (link(0, UP), link(1, DOWN))), Message(0, 2, 1, (link(0, UP), link(2, DOWN))),
                Message(1, 3, 1, (link(1, UP), link(3, DOWN)))]
    waited = [[Step((), (0,)), Step((0,), (1,))], [Step((0,), (2,))], [Step((1,), ())], [Step((2,), ())]]
    assert replay(waited, messages, [1.0] * 8) == pytest.approx(2.0)
    eager = [[Step((), (0, 1))], [Step((0,), (2,))], [Step((1,), ())], [Step((2,), ())]]
    assert replay(eager, messages, [1.0] * 8) == pytest.approx(3.0)


def test_programs_that_do_not_match_are_an_error():
    messages = [Message(0, 1, 1, (link(0, UP), link(1, DOWN)))]
    with pytest.raises(RuntimeError, match="never sent"):
        replay([[Step((), ())], [Step((0,), ())]], messages, [1.0] * 4)


@pytest.mark.parametrize("workers,chunks", [(3, 4), (4, 4), (5, 2), (8, 8)])
def test_the_double_binary_trees_price_is_its_replay_below_the_limit(workers, chunks):
    """sync_seconds (flat) is the replay at 1 byte/s scaled, plus the rounds' latency; traffic() keeps the slots'
    sum (its hand tables); the replay is never faster than the busiest rank's bytes."""
    config = strategies.make("double_binary_tree", chunks=chunks)
    numel, gbit = 25_557_032, 1e9 / 8
    replayed = config.replay_seconds(workers, numel, 4, 1, gbit)
    traffic = config.traffic(workers, numel, 4)
    assert cost.sync_seconds(config, workers, numel, cost.Fabric(gbit, 5e-6)) == \
        pytest.approx(replayed + traffic.rounds * 5e-6, rel=1e-9)
    assert cost.critical_path("double_binary_tree", workers, numel, {"chunks": chunks})[1] == \
        pytest.approx(replayed * gbit, rel=1e-9)
    busiest = max(max(r.bytes_sent, r.bytes_recv) for r in traffic.ranks)
    assert replayed >= busiest / gbit * (1 - 1e-9)


def test_beyond_the_limit_the_slots_sum_stands_and_costs_nothing():
    config = strategies.make("double_binary_tree")
    start = time.process_time()
    assert config.replay_seconds(16_384, 25_557_032, 4, 1, 1.0) is None  # refused before any work
    assert time.process_time() - start < 0.05
    assert config.replay_seconds(200, 25_557_032, 4, 1, 1.0) is None  # 4 x 199 x 4 messages
    rounds, path, _ = cost.config_path(config, 200, 25_557_032)
    assert path == config.traffic(200, 25_557_032, 4).path_bytes
    assert config.replay_seconds(1, 100, 4, 1, 1.0) is None


def test_on_nodes_the_price_is_the_replay_plus_the_rounds_latency():
    """3 ranks on one node of 3 (the chains 0 <- 1 <- 2, 2 <- 1 <- 0): 18 chunk times, not the slots' 20."""
    config = strategies.make("double_binary_tree", ranks_per_node=3)
    chunk = 3_194_629 * 4 / (100e9 / 8)
    node = cost.node_cost(config, 3, 25_557_032, 3, 10e9 / 8, 100e9 / 8, 5e-6, 2e-6)
    assert node.time_s == pytest.approx(18 * chunk + node.rounds * 2e-6, rel=1e-9)
    assert node.intra_s == pytest.approx(20 * chunk + node.rounds * 2e-6, rel=1e-9)  # the slots' sum, kept apart
    assert math.isfinite(node.time_s)


# -- the event loop against a reference that re-solves every message at every event ---------------------------


def reference_replay(programs, messages, capacity, precision=0.0):
    """The replay's physics, the plain way: at every event every moving message's max-min rate from scratch
    (progressive filling over all links), every message's bytes moved by the same dt."""
    links_of = [[link for link in msg.links if capacity[link] != math.inf] for msg in messages]
    arrived, position, queues = [None] * len(messages), [0] * len(programs), {}
    moving, latent, now = {}, [], 0.0  # moving: message -> bytes left; latent: [start time, message]

    def post(m):
        pair = (messages[m].src, messages[m].dst)
        queues.setdefault(pair, []).append(m)
        if len(queues[pair]) == 1:
            latent.append([now + messages[m].latency, m])

    def walk():
        for rank, program in enumerate(programs):
            while position[rank] < len(program) and all(arrived[m] is not None
                                                        for m in program[position[rank]].waits):
                for m in program[position[rank]].sends:
                    post(m)
                position[rank] += 1

    walk()
    while moving or latent:
        for start, m in [x for x in latent if x[0] <= now]:
            latent.remove([start, m])
            moving[m] = float(messages[m].nbytes)
        rates, share = {}, {}
        while len(rates) < len(moving):  # progressive filling
            count = {}
            for m in moving:
                if m not in rates:
                    for link in links_of[m]:
                        count[link] = count.get(link, 0) + 1
            if not count:
                rates.update({m: math.inf for m in moving if m not in rates})
                break
            low = min((capacity[link] - share.get(link, 0.0)) / c for link, c in count.items())
            for m in [m for m in moving if m not in rates]:
                if any((capacity[link] - share.get(link, 0.0)) / count[link] <= low * (1 + 1e-12)
                       for link in links_of[m]):
                    rates[m] = low
            for m, r in rates.items():
                if r == low:
                    for link in links_of[m]:
                        share[link] = share.get(link, 0.0) + low
        dt = min([left / rates[m] for m, left in moving.items()] + [start - now for start, _ in latent])
        now += dt
        done = []
        for m in list(moving):
            moving[m] = 0.0 if rates[m] == math.inf else moving[m] - rates[m] * dt
            if moving[m] <= precision * messages[m].nbytes + 1e-6:
                done.append(m)
                del moving[m]
        for m in done:
            arrived[m] = now
            pair = (messages[m].src, messages[m].dst)
            queues[pair].pop(0)
            if queues[pair]:
                latent.append([now + messages[queues[pair][0]].latency, queues[pair][0]])
        walk()
    assert all(position[r] == len(p) for r, p in enumerate(programs))
    return now


def random_programs(seed: int, ranks: int = 5, rounds: int = 4):
    """Rounds of random sends between ranks (sizes 1-9 bytes, some of them equal, some with a latency), every
    rank posting its round's sends then waiting for its round's receives and, sometimes, its own sends; ports of
    1-3 bytes/s and a shared 'NIC' link for ranks 0-2's sends, sometimes unlimited."""
    import random

    rng = random.Random(seed)
    messages, programs = [], [[] for _ in range(ranks)]
    nic = 2 * ranks
    for _ in range(rounds):
        sent, received = [[] for _ in range(ranks)], [[] for _ in range(ranks)]
        for src in range(ranks):
            for dst in rng.sample([r for r in range(ranks) if r != src], rng.randint(0, 3)):
                links = (2 * src, 2 * dst + 1) + ((nic,) if src < 3 and dst >= 3 else ())
                sent[src].append(len(messages))
                received[dst].append(len(messages))
                messages.append(Message(src, dst, rng.choice([1, 2, 3, 3, 5, 9]), links,
                                        rng.choice([0.0, 0.0, 0.25])))
        for rank in range(ranks):
            programs[rank].append(Step((), tuple(sent[rank])))
            own = tuple(sent[rank]) if rng.random() < 0.5 else ()
            programs[rank].append(Step(tuple(received[rank]) + own, ()))
    capacity = [rng.choice([1.0, 2.0, 3.0]) for _ in range(2 * ranks)] + [rng.choice([1.5, math.inf])]
    return programs, messages, capacity


@pytest.mark.parametrize("seed", range(40))
def test_the_event_loop_agrees_with_re_solving_everything_at_every_event(seed):
    """Only the part of the network an event changed is re-solved; every other message keeps its rate and its
    finish time: the same seconds as re-solving every message's rate at every event."""
    programs, messages, capacity = random_programs(seed)
    assert replay(programs, messages, capacity, precision=0.0) == \
        pytest.approx(reference_replay(programs, messages, capacity), rel=1e-9)

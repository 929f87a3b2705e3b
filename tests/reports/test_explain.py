"""`syncbench explain`: the real code's messages, round by round, against tables worked by hand from each
algorithm's definition (never from the output)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from experiments.cli import explain as cli
from experiments.cli.main import main
from reports.explain import assign_rounds, explain, pair, text
from strategies import explain as recording
from strategies.cost import parse_strategy
from strategies.transport.recorder import Direction, MessageEvent

FLOAT = 4  # bytes per element: explain syncs float32


def _explained(spec: str, workers: int, numel: int):
    rec = recording.record(*parse_strategy(spec), workers, numel)
    return rec, explain(rec.strategy, rec.events, rec.roles, rec.numel, rec.itemsize, rec.chunks)


def _table(x) -> set[tuple[int, int, int, tuple[int, int], int]]:
    return {(m.round, m.src, m.dst, m.chunk, m.nbytes) for m in x.messages}


def _balanced(numel: int, parts: int) -> list[tuple[int, int]]:
    """numel elements in `parts` contiguous chunks, the first numel mod parts one element longer."""
    base, extra = divmod(numel, parts)
    sizes = [base + (i < extra) for i in range(parts)]
    return [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(parts)]


# -- ring: n-1 rounds of reduce-scatter, then n-1 of all-gather, one chunk per rank per round to its right ----------

def _ring_by_hand(n: int, numel: int):
    chunk = _balanced(numel, n)
    table = set()
    for k in range(1, n):  # reduce-scatter round k: rank r sends chunk r - k + 1 (its own first) to r + 1
        for r in range(n):
            lo, hi = chunk[(r - k + 1) % n]
            table.add((k, r, (r + 1) % n, (lo, hi), (hi - lo) * FLOAT))
    for k in range(1, n):  # all-gather round k: rank r sends the chunk it finished, r + 1, then what it got
        for r in range(n):
            lo, hi = chunk[(r + 1 - (k - 1)) % n]
            table.add((n - 1 + k, r, (r + 1) % n, (lo, hi), (hi - lo) * FLOAT))
    return table


@pytest.mark.parametrize("n,numel", [(4, 10), (5, 12)])
def test_ring_matches_the_hand_worked_table(n, numel):
    rec, x = _explained("ring", n, numel)
    assert x.rounds == 2 * (n - 1)
    assert _table(x) == _ring_by_hand(n, numel)
    assert [x.phase(r) for r in range(1, x.rounds + 1)] == ["reduce"] * (n - 1) + ["gather"] * (n - 1)
    chunk = _balanced(numel, n)
    segment = {c: i for i, c in enumerate(chunk)}
    assert list(x.segments) == chunk
    everyone = frozenset(range(n))
    for r in range(n):
        # after reduce-scatter round k rank r holds k + 1 contributions on chunk r - k: its own and k from the left
        for k in range(1, n):
            assert x.holds[k][r][segment[chunk[(r - k) % n]]] == frozenset((r - j) % n for j in range(k + 1))
        assert x.holds[n - 1][r][(r + 1) % n] == everyone  # the chunk it owns, finished
        assert all(c == everyone for c in x.holds[2 * (n - 1)][r])
    assert sum(x.round_bytes(r) for r in range(1, x.rounds + 1)) == sum(c.bytes_sent for c in rec.counters)


# -- halving-doubling (Rabenseifner) on 4 and 5 ranks, 10 elements -----------------------------------------------
# p = 4 ranks, distance 2 then 1: in round 1 rank r pairs with r ^ 2 and both hold [0, 10), split at 5: the lower
# (bit 2 clear) keeps [0, 5) and sends [5, 10), the upper the reverse; in round 2 rank r pairs with r ^ 1 and splits
# its half at lo + (hi - lo) // 2 (7 for [5, 10), 2 for [0, 5)): the lower keeps the first part. The all-gather
# replays the exchanges backwards, each sending what it kept.
HD4 = {
    (1, 0, 2, (5, 10)), (1, 2, 0, (0, 5)), (1, 1, 3, (5, 10)), (1, 3, 1, (0, 5)),
    (2, 0, 1, (2, 5)), (2, 1, 0, (0, 2)), (2, 2, 3, (7, 10)), (2, 3, 2, (5, 7)),
    (3, 0, 1, (0, 2)), (3, 1, 0, (2, 5)), (3, 2, 3, (5, 7)), (3, 3, 2, (7, 10)),
    (4, 0, 2, (0, 5)), (4, 2, 0, (5, 10)), (4, 1, 3, (0, 5)), (4, 3, 1, (5, 10)),
}
# 5 ranks: rank 4 (beyond p = 4) folds its whole array into rank 0 and gets the result back at the end. Rounds by
# dependency: the fold is round 1; ranks 1 and 3 need nothing first, so their distance-2 exchange is round 1 too;
# rank 0 takes part only after it received the fold, so 0 <-> 2 is round 2; every later exchange waits for the
# pair's previous receives: distance 1 in round 3, the all-gather in rounds 4 and 5, the unfold round 6.
HD5 = (
    {(1, 4, 0, (0, 10)), (1, 1, 3, (5, 10)), (1, 3, 1, (0, 5)), (2, 0, 2, (5, 10)), (2, 2, 0, (0, 5))}
    | {(rnd + 1, src, dst, chunk) for rnd, src, dst, chunk in HD4 if rnd > 1}
    | {(6, 0, 4, (0, 10))}
)


@pytest.mark.parametrize("n,table", [(4, HD4), (5, HD5)])
def test_halving_doubling_matches_the_hand_worked_table(n, table):
    rec, x = _explained("halving_doubling", n, 10)
    assert _table(x) == {(rnd, src, dst, (lo, hi), (hi - lo) * FLOAT) for rnd, src, dst, (lo, hi) in table}
    assert x.rounds == max(rnd for rnd, *_ in table)
    assert sum(x.round_bytes(r) for r in range(1, x.rounds + 1)) == sum(c.bytes_sent for c in rec.counters)
    everyone = frozenset(range(n))
    assert all(c == everyone for per_rank in x.holds[x.rounds] for c in per_rank)
    # after the reduce-scatter each of the p ranks holds one finished quarter (its range of the last split)
    rs_end = 2 if n == 4 else 3
    owned = {0: (0, 2), 1: (2, 5), 2: (5, 7), 3: (7, 10)}
    for r, chunk in owned.items():
        finished = [seg for seg, c in zip(x.segments, x.holds[rs_end][r]) if c == everyone]
        assert finished == [chunk]
    if n == 5:
        assert x.holds[1][0] == tuple(frozenset({0, 4}) for _ in x.segments)  # the fold, on the whole array
        assert x.holds[5][4] == tuple(frozenset({4}) for _ in x.segments)  # rank 4 waits for the unfold


def test_parameter_server_pushes_then_pulls_per_partition():
    # 2 servers own halves [0, 5) and [5, 10) (one partition each at this size): every worker pushes each half to
    # its server in round 1, each server replies the finished half to every worker in round 2
    rec, x = _explained("parameter_server:servers=2", 3, 10)
    assert rec.roles == ("worker",) * 3 + ("server",) * 2
    halves = {3: (0, 5), 4: (5, 10)}
    assert _table(x) == ({(1, w, s, halves[s], 20) for w in range(3) for s in (3, 4)}
                         | {(2, s, w, halves[s], 20) for w in range(3) for s in (3, 4)})
    assert [x.phase(1), x.phase(2)] == ["reduce", "gather"]
    assert "push" in text(x) and "pull" in text(x)


def test_decentralized_talks_to_its_ring_neighbours_in_one_round():
    rec, x = _explained("decentralized", 5, 6)
    assert _table(x) == {(1, r, (r + d) % 5, (0, 6), 24) for r in range(5) for d in (1, -1)}
    assert x.holds[1][2] == (frozenset({1, 2, 3}),)


@pytest.mark.parametrize("spec,workers", [
    ("all_to_all", 3), ("double_binary_tree", 6), ("reduce_broadcast", 4), ("ring:compression=fp16", 3),
    ("hierarchical:ranks_per_node=2", 4), ("node_parameter_server:ranks_per_node=2", 4),
    ("parameter_server:servers=2,placement=colocated", 3), ("naive_ring", 4),
])
def test_bytes_per_round_sum_to_the_counters_and_every_worker_ends_with_every_contribution(spec, workers):
    rec, x = _explained(spec, workers, 37)
    assert x.rounds >= 1
    assert sum(x.round_bytes(r) for r in range(1, x.rounds + 1)) == sum(c.bytes_sent for c in rec.counters) > 0
    assert sum(sum(x.link_bytes(r).values()) for r in range(1, x.rounds + 1)) == x.total_bytes
    if x.holds is not None:  # an allreduce: after the last round each worker holds the sum of all on every chunk
        everyone = frozenset(range(workers))
        assert all(c == everyone for w in range(workers) for c in x.holds[x.rounds][w])
        assert not any(c == everyone for w in range(workers) for c in x.holds[0][w])


def test_compressed_messages_are_not_views_of_the_buffer_and_say_so():
    _, x = _explained("ring:compression=fp16", 3, 6)
    assert x.holds is None and x.segments is None
    assert "chunks: unknown" in text(x)


# -- the round rule on hand-made events ---------------------------------------------------------------------------

def _ev(rank, peer, direction, seq, posted, finished, nbytes=8):
    return MessageEvent(rank, peer, Direction(direction), nbytes, seq, posted, finished)


def test_a_message_waits_for_what_its_receiver_received_before_posting_the_receive():
    # rank 2 sends to rank 0 (round 1); only then does rank 0 post its receive from rank 1, whose send needs nothing:
    # 1 -> 0 is round 2 (rank 0 took it after round 1), though rank 1 posted it first
    events = [
        _ev(2, 0, "send", 0, 0.0, 0.1), _ev(0, 2, "recv", 0, 0.0, 1.0),
        _ev(1, 0, "send", 0, 0.0, 0.1), _ev(0, 1, "recv", 1, 2.0, 3.0),
        # and rank 0 forwards to rank 3 after both: round 3
        _ev(0, 3, "send", 2, 4.0, 4.5), _ev(3, 0, "recv", 0, 0.0, 5.0),
    ]
    rounds = {(m.src, m.dst): m.round for m in assign_rounds(pair(events))}
    assert rounds == {(2, 0): 1, (1, 0): 2, (0, 3): 3}


def test_pairing_refuses_a_recording_with_one_end_missing():
    with pytest.raises(ValueError, match="rank 0 sent 1 messages to rank 1, which received 0"):
        pair([_ev(0, 1, "send", 0, 0.0, 0.1)])
    with pytest.raises(ValueError, match="8 bytes sent, 4 received"):
        pair([_ev(0, 1, "send", 0, 0.0, 0.1), _ev(1, 0, "recv", 0, 0.0, 0.2, nbytes=4)])
    with pytest.raises(ValueError, match="rank 1 received from rank 0, which sent nothing"):
        pair([_ev(1, 0, "recv", 0, 0.0, 0.2)])


# -- the command --------------------------------------------------------------------------------------------------

def test_the_command_prints_the_table_and_writes_the_picture(tmp_path, capsys):
    svg, page = tmp_path / "ring.svg", tmp_path / "ring.html"
    assert main(["explain", "ring", "--workers", "4", "--numel", "8", "--svg", str(svg), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "6 rounds, 24 messages, 192 bytes" in out and "(= the run's counters: 192 bytes sent)" in out
    assert "rounds 1-3: reduce" in out and "rounds 4-6: gather" in out
    root = ET.parse(svg).getroot()
    arrows = [e for e in root.iter("{http://www.w3.org/2000/svg}line") if e.get("marker-end")]
    assert len(arrows) == 24
    assert "<svg" in page.read_text() and "holds after round 6" in page.read_text()


@pytest.mark.parametrize("argv,message", [
    (["ring", "--workers", "1"], "--workers 1: accepted is an integer from 2 to 32"),
    (["ring", "--workers", "4", "--numel", "0"], "--numel 0: accepted is an integer from 1"),
    (["native", "--workers", "3"], "moves its bytes inside the backend"),
    (["parameter_server:staleness=1", "--workers", "3"], "staleness = 0"),
    (["no_such", "--workers", "3"], "no_such"),
    (["ring", "--workers", "3", "--svg", "/no/such/dir/x.svg"], "--svg /no/such/dir/x.svg"),
])
def test_bad_input_is_refused_naming_it(argv, message, capsys):
    assert main(["explain", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_command_states_the_recording_bounds():
    assert (cli.MAX_WORKERS, cli.MAX_NUMEL, cli.DEFAULT_NUMEL) == (
        recording.MAX_WORKERS, recording.MAX_NUMEL, recording.DEFAULT_NUMEL)


# -- the report's section -----------------------------------------------------------------------------------------

@pytest.mark.slow  # the report built whole: out of make test-fast
def test_the_report_draws_each_strategy_of_the_sweep(built_report):
    page = built_report.read_text()
    section = page.split('<section id="explain">')[1].split("</section>")[0]
    # the fixture sweep ran ring, a parameter server and decentralized averaging at 2 and 4 workers
    for heading in ("ring on 4 workers", "parameter_server", "decentralized on 4 workers"):
        assert heading in section
    assert section.count("<svg") == 3 and "holds after round 6" in section  # ring at 4: 2(n-1) rounds


@pytest.mark.parametrize("ran,drawn", [([2, 4, 8], 4), ([2], 2), ([2, 3], 3), ([5, 6], 5), ([16, 64], 4), ([8], 8)])
def test_the_section_draws_the_readable_worker_count_nearest_four(ran, drawn):
    from reports.explain_section import drawn_workers

    assert drawn_workers(ran) == drawn


def test_the_section_is_absent_when_nothing_moves_through_send_recv():
    import pandas as pd

    from reports.explain_section import section
    from reports.sections import Absent, Results

    ok = pd.DataFrame({"strategy": ["native"], "workers": [4], "strategy_label": ["native"]})
    got = section(Results(ok, ok, None, None, []))
    assert isinstance(got, Absent) and "nothing to draw" in got.reason


@pytest.mark.parametrize("spec,workers", [("ring", 5), ("halving_doubling", 7),
                                          ("parameter_server:servers=2,partition_mb=0.00001", 3)])
def test_rounds_do_not_depend_on_how_fast_the_threads_ran(spec, workers):
    tables = {frozenset(_table(_explained(spec, workers, 37)[1])) for _ in range(4)}
    assert len(tables) == 1


def test_the_section_names_what_it_could_not_draw():
    import pandas as pd

    from reports.explain_section import section
    from reports.sections import Results

    ok = pd.DataFrame({"strategy": ["native", "ring", "ring"], "workers": [4, 16, 64],
                       "strategy_label": ["native", "ring", "ring"]})
    got = section(Results(ok, ok, None, None, []))
    assert [(d["label"], d["workers"]) for d in got["drawn"]] == [("ring", 4)]
    assert "ran at 16 or more" in got["drawn"][0]["note"]
    assert [label for label, _ in got["skipped"]] == ["native"] and "inside the backend" in got["skipped"][0][1]

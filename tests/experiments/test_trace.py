"""Traced steps: recorded on thread ranks, stored, read back; the critical path of a scripted run with a planted
straggler; totals equal the steps table; the Chrome and Chakra exports read back; the report draws them."""

from __future__ import annotations

import json
import time
import tomllib
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from experiments.cli.main import main as cli
from experiments.config.sweep import RunSpec, SweepError, parse
from experiments.pipeline import runner
from experiments.pipeline.substrate import ThreadSubstrate
from experiments.pipeline.trace import COMM, COMPUTE, PHASES, StepTrace, run_events, traced_steps
from experiments.results import dataset, timeline
from experiments.results.dataset import read_events, read_runs, read_steps
from strategies.transport.threads import run_threads

SWEEP = """
name = "traced"
[defaults]
workload = "tiny"
steps = 4
warmup_steps = 1
batch_size = 8
{link}
trace_steps = 2
{extra}
[grid]
strategy = {strategies}
workers = [4]
"""
LINK = 'link = { bandwidth = "1Gbit", latency = "20us" }'
DEMO = '["ring", "parameter_server", "halving_doubling"]'


def _text(extra: str = "", link: str = LINK, strategies: str = DEMO) -> str:
    text = SWEEP.format(extra=extra, link=link, strategies=strategies)
    return text.replace("trace_steps = 2\n", "", 1) if "trace_steps" in extra else text


def _sweep(tmp_path, extra: str = "", name: str = "out", link: str = LINK, strategies: str = DEMO):
    torch.set_num_threads(1)
    text = _text(extra, link, strategies)
    sweep = parse(tomllib.loads(text), source=text)
    out = tmp_path / name
    runner.run_sweep(sweep, out, log=open("/dev/null", "w"), substrate=ThreadSubstrate())
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The demo's three 4-worker strategies on thread ranks, two traced steps each; and one with buckets overlapped."""
    out = _sweep(tmp_path_factory.mktemp("trace"))
    return out


@pytest.fixture(scope="module")
def untraced(tmp_path_factory):
    """ring on thread ranks with trace_steps = 0 (read only by the tests that share it)."""
    return _sweep(tmp_path_factory.mktemp("untraced"), extra="trace_steps = 0", strategies='["ring"]')


# -- the critical path of a scripted run ------------------------------------------------------------------------


def _scripted(slow_rank: int):
    """Three thread ranks: each computes 10 ms (the straggler 80 ms), then a chain 0 -> 1 -> 2 of one message each,
    rank 1 forwarding once it has both computed and received; then 2 ms of optimizer on rank 2."""
    spec = SimpleNamespace(warmup_steps=0, steps=1, trace_steps=1)

    def body(comm):
        clock = time.perf_counter
        trace = StepTrace(spec, comm, clock)
        trace.begin(0)
        start = clock()
        time.sleep(0.08 if comm.rank == slow_rank else 0.01)
        compute_end = clock()
        trace.phase("forward+backward", start, compute_end)
        buf = torch.zeros(1000)
        sync_start = clock()
        if comm.rank == 0:
            comm.send(buf, 1)
        elif comm.rank == 1:
            comm.recv(buf, 0)
            comm.send(buf, 2)
        else:
            comm.recv(buf, 1)
        sync_end = clock()
        trace.phase("sync", sync_start, sync_end)
        if comm.rank == 2:
            time.sleep(0.002)
        trace.phase("optimizer", sync_end, clock())
        trace.end()
        return {"events": trace.events}

    results = run_threads(3, body, timeout=20)
    return pd.DataFrame(run_events("scripted", results))


@pytest.mark.parametrize("slow_rank, expected", [
    (0, [(0, "forward+backward"), (0, "send to r1"), (1, "recv from r0"), (1, "send to r2"), (2, "recv from r1"),
         (2, "optimizer")]),
    (1, [(1, "forward+backward"), (1, "recv from r0"), (1, "send to r2"), (2, "recv from r1"), (2, "optimizer")]),
    (2, [(2, "forward+backward"), (2, "recv from r1"), (2, "optimizer")]),
])
def test_a_planted_straggler_is_on_the_critical_path(slow_rank, expected):
    step = timeline.one_step(_scripted(slow_rank), "scripted")
    path = [(link.rank, link.what) for link in timeline.critical_path(step)]
    assert path == expected
    # the step ends with rank 2's optimizer: the path's last link
    assert timeline.critical_path(step)[-1].end_s == pytest.approx(step["end_s"].max())


def test_the_straggler_of_a_ring_run_carries_its_critical_path(tmp_path):
    """A real ring step on thread ranks, rank 2 computing 8x longer: every compute phase on the path before the
    first message is rank 2's, and its straggle is one of them."""
    out = _sweep(tmp_path, extra="straggler = { ranks = [2], slowdown = 8 }", link="", strategies='["ring"]')
    runs = read_runs(out).set_index("strategy")
    events = read_events(out, runs.loc["ring", "run_id"])
    for step_index in sorted(events["step"].unique()):
        path = timeline.critical_path(timeline.one_step(events, runs.loc["ring", "run_id"], int(step_index)))
        before_messages = []
        for link in path:
            if link.what.startswith(("recv", "send")):
                break
            before_messages.append(link)
        assert {link.rank for link in before_messages} == {2}, path
        assert "straggle" in {link.what for link in before_messages}, path


# -- recording and storing ------------------------------------------------------------------------------------


def test_traced_steps_are_the_first_after_warm_up_and_every_rank_records(traced):
    events, runs = read_events(traced), read_runs(traced)
    assert (runs["status"] == "ok").all(), runs["error"].tolist()
    for run in runs.itertuples():
        mine = events[events["run_id"] == run.run_id]
        assert sorted(mine["step"].unique()) == [1, 2]
        workers = mine[mine["rank"] < 4]
        assert set(workers["rank"]) == {0, 1, 2, 3}
        assert set(mine["kind"]) >= {"phase", "message", "bucket_sync"}
        assert set(mine.loc[mine["kind"] == "phase", "name"]) <= set(PHASES)
        assert (mine["end_s"] >= mine["start_s"]).all() and mine["start_s"].min() == 0.0


def test_trace_totals_equal_the_steps_table_within_one_percent(traced):
    """Per rank and traced step: compute phases sum to compute_s, exposed-communication phases to comm_s, the
    messages' bytes to bytes_sent (ring, parameter server, halving-doubling)."""
    events, steps = read_events(traced), read_steps(traced)
    compared = 0
    for run_id, step in timeline.traced(events):
        totals = timeline.totals(timeline.one_step(events, run_id, step)).set_index("rank")
        rows = steps[(steps["run_id"] == run_id) & (steps["step"] == step) & (steps["role"] == "worker")]
        for row in rows.itertuples():
            assert totals.at[row.rank, "compute_s"] == pytest.approx(row.compute_s, rel=0.01)
            assert totals.at[row.rank, "comm_s"] == pytest.approx(row.comm_s, rel=0.01, abs=1e-6)
            assert totals.at[row.rank, "bytes_sent"] == row.bytes_sent
            compared += 1
    assert compared == 3 * 2 * 4


def test_overlapped_buckets_record_readiness_and_hidden_communication(tmp_path):
    out = _sweep(tmp_path, extra="bucket_mb = 0.02\noverlap = true", strategies='["ring"]')
    events, steps = read_events(out), read_steps(out)
    ring = read_runs(out).set_index("strategy").loc["ring", "run_id"]
    mine = events[events["run_id"] == ring]
    ready, synced = mine[mine["kind"] == "bucket_ready"], mine[mine["kind"] == "bucket_sync"]
    assert ready["bucket"].nunique() > 1 and set(synced["thread"]) == {"comm"}
    for (rank, step), one in synced.groupby(["rank", "step"]):  # a bucket starts once it is ready
        ready_at = ready[(ready["rank"] == rank) & (ready["step"] == step)].set_index("bucket")["start_s"]
        for bucket in one.itertuples():
            assert bucket.start_s >= ready_at[bucket.bucket] - 1e-9
    totals = timeline.totals(timeline.one_step(events, ring))
    row = steps[(steps["run_id"] == ring) & (steps["step"] == 1)].set_index("rank")
    assert totals.set_index("rank")["comm_s"].to_numpy() == pytest.approx(row["comm_s"].to_numpy(), rel=0.01,
                                                                           abs=1e-6)
    assert (totals["busy_s"] >= totals["hidden_s"]).all()


def test_no_trace_steps_records_nothing(untraced):
    assert read_events(untraced).empty
    assert not (untraced / "events").exists() or not any((untraced / "events").iterdir())


def test_trace_steps_is_capped_before_work():
    text = _text().replace("trace_steps = 2", "trace_steps = 17")
    with pytest.raises(SweepError, match=r"trace_steps = 17: accepted are values >= 0 and <= 16"):
        parse(tomllib.loads(text), source=text)


def test_the_default_keeps_earlier_run_ids_and_traces_small_runs_only():
    """trace_steps left unset is left out of the run id (results written before it resume as the same runs): 3
    steps in a run of at most 64 ranks, none in a larger one; set, more than 64 ranks are refused before work."""
    assert RunSpec().run_id != RunSpec(trace_steps=3).run_id != RunSpec(trace_steps=0).run_id
    assert RunSpec().run_id == RunSpec(trace_steps=None).run_id
    assert [traced_steps(RunSpec(workers=n)) for n in (4, 64, 65)] == [3, 3, 0]
    assert traced_steps(RunSpec(workers=4, trace_steps=0)) == 0
    text = _text("trace_steps = 1").replace("workers = [4]", "workers = [65]")
    with pytest.raises(SweepError, match=r"trace_steps = 1 with 66 ranks: runs of at most 64 ranks are traced"):
        parse(tomllib.loads(text), source=text)


def test_a_merged_batch_keeps_the_events_of_the_latest_attempts(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "BATCH", 3)
    from experiments.results.schema import RUNS, row

    def event(run_id, step):
        return {"run_id": run_id, "step": step, "rank": 0, "kind": "phase", "name": "forward", "thread": "main",
                "bucket": -1, "peer": -1, "nbytes": 0, "seq": -1, "start_s": 0.0, "end_s": 1.0}

    for seq, (run_id, step) in enumerate([("a", 1), ("b", 1), ("a", 2)]):  # run a's second attempt wins
        dataset.write_run(tmp_path, seq, row(RUNS, run_id=run_id, status="ok"), [], [event(run_id, step)])
    dataset.merge(tmp_path)
    assert [p.name for p in (tmp_path / "events").iterdir()] == ["00000000-00000002.parquet"]
    events = read_events(tmp_path).sort_values("run_id")
    assert events[["run_id", "step"]].values.tolist() == [["a", 2], ["b", 1]]


# -- exports ------------------------------------------------------------------------------------------------------


def _run_id(out, strategy):
    return read_runs(out).set_index("strategy").loc[strategy, "run_id"]


@pytest.mark.parametrize("strategy", ["ring", "parameter_server", "halving_doubling"])
def test_chrome_trace_reads_back_with_nested_tracks_flows_and_the_steps_totals(traced, tmp_path, strategy):
    run_id = _run_id(traced, strategy)
    path = tmp_path / "trace.json"
    assert cli(["trace", str(traced), run_id, "--format", "chrome", "--out", str(path)]) == 0
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == set(read_events(traced, run_id)["rank"])
    for e in slices:
        assert {"name", "cat", "pid", "tid", "ts", "dur"} <= set(e) and e["dur"] >= 0
    tracks: dict = {}
    for e in slices:  # slices on one track nest (the format's rule): no partial overlap
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-6 or b1 <= a1 + 1e-6, (a0, a1, b0, b1)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    messages = [e for e in slices if e["cat"] == "message"]
    assert set(starts) == set(ends) and 2 * len(starts) == len(messages)
    for flow, start in starts.items():  # an arrow from a send on its rank to the receive on the peer's
        end = ends[flow]
        sender = next(e for e in messages if e["pid"] == start["pid"] and e["ts"] == start["ts"])
        assert sender["name"] == f"send to r{end['pid']}" and end["ts"] >= start["ts"]
    steps = read_steps(traced)
    steps = steps[(steps["run_id"] == run_id) & (steps["role"] == "worker")
                  & steps["step"].isin(trace["otherData"]["steps"])]
    for category, column in ((COMPUTE, "compute_s"), (COMM, "comm_s")):
        traced_total = sum(e["dur"] for e in slices if e["cat"] == category and e["pid"] < 4) / 1e6
        assert traced_total == pytest.approx(steps[column].sum(), rel=0.01)


@pytest.mark.parametrize("strategy", ["ring", "parameter_server"])
def test_chakra_traces_read_back_with_their_own_reader(traced, tmp_path, strategy):
    et_def = pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    run_id = _run_id(traced, strategy)
    assert cli(["trace", str(traced), run_id, "--format", "chakra", "--out", str(tmp_path)]) == 0
    events = timeline.one_step(read_events(traced, run_id), run_id)
    sends, recvs = set(), set()
    for rank in sorted(events["rank"].unique()):
        mine = events[events["rank"] == rank]
        f = openFileRd(str(tmp_path / f"{run_id}.{rank}.et"))
        meta = et_def.GlobalMetadata()
        assert decodeMessage(f, meta) and meta.version
        nodes = []
        while True:
            node = et_def.Node()
            if not decodeMessage(f, node):
                break
            nodes.append(node)
        f.close()
        compute = mine[(mine["kind"] == "phase") & (mine["name"].map(PHASES) == COMPUTE)]
        messages = mine[mine["kind"] == "message"]
        assert sum(n.type == et_def.COMP_NODE for n in nodes) == len(compute)
        assert sum(n.type in (et_def.COMM_SEND_NODE, et_def.COMM_RECV_NODE) for n in nodes) == len(messages)
        assert sum(n.duration_micros for n in nodes if n.type == et_def.COMP_NODE) == pytest.approx(
            1e6 * (compute["end_s"] - compute["start_s"]).sum(), abs=len(compute))
        for n in nodes:
            assert all(dep < n.id for dep in n.data_deps)
            attrs = {a.name: a for a in n.attr}
            if n.type in (et_def.COMM_SEND_NODE, et_def.COMM_RECV_NODE):
                key = (attrs["comm_src"].int32_val, attrs["comm_dst"].int32_val, attrs["comm_tag"].int32_val,
                       attrs["comm_size"].int64_val)
                (sends if n.type == et_def.COMM_SEND_NODE else recvs).add(key)
    assert sends == recvs and sends  # every send has its receive on the peer, same tag and size


def test_trace_refuses_an_unknown_run_and_a_run_without_events(traced, untraced, tmp_path, capsys):
    assert cli(["trace", str(traced), "no-such-run", "--format", "chrome"]) == 2
    assert "run 'no-such-run' is not in" in capsys.readouterr().err
    assert cli(["trace", str(untraced), _run_id(untraced, "ring"), "--format", "chrome"]) == 2
    assert "recorded no events" in capsys.readouterr().err
    assert cli(["trace", str(traced), _run_id(traced, "ring"), "--format", "chrome", "--step", "0"]) == 2
    assert "traced steps 1, 2" in capsys.readouterr().err
    link = traced / "trace"
    link.symlink_to(tmp_path)  # the default output folder a link out of the results directory: refused
    try:
        assert cli(["trace", str(traced), _run_id(traced, "ring"), "--format", "chrome"]) == 2
        assert "is a symbolic link" in capsys.readouterr().err and not any(tmp_path.glob("*.json"))
    finally:
        link.unlink()


# -- the report -----------------------------------------------------------------------------------------------


@pytest.mark.slow  # the report built whole: out of make test-fast
def test_the_report_draws_each_compared_configuration_with_its_critical_path(traced):
    from reports.page import build

    page = build(traced).read_text()
    section = page[page.index('id="timeline"'):]
    assert section.count("<svg") >= 2  # the fastest and the runner-up of the 4-worker comparison
    assert "Critical path: " in section and 'stroke="#d00"' in section
    assert "<title>rank 0 forward (compute):" in section


def test_the_events_columns_keep_their_types():
    from experiments.results import schema

    assert [(c.name, str(c.type)) for c in schema.EVENTS] == [
        ("run_id", "string"), ("step", "int64"), ("rank", "int64"), ("kind", "string"), ("name", "string"),
        ("thread", "string"), ("bucket", "int64"), ("peer", "int64"), ("nbytes", "int64"), ("seq", "int64"),
        ("start_s", "double"), ("end_s", "double")]


def _simulate_traced(tmp_path, grid: str, defaults: str = ""):
    """A 3-step SimGrid sweep of the tiny workload with step 1 traced (1 Gbit/s, 50 us, rank 1 computing 3x slower,
    forward 10 ms, backward 20 ms, optimizer 1 ms); `grid` is the [grid] table's body and what follows it. Skips
    where SimGrid is not installed; returns the results directory and its runs, every run ok."""
    from experiments.simulate.substrate import simulate_sweep
    from strategies.transport.simgrid import simgrid_available

    if simgrid_available():
        pytest.skip(simgrid_available())
    sweep = tmp_path / "sim.toml"
    sweep.write_text(f"""
name = "sim"
[defaults]
workload = "tiny"
steps = 3
warmup_steps = 1
trace_steps = 1
{defaults}link = {{ bandwidth = "1Gbit", latency = "50us" }}
straggler = {{ ranks = [1], slowdown = 3 }}
[grid]
{grid}
[simulate]
forward_s = 0.01
backward_s = 0.02
optimizer_s = 0.001
""")
    out = tmp_path / "out"
    runs = simulate_sweep(sweep, out, log=open("/dev/null", "w"))
    assert (runs["status"] == "ok").all(), runs["error"].tolist()
    return out, runs


def test_a_simulated_run_traces_on_the_simulated_clock(tmp_path):
    """SimGrid: the phases are the timeline's simulated seconds (forward 10 ms, backward 20 ms, optimizer 1 ms),
    the totals equal the steps table's, and the path of a straggler's ring starts with its compute."""
    out, runs = _simulate_traced(tmp_path, 'strategy = ["ring"]\nworkers = [4]')
    events, steps = read_events(out), read_steps(out)
    step = timeline.one_step(events, runs["run_id"].iloc[0])
    assert set(step["step"]) == {1}
    phases = step[(step["kind"] == "phase") & (step["rank"] == 0)].set_index("name")
    assert phases.at["forward", "end_s"] - phases.at["forward", "start_s"] == pytest.approx(0.01)
    assert phases.at["backward", "end_s"] - phases.at["backward", "start_s"] == pytest.approx(0.02)
    assert phases.at["optimizer", "end_s"] - phases.at["optimizer", "start_s"] == pytest.approx(0.001)
    totals = timeline.totals(step).set_index("rank")
    rows = steps[steps["step"] == 1].set_index("rank")
    assert totals["compute_s"].to_numpy() == pytest.approx(rows["compute_s"].to_numpy(), rel=0.01)
    assert totals["comm_s"].to_numpy() == pytest.approx(rows["comm_s"].to_numpy(), rel=0.01, abs=1e-9)
    path = timeline.critical_path(step)
    assert [(link.rank, link.what) for link in path[:2]] == [(1, "forward"), (1, "backward")]


def test_ray_actors_trace_on_one_clock(ray_session, tmp_path):
    """Ranks in separate actor processes: their events land on one axis (a receive never completes before its
    send was posted), and the totals equal the steps table's."""
    text = _text(strategies='["ring"]').replace("workers = [4]", "workers = [2]")
    out = tmp_path / "ray"
    runs = runner.run_sweep(parse(tomllib.loads(text), source=text), out, log=open("/dev/null", "w"))
    assert (runs["status"] == "ok").all(), runs["error"].tolist()
    events, steps = read_events(out), read_steps(out)
    assert set(events["rank"]) == {0, 1} and sorted(events["step"].unique()) == [1, 2]
    for run_id, step in timeline.traced(events):
        one = timeline.one_step(events, run_id, step)
        for recv, send in timeline.matches(one).items():
            assert one.at[recv, "end_s"] >= one.at[send, "start_s"] - 1e-4
        totals = timeline.totals(one).set_index("rank")
        rows = steps[(steps["step"] == step)].set_index("rank")
        assert totals["compute_s"].to_numpy() == pytest.approx(rows["compute_s"].to_numpy(), rel=0.01)


def test_a_step_of_too_many_messages_is_drawn_without_them(traced, monkeypatch):
    from reports import timeline as report_timeline
    from reports.load import load_runs
    from reports.sections import Results

    runs = load_runs(traced)
    r = Results(runs=runs, ok=runs[runs["ok"]], steps=None, sweep_text=None, links=[], events=read_events(traced))
    monkeypatch.setattr(report_timeline, "MAX_MESSAGES", 1)
    drawn = report_timeline.section(r)["drawn"]
    assert drawn and all(d["messages_left_out"] > 1 for d in drawn)
    assert all("send to rank" not in d["svg"] and "bucket 0 sync" in d["svg"] for d in drawn)


BARRIER_FREE = """straggler = { ranks = [1], slowdown = 3 }
bucket_mb = 0.02
[strategy_params.parameter_server]
servers = 2
staleness = 1
"""


def test_a_barrier_free_servers_lanes_record_each_push_served_its_update_and_its_wait(tmp_path):
    """A parameter server without a global barrier (staleness 1, 2 servers, several buckets, a straggler) on thread
    ranks: each server rank records, per traced step, one lane per worker with every unit it served (push in hand
    to reply made) holding its update and its wait at the bound, whose sum is the steps table's bound_wait_s; its
    messages of that step are exactly the ones its workers sent it and took from it in that step (count, order,
    bytes); the Chrome export keeps every track nested."""
    out = _sweep(tmp_path, extra=BARRIER_FREE, strategies='["parameter_server"]')
    runs = read_runs(out)
    assert (runs["status"] == "ok").all(), runs["error"].tolist()
    events, steps = read_events(out), read_steps(out)
    assert sorted(events["step"].unique()) == [1, 2]
    messages = events[events["kind"] == "message"]
    for step in (1, 2):
        for server in (4, 5):
            mine = events[(events["rank"] == server) & (events["step"] == step)]
            served = mine[mine["kind"] == "bucket_sync"]
            phases = mine[mine["kind"] == "phase"]
            assert set(served["peer"]) == {0, 1, 2, 3} and set(phases["name"]) <= {"update", "bound wait"}
            units = len(served) // 4
            assert units > 1 and (served.groupby("peer").size() == units).all()
            assert (phases["name"] == "update").sum() == 4 * units
            for _, span in served.iterrows():  # the update and the wait lie inside the unit's span, on its lane
                inside = phases[(phases["peer"] == span["peer"]) & (phases["start_s"] >= span["start_s"] - 1e-9)
                                & (phases["end_s"] <= span["end_s"] + 1e-9)]
                assert (inside["thread"] == f"worker {span['peer']}").all() and len(inside) >= 1
            row = steps[(steps["rank"] == server) & (steps["step"] == step)].iloc[0]
            waits = phases[phases["name"] == "bound wait"]
            assert (waits["end_s"] - waits["start_s"]).sum() == pytest.approx(row["bound_wait_s"], abs=1e-6)
            for worker in range(4):
                for mine_dir, theirs_dir in (("recv", "send"), ("send", "recv")):
                    here = messages[(messages["rank"] == server) & (messages["step"] == step)
                                    & (messages["peer"] == worker) & (messages["name"] == mine_dir)]
                    there = messages[(messages["rank"] == worker) & (messages["step"] == step)
                                     & (messages["peer"] == server) & (messages["name"] == theirs_dir)]
                    assert len(here) == units
                    assert here.sort_values("seq")["nbytes"].tolist() == there.sort_values("seq")["nbytes"].tolist()
    from reports.timeline import gantt

    step = timeline.one_step(events, runs["run_id"].iloc[0])
    drawn = str(gantt(step, timeline.critical_path(step)))  # the report draws the server's phases
    assert "<title>rank 4 update (compute):" in drawn and "<title>rank 5 update (compute):" in drawn
    path = tmp_path / "trace.json"
    assert cli(["trace", str(out), runs["run_id"].iloc[0], "--format", "chrome", "--out", str(path)]) == 0
    tracks: dict = {}
    for e in json.loads(path.read_text())["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-3 or b1 <= a1 + 1e-3, (a0, a1, b0, b1)


@pytest.mark.simgrid
def test_a_simulated_barrier_free_server_records_its_lanes_and_its_any_source_receives(tmp_path):
    """SimGrid (one actor serving every worker through irecv_any / wait_any): the server ranks' traced step has
    each worker's pushes received and replies sent, as many as the workers sent and took in that step, and one
    update per push, on the simulated clock."""
    out, _ = _simulate_traced(tmp_path, 'strategy = ["parameter_server"]\nworkers = [3]\n'
                                        '[strategy_params.parameter_server]\nservers = 1\nstaleness = "async"',
                              defaults='bucket_mb = 0.02\n')
    events = read_events(out)
    assert set(events["step"]) == {1}
    server = events[events["rank"] == 3]
    served = server[server["kind"] == "bucket_sync"]
    units = len(served) // 3
    assert units > 1 and set(served["peer"]) == {0, 1, 2}
    assert (server[server["kind"] == "phase"]["name"] == "update").sum() == 3 * units
    messages = events[events["kind"] == "message"]
    for worker in range(3):
        for here, there in (("recv", "send"), ("send", "recv")):
            mine = messages[(messages["rank"] == 3) & (messages["peer"] == worker) & (messages["name"] == here)]
            theirs = messages[(messages["rank"] == worker) & (messages["peer"] == 3) & (messages["name"] == there)]
            assert len(mine) == units and mine["nbytes"].sum() == theirs["nbytes"].sum() > 0

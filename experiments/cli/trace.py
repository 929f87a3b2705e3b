"""`syncbench trace DIR RUN_ID --format chrome|chakra`: a run's traced steps as files other tools open.

- chrome: one Chrome trace JSON (the Trace Event Format that chrome://tracing and the Perfetto UI open) of every
  traced step: one process per rank; tracks for its phases (forward, backward, optimizer, the exposed sync), for
  each bucket's sync, and for its messages (one track per lane of overlapping messages); bucket readiness as
  instants; a flow arrow from each send to its receive. Times in microseconds from the run's first event.
- chakra: one Chakra execution trace per rank of one traced step (MLCommons `mlc-chakra`'s protobuf, the format
  ASTRA-sim replays): COMP_NODE per compute phase with its duration, COMM_SEND_NODE / COMM_RECV_NODE per message
  with comm_src, comm_dst, comm_size and comm_tag (the k-th message from a to b has tag k on both sides); each
  node depends on the rank's node that finished last before it started.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import pandas as pd

from experiments.pipeline.trace import COMPUTE, PHASES
from experiments.results import timeline
from experiments.results.dataset import check_contained, has_results, read_events, read_runs

FORMATS = ("chrome", "chakra")
US = 1e6  # Chrome traces count microseconds
# a rank's tracks: its phases, bucket b at 100+b, message lanes, a barrier-free server's lane of worker w at 10000+w
PHASE_TID, BUCKET_TID, MESSAGE_TID, LANE_TID = 0, 100, 1000, 10_000


def add_arguments(p) -> None:
    p.add_argument("dir", help="a results directory (the --out of run or simulate)")
    p.add_argument("run_id", help="the run (its run_id in the runs table; `syncbench export` lists them)")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="chrome: Chrome trace JSON (Perfetto, chrome://tracing); chakra: one Chakra execution trace "
                        "per rank of one step (ASTRA-sim)")
    p.add_argument("--step", type=int, help="the traced step to write (default: every traced step for chrome, the "
                                            "first for chakra)")
    p.add_argument("--out", help="the file (chrome) or directory (chakra) to write; default DIR/trace/RUN_ID.json "
                                 "or DIR/trace/RUN_ID/")


def run(args) -> int:
    directory = Path(args.dir)
    events = load(directory, args.run_id, args.step)
    if not args.out and (directory / "trace").is_symlink():  # the default writes inside DIR, never through a link
        raise ValueError(f"{str(directory / 'trace')!r} is a symbolic link: syncbench writes inside the results "
                         f"directory only, never through a link; remove it or give --out")
    if args.format == "chrome":
        out = Path(args.out) if args.out else directory / "trace" / f"{args.run_id}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(chrome_trace(events, args.run_id)))
        print(out)
        return 0
    out = Path(args.out) if args.out else directory / "trace" / args.run_id
    for path in write_chakra(events, args.run_id, out):
        print(path)
    return 0


def load(directory: Path, run_id: str, step: int | None = None) -> pd.DataFrame:
    """The run's traced events (one step if `step`), or ValueError naming what is there, before anything is
    written."""
    if not directory.is_dir() or not has_results(directory):
        raise ValueError(f"{str(directory)!r} holds no syncbench results (expected the --out of run or simulate)")
    check_contained(directory)
    runs = read_runs(directory)
    if run_id not in set(runs["run_id"]):
        shown = ", ".join(list(runs["run_id"])[:5]) + (f", ... ({len(runs)} runs)" if len(runs) > 5 else "")
        raise ValueError(f"run {run_id!r} is not in {directory}: its runs are {shown}")
    events = read_events(directory, run_id)
    if events.empty:
        raise ValueError(f"run {run_id!r} recorded no events (trace_steps = 0, results written before tracing, or "
                         f"the run failed before its first traced step): run it with trace_steps >= 1")
    if step is not None:
        events = timeline.one_step(events, run_id, step)
    return events


# -- Chrome trace JSON ----------------------------------------------------------------------------------------


def chrome_trace(events: pd.DataFrame, run_id: str) -> dict:
    """The Trace Event Format's JSON object (traceEvents, displayTimeUnit, otherData) of `events`."""
    out: list[dict] = []
    for rank in sorted(int(r) for r in events["rank"].unique()):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": PHASE_TID, "args": {"name": "phases"}})
    named: set[tuple[int, int]] = set()

    def track(rank: int, tid: int, name: str) -> int:
        if (rank, tid) not in named:
            named.add((rank, tid))
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        return tid

    message_tid: dict[int, int] = {}
    lane_ends: dict[int, list[float]] = {}  # per rank, across steps (a barrier-free server's steps overlap)
    for (_, step), one in events.groupby(["run_id", "step"], sort=True):
        one = one.reset_index(drop=True)
        for _, e in one.iterrows():
            rank, step = int(e["rank"]), int(e["step"])
            ts, dur = e["start_s"] * US, (e["end_s"] - e["start_s"]) * US
            lane = e["peer"] >= 0 and e["kind"] != "message"  # a barrier-free server's lane: one per worker
            if e["kind"] == "phase":
                tid = track(rank, LANE_TID + int(e["peer"]), e["thread"]) if lane else PHASE_TID
                out.append({"ph": "X", "name": e["name"], "cat": PHASES[e["name"]], "pid": rank, "tid": tid,
                            "ts": ts, "dur": dur, "args": {"step": step}})
            elif e["kind"] == "bucket_sync":
                tid = (track(rank, LANE_TID + int(e["peer"]), e["thread"]) if lane else
                       track(rank, BUCKET_TID + int(e["bucket"]), f"bucket {int(e['bucket'])} sync ({e['thread']})"))
                out.append({"ph": "X", "name": f"bucket {int(e['bucket'])}", "cat": "bucket", "pid": rank,
                            "tid": tid, "ts": ts, "dur": dur, "args": {"step": step}})
            elif e["kind"] == "bucket_ready":
                out.append({"ph": "i", "s": "t", "name": f"bucket {int(e['bucket'])} ready", "cat": "bucket",
                            "pid": rank, "tid": PHASE_TID, "ts": ts, "args": {"step": step}})
        lanes = _lanes(one[one["kind"] == "message"], lane_ends)
        for i, lane in lanes.items():
            e = one.loc[i]
            rank = int(e["rank"])
            tid = track(rank, MESSAGE_TID + lane, f"messages {lane}")
            message_tid[i] = tid
            what = f"send to r{int(e['peer'])}" if e["name"] == "send" else f"recv from r{int(e['peer'])}"
            out.append({"ph": "X", "name": what, "cat": "message", "pid": rank, "tid": tid,
                        "ts": e["start_s"] * US, "dur": (e["end_s"] - e["start_s"]) * US,
                        "args": {"step": int(e["step"]), "bytes": int(e["nbytes"]), "peer": int(e["peer"]),
                                 "seq": int(e["seq"])}})
        for recv, send in timeline.matches(one).items():
            s, r = one.loc[send], one.loc[recv]
            flow = f"{run_id}:{int(s['step'])}:{int(s['rank'])}:{int(s['seq'])}"
            out.append({"ph": "s", "id": flow, "name": "message", "cat": "message", "pid": int(s["rank"]),
                        "tid": message_tid[send], "ts": s["start_s"] * US})
            end = r["end_s"] * US - min(0.001, (r["end_s"] - r["start_s"]) * US / 2)  # inside the receive's slice
            out.append({"ph": "f", "bp": "e", "id": flow, "name": "message", "cat": "message", "pid": int(r["rank"]),
                        "tid": message_tid[recv], "ts": end})
        message_tid.clear()
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"run_id": run_id, "steps": sorted(int(s) for s in events["step"].unique()),
                          "clock": "seconds since the run's first recorded event, in microseconds"}}


def _lanes(messages: pd.DataFrame, ends_by_rank: dict[int, list[float]]) -> dict[int, int]:
    """Each message's lane on its rank: the lowest whose last message ended before it was posted (slices on one
    track must nest, and a rank's messages overlap); `ends_by_rank`: each lane's last end, kept across calls."""
    lanes: dict[int, int] = {}
    for rank, mine in messages.groupby("rank"):
        ends = ends_by_rank.setdefault(int(rank), [])
        for i, m in mine.sort_values(["start_s", "seq"]).iterrows():
            lane = next((k for k, end in enumerate(ends) if end <= m["start_s"]), len(ends))
            if lane == len(ends):
                ends.append(m["end_s"])
            else:
                ends[lane] = m["end_s"]
            lanes[i] = lane
    return lanes


# -- Chakra execution traces ------------------------------------------------------------------------------------


def write_chakra(events: pd.DataFrame, run_id: str, out: Path) -> list[Path]:
    """One Chakra ET per rank of one step (the first traced step of `events`): out/<run_id>.<rank>.et."""
    try:
        from chakra.schema.protobuf.et_def_pb2 import (
            COMM_RECV_NODE,
            COMM_SEND_NODE,
            COMP_NODE,
            AttributeProto,
            GlobalMetadata,
            Node,
        )
        from chakra.src.third_party.utils.protolib import encodeMessage
    except ImportError:
        raise ValueError("--format chakra needs MLCommons' Chakra: pip install mlc-chakra (or syncbench[trace])") \
            from None
    step = timeline.one_step(events, run_id)
    tags = _tags(step)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, mine in step.groupby("rank", sort=True):
        nodes = mine[((mine["kind"] == "phase") & (mine["name"].map(PHASES) == COMPUTE)) | (mine["kind"] == "message")]
        nodes = nodes.sort_values(["start_s", "end_s"])
        path = out / f"{run_id}.{int(rank)}.et"
        running: list[tuple[float, int]] = []  # (end, node id) of the nodes written, earliest end first
        latest: tuple[float, int] | None = None  # the node that finished last among those ended so far
        with open(path, "wb") as f:
            encodeMessage(f, GlobalMetadata(version="0.0.4"))
            for node_id, (i, e) in enumerate(nodes.iterrows()):
                node = Node(id=node_id, duration_micros=max(0, round((e["end_s"] - e["start_s"]) * US)))
                while running and running[0][0] <= e["start_s"]:
                    ended = heapq.heappop(running)
                    latest = ended if latest is None or ended[0] >= latest[0] else latest
                if latest is not None:  # after the node of this rank that finished last before this one started
                    node.data_deps.append(latest[1])
                heapq.heappush(running, (float(e["end_s"]), node_id))
                node.attr.append(AttributeProto(name="is_cpu_op", bool_val=False))
                if e["kind"] == "phase":
                    node.name, node.type = str(e["name"]), COMP_NODE
                else:
                    send = e["name"] == "send"
                    src, dst = (int(rank), int(e["peer"])) if send else (int(e["peer"]), int(rank))
                    node.name = f"send to r{dst}" if send else f"recv from r{src}"
                    node.type = COMM_SEND_NODE if send else COMM_RECV_NODE
                    node.attr.extend([AttributeProto(name="comm_src", int32_val=src),
                                      AttributeProto(name="comm_dst", int32_val=dst),
                                      AttributeProto(name="comm_size", int64_val=int(e["nbytes"])),
                                      AttributeProto(name="comm_tag", int32_val=tags[i])])
                encodeMessage(f, node)
        paths.append(path)
    return paths


def _tags(step: pd.DataFrame) -> dict[int, int]:
    """Each message's tag: its place among the messages of its (sender, receiver) pair, the same on both sides."""
    tags = {}
    messages = step[step["kind"] == "message"]
    for _, pair in messages.groupby([messages["rank"], messages["peer"], messages["name"]]):
        for k, i in enumerate(pair.sort_values("seq").index):
            tags[i] = k
    return tags


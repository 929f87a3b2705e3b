"""One traced step read back: its phases and messages per rank, the critical path that ended it, and how much of
each rank's communication was hidden behind compute. The report's timeline (reports/timeline.py) and the trace
exports (experiments/cli/trace.py) read a step through here.

The critical path is walked backwards from the event that ended the step (the latest end of a rank's last phase).
On a rank, the next link back is the latest of its compute phases and completed receives that ended by then. A
receive whose sender posted the message after the receiver had posted the receive waited for the sender: the
path jumps to the sender at the time it posted the message, and goes on there (what kept the sender busy until
then). A receive posted after its message was sent waited for nothing but its own transfer: the path stays on the
rank, at the time the receive was posted. Sends are not links of their own: a slow link shows as the receive that
waited for it. Messages are matched in order per (sender, receiver) pair: the k-th send of rank a to rank b is
the k-th receive of rank b from rank a.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# Every phase a rank records (experiments/pipeline/trace.py), and whether it is compute or (exposed)
# communication: the steps table's compute_s and comm_s are the sums of these, per rank and step.
COMPUTE, COMM = "compute", "comm"
PHASES = {"forward": COMPUTE, "backward": COMPUTE, "forward+backward": COMPUTE, "straggle": COMPUTE,
          "after backward": COMPUTE, "optimizer": COMPUTE, "apply": COMPUTE, "sync in backward": COMM,
          "sync": COMM,
          # a barrier-free parameter server's, per push (its lanes: one per worker): the push handled, the reply held
          "update": COMPUTE, "bound wait": COMM}

EPS = 1e-9  # seconds: ends this close count as the same instant


@dataclass(frozen=True)
class Link:
    """One event on the critical path: the row index in the step's events, its rank and what it was."""

    index: int
    rank: int
    what: str  # the phase's name, or 'recv from r<peer>' / 'send to r<peer>' (the sender's side of a wait)
    start_s: float
    end_s: float


def traced(events: pd.DataFrame) -> list[tuple[str, int]]:
    """The (run_id, step) pairs the events hold, in order."""
    if events.empty:
        return []
    return list(dict.fromkeys(zip(events["run_id"], events["step"].astype(int))))


def one_step(events: pd.DataFrame, run_id: str, step: int | None = None) -> pd.DataFrame:
    """The events of one traced step of a run (the first traced one when `step` is None), index 0..n-1;
    ValueError naming the steps there are when the run has no such step."""
    mine = events[events["run_id"] == run_id]
    steps = sorted(int(s) for s in mine["step"].unique())
    if not steps:
        raise ValueError(f"run {run_id!r} has no traced step (trace_steps = 0, or it failed before its first one)")
    chosen = steps[0] if step is None else step
    if chosen not in steps:
        raise ValueError(f"step {step!r}: run {run_id!r} traced steps {', '.join(map(str, steps))}")
    return mine[mine["step"] == chosen].reset_index(drop=True)


def category(name: str) -> str:
    return PHASES.get(name, "")


def totals(step: pd.DataFrame) -> pd.DataFrame:
    """Per rank: compute_s and comm_s (exposed) from the phases, busy_s (union of its bucket syncs) and hidden_s
    (the part of busy_s that ran beside a compute phase); messages and bytes sent."""
    rows = []
    for rank, mine in step.groupby("rank", sort=True):
        phases = mine[mine["kind"] == "phase"]
        kinds = phases["name"].map(category)
        compute = phases[kinds == COMPUTE]
        buckets = mine[mine["kind"] == "bucket_sync"]
        busy = union_length(list(zip(buckets["start_s"], buckets["end_s"])))
        hidden = _overlap(list(zip(buckets["start_s"], buckets["end_s"])),
                          list(zip(compute["start_s"], compute["end_s"])))
        sends = mine[(mine["kind"] == "message") & (mine["name"] == "send")]
        rows.append({"rank": int(rank), "compute_s": float((compute["end_s"] - compute["start_s"]).sum()),
                     "comm_s": float((phases["end_s"] - phases["start_s"])[kinds == COMM].sum()),
                     "busy_s": busy, "hidden_s": hidden, "messages_sent": len(sends),
                     "bytes_sent": int(sends["nbytes"].sum())})
    return pd.DataFrame(rows, columns=["rank", "compute_s", "comm_s", "busy_s", "hidden_s", "messages_sent",
                                       "bytes_sent"])


def matches(step: pd.DataFrame) -> dict[int, int]:
    """Each receive's row index -> its send's row index (k-th send of a to b = k-th receive of b from a)."""
    messages = step[step["kind"] == "message"]
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for i, m in messages.sort_values(["rank", "seq"]).iterrows():
        if m["name"] == "send":
            sends.setdefault((int(m["rank"]), int(m["peer"])), []).append(i)
        else:
            recvs.setdefault((int(m["peer"]), int(m["rank"])), []).append(i)
    return {r: s for pair, received in recvs.items() for r, s in zip(received, sends.get(pair, []))}


def critical_path(step: pd.DataFrame) -> list[Link]:
    """The chain of events that ended the step, first to last (see the module's docstring)."""
    phases = step[(step["kind"] == "phase")]
    if phases.empty:
        return []
    candidates = step[((step["kind"] == "phase") & (step["name"].map(category) == COMPUTE))
                      | ((step["kind"] == "message") & (step["name"] == "recv"))]
    by_rank = {int(r): g.sort_values("end_s") for r, g in candidates.groupby("rank")}
    pairs = matches(step)
    last = phases.loc[phases["end_s"].idxmax()]
    rank, t = int(last["rank"]), float(last["end_s"])
    used: set[int] = set()
    path: list[Link] = []
    for _ in range(len(candidates) + 1):
        mine = by_rank.get(rank)
        if mine is None:
            break
        before = mine[(mine["end_s"] <= t + EPS) & ~mine.index.isin(used)]
        if before.empty:
            break
        index = int(before.index[-1])
        event = step.loc[index]
        used.add(index)
        if event["kind"] == "phase":
            path.append(Link(index, rank, str(event["name"]), float(event["start_s"]), float(event["end_s"])))
            t = float(event["start_s"])
            continue
        path.append(Link(index, rank, f"recv from r{int(event['peer'])}", float(event["start_s"]),
                         float(event["end_s"])))
        send = pairs.get(index)
        if send is not None and float(step.at[send, "start_s"]) > float(event["start_s"]) + EPS:
            sender = step.loc[send]  # the receiver waited for the sender to post it: the path goes there
            path.append(Link(send, int(sender["rank"]), f"send to r{rank}", float(sender["start_s"]),
                             float(sender["end_s"])))
            rank, t = int(sender["rank"]), min(float(sender["start_s"]), t)
        else:
            t = float(event["start_s"])
    return path[::-1]


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end] intervals (also a live step's busy time: pipeline/bucket_sync.py)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of (union of a) intersected with (union of b)."""
    total = 0.0
    for start, end in _merged(a):
        for lo, hi in _merged(b):
            total += max(0.0, min(end, hi) - max(start, lo))
    return total


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]

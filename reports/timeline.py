"""The report's timeline: one traced step per rank as a Gantt chart, for the configurations the verdict compares.

For each (workload, condition, workers) the verdict ranks, the two fastest configurations by mean throughput (the
best and the runner-up the verdict weighs), one run each, its first traced step: per rank a lane of phases
(forward, backward, optimizer, the exposed sync), a lane of bucket syncs split into the part hidden behind compute
and the part exposed, and a lane of messages. The critical path (experiments/results/timeline.py: the chain of
events that ended the step) is outlined in red, its jumps between ranks drawn as red arrows. Hovering a bar names
it. Plain inline SVG: offline, like the rest of the page.
"""

from __future__ import annotations

import html

import pandas as pd
from markupsafe import Markup

from experiments.results import timeline
from experiments.results.timeline import COMM, PHASES

MAX_GROUPS = 3  # verdict groups drawn (each: its best two configurations)
MAX_MESSAGES = 20_000  # messages drawn per step; a step with more draws its phases and buckets only (page size)
WIDTH, LEFT, RIGHT = 960, 70, 20  # pixels: the drawing, the rank labels' margin, the right margin
LANE, GAP = 14, 8  # pixels: one lane, the space between ranks
COLOURS = {"forward": "#4c78a8", "backward": "#72b7b2", "forward+backward": "#4c78a8", "straggle": "#b279a2",
           "after backward": "#9d755d", "optimizer": "#54a24b", "apply": "#54a24b", "sync": "#e45756",
           "sync in backward": "#e45756", "hidden": "#88d27a", "exposed": "#f58518", "send": "#bab0ac",
           "recv": "#79706e", "update": "#54a24b", "bound wait": "#e45756"}


def chosen_runs(ok: pd.DataFrame, events: pd.DataFrame) -> list[tuple[str, pd.Series]]:
    """(group title, run) of the runs drawn: per verdict group with traced runs, its two fastest configurations."""
    traced = set(events["run_id"]) if events is not None and not events.empty else set()
    multi = ok[(ok["workers"] > 1) & ok["run_id"].isin(traced)]
    if "bypasses_link" in multi:
        multi = multi[~multi["bypasses_link"].astype(bool)]
    chosen = []
    for (workload, _, workers), group in multi.groupby(["workload", "condition", "workers"], sort=False):
        speed = group.groupby("config")["throughput"].mean().sort_values(ascending=False)
        for rank, config in enumerate(speed.index[:2]):
            run = group[group["config"] == config].sort_values("repeat").iloc[0]
            where = run.get("condition_label", "") or run.get("link", "")
            title = (f"{workload}, {int(workers)} workers, {where}: "
                     f"{'fastest' if rank == 0 else 'runner-up'} {run.get('config_label', run['strategy'])}")
            chosen.append((title, run))
        if len(chosen) >= 2 * MAX_GROUPS:
            break
    return chosen


def section(r) -> dict:
    """The section's context: one Gantt per chosen run, or Absent saying why there is none."""
    from reports.section_parts import Absent

    events = getattr(r, "events", None)
    if events is None or events.empty:
        return Absent("no traced steps (trace_steps = 0, or results written before tracing)")
    drawn = []
    for title, run in chosen_runs(r.ok, events):
        step = timeline.one_step(events, run["run_id"])
        path = timeline.critical_path(step)
        totals = timeline.totals(step)
        messages = int((step["kind"] == "message").sum())
        shown = step if messages <= MAX_MESSAGES else step[step["kind"] != "message"]
        drawn.append({"title": title, "run_id": run["run_id"], "step": int(step["step"].iloc[0]),
                      "svg": gantt(shown, [link for link in path if link.index in shown.index]),
                      "path": describe_path(path),
                      "messages_left_out": messages if messages > MAX_MESSAGES else 0,
                      "hidden_ms": 1e3 * float(totals["hidden_s"].sum()),
                      "exposed_ms": 1e3 * float(totals["comm_s"].sum())})
    if not drawn:
        return Absent("no multi-worker run that crossed its link has traced steps")
    return {"drawn": drawn}


def describe_path(path: list[timeline.Link]) -> str:
    """The critical path in words: its phases by rank, and each run of messages between them as the ranks it
    crossed ('7 messages through r1 -> r2 -> r3')."""
    parts: list[str] = []
    hops: list[int] = []

    def close() -> None:
        if hops:
            ranks = [r for i, r in enumerate(hops) if i == 0 or hops[i - 1] != r]
            shown = " -> ".join(f"r{r}" for r in ranks[:12]) + (" -> ..." if len(ranks) > 12 else "")
            parts.append(f"{len(hops)} message{'s' * (len(hops) > 1)} through {shown}")
            hops.clear()

    for link in path:
        if link.what.startswith(("recv", "send")):
            hops.append(link.rank)
            continue
        close()
        parts.append(f"r{link.rank} {link.what}")
    close()
    return " -> ".join(parts)


def gantt(step: pd.DataFrame, path: list[timeline.Link]) -> Markup:
    """One step as an SVG: a band per rank (phases, bucket syncs hidden/exposed, messages), the critical path in red."""
    t0, t1 = float(step["start_s"].min()), float(step["end_s"].max())
    span = max(t1 - t0, 1e-9)
    ranks = sorted(int(r) for r in step["rank"].unique())
    band = 3 * LANE + GAP
    height = 30 + band * len(ranks)
    scale = (WIDTH - LEFT - RIGHT) / span

    def x(t: float) -> float:
        return LEFT + (t - t0) * scale

    top = {rank: 20 + i * band for i, rank in enumerate(ranks)}
    on_path = {link.index for link in path}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">']
    for i in range(6):  # the time axis, ms from the step's first event
        t = t0 + span * i / 5
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="14" y2="{height - 4}" stroke="#ddd"/>'
                   f'<text x="{x(t):.1f}" y="11" text-anchor="middle">{(t - t0) * 1e3:.3g} ms</text>')
    for rank in ranks:
        out.append(f'<text x="4" y="{top[rank] + LANE + 4}">rank {rank}</text>')

    def bar(i, start, end, lane, colour, label, rank):
        w = max((end - start) * scale, 0.5)
        y = top[rank] + lane * LANE
        stroke = ' stroke="#d00" stroke-width="2"' if i in on_path else ""
        out.append(f'<rect x="{x(start):.2f}" y="{y + 1}" width="{w:.2f}" height="{LANE - 2}" fill="{colour}"'
                   f'{stroke}><title>{html.escape(label)}</title></rect>')

    for i, e in step.iterrows():
        rank, start, end = int(e["rank"]), float(e["start_s"]), float(e["end_s"])
        ms = f"{(end - start) * 1e3:.3f} ms ({(start - t0) * 1e3:.3f} to {(end - t0) * 1e3:.3f} ms)"
        if e["kind"] == "phase":
            kind = "exposed communication" if PHASES[e["name"]] == COMM else "compute"
            bar(i, start, end, 0, COLOURS[e["name"]], f"rank {rank} {e['name']} ({kind}): {ms}", rank)
        elif e["kind"] == "bucket_sync":
            compute = step[(step["rank"] == rank) & (step["kind"] == "phase")
                           & (step["name"].map(PHASES) != COMM)]
            for lo, hi, hidden in _split(start, end, list(zip(compute["start_s"], compute["end_s"]))):
                what = "hidden behind compute" if hidden else "exposed"
                bar(-1, lo, hi, 1, COLOURS["hidden" if hidden else "exposed"],
                    f"rank {rank} bucket {int(e['bucket'])} sync ({e['thread']} thread), {what}: "
                    f"{(hi - lo) * 1e3:.3f} ms", rank)
        elif e["kind"] == "message":
            peer = int(e["peer"])
            what = f"send to rank {peer}" if e["name"] == "send" else f"recv from rank {peer}"
            bar(i, start, end, 2, COLOURS[e["name"]], f"rank {rank} {what}, {int(e['nbytes']):,} bytes: {ms}", rank)
    for a, b in zip(path, path[1:]):  # the path's jumps between ranks: the sender's post -> the receive it ended
        if a.rank != b.rank:
            ya, yb = top[a.rank] + 2.5 * LANE, top[b.rank] + 2.5 * LANE
            out.append(f'<line x1="{x(a.start_s):.2f}" y1="{ya}" x2="{x(b.end_s):.2f}" y2="{yb}" stroke="#d00" '
                       f'stroke-width="1.5"><title>critical path: rank {a.rank} {html.escape(a.what)} -> rank '
                       f'{b.rank} {html.escape(b.what)}</title></line>')
    out.append("</svg>")
    return Markup("".join(out))


def _split(start: float, end: float, compute: list[tuple[float, float]]) -> list[tuple[float, float, bool]]:
    """[start, end] cut into pieces hidden behind the compute spans (True) and exposed (False)."""
    pieces, t = [], start
    for lo, hi in sorted(compute):
        lo, hi = max(lo, start), min(hi, end)
        if hi <= lo or hi <= t:
            continue
        if lo > t:
            pieces.append((t, lo, False))
        pieces.append((max(lo, t), hi, True))
        t = hi
    if t < end:
        pieces.append((t, end, False))
    return pieces

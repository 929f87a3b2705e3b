"""The report's drawn strategies: each exact-or-not strategy of the sweep that moves its bytes through send/recv,
one sync of its real code on a few thread ranks, drawn round by round from its recorded messages (reports/explain.py,
the same picture and table as `syncbench explain`)."""

from __future__ import annotations

from markupsafe import Markup

from reports.explain import explain, svg, text
from reports.load import strategy_params

MOST_DRAWN = 8  # strategies per page
READABLE_WORKERS = 8  # beyond this a picture of every message is no longer read: drawn at DRAWN_WORKERS instead
DRAWN_WORKERS = 4
NUMEL = 1000


def drawn_workers(ran: list[int]) -> int:
    """The sweep's worker count nearest DRAWN_WORKERS among the readable ones (the smaller on a tie), else
    DRAWN_WORKERS."""
    readable = [n for n in ran if 2 <= n <= READABLE_WORKERS]
    return min(readable, key=lambda n: (abs(n - DRAWN_WORKERS), n)) if readable else DRAWN_WORKERS


def section(r) -> dict:
    """Absent when no strategy of the sweep can be drawn (see strategies.explain.check)."""
    from reports.section_parts import Absent
    from strategies.explain import record

    configs: dict = {}  # (strategy, its parameters) -> (a run of it, the worker counts it ran at)
    for _, run in r.ok[r.ok["workers"] >= 2].iterrows():
        params = strategy_params(run)
        key = (run["strategy"], tuple(sorted((k, repr(v)) for k, v in params.items())))
        configs.setdefault(key, (run, params, set()))[2].add(int(run["workers"]))
    drawn, skipped = [], []
    for run, params, ran in list(configs.values())[:MOST_DRAWN]:
        label = run.get("strategy_label") or run["strategy"]
        workers = drawn_workers(sorted(ran))
        try:
            rec = record(run["strategy"], dict(params), workers, NUMEL)
        except ValueError as e:
            skipped.append((label, str(e)))
            continue
        x = explain(rec.strategy, rec.events, rec.roles, rec.numel, rec.itemsize, rec.chunks)
        note = "" if workers in ran else f" (it ran at {min(ran)} or more: too many to read)"
        drawn.append({"label": label, "workers": workers, "note": note, "svg": Markup(svg(x)), "table": text(x)})
    if not drawn:
        return Absent("no strategy of this sweep moves its bytes through send/recv (nothing to draw)")
    return {"drawn": drawn, "skipped": skipped, "numel": NUMEL}

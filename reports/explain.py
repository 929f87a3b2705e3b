"""A strategy drawn round by round from the messages its real code posted (`syncbench explain`).

Input: the MessageEvents a run recorded on every rank (strategies/transport/recorder.py) and, where known, the
element range of the buffer each message carried. Output: the messages paired (a rank's k-th send to a peer is
the peer's k-th receive from it: a pair's messages match in posting order), each put in a round, what each rank
holds after every round, a text table and an SVG picture.

The round of a message (dependencies, not clocks): 1 + the latest round of any message that either end had
received before posting its side of this one: the sender before its isend (the data it sends may depend on it),
the receiver before its irecv (it takes this message only after those). An exchange is thus one round for both
directions, a rank that receives nothing first sends in round 1, and rounds are the algorithm's steps wherever
its ranks move in lockstep: ring's 2(n-1), halving-doubling's 2 log2 p (+ fold and unfold), a parameter server's
push then pull. Where they do not (the ranks of halving-doubling that no extra rank folds into start their first
exchange while the fold is on the wire), the round says when a message could move at the earliest, which is when
it did: a picture of the run, not of a textbook.

What a rank holds: every worker starts with its own contribution on the whole buffer, a server with none; a
message carries what its sender held on its range when it posted it (its receives finished by then), and the
receiver then holds the union (a reduction adds contributions, a copy of a finished range replaces fewer with
all). Derivable only when every message's range is known.

reports imports no strategy code: the recording comes from experiments/cli/explain.py.
"""

from __future__ import annotations

import html
from bisect import bisect_right
from dataclasses import dataclass, field

Range = tuple[int, int]


@dataclass(frozen=True)
class Message:
    """One message, both ends paired: payload bytes, the buffer's element range (None: not a view of it), when the
    sender posted it, when the receiver posted its receive and when that completed, and its round (0 until put in
    one)."""

    src: int
    dst: int
    nbytes: int
    chunk: Range | None
    send_posted: float
    recv_posted: float
    recv_finished: float
    round: int = 0


@dataclass(frozen=True)
class Explained:
    """A strategy's recorded run, round by round."""

    strategy: str
    roles: tuple[str, ...]  # per rank: "worker" or "server"
    numel: int
    itemsize: int
    messages: tuple[Message, ...]  # in round order, then sender, receiver
    segments: tuple[Range, ...] | None  # the buffer cut at every message's range ends (None: ranges unknown)
    holds: tuple[tuple[tuple[frozenset, ...], ...], ...] | None  # [round 0..R][rank][segment]: contributors
    carries: dict = field(default_factory=dict)  # message index in `messages` -> frozenset of contributors

    @property
    def workers(self) -> int:
        return sum(role == "worker" for role in self.roles)

    @property
    def rounds(self) -> int:
        return max((m.round for m in self.messages), default=0)

    @property
    def total_bytes(self) -> int:
        return sum(m.nbytes for m in self.messages)

    def round_messages(self, rnd: int) -> list[tuple[int, Message]]:
        return [(i, m) for i, m in enumerate(self.messages) if m.round == rnd]

    def round_bytes(self, rnd: int) -> int:
        return sum(m.nbytes for _, m in self.round_messages(rnd))

    def link_bytes(self, rnd: int) -> dict[tuple[int, int], int]:
        """Bytes per directed link (src, dst) in round `rnd`."""
        out: dict[tuple[int, int], int] = {}
        for _, m in self.round_messages(rnd):
            out[m.src, m.dst] = out.get((m.src, m.dst), 0) + m.nbytes
        return out

    def phase(self, rnd: int) -> str:
        """'reduce' when every message of the round carries a partial result (fewer than all workers'
        contributions), 'gather' when every one carries a finished one, 'mixed' otherwise, '' when unknown."""
        if self.holds is None:
            return ""
        everyone = frozenset(r for r, role in enumerate(self.roles) if role == "worker")
        done = {self.carries[i] == everyone for i, _ in self.round_messages(rnd)}
        return "gather" if done == {True} else "reduce" if done == {False} else "mixed"

    def chunk_name(self, chunk: Range | None) -> str:
        """c3 for one segment, c0-1 for segments 0 to 1, ? when unknown."""
        if chunk is None or self.segments is None:
            return "?"
        first = next(i for i, s in enumerate(self.segments) if s[0] == chunk[0])
        last = next(i for i, s in enumerate(self.segments) if s[1] == chunk[1])
        return f"c{first}" if first == last else f"c{first}-{last}"


# -- pairing the two ends of every message ----------------------------------------------------------------------

def pair(events, chunks: dict | None = None) -> list[Message]:
    """Messages from every rank's MessageEvents. `chunks` maps (rank, direction, peer, k) -- the k-th event of
    that rank, direction and peer in posting order -- to the element range it carried (absent or None: unknown);
    the sender's range wins, the receiver's is used where the sender's is unknown."""
    chunks = chunks or {}
    ends: dict[tuple[str, int, int], list] = {}
    for e in sorted(events, key=lambda e: (e.rank, e.seq)):
        ends.setdefault((str(e.direction), e.rank, e.peer), []).append(e)
    messages = []
    for (direction, src, dst), sends in sorted(ends.items()):
        if direction != "send":
            continue
        recvs = ends.get(("recv", dst, src), [])
        if len(recvs) != len(sends):
            raise ValueError(f"rank {src} sent {len(sends)} messages to rank {dst}, which received {len(recvs)}: "
                             f"a recording of a whole run is needed (every message's two ends)")
        for k, (s, r) in enumerate(zip(sends, recvs)):
            if s.nbytes != r.nbytes:
                raise ValueError(f"rank {src}'s message {k} to rank {dst} has {s.nbytes} bytes sent, {r.nbytes} "
                                 f"received: the ends do not pair")
            chunk = chunks.get((src, "send", dst, k)) or chunks.get((dst, "recv", src, k))
            messages.append(Message(src, dst, s.nbytes, chunk, s.posted, r.posted, r.finished))
    unpaired = [key for key in ends if key[0] == "recv" and ("send", key[2], key[1]) not in ends]
    if unpaired:
        _, rank, peer = unpaired[0]
        raise ValueError(f"rank {rank} received from rank {peer}, which sent nothing in the recording")
    return messages


def assign_rounds(messages: list[Message]) -> list[Message]:
    """Each message with its round (see the module's docstring), in order of completion."""
    done: dict[int, tuple[list[float], list[int]]] = {}  # rank -> (finish times, running max round) of its receives

    def latest(rank: int, t: float) -> int:
        times, best = done.get(rank, ([], []))
        i = bisect_right(times, t)
        return best[i - 1] if i else 0

    out = []
    for m in sorted(messages, key=lambda m: m.recv_finished):
        rnd = 1 + max(latest(m.src, m.send_posted), latest(m.dst, m.recv_posted))
        times, best = done.setdefault(m.dst, ([], []))
        times.append(m.recv_finished)  # in order: messages are taken in order of completion
        best.append(max(best[-1], rnd) if best else rnd)
        out.append(Message(m.src, m.dst, m.nbytes, m.chunk, m.send_posted, m.recv_posted, m.recv_finished, rnd))
    return out


# -- what each rank holds ------------------------------------------------------------------------------------------

def _segments(messages: list[Message], numel: int) -> tuple[Range, ...]:
    cuts = sorted({0, numel} | {c for m in messages for c in m.chunk})
    return tuple(zip(cuts[:-1], cuts[1:]))


def holdings(messages: list[Message], roles: tuple[str, ...], numel: int):
    """(segments, holds[round][rank][segment], carries[i]) or (None, None, {}) when a range is unknown."""
    if not messages or any(m.chunk is None for m in messages):
        return None, None, {}
    segments = _segments(messages, numel)
    starts = [lo for lo, _ in segments]

    def covered(chunk: Range) -> range:
        return range(starts.index(chunk[0]), bisect_right(starts, chunk[1] - 1))

    init = [frozenset([r]) if role == "worker" else frozenset() for r, role in enumerate(roles)]
    received: dict[int, list[tuple[float, range, list[frozenset]]]] = {r: [] for r in range(len(roles))}
    carried: list[list[frozenset]] = [[] for _ in messages]
    order = sorted(range(len(messages)), key=lambda i: messages[i].recv_finished)
    for i in order:
        m = messages[i]
        segs = covered(m.chunk)
        # what the sender held on this range when it posted: its own start and every receive finished by then
        held = {s: set(init[m.src]) for s in segs}
        for finished, got_segs, got in received[m.src]:
            if finished <= m.send_posted:
                for s, contributors in zip(got_segs, got):
                    if s in held:
                        held[s] |= contributors
        carried[i] = [frozenset(held[s]) for s in segs]
        received[m.dst].append((m.recv_finished, segs, carried[i]))
    rounds = max(m.round for m in messages)
    holds = []
    for rnd in range(rounds + 1):
        state = [[set(init[r]) for _ in segments] for r in range(len(roles))]
        for i, m in enumerate(messages):
            if m.round <= rnd:
                for s, contributors in zip(covered(m.chunk), carried[i]):
                    state[m.dst][s] |= contributors
        holds.append(tuple(tuple(frozenset(c) for c in per_rank) for per_rank in state))
    carries = {i: frozenset().union(*c) for i, c in enumerate(carried)}
    return segments, tuple(holds), carries


def explain(strategy: str, events, roles, numel: int, itemsize: int, chunks: dict | None = None) -> Explained:
    """The whole picture of one recorded run: messages paired, rounds, holdings."""
    messages = assign_rounds(pair(events, chunks))
    messages.sort(key=lambda m: (m.round, m.src, m.dst, m.send_posted))
    roles = tuple(roles)
    segments, holds, carries = holdings(messages, roles, numel)
    return Explained(strategy, roles, numel, itemsize, tuple(messages), segments, holds, carries)


# -- the text table -----------------------------------------------------------------------------------------------

def _who(contributors: frozenset, everyone: frozenset) -> str:
    if not contributors:
        return "-"
    if contributors == everyone:
        return "*"
    return "+".join(str(r) for r in sorted(contributors))


def _kind(x: Explained, m: Message) -> str:
    a, b = x.roles[m.src], x.roles[m.dst]
    return "push" if (a, b) == ("worker", "server") else "pull" if (a, b) == ("server", "worker") else ""


PHASE_WORDS = {"reduce": "reduce: partial results move", "gather": "gather: finished results move",
               "mixed": "partial and finished results move", "": "ranges unknown"}


def text(x: Explained) -> str:
    """The plain table: per round every message (link, |src - dst|, bytes, chunk, whose contributions it carries),
    bytes per link, and what each rank holds after the round."""
    everyone = frozenset(r for r, role in enumerate(x.roles) if role == "worker")
    servers = len(x.roles) - x.workers
    lines = [f"{x.strategy} on {x.workers} workers" + (f" and {servers} servers" if servers else "") +
             f": {x.numel:,} elements of {x.itemsize} bytes per worker; {_count(x.rounds, 'round')}, "
             f"{_count(len(x.messages), 'message')}, {x.total_bytes:,} bytes"]
    if x.segments is not None:
        lines.append("chunks: " + "  ".join(f"c{i} [{lo},{hi})" for i, (lo, hi) in enumerate(x.segments)))
        lines.append("carries / holds: whose contributions (ranks; * = all workers, - = none)")
    else:
        lines.append("chunks: unknown (the messages are not views of the synced buffer): bytes only")
    peers = {}
    for m in x.messages:
        peers.setdefault(m.src, set()).add(m.dst)
    runs = _phase_runs(x)
    if runs:
        lines.append("phases: " + "; ".join(f"round{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''}: "
                                            f"{PHASE_WORDS[p]}" for a, b, p in runs))
    lines.append("sends to: " + "; ".join(f"{r} -> {','.join(map(str, sorted(p)))}" for r, p in sorted(peers.items())))
    for rnd in range(1, x.rounds + 1):
        lines.append("")
        phase = x.phase(rnd)
        lines.append(f"round {rnd}" + (f"  ({PHASE_WORDS[phase]})" if phase else "") +
                     f"  {x.round_bytes(rnd):,} bytes")
        rows = [("link", "dist", "kind", "bytes", "chunk", "range", "carries")]
        for i, m in x.round_messages(rnd):
            kind = _kind(x, m)
            rows.append((f"{m.src} -> {m.dst}", "" if kind else str(abs(m.src - m.dst)), kind, f"{m.nbytes:,}",
                         x.chunk_name(m.chunk), "?" if m.chunk is None else f"[{m.chunk[0]},{m.chunk[1]})",
                         _who(x.carries[i], everyone) if x.holds is not None else "?"))
        lines += _columns(rows, indent=2)
        links = x.link_bytes(rnd)
        if any(sum(1 for _, m in x.round_messages(rnd) if (m.src, m.dst) == k) > 1 for k in links):
            lines.append("  bytes per link: " + ", ".join(f"{s}->{d} {b:,}" for (s, d), b in sorted(links.items())))
        if x.holds is not None:
            lines.append(f"  holds after round {rnd}:")
            head = ("rank",) + tuple(f"c{i}" for i in range(len(x.segments)))
            lines += _columns([head] + [(str(r),) + tuple(_who(c, everyone) for c in x.holds[rnd][r])
                                        for r in range(len(x.roles))], indent=4)
    lines.append("")
    lines.append(f"total: {x.total_bytes:,} bytes in {_count(len(x.messages), 'message')} over "
                 f"{_count(x.rounds, 'round')} (" +
                 " + ".join(f"{x.round_bytes(r):,}" for r in range(1, x.rounds + 1)) + ")")
    return "\n".join(lines) + "\n"


def _count(k: int, what: str) -> str:
    return f"{k:,} {what}" + ("" if k == 1 else "s")


def _phase_runs(x: Explained) -> list[tuple[int, int, str]]:
    """Consecutive rounds of one phase: (first, last, phase)."""
    runs: list[list] = []
    for rnd in range(1, x.rounds + 1):
        phase = x.phase(rnd)
        if runs and runs[-1][2] == phase:
            runs[-1][1] = rnd
        else:
            runs.append([rnd, rnd, phase])
    return [tuple(r) for r in runs if r[2]]


def _columns(rows, indent: int) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return [" " * indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


# -- the picture ---------------------------------------------------------------------------------------------------

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def svg(x: Explained) -> str:
    """Ranks as lanes, rounds as columns, every message an arrow from its sender's lane to its receiver's, coloured
    by its chunk; under each lane at the end of each round, one square per chunk, as full as the share of the
    workers' contributions the rank holds there. Hovering an arrow or a square names it."""
    everyone = frozenset(r for r, role in enumerate(x.roles) if role == "worker")
    n_ranks, rounds = len(x.roles), max(x.rounds, 1)
    segs = len(x.segments) if x.segments else 0
    squares_w = 16 * segs + 14 if segs else 0  # the holdings, right of each round's arrows
    col_w = 130 + squares_w
    lane_h = 74 if segs else 52
    left, top = 110, 92
    width, height = max(left + col_w * rounds + 30, 660), top + lane_h * n_ranks + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker></defs>',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="15" font-weight="bold">{html.escape(_title(x))}</text>']

    def lane_y(rank: int) -> float:
        return top + lane_h * rank + 18

    for rnd in range(1, rounds + 1):
        x0 = left + col_w * (rnd - 1)
        phase = x.phase(rnd)
        if rnd % 2 == 0:
            out.append(f'<rect x="{x0}" y="{top - 44}" width="{col_w}" height="{lane_h * n_ranks + 44}" '
                       f'fill="#f4f6f8"/>')
        distances = sorted({abs(m.src - m.dst) for _, m in x.round_messages(rnd) if not _kind(x, m)})
        out.append(f'<text x="{x0 + col_w / 2}" y="{top - 30}" text-anchor="middle" font-weight="bold">round {rnd}'
                   f'</text>')
        out.append(f'<text x="{x0 + col_w / 2}" y="{top - 17}" text-anchor="middle" fill="#555">'
                   f'{html.escape(phase)} {x.round_bytes(rnd):,} B</text>')
        if distances:  # |src - dst|: halving-doubling's distances, a ring's 1 (and n - 1 where it wraps)
            out.append(f'<text x="{x0 + col_w / 2}" y="{top - 4}" text-anchor="middle" fill="#555" font-size="11">'
                       f'{"distance" if len(distances) == 1 else "distances"} '
                       f'{", ".join(map(str, distances))}</text>')
    for rank, role in enumerate(x.roles):
        y = lane_y(rank)
        out.append(f'<text x="10" y="{y + 4}">{"server" if role == "server" else "rank"} {rank}</text>')
        out.append(f'<line x1="{left}" y1="{y}" x2="{left + col_w * rounds}" y2="{y}" stroke="#999"/>')
    for rnd in range(1, rounds + 1):
        x0 = left + col_w * (rnd - 1)
        msgs = x.round_messages(rnd)
        for j, (i, m) in enumerate(msgs):
            colour = _colour(x, m.chunk)
            # spread arrows between the same lanes apart
            same = [k for k, (_, o) in enumerate(msgs) if (o.src, o.dst) == (m.src, m.dst)]
            shift = (same.index(j) - (len(same) - 1) / 2) * 10
            xa, xb = x0 + 14 + shift, x0 + col_w - squares_w - 16 + shift
            ya, yb = lane_y(m.src), lane_y(m.dst)
            carries = _who(x.carries[i], everyone) if x.holds is not None else "?"
            tip = (f"round {rnd}: rank {m.src} -> rank {m.dst}, {m.nbytes:,} bytes, chunk {x.chunk_name(m.chunk)}"
                   + ("" if m.chunk is None else f" [{m.chunk[0]},{m.chunk[1]})") + f", carries {carries}")
            label = f"{x.chunk_name(m.chunk)}" if m.chunk else f"{m.nbytes:,} B"
            # near the sender going down, near the receiver going up, a sender's several arrows at steps: apart
            k = [o.src for _, o in msgs[:j]].count(m.src) % 4
            t = 0.22 + 0.16 * k if yb >= ya else 0.8 - 0.16 * k
            out.append(f'<g><title>{html.escape(tip)}</title><line x1="{xa:.1f}" y1="{ya}" x2="{xb:.1f}" y2="{yb}" '
                       f'stroke="{colour}" stroke-width="2" marker-end="url(#head)"/>'
                       f'<text x="{xa + t * (xb - xa) + 5:.1f}" y="{ya + t * (yb - ya) + 4:.1f}" '
                       f'fill="{colour}" '
                       f'font-size="11">{html.escape(label)}</text></g>')
        if x.holds is not None:
            out += _svg_holdings(x, rnd, x0 + col_w - 8, everyone, lane_y)
    note = ("squares: chunks, filled by the share of the workers' contributions the rank holds after the round"
            if x.holds is not None else "chunks unknown: arrows labelled with bytes")
    out.append(f'<text x="10" y="{height - 12}" fill="#555">{html.escape(note)}; total {x.total_bytes:,} bytes'
               f'</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _svg_holdings(x: Explained, rnd: int, right: float, everyone: frozenset, lane_y) -> list[str]:
    """Each rank's chunks after round `rnd`, squares ending at `right`, each as full as the share of the workers'
    contributions the rank holds."""
    out, segs, n_ranks = [], len(x.segments), len(x.roles)
    for rank in range(n_ranks):
        for s, contributors in enumerate(x.holds[rnd][rank]):
            sx, sy = right - 16 * (segs - s), lane_y(rank) - 6
            share = len(contributors) / max(len(everyone), 1)
            colour = PALETTE[s % len(PALETTE)]
            tip = (f"rank {rank} after round {rnd}: c{s} [{x.segments[s][0]},{x.segments[s][1]}) holds "
                   f"{_who(contributors, everyone)}")
            out.append(f'<g><title>{html.escape(tip)}</title><rect x="{sx}" y="{sy}" width="13" '
                       f'height="13" fill="white" stroke="{colour}"/>'
                       f'<rect x="{sx}" y="{sy + 13 * (1 - share):.1f}" '
                       f'width="13" height="{13 * share:.1f}" fill="{colour}"/>'
                       + (f'<text x="{sx + 6.5}" y="{sy + 24}" text-anchor="middle" font-size="9">'
                          f'c{s}</text>' if rank == n_ranks - 1 else "") + '</g>')
    return out


def _colour(x: Explained, chunk: Range | None) -> str:
    """A chunk's colour: its first segment's (a square's colour below the lanes)."""
    if chunk is None or x.segments is None:
        return "#444"
    return PALETTE[[lo for lo, _ in x.segments].index(chunk[0]) % len(PALETTE)]


def _title(x: Explained) -> str:
    servers = len(x.roles) - x.workers
    return (f"{x.strategy}: {_count(x.workers, 'worker')}" + (f" + {_count(servers, 'server')}" if servers else "")
            + f", {x.numel:,} elements, {_count(x.rounds, 'round')}, {x.total_bytes:,} bytes")


def html_page(x: Explained) -> str:
    """The picture and the table on one offline page."""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(_title(x)) +
            "</title></head><body style='font-family:sans-serif'>\n" + svg(x) +
            "<pre>" + html.escape(text(x)) + "</pre></body></html>\n")

"""What one rank records of the traced steps: its compute phases, each bucket's readiness and sync, its messages.

A run traces `trace_steps` steps (a sweep setting, 0: none), the first ones after warm-up. On a traced step the
rank's communicator carries a MessageRecorder (strategies/transport/recorder.py: every send and receive with its
peer, bytes, posting and finishing time); on every other step it carries none, and nothing is recorded or paid.
The step loop (experiments/pipeline/train.py) hands over the clock readings it already takes for the step's
compute and communication columns, so that the phases sum to exactly what the steps table says.

One clock per run: every rank reads the communicator's clock (the wall clock's perf_counter on thread ranks and
Ray actors, the simulated clock on SimGrid). A wall-clock rank adds its offset to the epoch clock (time.time), so
that ranks of one run, in one process or in several, land on one time axis; the stored table counts from the
run's first recorded event (experiments/results/events.py).
"""

from __future__ import annotations

import math
import time

from experiments.results.timeline import COMM, COMPUTE, PHASES  # noqa: F401 - the phases' vocabulary, read back there
from strategies.transport.recorder import Direction, MessageEvent, MessageRecorder

MAX_MESSAGES = 200_000  # messages one rank may record over a run's traced steps (the recorder's limit)


def traced_steps(spec) -> int:
    """The run's traced steps: trace_steps, or when the sweep left it unset DEFAULT_TRACE_STEPS in a run of at most
    MAX_TRACED_RANKS ranks and none in a larger one (a simulation of thousands of ranks records nothing)."""
    from experiments.config.sweep import DEFAULT_TRACE_STEPS, MAX_TRACED_RANKS

    if spec.trace_steps is not None:
        return spec.trace_steps
    return DEFAULT_TRACE_STEPS if spec.world_size() <= MAX_TRACED_RANKS else 0


class StepTrace:
    """One rank's events over the traced steps; `rows()` at the end of the run (plain dicts, cheap to ship)."""

    def __init__(self, spec, comm, clock):
        self.comm = comm
        self.first = spec.warmup_steps
        self.stop = min(spec.steps, spec.warmup_steps + traced_steps(spec))
        # wall-clock ranks on one epoch axis; a simulated clock is already one axis
        self.offset = time.time() - clock() if clock is time.perf_counter else 0.0
        self.recorder = MessageRecorder(MAX_MESSAGES) if self.stop > self.first else None
        self.events: list[dict] = []
        self.step = -1

    def wants(self, step: int) -> bool:
        return self.first <= step < self.stop

    def begin(self, step: int, syncer=None) -> None:
        """Before the step's first clock reading: messages and bucket readiness are recorded from here."""
        if not self.wants(step):
            return
        self.step = step
        self.recorder.clear()
        self.comm.recorder = self.recorder
        if syncer is not None:
            syncer.ready_at = {}

    def phase(self, name: str, start: float, end: float, thread: str = "main", bucket: int = -1) -> None:
        if name not in PHASES:
            raise ValueError(f"phase {name!r}: accepted are {', '.join(PHASES)}")
        self._add("phase", name, start, end, thread=thread, bucket=bucket)

    def end(self, syncer=None) -> None:
        """After the step: its messages, and its buckets' readiness and sync spans; recording off again."""
        if self.step < 0:
            return
        self.comm.recorder = None
        for m in self.recorder.events():
            self._add("message", str(getattr(m.direction, "value", m.direction)), m.posted, m.finished,
                      peer=m.peer, nbytes=m.nbytes, seq=m.seq)
        if syncer is not None:
            thread = "comm" if syncer.overlap and syncer.threaded else "main"
            for bucket, at in sorted(syncer.ready_at.items()):
                self._add("bucket_ready", "ready", at, at, thread="main", bucket=bucket)
            for bucket, start, done in syncer.bucket_spans:
                self._add("bucket_sync", "bucket", start, done, thread=thread, bucket=bucket)
            syncer.ready_at = None
        self.step = -1

    def serve(self, bucket: int, start: float, end: float) -> None:
        """A server rank's bucket: from its first push expected to its replies sent."""
        self._add("bucket_sync", "bucket", start, end, thread="main", bucket=bucket)

    # -- a server without a global barrier: it serves the whole run at once, the workers' steps interleaved ----

    def begin_run(self, unit_buckets: list[int]) -> None:
        """Before a barrier-free server's run: record its messages of the traced steps over the whole run. A
        worker's step pushes one message per unit (`unit_buckets`: each unit's bucket, in push order) and gets
        one reply per unit: its k-th push and k-th reply belong to its step k // units (ByStep)."""
        if self.recorder is None or not unit_buckets:
            return
        self.recorder = ByStep(MAX_MESSAGES, len(unit_buckets), self.wants)
        self.comm.recorder = self.recorder

    def end_run(self, records, unit_buckets: list[int]) -> None:
        """After the run: every traced push as one worker's lane of the server (thread `worker w`, peer w): its
        unit served (`bucket_sync`, from the push in hand to its reply made), the `update` (its handling under
        the server's lock) and the reply's `bound wait` (at the staleness bound, or for a step's first n - b
        pushes); then the traced steps' messages."""
        self.comm.recorder = None
        if not isinstance(self.recorder, ByStep):
            return
        for r in records:
            if not self.wants(r.step):
                continue
            self.step, bucket, lane = r.step, unit_buckets[r.unit], f"worker {r.worker}"
            self._add("bucket_sync", "bucket", r.arrived_s, r.answered_s, thread=lane, bucket=bucket, peer=r.worker)
            self._add("phase", "update", r.handle_start_s, r.handle_end_s, thread=lane, bucket=bucket, peer=r.worker)
            if r.answered_s > r.handle_end_s:
                self._add("phase", "bound wait", r.handle_end_s, r.answered_s, thread=lane, bucket=bucket,
                          peer=r.worker)
        for m in self.recorder.events():
            self.step = self.recorder.step_of[m.seq]
            self._add("message", str(m.direction.value), m.posted, m.finished, peer=m.peer, nbytes=m.nbytes,
                      seq=m.seq)
        self.step = -1

    def _add(self, kind: str, name: str, start: float, end: float, thread: str = "main", bucket: int = -1,
             peer: int = -1, nbytes: int = 0, seq: int = -1) -> None:
        self.events.append({"step": self.step, "rank": self.comm.rank, "kind": kind, "name": name, "thread": thread,
                            "bucket": int(bucket), "peer": int(peer), "nbytes": int(nbytes), "seq": int(seq),
                            "start_s": float(start) + self.offset, "end_s": float(end) + self.offset})


class ByStep(MessageRecorder):
    """A recorder over a barrier-free server's whole run that keeps only the traced steps' messages (they alone
    count to the limit): the k-th message with a peer in one direction belongs to that worker's step
    k // `units` (a worker's step is `units` pushes, each answered by one reply, posted in order per worker).
    `step_of[seq]`: a kept message's step."""

    def __init__(self, limit: int, units: int, wants):
        super().__init__(limit)
        self.units, self.wants = units, wants
        self.step_of: dict[int, int] = {}
        self._count: dict[tuple[int, Direction], int] = {}

    def start(self, rank: int, peer: int, direction: Direction, nbytes: int, clock):
        with self._lock:
            k = self._count.get((peer, direction), 0)
            self._count[(peer, direction)] = k + 1
        step = k // self.units
        if not self.wants(step):
            return _not_kept
        seq = self.post(rank)
        with self._lock:
            self.step_of[seq] = step
        posted = clock()

        def done() -> None:
            self.add(MessageEvent(rank, peer, direction, nbytes, seq, posted, clock()))

        return done


def _not_kept() -> None:
    """A message ByStep does not keep: nothing to record when its wait completes."""


def worker_phases(trace: StepTrace, t: dict, exposed: float, role: str, straggles: bool) -> None:
    """A worker step's phases from the loop's clock readings `t` (their sums are the row's compute_s and comm_s):
    forward and backward (one phase when the compute does not say where forward ended), the communication that
    outlasted backward (ddp), what ran between backward and the sync (a decentralized step's optimizer, a real-mode
    straggler's stretch), the exposed sync, and the apply (optimizer, or the parameters taken from the servers)."""
    backward_end = t["fb_end"] - exposed
    forward_end = t.get("forward_end", math.nan)
    if t["step_start"] <= forward_end <= backward_end:
        trace.phase("forward", t["step_start"], forward_end)
        trace.phase("backward", forward_end, backward_end)
    else:
        trace.phase("forward+backward", t["step_start"], backward_end)
    if exposed > 0:
        trace.phase("sync in backward", backward_end, t["fb_end"])
    between = "optimizer" if role == "parameters" else "straggle" if straggles else "after backward"
    trace.phase(between, t["fb_end"], t["compute_end"])
    trace.phase("sync", t["comm_start"], t["comm_end"])
    trace.phase("apply" if role != "gradients" else "optimizer", t["apply_start"], t["apply_end"])


def run_events(run_id: str, results: list[dict] | None) -> list[dict]:
    """Every rank's events of a finished run as rows of the events table (experiments/results/schema.py EVENTS):
    times counted from the run's first recorded event. [] when the run failed or traced nothing."""
    rows = [dict(e, run_id=run_id) for result in (results or []) for e in result.get("events", ())]
    if not rows:
        return []
    origin = min(r["start_s"] for r in rows)
    for r in rows:
        r["start_s"] -= origin
        r["end_s"] -= origin
    return rows

"""Synchronize one flat buffer bucket by bucket through a strategy, after backward or overlapped with it.

Each bucket (workloads/buckets.py) gets its own bound strategy runtime, so a strategy's per-tensor state
(its size check, scratch buffers, a decentralized round counter) is per bucket and every bucket is an
ordinary sync of a contiguous slice. Buckets are started in bucket order on every rank, which is what keeps
ranks matched on the wire.

A bucket is started with the runtime's `isync()` and completed by its handle's wait(). Most strategies sync
inside isync() (strategies/base.py: the default), so a bucket is done when it is started, as before. One that
pipelines (the synchronous parameter server with dedicated servers) only posts its pushes and its replies'
receives there: every bucket of the step is then started before any reply is waited for, so a bucket's pushes
leave while earlier buckets' replies are still on their way, and the handles are waited in bucket order once
all are started.

- overlap off: `finish()` starts bucket 0, 1, ... once backward is done, then waits them in order. With a single
  bucket this is exactly the flat-buffer sync syncbench has always done.
- overlap on: one communication thread per rank. `grad_ready(i)` (autograd's post-accumulate-grad hook of
  parameter i, real or replayed) counts down its bucket; a bucket whose last gradient arrived is handed to the
  thread, which starts buckets strictly in order while backward continues, and waits them all once the last one
  is started. While no bucket is ready it waits for the sends of those already started (never their replies): a
  transport that moves bytes only inside a wait (the sockets) keeps moving. `finish()` waits for the thread.
  Every communicator call of the step is made on that thread.
- overlap on, `threaded = False` (the simulated substrate, whose ranks are SimGrid actors: backward is simulated
  time, not work a thread must share): `grad_ready(i)` starts the completed buckets in order right away, in the
  caller, while the simulated backward goes on; `finish()` starts what is left and waits them all.

Timing per step: `busy_s` is the time at least one bucket was in flight on this rank, on the run's `clock` (wall
or simulated): the union of each bucket's interval from its start to its completion, which is the return of
isync() for a bucket synced there and the return of its wait() otherwise. A pipelined bucket's replies are waited
for only once every bucket is started, so its interval runs to then even if its replies came earlier: for the
pipelined parameter server busy_s is an upper bound (it may count time the rank only waited for backward). The
caller measures how long `finish()` blocks, which is the communication the step exposes.
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from experiments.results.timeline import union_length
from strategies.base import Pending
from strategies.transport.communicator import DONE
from workloads.buckets import Bucket

_STOP = -1


class BucketSync:
    def __init__(self, config, comm, workers: int, buffer: torch.Tensor, buckets: tuple[Bucket, ...],
                 overlap: bool, op: str = "mean", threaded: bool = True, clock=time.perf_counter):
        self.comm = comm
        self.clock = clock
        self.buffer = buffer
        self.buckets = buckets
        self.overlap = overlap
        self.op = op
        self.runtimes = [config.bind(comm, workers) for _ in buckets]
        self.owner = {i: b.index for b in buckets for i in b.params}
        self.pending = [len(b.params) for b in buckets]
        self.busy_s = 0.0
        self.threaded = threaded
        self.ready_at: dict[int, float] | None = None  # a traced step (experiments/pipeline/trace.py): bucket -> ready
        self.bucket_spans: list[tuple[int, float, float]] = []  # this step's (bucket, start, done)
        self._in_flight: list[tuple[float, object, int]] = []  # (start, handle, bucket) started, not yet waited
        self._spans: list[tuple[float, float]] = []  # this step's (start, done) per bucket
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._following = 0  # overlap: the next bucket to start, in bucket order
        if overlap and threaded:
            self._thread = threading.Thread(target=self._loop, name=f"comm-rank{comm.rank}", daemon=True)
            self._thread.start()

    def begin_step(self) -> None:
        self.pending = [len(b.params) for b in self.buckets]
        self.busy_s = 0.0
        self._following = 0
        self._in_flight, self._spans, self.bucket_spans = [], [], []
        self._done.clear()

    def grad_ready(self, param: int) -> None:
        """Parameter `param`'s gradient is accumulated; hand its bucket over once it is complete."""
        bucket = self.owner[param]
        self.pending[bucket] -= 1
        if self.pending[bucket] == 0 and self.ready_at is not None:
            self.ready_at[bucket] = self.clock()
        if self.pending[bucket] == 0 and self.overlap and self._thread is None:
            self._start_ready()
        elif self.pending[bucket] == 0 and self.overlap:
            ready = None
            if self.buffer.is_cuda:  # the hook runs when the kernel is queued: the thread waits for it to run
                ready = torch.cuda.Event()
                ready.record()
            self._queue.put((bucket, ready))

    def finish(self) -> None:
        """Return once every bucket is synchronized (overlap off: start them all now, in order, then wait)."""
        if not self.overlap:
            for bucket in self.buckets:
                self._start(bucket)
            self._wait_all()
            return
        if self._thread is None:  # inline: a bucket that got no gradient this step goes as it is, in order
            self.pending = [0] * len(self.buckets)
            self._start_ready()
            self._wait_all()
            return
        for bucket in self.buckets:  # a parameter that got no gradient this step: its bucket goes as it is
            if self.pending[bucket.index] > 0:
                self.pending[bucket.index] = 0
                self._queue.put((bucket.index, None))
        if not self._done.wait(self.comm.timeout * len(self.buckets) + 30):
            raise TimeoutError(f"rank {self.comm.rank}: the communication thread did not finish the step's "
                               f"{len(self.buckets)} bucket(s) within the timeout")
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put((_STOP, None))
            self._thread.join(timeout=5)
            self._thread = None

    def _start(self, bucket: Bucket) -> None:
        runtime = self.runtimes[bucket.index]
        if self._in_flight and not runtime.size_checked(bucket.numel):
            # a runtime's first sync checks its size with every rank on the control plane: finish the buckets in
            # flight first, or a server still sending this rank an earlier bucket's reply (over the sockets, bytes
            # move only inside a wait) never reaches the check, and both wait out the timeout. First step only.
            self._wait_all()
        start = self.clock()
        handle = runtime.isync(self.buffer[bucket.lo:bucket.hi], self.op)
        if handle is DONE:  # synced inside isync()
            self._spans.append((start, self.clock()))
            self.bucket_spans.append((bucket.index, *self._spans[-1]))
        else:
            self._in_flight.append((start, handle, bucket.index))

    def _wait_all(self) -> None:
        """Wait for every started bucket, in bucket order; then this step's busy time."""
        try:
            for start, handle, index in self._in_flight:
                handle.wait()
                self._spans.append((start, self.clock()))
                self.bucket_spans.append((index, *self._spans[-1]))
        finally:
            self._in_flight = []  # after a failure the rest is abandoned with the step: never waited again
        self.busy_s = union_length(self._spans)

    def _send_one(self) -> bool:
        """While no bucket is ready: wait for the sends of the oldest started bucket with any left (its replies
        stay posted); False if there were none."""
        return any(handle.wait_sent() for _, handle, _ in self._in_flight if isinstance(handle, Pending))

    def _start_ready(self) -> None:
        """Overlap: start, in bucket order, every bucket whose gradients are all in."""
        while self._following < len(self.buckets) and self.pending[self._following] == 0:
            self._start(self.buckets[self._following])
            self._following += 1

    def _loop(self) -> None:
        """The communication thread: start buckets in bucket order as they become ready, wait for them all once the
        last one is started, one step after another."""
        ready: set[int] = set()
        following = 0
        while True:
            try:
                bucket, event = self._queue.get_nowait()
            except queue.Empty:
                try:
                    if self._error is None and self._send_one():
                        continue  # sends waited for: look for a ready bucket again before the next
                except BaseException as e:  # noqa: BLE001 - handed to the training thread in finish()
                    self._error = e
                bucket, event = self._queue.get()
            if bucket == _STOP:
                return
            if event is not None:
                event.synchronize()
            ready.add(bucket)
            try:
                while following in ready and self._error is None:
                    ready.discard(following)
                    self._start(self.buckets[following])
                    following += 1
                if following == len(self.buckets) and self._error is None:
                    self._wait_all()
            except BaseException as e:  # noqa: BLE001 - handed to the training thread in finish()
                self._error = e
            if following == len(self.buckets) or self._error is not None:
                ready.clear()
                following = 0
                self._in_flight = []
                self._done.set()

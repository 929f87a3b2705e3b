"""Synchronize one flat buffer bucket by bucket through a strategy, after backward or overlapped with it.

Each bucket (workloads/buckets.py) gets its own bound strategy runtime, so a strategy's per-tensor state
(its size check, scratch buffers, a decentralized round counter) is per bucket and every bucket is an
ordinary `sync()` of a contiguous slice. Buckets are synchronized in bucket order on every rank, which is
what keeps ranks matched on the wire.

- overlap off: `finish()` syncs bucket 0, 1, ... one after the other once backward is done. With a single
  bucket this is exactly the flat-buffer sync syncbench has always done.
- overlap on: one communication thread per rank. `grad_ready(i)` (autograd's post-accumulate-grad hook of
  parameter i, real or replayed) counts down its bucket; a bucket whose last gradient arrived is handed to the
  thread, which syncs buckets strictly in order while backward continues. `finish()` waits for the last one.
- overlap on, `threaded = False` (the simulated substrate, whose ranks are SimGrid actors: backward is simulated
  time, not work a thread must share): `grad_ready(i)` syncs the completed buckets in order right away, in the
  caller, while the simulated backward goes on; `finish()` syncs what is left.

Timing per step: `busy_s` is the time spent inside bucket syncs, on the run's `clock` (wall or simulated); the
caller measures how long `finish()` blocks, which is the communication the step exposes.
"""

from __future__ import annotations

import queue
import threading
import time

import torch

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
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._following = 0  # overlap without a thread: the next bucket to sync, in bucket order
        if overlap and threaded:
            self._thread = threading.Thread(target=self._loop, name=f"comm-rank{comm.rank}", daemon=True)
            self._thread.start()

    def begin_step(self) -> None:
        self.pending = [len(b.params) for b in self.buckets]
        self.busy_s = 0.0
        self._following = 0
        self._done.clear()

    def grad_ready(self, param: int) -> None:
        """Parameter `param`'s gradient is accumulated; hand its bucket over once it is complete."""
        bucket = self.owner[param]
        self.pending[bucket] -= 1
        if self.pending[bucket] == 0 and self.overlap and self._thread is None:
            self._sync_ready()
        elif self.pending[bucket] == 0 and self.overlap:
            ready = None
            if self.buffer.is_cuda:  # the hook runs when the kernel is queued: the thread waits for it to run
                ready = torch.cuda.Event()
                ready.record()
            self._queue.put((bucket, ready))

    def finish(self) -> None:
        """Return once every bucket is synchronized (overlap off: sync them all now, in order)."""
        if not self.overlap:
            for bucket in self.buckets:
                self._sync(bucket)
            return
        if self._thread is None:  # inline: a bucket that got no gradient this step goes as it is, in order
            self.pending = [0] * len(self.buckets)
            self._sync_ready()
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

    def _sync(self, bucket: Bucket) -> None:
        start = self.clock()
        self.runtimes[bucket.index].sync(self.buffer[bucket.lo:bucket.hi], self.op)
        self.busy_s += self.clock() - start

    def _sync_ready(self) -> None:
        """Overlap without a thread: sync, in bucket order, every bucket whose gradients are all in."""
        while self._following < len(self.buckets) and self.pending[self._following] == 0:
            self._sync(self.buckets[self._following])
            self._following += 1

    def _loop(self) -> None:
        """The communication thread: sync buckets in bucket order as they become ready, one step after another."""
        ready: set[int] = set()
        following = 0
        while True:
            bucket, event = self._queue.get()
            if bucket == _STOP:
                return
            if event is not None:
                event.synchronize()
            ready.add(bucket)
            try:
                while following in ready and self._error is None:
                    ready.discard(following)
                    self._sync(self.buckets[following])
                    following += 1
            except BaseException as e:  # noqa: BLE001 - handed to the training thread in finish()
                self._error = e
            if following == len(self.buckets) or self._error is not None:
                ready.clear()
                following = 0
                self._done.set()

"""The parameter server without a global barrier: asynchronous (Downpour SGD), stale-synchronous (SSP) and
backup workers. Update mode, dedicated servers: each server owns its shard's parameters and optimizer.

A worker's step is one push/pull per server: it sends its gradient's shard s to server s and receives the shard's
parameters back. A server serves every worker from a thread of its own (pushes arrive in any order), over the
whole run (a worker's clock is the number of pushes it made; the bound spans steps):

- staleness = s > 0 or "async": a push is applied as soon as it arrives, scaled by 1/n (n pushes make about one
  synchronous step). Its staleness is how many updates the shard took between the worker's last read and this
  push. The reply waits while the slowest worker's clock is below c - s, c the pusher's clock (SSP: no worker
  runs more than s steps ahead of the slowest); "async" never waits.
- backups = b (staleness 0): step t's update is the mean, in worker-rank order, of the first n - b pushes of step
  t; a later push of step t is dropped (counted) and its worker gets the newest parameters. Every worker that
  made step t gets the parameters step t made.

Every applied push leaves a record: (step, worker, staleness, seconds its reply waited at the bound, dropped).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from strategies.base import chunk_bounds


@dataclass(frozen=True)
class PushRecord:
    step: int          # the pusher's clock: its step number
    worker: int
    staleness: int     # updates this shard took between the worker's read and its push (0 when dropped)
    bound_wait_s: float  # how long the reply waited for the slowest worker (SSP), 0 for async and backups
    dropped: bool      # a backup worker's late push: received, not applied
    lead: int = 0      # the pusher's clock minus the slowest worker's when the reply left (SSP keeps it <= s)


def push_pull(comm, flat: torch.Tensor, workers: int, servers: int) -> None:
    """A worker's step: push every shard of the gradient, receive every shard's parameters into `flat`."""
    shards = chunk_bounds(flat.numel(), servers)
    pushes = [comm.isend(flat[lo:hi], workers + s) for s, (lo, hi) in enumerate(shards)]
    for handle in pushes:  # the gradient is sent before the same buffer receives the parameters
        handle.wait()
    pulls = [comm.irecv(flat[lo:hi], workers + s) for s, (lo, hi) in enumerate(shards)]
    for handle in pulls:
        handle.wait()


class ShardServer:
    """One server's shard over a whole run: `run(steps)` serves every worker from its own thread; returns the
    records of every push. `update(gradient, where)` steps the shard's parameters and returns them."""

    def __init__(self, comm, workers: int, servers: int, numel: int, dtype, update, staleness, backups: int = 0,
                 device="cpu"):
        self.comm, self.workers, self.update = comm, workers, update
        self.staleness, self.backups = staleness, backups
        server = comm.rank - workers
        self.lo, self.hi = chunk_bounds(numel, servers)[server]
        self.dtype, self.device = dtype, device
        self.cond = threading.Condition()
        self.version = 0                  # updates applied to this shard
        self.clock = [0] * workers        # pushes received per worker
        self.read = [0] * workers         # the version each worker last received
        self.params: torch.Tensor | None = None  # the newest parameters (None until the first update)
        self.pending: dict[int, dict[int, torch.Tensor]] = {}  # backups: step -> worker -> gradient
        self.made: dict[int, torch.Tensor] = {}                # backups: step -> parameters it made
        self.records: list[PushRecord] = []

    def run(self, steps: int) -> list[PushRecord]:
        errors: list[BaseException] = []

        def serve(worker):
            try:
                self._serve_worker(worker, steps)
            except BaseException as e:  # noqa: BLE001 - re-raised below on the server's thread
                errors.append(e)
                with self.cond:
                    self.cond.notify_all()

        threads = [threading.Thread(target=serve, args=(w,), name=f"server{self.comm.rank}-worker{w}", daemon=True)
                   for w in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return sorted(self.records, key=lambda r: (r.step, r.worker))

    def _serve_worker(self, worker: int, steps: int) -> None:
        size = self.hi - self.lo
        incoming = torch.empty(size, dtype=self.dtype, device=self.device)
        for step in range(steps):
            if size:
                self.comm.recv(incoming, worker)
            with self.cond:
                reply = (self._backup_push if self.staleness == 0 else self._stale_push)(worker, step, incoming)
            if size:
                self.comm.send(reply, worker)

    def _stale_push(self, worker: int, step: int, gradient: torch.Tensor) -> torch.Tensor:
        """SSP / async, under the lock: apply at once, then wait at the bound; the reply is the newest shard."""
        staleness = self.version - self.read[worker]
        self.params = self.update(gradient / self.workers, slice(self.lo, self.hi)).detach().clone()
        self.version += 1
        self.clock[worker] += 1
        self.cond.notify_all()
        start = time.perf_counter()
        if self.staleness != "async":
            # the pusher now starts step c = clock; it may while the slowest worker has reached c - s
            bound = self.clock[worker] - self.staleness
            if not self.cond.wait_for(lambda: min(self.clock) >= bound, timeout=self.comm.timeout):
                raise TimeoutError(f"rank {self.comm.rank}: worker {worker} waited {self.comm.timeout:g} s at the "
                                   f"staleness bound (clocks {self.clock}, s = {self.staleness})")
        self.records.append(PushRecord(step, worker, staleness, time.perf_counter() - start, False,
                                       self.clock[worker] - min(self.clock)))
        self.read[worker] = self.version
        return self.params.clone()

    def _backup_push(self, worker: int, step: int, gradient: torch.Tensor) -> torch.Tensor:
        """Backups, under the lock: the first n - b pushes of a step make it; a later one is dropped."""
        self.clock[worker] += 1
        if step in self.made:  # late: the step was made without this push
            self.records.append(PushRecord(step, worker, 0, 0.0, True))
            return self.made[max(self.made)].clone()
        arrived = self.pending.setdefault(step, {})
        arrived[worker] = gradient.clone()
        if len(arrived) == self.workers - self.backups:
            rows = [arrived[w] for w in sorted(arrived)]  # worker-rank order: the same bits whoever came first
            total = rows[0].clone()
            for row in rows[1:]:
                total.add_(row)
            self.made[step] = self.update(total / len(rows), slice(self.lo, self.hi)).detach().clone()
            self.version += 1
            del self.pending[step]
            self.cond.notify_all()
        if not self.cond.wait_for(lambda: step in self.made, timeout=self.comm.timeout):
            raise TimeoutError(f"rank {self.comm.rank}: step {step} never got {self.workers - self.backups} pushes")
        self.records.append(PushRecord(step, worker, 0, 0.0, False))
        return self.made[step].clone()

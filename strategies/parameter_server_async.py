"""The parameter server without a global barrier: asynchronous (Downpour SGD), stale-synchronous (SSP) and
backup workers, in both modes, on dedicated servers, bucket by bucket, partition by partition.

Units. Every bucket (the pipeline's; one flat bucket by default) is cut as the synchronous server cuts it: k
balanced shards, each into partitions of at most `partition_mb` MiB (strategies/parameter_server.py
`partitions`). Server s owns its shard's partitions of every bucket; each (bucket, partition) is a unit with its
own state: clocks, versions, parameters or sums. A worker's step pushes every unit of a bucket at once and takes
every reply (full duplex: the replies land in a buffer of their own while pushes still stream); a server serves
every worker from a thread of its own over the whole run (pushes arrive in any order), unit after unit, in the
order the worker pushes them, answering each unit as soon as it is handled. A worker's clock on a unit is the
number of pushes it made to it; the bound spans steps.

- staleness = s > 0 or "async": a push is handled as soon as it arrives, scaled by 1/n (n pushes make about one
  synchronous step). Its staleness is how many pushes of other workers the unit took between this worker's
  last reply and this push. The reply waits while the slowest worker's clock is below c - s, c the pusher's
  clock (SSP: no worker runs more than s steps ahead of the slowest); "async" never waits. What is handled:
  - mode "update": the server's optimizer applies the push to the unit's parameters at once; the reply is the
    newest parameters.
  - mode "summation": the server sums, it runs no optimizer. The reply to worker w is the sum, in the order
    they arrived, of every push (scaled by 1/n) the unit received since w's previous reply, w's own included:
    every worker's gradient reaches every worker exactly once, as soon as that worker next pulls, and each
    worker's optimizer applies what it receives. With plain SGD every worker's parameters are then the update
    server's parameters at the version it read (momentum is each worker's own).
- backups = b (staleness 0): step t's result is the mean, in worker-rank order, of the first n - b pushes of
  step t; a later push of step t is dropped (counted). Every worker that made step t gets what step t made;
  a late worker gets, in update mode, the newest parameters (it continues from them), in summation mode step
  t's mean (the update the others applied, so every worker applies every step's mean once).

Every push leaves a record: (step, worker, staleness, seconds its reply waited at the bound, dropped, lead,
unit, elements, and when, on the communicator's clock, it arrived, was handled and was answered: a traced step's
server phases, experiments/pipeline/servers.py). Colocated servers are refused by the config
(ParameterServerConfig.validate): see there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from strategies.partitions import partitions

ASYNC = "async"


@dataclass(frozen=True)
class PushRecord:
    step: int          # the pusher's clock: its step number
    worker: int
    staleness: int     # pushes of others this unit took between the worker's last reply and this push (0: dropped)
    bound_wait_s: float  # how long the reply waited for the slowest worker (SSP), 0 for async and backups
    dropped: bool      # a backup worker's late push: received, not applied
    lead: int = 0      # the pusher's clock minus the slowest worker's when the reply left (SSP keeps it <= s)
    unit: int = 0      # which (bucket, partition) of this server's: the order a worker pushes them in
    numel: int = 0     # the unit's elements (its push and its reply each move this many)
    # on the communicator's clock: the push was in hand, handled under the server's lock (from, to: the update,
    # or the sum, or a backup's step made), its reply made (it leaves at once: answered - handled is its wait)
    arrived_s: float = float("nan")
    handle_start_s: float = float("nan")
    handle_end_s: float = float("nan")
    answered_s: float = float("nan")


def unit_bounds(numel: int, servers: int, itemsize: int, partition_mb: float) -> list[list[tuple[int, int]]]:
    """Per server: its shard of a bucket of numel elements cut into partitions, (lo, hi) in the bucket."""
    return partitions(numel, servers, itemsize, partition_mb)


def unit_buckets(numels, server: int, servers: int, itemsize: int, partition_mb: float) -> list[int]:
    """The bucket of each unit of server `server` (0..servers-1), in unit order: a worker's step pushes to it (and
    gets back) one message per unit, in this order."""
    return [b for b, numel in enumerate(numels) for _ in unit_bounds(numel, servers, itemsize, partition_mb)[server]]


def push_pull(comm, flat: torch.Tensor, workers: int, servers: int, partition_mb: float) -> None:
    """A worker's step on one bucket: push every partition of every shard, take every reply into `flat`.

    The replies land in a buffer of their own (pushes of later partitions may still be on the wire: the NIC
    sends and receives at once), copied into `flat` once every push has left."""
    parts = unit_bounds(flat.numel(), servers, flat.element_size(), partition_mb)
    rounds = max((len(p) for p in parts), default=0)
    # round by round, servers from rank mod k on: in each slot the workers push to different servers
    order = [(s, r) for r in range(rounds) for s in ((comm.rank + i) % servers for i in range(servers))
             if r < len(parts[s])]
    pushes = [comm.isend(flat[slice(*parts[s][r])], workers + s) for s, r in order]
    replies = torch.empty_like(flat)
    pulls = [comm.irecv(replies[slice(*parts[s][r])], workers + s) for s, r in order]
    for handle in pushes + pulls:
        handle.wait()
    flat.copy_(replies)


class Clocks:
    """Per-worker counts that never decrease, with their minimum kept as they change (`lowest`): a server asks
    for the slowest worker's clock at every push, and a min() over 1,024 workers each time was about a tenth of
    a 1,024 x 128 simulation's CPU time (perf). A rescan happens only when the last worker at the minimum moves
    on."""

    __slots__ = ("values", "lowest", "at_lowest")

    def __init__(self, workers: int):
        self.values = [0] * workers
        self.lowest = 0
        self.at_lowest = workers  # how many workers are at `lowest`

    def __getitem__(self, worker: int) -> int:
        return self.values[worker]

    def __setitem__(self, worker: int, value: int) -> None:
        old = self.values[worker]
        if value < old:
            raise ValueError(f"worker {worker}'s count would go back from {old} to {value}: counts only grow")
        self.values[worker] = value
        if old == self.lowest and value != old:
            self.at_lowest -= 1
            if self.at_lowest == 0:
                self.lowest = min(self.values)
                self.at_lowest = self.values.count(self.lowest)

    def __repr__(self) -> str:
        return repr(self.values)


class Unit:
    """One (bucket, partition) of a server's shard: its clocks, version and what its mode keeps."""

    def __init__(self, index: int, bucket: int, lo: int, hi: int, workers: int):
        self.index, self.bucket, self.lo, self.hi = index, bucket, lo, hi
        self.version = 0                  # pushes handled (SSP/async) or steps made (backups)
        self.clock = Clocks(workers)      # pushes received per worker
        self.read = Clocks(workers)       # the version each worker last got a reply at (backups: its replies)
        self.params: torch.Tensor | None = None   # update mode: the newest parameters
        self.log: list[torch.Tensor] = []         # summation, SSP/async: pushes from version `base` on
        self.base = 0
        self.pending: dict[int, dict[int, torch.Tensor]] = {}  # backups: step -> worker -> gradient
        self.made: dict[int, torch.Tensor] = {}                # backups: step -> what it made

    @property
    def where(self) -> slice:
        return slice(self.lo, self.hi)


class ShardServer:
    """One server's shard of every bucket over a whole run: `run(steps)` serves every worker from its own
    thread; returns the records of every push. `update(bucket, gradient, where)` (update mode) steps the unit's
    parameters (where: the unit's slice of its bucket) and returns them; summation mode needs none."""

    def __init__(self, comm, workers: int, servers: int, numels, dtype, update, staleness, backups: int = 0,
                 device="cpu", mode: str = "update", partition_mb: float = 4.0):
        self.comm, self.workers, self.update, self.mode = comm, workers, update, mode
        self.staleness, self.backups = staleness, backups
        self.dtype, self.device = dtype, device
        server = comm.rank - workers
        itemsize = torch.empty(0, dtype=dtype).element_size()
        self.buckets = len(numels)
        self.units = [Unit(0, b, lo, hi, workers) for b, numel in enumerate(numels)
                      for lo, hi in unit_bounds(numel, servers, itemsize, partition_mb)[server]]
        for i, unit in enumerate(self.units):
            unit.index = i
        self.cond = comm.concurrency.condition()  # threads, or a simulated rank's actors (transport/concurrency.py)
        self.records: list[PushRecord] = []

    def run(self, steps: int, before=None) -> list[PushRecord]:
        """Serve `steps` pushes of every unit from every worker. `before()`: run on this thread once the workers'
        loops are up (the control-plane size checks, which the workers make bucket by bucket between pushes).

        A loop per worker, each on a thread of its own (OS threads, or a simulated rank's actors), or, where the
        communicator can wait for whichever of several receives ends first (`receives_any`: a simulated rank,
        whose every actor is an OS thread), every worker's loop interleaved on this one (`_run_interleaved`).
        There `before()` runs first when there is one bucket; with several, on an actor of its own beside the
        loop (one more per server, until the checks are done): a worker checks bucket b + 1's size only once
        bucket b's replies are in, which the loop sends (run first, the checks waited for a worker waiting for
        them: a deadlock)."""
        errors: list[BaseException] = []
        if getattr(self.comm, "receives_any", False):
            checks = None
            if before is not None and self.buckets <= 1:
                before()
            elif before is not None:
                def check():
                    try:
                        before()
                    except BaseException as e:  # noqa: BLE001 - re-raised below on the server's actor
                        errors.append(e)

                checks = self.comm.concurrency.start(check, f"server{self.comm.rank}-checks")
            self._run_interleaved(steps)
            if checks is not None:
                checks.join()
            if errors:
                raise errors[0]
            return sorted(self.records, key=lambda r: (r.step, r.worker, r.unit))

        def serve(worker):
            try:
                self._serve_worker(worker, steps)
            except BaseException as e:  # noqa: BLE001 - re-raised below on the server's thread
                errors.append(e)
                with self.cond:
                    self.cond.notify_all()

        # one loop per worker: OS threads, or a simulated rank's actors on its simulated clock
        threads = [self.comm.concurrency.start(functools.partial(serve, w), f"server{self.comm.rank}-worker{w}")
                   for w in range(self.workers)]
        if before is not None:
            before()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return sorted(self.records, key=lambda r: (r.step, r.worker, r.unit))

    def _serve_worker(self, worker: int, steps: int) -> None:
        largest = max((u.hi - u.lo for u in self.units), default=0)
        incoming = torch.empty(largest, dtype=self.dtype, device=self.device)
        for step in range(steps):
            replies = []
            for unit in self.units:
                gradient = incoming[:unit.hi - unit.lo]
                self.comm.recv(gradient, worker)
                arrived = self.comm.concurrency.clock()
                with self.cond:
                    held = self._accept(unit, worker, step, gradient, arrived)
                    if not self.cond.wait_for(held.ready, timeout=self.comm.timeout):
                        raise TimeoutError(held.timeout_message(self.comm.timeout))
                    reply = held.answer()
                replies.append(self.comm.isend(reply, worker))  # while the next unit's push comes in
            for sent in replies:
                sent.wait()

    def _run_interleaved(self, steps: int) -> None:
        """Every worker's loop of _serve_worker on this one thread, step for step: each worker's next push is
        received (posted) once its previous reply has left, a push is handled when it arrives, a reply held at
        the bound or for a step's backups leaves as soon as a later push lets it. The simulated clock makes the
        interleaving exact: nothing here takes simulated time but the waits."""
        if steps == 0 or not self.units:
            return
        largest = max(u.hi - u.lo for u in self.units)
        incoming = [torch.empty(largest, dtype=self.dtype, device=self.device) for _ in range(self.workers)]
        position = [0] * self.workers  # worker w's next push: step position // units, unit position % units
        last = steps * len(self.units)
        sends = []

        def post(worker):
            unit = self.units[position[worker] % len(self.units)]
            return self.comm.irecv_any(incoming[worker][:unit.hi - unit.lo], worker)

        receiving = {w: post(w) for w in range(self.workers)}  # worker -> its posted receive
        held: dict[int, dict[int, Held]] = {}  # unit -> worker -> its reply waiting for the bound or the backups

        def answer(worker, waiting):
            sends.append(self.comm.isend(waiting.answer(), worker))
            position[worker] += 1
            if position[worker] < last:
                receiving[worker] = post(worker)

        while receiving or any(held.values()):
            if not receiving:
                stuck = {w: h.timeout_message(0.0) for waiting in held.values() for w, h in waiting.items()}
                raise RuntimeError(f"rank {self.comm.rank}: every worker's reply is held and no push can free one: "
                                   f"{stuck}")
            workers = list(receiving)
            # every push that has arrived, in arrival order (one wait for all that arrived together)
            for worker in [workers[i] for i in self.comm.wait_any([receiving[w] for w in workers])]:
                del receiving[worker]
                unit = self.units[position[worker] % len(self.units)]
                progress = (unit.version, unit.clock.lowest)
                waiting = self._accept(unit, worker, position[worker] // len(self.units),
                                       incoming[worker][:unit.hi - unit.lo], self.comm.concurrency.clock())
                if waiting.ready():
                    answer(worker, waiting)
                else:
                    held.setdefault(unit.index, {})[worker] = waiting
                if (unit.version, unit.clock.lowest) != progress:  # only then can a held reply of this unit leave
                    parked = held.get(unit.index, {})
                    for other in [w for w, h in parked.items() if h.ready()]:  # in the order they were held
                        answer(other, parked.pop(other))
        for sent in sends:
            sent.wait()

    def _accept(self, unit: Unit, worker: int, step: int, gradient: torch.Tensor, arrived: float) -> Held:
        """A push (in hand since `arrived`), under the lock: handled as its mode says; the reply may have to wait
        (Held.ready)."""
        return (self._backup_push if self.staleness == 0 else self._stale_push)(unit, worker, step, gradient,
                                                                                arrived)

    # -- stale-synchronous and asynchronous ------------------------------------------------------------

    def _stale_push(self, unit: Unit, worker: int, step: int, gradient: torch.Tensor, arrived: float) -> Held:
        """SSP / async, under the lock: handle the push at once; the reply waits at the bound."""
        begin = self.comm.concurrency.clock()
        staleness = unit.version - unit.read[worker]
        # a new tensor (`gradient` is the worker's receive buffer); the same bits as gradient / n. Meta tensors
        # (the simulator's) have a shape and no values: nothing to divide, and torch's meta ops cost 50-650 us
        # each, 7 s of a 1,024 x 128 simulation (as strategies/ops.py reduce_into skips them)
        scaled = gradient.clone()
        if not scaled.is_meta:
            scaled.div_(self.workers)
        if self.mode == "update":
            unit.params = self.update(unit.bucket, scaled, unit.where).detach().clone()
        else:
            unit.log.append(scaled)
        unit.version += 1
        unit.clock[worker] += 1
        self.cond.notify_all()
        start = self.comm.concurrency.clock()
        # the pusher now starts step c = clock; it may while the slowest worker has reached c - s
        bound = unit.clock[worker] - self.staleness if self.staleness != ASYNC else None

        def ready():
            return bound is None or unit.clock.lowest >= bound

        def answer():
            now = self.comm.concurrency.clock()
            self.records.append(PushRecord(step, worker, staleness, now - start, False,
                                           unit.clock[worker] - unit.clock.lowest, unit.index, unit.hi - unit.lo,
                                           arrived, begin, start, now))
            if self.mode == "update":
                reply = unit.params.clone()
            else:  # the pushes since this worker's previous reply, in arrival order (its own included)
                since = unit.log[unit.read[worker] - unit.base:unit.version - unit.base]
                reply = since[0].clone()
                if not reply.is_meta:  # meta tensors (the simulator's) have no values to add, only the shape
                    for push in since[1:]:
                        reply.add_(push)
            unit.read[worker] = unit.version
            oldest = unit.read.lowest  # pushes every worker has been sent are dropped from the log
            del unit.log[:oldest - unit.base]
            unit.base = max(unit.base, oldest)
            return reply

        def timeout_message(timeout):
            return (f"rank {self.comm.rank}: worker {worker} waited {timeout:g} s at the staleness bound (clocks "
                    f"{unit.clock}, s = {self.staleness})")

        return Held(ready, answer, timeout_message)

    # -- backup workers --------------------------------------------------------------------------------

    def _backup_push(self, unit: Unit, worker: int, step: int, gradient: torch.Tensor, arrived: float) -> Held:
        """Backups, under the lock: the first n - b pushes of a step make it; a later one is dropped. The reply
        waits until the step is made."""
        begin = self.comm.concurrency.clock()
        unit.clock[worker] += 1
        late = step in unit.made  # the step was made without this push
        if not late:
            pushed = unit.pending.setdefault(step, {})
            pushed[worker] = gradient.clone()
            if len(pushed) == self.workers - self.backups:
                rows = [pushed[w] for w in sorted(pushed)]  # worker-rank order: the same bits whoever came first
                mean = rows[0].clone()
                if not mean.is_meta:  # meta (the simulator's): the shape is the mean's, no values to add
                    for row in rows[1:]:
                        mean.add_(row)
                    mean = mean / len(rows)
                unit.made[step] = (self.update(unit.bucket, mean, unit.where).detach().clone()
                                   if self.mode == "update" else mean)
                unit.version += 1
                del unit.pending[step]
                self.cond.notify_all()
        handled = self.comm.concurrency.clock()

        def ready():
            return step in unit.made

        def answer():
            self.records.append(PushRecord(step, worker, 0, 0.0, late, 0, unit.index, unit.hi - unit.lo,
                                           arrived, begin, handled, self.comm.concurrency.clock()))
            if late:
                made = unit.made[max(unit.made)] if self.mode == "update" else unit.made[step]
                reply = made.clone()
            else:
                reply = unit.made[step].clone()
            unit.read[worker] = step + 1  # replies this worker got
            # a step every worker has been answered for is never asked for again (update mode keeps the newest)
            for old in [t for t in unit.made if t < unit.read.lowest and t != max(unit.made)]:
                del unit.made[old]
            return reply

        def timeout_message(timeout):
            return f"rank {self.comm.rank}: step {step} never got {self.workers - self.backups} pushes"

        return Held(ready, answer, timeout_message)


@dataclass(frozen=True)
class Held:
    """A handled push's reply: it may leave once ready(); answer() records the push and makes the reply (both
    under the server's lock); timeout_message(seconds) says what it waited for."""

    ready: Callable[[], bool]
    answer: Callable[[], torch.Tensor]
    timeout_message: Callable[[float], str]

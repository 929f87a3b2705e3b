"""Parameter server, BytePS-style push/pull: k servers own shards, workers push partitions and pull results.

Layout. The buffer is cut into k balanced shards, one per server, and every shard into partitions of at most
`partition_mb` MiB (balanced too). Server s lives on its own rank n + s (`placement = "dedicated"`: its own NIC)
or on worker rank s (`"colocated"`: it shares that worker's NIC, and the local push and pull cost no bytes).

On the wire, in this order:
  1. every worker posts all its pushes at once; in round r it pushes partition r of every shard, visiting the
     servers from s = rank mod k on, so that in each slot the workers push to different servers;
  2. server s takes partition r from every worker (waiting in the order they arrive: worker w's push reaches
     it in slot (s - w) mod k), reduces it in worker-rank order (every worker then gets the same bits), and
     answers at once: the sum or mean (`mode = "summation"`, the workers run the optimizer) or, in training,
     the parameters the server's optimizer made of it (`mode = "update"`);
  3. every worker takes its replies, round by round.
A worker's NIC sends pushes and receives replies of earlier partitions at the same time (full duplex), so with
k = n dedicated servers a step costs about M/B plus one partition's fan-out (BytePS's optimum, 2 - 2/n times
faster than a ring); a server's link carries n/k times a worker's bytes.

Across buckets (dedicated, synchronous): `isync()` posts a bucket's pushes and its replies' receives and returns;
experiments/pipeline/bucket_sync.py starts the next bucket without waiting for this one's replies and waits them
all, in bucket order, once every bucket is started. Servers serve the buckets in bucket order (serve_steps), so
from each server replies come back in the order their receives were posted; the fan-out of one partition is paid
once per step, not once per bucket.

Without a global barrier (`staleness` s or "async", `backups` b; dedicated servers, either mode, any buckets
and partitions, with or without overlap) a server serves each worker from a thread of its own and handles each
push as it arrives; in summation mode it sums what arrived since the worker's previous reply and the workers'
optimizers apply it: strategies/parameter_server_async.py defines every case. Colocated servers need a global
barrier: a colocated rank would receive a peer's pushes and that peer's server's replies, in an order nothing
fixes, on one channel the transports match by sender only (no tags), so they are refused.

Receives from one peer are waited for in the order that peer sent them (the thread transport matches a message
at wait time), which is why a colocated rank first serves all its partitions and then takes its replies.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from strategies.base import (
    GRADIENTS,
    MAX_MESSAGES,
    SERVER,
    Pending,
    RankTraffic,
    Strategy,
    StrategyConfig,
    Traffic,
)
from strategies.ops import check_op, finish_reduction, prescale, reduce_into, wire_dtype, wire_form
from strategies.parameter_server_async import ShardServer, push_pull
from strategies.partitions import check_partition_mb, least_partition_mb, partition_count, partitions
from strategies.primitives import Scratch
from strategies.transport.communicator import DONE

PLACEMENTS = ("dedicated", "colocated")
MODES = ("summation", "update")
ASYNC = "async"
MAX_STALENESS = 1_000_000  # the most steps a run has: a larger bound is never reached (use "async")


def push_order(rank: int, parts: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """(server, round) in the order worker `rank` pushes: round by round, servers from rank mod k on."""
    k = len(parts)
    rounds = max((len(p) for p in parts), default=0)
    return [(s, r) for r in range(rounds) for s in ((rank + i) % k for i in range(k)) if r < len(parts[s])]


class ParameterServer(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.servers = config.servers
        self.colocated = config.placement == "colocated"
        hosted = [s for s in range(self.servers) if self.host(s) == self.rank]
        self.server = hosted[0] if hosted else None  # the server this rank runs (colocated: at most one)
        # update mode, colocated: the optimizer hook of this rank's server (the pipeline sets it; None: reply the sum)
        self.update = None
        self.scratch = Scratch()

    def host(self, server: int) -> int:
        return server if self.colocated else self.workers + server

    # -- worker ranks (colocated: worker and server) -----------------------------------------------------

    @property
    def pipelines(self) -> bool:
        """isync() keeps this sync in flight with the next ones: synchronous (staleness 0, no backups), dedicated."""
        return not self.colocated and not self.config.asynchronous

    def isync(self, tensor, op="mean"):
        """Dedicated, synchronous: post every push and every reply's receive now; the Pending waits for them.
        Several buckets' syncs are then in flight together: a bucket's pushes leave while earlier buckets' replies
        are on their way. The servers serve buckets in bucket order (serve_steps), each one's partitions round by
        round, so from each server the replies arrive in the order this rank posted their receives. Colocated
        and barrier-free servers: sync() now (the base class)."""
        if not self.pipelines:
            return super().isync(tensor, op)
        flat = self._flat_to_sync(tensor, op, "isync")  # sync()'s checks (strategies/base.py)
        if flat is None:
            return DONE
        form = contextlib.ExitStack()  # the wire form lasts until the replies are in (sync() holds it as long)
        try:
            wire = form.enter_context(wire_form(flat, op))
            prescale(wire, op, self.workers)
            pushes, replies = self._post(wire)
        except BaseException:
            form.close()
            raise

        def finish():
            try:
                for handle in replies + pushes:
                    handle.wait()
            finally:
                form.close()

        return Pending(pushes, finish)

    def _post(self, flat) -> tuple[list, list]:
        """Dedicated servers: every push posted at once (the transmit side streams them back to back), then every
        reply's receive, round by round; a server answers worker w in slot (w - s) mod n of its fan-out."""
        parts = partitions(flat.numel(), self.servers, flat.element_size(), self.config.partition_mb)
        pushes = [self.comm.isend(flat[slice(*parts[s][r])], self.host(s)) for s, r in push_order(self.rank, parts)]
        rounds = max((len(p) for p in parts), default=0)
        fan_out = sorted(range(self.servers), key=lambda s: ((self.rank - s) % self.workers, s))
        replies = [self.comm.irecv(flat[slice(*parts[s][r])], self.host(s))
                   for r in range(rounds) for s in fan_out if r < len(parts[s])]
        return pushes, replies

    def _sync(self, flat, op):
        if self.config.asynchronous:  # SSP, async or backups: partitions pushed and pulled, no global barrier
            if op != "mean":
                raise ValueError(f"parameter_server with staleness={self.config.staleness!r}, backups="
                                 f"{self.config.backups}: op={op!r} is not accepted: its servers scale each push "
                                 f"by 1/workers (accepted: 'mean')")
            push_pull(self.comm, flat, self.workers, self.servers, self.config.partition_mb)
            return
        if not self.colocated:  # dedicated: isync()'s posts, waited at once
            pushes, replies = self._post(flat)
            for handle in replies + pushes:
                handle.wait()
            return
        parts = partitions(flat.numel(), self.servers, flat.element_size(), self.config.partition_mb)
        order = push_order(self.rank, parts)
        # 1. every push at once: the transmit side streams them back to back
        pushes = [self.comm.isend(flat[slice(*parts[s][r])], self.host(s)) for s, r in order
                  if self.host(s) != self.rank]
        # 2. colocated: this rank's server takes every partition of its shard, reduces and answers it
        replies = []
        if self.server is not None:
            replies = self._serve_shard(flat, parts[self.server], op, local=flat, update=self.update)
        # 3. the replies, round by round; a server answers worker w in slot (w - s) mod n of its fan-out
        rounds = max((len(p) for p in parts), default=0)
        for r in range(rounds):
            for s in sorted(range(self.servers), key=lambda s: ((self.rank - s) % self.workers, s)):
                if r < len(parts[s]) and self.host(s) != self.rank:
                    self.comm.recv(flat[slice(*parts[s][r])], self.host(s))
        for handle in pushes + replies:
            handle.wait()

    # -- server ranks ----------------------------------------------------------------------------------

    def serve_run(self, steps, numels, dtype, update=None, device="cpu", checked=False):
        """Without a barrier (staleness s, "async" or backups): serve every worker for the whole run, each from a
        thread of its own, every bucket of `numels` (an int: one bucket); returns the PushRecords
        (strategies/parameter_server_async.py). `update(bucket, gradient, where)`: update mode's optimizer.
        The buckets' sizes are checked on the control plane as the workers' first syncs check them, unless
        `checked` (the caller's runtimes checked them all before)."""
        numels = [numels] if isinstance(numels, int) else list(numels)
        if self.config.mode == "update" and update is None:
            raise ValueError("parameter_server in update mode: serve_run needs update(bucket, gradient, where)")
        server = ShardServer(self.comm, self.workers, self.servers, numels, wire_dtype(dtype), update,
                             self.config.staleness, self.config.backups, device, self.config.mode,
                             self.config.partition_mb)

        def check_sizes():  # as the workers' buckets check theirs at their first sync(), in bucket order
            if checked:
                return
            self._check_size(numels[0], dtype.itemsize)
            for numel in numels[1:]:
                self.comm.check_same_numel(numel)

        return server.run(steps, before=check_sizes)

    def serve(self, numel, dtype, op="mean", update=None, device="cpu"):
        """Dedicated server: take every partition of this server's shard from every worker, reduce it, answer it."""
        if self.config.asynchronous:
            raise RuntimeError(f"parameter_server with staleness={self.config.staleness!r}, "
                               f"backups={self.config.backups}: servers run serve_run(steps, ...), not serve()")
        check_op(op, dtype, self.config.ops)
        self._check_size(numel, dtype.itemsize)
        dtype = wire_dtype(dtype)  # as the workers send it (see Strategy.sync)
        like = torch.empty(0, dtype=dtype, device=device)
        parts = partitions(numel, self.servers, like.element_size(), self.config.partition_mb)
        for handle in self._serve_shard(like, parts[self.server], op, local=None, update=update):
            handle.wait()

    def _serve_shard(self, like, parts, op, local, update):
        """Receive, reduce and answer each partition of this server's shard as soon as every worker's is in.
        `local`: the colocated worker's own buffer (its contribution moves no bytes); returns the reply sends."""
        n, s = self.workers, self.server
        if self.config.mode == "summation":
            update = None  # servers only sum: the workers' optimizers apply the result
        peers = [w for w in range(n) if w != self.rank]
        slot = max((hi - lo for lo, hi in parts), default=0)
        incoming = self.scratch.get(len(parts) * n * slot, like).view(len(parts), n, slot) if slot else None
        # every receive posted up front, each into its own slot: pushes of later rounds land while we reduce
        pending = {(r, w): self.comm.irecv(incoming[r, w, :hi - lo], w)
                   for r, (lo, hi) in enumerate(parts) for w in peers}
        arrival = sorted(peers, key=lambda w: ((s - w) % self.servers, w))  # worker w pushes to s in slot (s-w) mod k
        fan_out = sorted(peers, key=lambda w: ((w - s) % n, w))
        replies = []
        for r, (lo, hi) in enumerate(parts):
            for w in arrival:
                pending[r, w].wait()
            rows = [local[lo:hi] if w == self.rank else incoming[r, w, :hi - lo] for w in range(n)]
            # summed into worker 0's receive slot (this step's scratch): no copy; the colocated worker's own
            # buffer is cloned instead (it receives the result)
            reduced = rows[0].clone() if self.rank == 0 and local is not None else rows[0]
            for row in rows[1:]:  # worker-rank order: the same bits whichever push came first
                reduce_into(reduced, row, op)
            finish_reduction(reduced, op, n)
            result = reduced if update is None else update(reduced, slice(lo, hi))
            if result.numel() != hi - lo:
                raise ValueError(f"parameter_server: update() returned {result.numel()} elements for shard "
                                 f"partition [{lo}, {hi}): it must return exactly {hi - lo}")
            result = result.reshape(-1).to(reduced.dtype)
            if local is not None:
                local[lo:hi].copy_(result)
                result = local[lo:hi]  # the other workers get exactly these bits
            replies += [self.comm.isend(result, w) for w in fan_out]
        return replies


@dataclass(frozen=True)
class ParameterServerConfig(StrategyConfig):
    name = "parameter_server"
    summary = ("k servers own shards; workers push partitions, servers reduce (and update) and answer each at once; "
               "dedicated or colocated")
    role = SERVER  # in "update" mode; "summation" hands the optimizer back to the workers (GRADIENTS), see below
    runtime = ParameterServer
    variants = ({"servers": 1}, {"servers": 2}, {"servers": 3},
                {"servers": 1, "placement": "colocated", "mode": "summation", "partition_mb": 1e-4},
                {"servers": 3, "mode": "summation", "partition_mb": 3e-4})
    servers: int = 1
    placement: str = "dedicated"
    mode: str = "update"
    partition_mb: float = 4.0
    staleness: int | str = 0
    backups: int = 0

    def validate(self):
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ValueError(f"parameter_server: servers={self.servers!r} is not accepted: "
                             f"use an integer >= 1")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"parameter_server: placement={self.placement!r} is not accepted: use one of "
                             f"{', '.join(map(repr, PLACEMENTS))}")
        if self.mode not in MODES:
            raise ValueError(f"parameter_server: mode={self.mode!r} is not accepted: use one of "
                             f"{', '.join(map(repr, MODES))}")
        check_partition_mb(f"parameter_server: partition_mb={self.partition_mb!r} is not accepted", self.partition_mb)
        if self.staleness != ASYNC and (isinstance(self.staleness, bool) or not isinstance(self.staleness, int)
                                        or not 0 <= self.staleness <= MAX_STALENESS):
            raise ValueError(f"parameter_server: staleness={self.staleness!r} is not accepted: use 0 (synchronous), "
                             f"an integer s from 1 to {MAX_STALENESS:,} (stale-synchronous; a run has at most that "
                             f"many steps) or {ASYNC!r}")
        if isinstance(self.backups, bool) or not isinstance(self.backups, int) or self.backups < 0:
            raise ValueError(f"parameter_server: backups={self.backups!r} is not accepted: use an integer >= 0, "
                             f"less than the number of workers")
        if self.backups and self.staleness != 0:
            raise ValueError(f"parameter_server: backups={self.backups} needs staleness=0 (backup workers are a "
                             f"synchronous scheme), got staleness={self.staleness!r}")
        if self.asynchronous and self.placement != "dedicated":
            raise ValueError(f"parameter_server: staleness={self.staleness!r}, backups={self.backups} need "
                             f"placement='dedicated', got placement={self.placement!r}: a colocated rank would "
                             f"take its peers' pushes and their servers' replies on one channel per pair of "
                             f"ranks in an order no barrier fixes (the transports match by sender, no tags); "
                             f"accepted: placement='dedicated' with staleness/backups, or 'colocated' with "
                             f"staleness=0, backups=0")
        # the role follows the mode: summation servers return gradients, update servers return parameters
        object.__setattr__(self, "role", SERVER if self.mode == "update" else GRADIENTS)

    @property
    def asynchronous(self) -> bool:
        """Servers without a global barrier: stale-synchronous, asynchronous, or synchronous with backups."""
        return self.staleness != 0 or self.backups > 0

    def messages(self, workers, numel, itemsize=4):
        """Every partition pushed and answered once."""
        return 2 * partition_count(numel, self.servers, itemsize, self.partition_mb)

    def fewer_messages(self, workers, numel, itemsize=4):
        return least_partition_mb(numel, self.servers, itemsize, MAX_MESSAGES // 2)

    def check_workers(self, workers: int) -> None:
        """What depends on the number of workers: colocated servers need as many workers, backups fewer."""
        if self.placement == "colocated" and self.servers > workers:
            raise ValueError(f"parameter_server: servers={self.servers} with placement='colocated' needs at least "
                             f"{self.servers} workers (server s runs beside worker s), got workers={workers}: use "
                             f"servers <= {workers} or placement='dedicated'")
        if self.backups and self.backups >= workers:
            raise ValueError(f"parameter_server: backups={self.backups} is not accepted with workers={workers}: "
                             f"use 0 <= backups < {workers} (a step aggregates the first workers - backups pushes)")

    def num_servers(self, workers):
        self.check_workers(workers)
        return 0 if self.placement == "colocated" else self.servers

    def pipeline_fill(self, workers, numel, itemsize=4) -> tuple[int, int]:
        """(rounds, bytes) of traffic()'s critical path that the next bucket's sync overlaps (strategies.cost's
        overlap timeline): dedicated, synchronous servers keep buckets in flight together (isync), so a bucket's
        last fan-out (n messages of its largest partition) runs under the next bucket's pushes; others: (0, 0)."""
        if self.placement != "dedicated" or self.asynchronous:
            return 0, 0
        parts = partitions(numel, self.servers, itemsize, self.partition_mb)
        largest = max((hi - lo for p in parts for lo, hi in p), default=0) * itemsize
        # the n replies leave at once, each on its own connection: one latency, n partitions through the NIC
        return (1, workers * largest) if largest else (0, 0)

    def server_updates(self, workers, numel, itemsize=4) -> list[int]:
        """The elements of each partition the busiest server applies the optimizer to, in the order it does (one
        after another, each once every worker's push of it is in; strategies.cost prices that compute beside the
        bytes): synchronous dedicated servers in update mode; [] for any other (the workers step)."""
        if self.mode != "update" or self.placement != "dedicated" or self.asynchronous:
            return []
        parts = partitions(numel, self.servers, itemsize, self.partition_mb)
        return [hi - lo for lo, hi in max(parts, key=lambda p: sum(hi - lo for lo, hi in p), default=[])]

    def push_updates(self, workers, numel, itemsize=4) -> list[int]:
        """The elements of each partition of the busiest server's shard, in the order its pushes come in, where a
        barrier-free server (staleness s or "async") in update mode applies the optimizer to every worker's push on
        its own (n updates a partition, one after another) and answers each push once its update is done
        (strategies.cost.barrier_free_update_seconds prices it); [] for any other: synchronous servers
        (server_updates), backups (one update a step), summation (the workers step)."""
        if self.mode != "update" or self.staleness == 0 or self.backups or self.placement != "dedicated":
            return []
        parts = partitions(numel, self.servers, itemsize, self.partition_mb)
        return [hi - lo for lo, hi in max(parts, key=lambda p: sum(hi - lo for lo, hi in p), default=[])]

    def traffic(self, workers, numel, itemsize=4):
        n, k = workers, self.servers
        self.check_workers(n)
        parts = partitions(numel, k, itemsize, self.partition_mb)
        shard = [sum(hi - lo for lo, hi in p) * itemsize for p in parts]
        count = [len(p) for p in parts]
        largest = max((hi - lo for p in parts for lo, hi in p), default=0) * itemsize
        if self.placement == "dedicated":
            # a worker pushes every partition and pulls it back; server s takes and answers n copies of its shard
            worker = RankTraffic("worker", sum(shard), sum(shard), sum(count), sum(count))
            servers = tuple(RankTraffic("server", n * b, n * b, n * c, n * c) for b, c in zip(shard, count))
            # Full duplex: the busiest link (a worker's M or a server's n M / k) streams without a break, except
            # the fill: the last partition's n-fold fan-out waits for its last push.
            # Latencies: messages to different peers travel side by side, so their latencies overlap; those to one
            # peer follow one another on its connection (one TCP socket, one gloo pair), a latency each. Worker
            # w's c_s pushes to server s are such a chain; the last partition's replies leave after it, at once:
            # max c_s + 1 (SimGrid alpha_beta: exactly that many latencies over the bytes, k = 1 .. n).
            worker_path, server_path = sum(shard), n * max(shard)
            return Traffic((worker,) * n + servers, rounds=max(count) + 1 if largest else 0,
                           path_bytes=max(worker_path, server_path) + n * largest)
        # colocated: worker w (w < k) also runs server w; its own push and pull of shard w move no bytes
        ranks, paths = [], []
        total_b, total_c = sum(shard), sum(count)  # once: inside the loop they made it O(n k)
        for w in range(n):
            own_b, own_c = (shard[w], count[w]) if w < k else (0, 0)
            pushed_b, pushed_c = total_b - own_b, total_c - own_c
            sent_b, sent_c = pushed_b + (n - 1) * own_b, pushed_c + (n - 1) * own_c
            ranks.append(RankTraffic("worker", sent_b, sent_b, sent_c, sent_c))
            # transmit side: pushes first, then the replies, which wait for the first partition from n - 1 peers
            gap = max(0, (n - 1) * largest - pushed_b) if own_b else 0
            paths.append((sent_b + gap, sent_c))
        path_bytes = max(paths)[0]
        return Traffic(tuple(ranks), rounds=_colocated_rounds(count, n), path_bytes=path_bytes)


def _colocated_rounds(count: list[int], workers: int) -> int:
    """Latencies on the colocated servers' critical path: messages to one peer follow one another on its connection
    (a latency each), messages to different peers travel side by side. Server s (on worker s) sends worker w, on
    one connection, first its pushes of shard w (c_w partitions, w a server too) and then its c_s replies, the
    last of which leaves once the last pushes into s are in (a chain of c_s): c_s + max(c_w, 1) over the pairs
    (SimGrid alpha_beta: exactly that many latencies over the bytes, k = 1 .. n)."""
    if workers <= 1 or not any(count):
        return 0
    top, second = sorted(count, reverse=True)[:2] if len(count) > 1 else (count[0], 0)
    # the longest chain of pushes into s's pair from another server: the largest count but s's own (O(k))
    return max(c + max(second if c == top else top, 1) for c in count if c)

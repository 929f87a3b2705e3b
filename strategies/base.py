"""The plug-in API: a strategy's settings, its runtime bound to a Communicator, and its analytic traffic.

A strategy is two classes, as Bagua's Algorithm/AlgorithmImpl:
- `StrategyConfig`: a small picklable dataclass of settings the driver sends to every actor. It knows the
  strategy's role in training, how many server ranks it needs, and its analytic traffic.
- `Strategy`: the runtime, made by `config.bind(comm, workers)` on every rank. Worker ranks call
  `sync(tensor, op)`, or `isync(tensor, op)` and later the handle's wait() (several syncs in flight at once, for
  a strategy that can pipeline them); server ranks (parameter server only) call `serve(...)`.

Ranks 0..workers-1 are workers; ranks workers..world_size-1 are the strategy's servers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from strategies.ops import OPS, check_op, finish_reduction, prescale, wire_form
from strategies.transport.communicator import DONE, Communicator, Handle

# What a strategy synchronizes in training.
GRADIENTS = "gradients"    # allreduce family: average one flat gradient buffer, then a local optimizer step
PARAMETERS = "parameters"  # decentralized: local step, then average parameters with neighbours
SERVER = "server"          # parameter server: servers own parameters and optimizer; workers get parameters back
ROLES = (GRADIENTS, PARAMETERS, SERVER)

# The most messages one worker may send and receive in one synchronization. Settings that cut a message small
# (partition_mb, chunks, pipeline_mb) are bounded by it, for the array they will cut: every message costs memory to
# plan and a latency to send, and 25 million partitions of ResNet-50 (partition_mb = 1e-9) took 7 GB and minutes.
MAX_MESSAGES = 100_000


@dataclass(frozen=True)
class RankTraffic:
    """What one rank sends and receives in one collective call (payload bytes and non-empty messages)."""

    role: str  # "worker" or "server"
    bytes_sent: int
    bytes_recv: int
    msgs_sent: int
    msgs_recv: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Traffic:
    """A strategy's analytic cost for n workers and one message of numel elements.

    ranks:      per rank (workers first, then servers): exact bytes and messages, uneven chunks included.
    rounds:     message latencies on the critical path (the alpha term).
    path_bytes: bytes serialized on the critical path through the busiest NIC (the beta term), for a
                homogeneous network where a NIC sends and receives at the same time.
    counted:    False when the bytes move inside the backend (native) and the communicator cannot see them.
    """

    ranks: tuple[RankTraffic, ...]
    rounds: int
    path_bytes: int
    counted: bool = True

    def workers(self) -> list[RankTraffic]:
        return [r for r in self.ranks if r.role == "worker"]

    def servers(self) -> list[RankTraffic]:
        return [r for r in self.ranks if r.role == "server"]

    @property
    def worker_bytes_sent(self) -> int:
        return max((r.bytes_sent for r in self.workers()), default=0)


def uniform_traffic(workers: int, sent: int, recv: int, msgs_sent: int, msgs_recv: int, rounds: int,
                    path_bytes: int) -> Traffic:
    """Traffic of a symmetric algorithm where every worker does the same."""
    rank = RankTraffic("worker", sent, recv, msgs_sent, msgs_recv)
    return Traffic(tuple(rank for _ in range(workers)), rounds, path_bytes)


@dataclass(frozen=True)
class StrategyConfig:
    """Settings of one strategy. Subclasses add dataclass fields for their parameters.

    The plug-in contract: what a strategy declares, checked at registration (strategies/registry.py), and
    all the generic tests, `verify`, training and the report need to know about it:
      name, summary   an identifier and one line for `syncbench strategies`
      role            GRADIENTS, PARAMETERS or SERVER: what it synchronizes in training
      runtime         the Strategy subclass bound on every rank
      traffic()       its analytic bytes, messages and rounds (measured counters must equal them)
      ops             the reduction ops it supports
      exact           True: an exact allreduce; False: a neighbour average with mixing_matrix/spectral_gap
      identical       every worker rank ends with the same bits (required of an exact strategy)
      counted         the Communicator sees its bytes (False: they move inside a backend, like native)
      variants        parameter settings the generic tests cover (each a dict of this class's fields)
      wraps_model     training wraps the model (wrap(), e.g. DistributedDataParallel) instead of calling
                      sync() on gradient buckets; it then needs ranks joined by torch.distributed
      step_dependent  its traffic changes from step to step (step_traffic(): compression's warm-up, local SGD's
                      steps between syncs); the run's bytes are then checked step by step
      sends_while_receiving  a rank's sends and receives overlap in time (False: phases one way, then the
                      other, as reduce then broadcast); the tcp price loads a NIC with its incoming flows' ACKs
                      only when they overlap

    The members the pipeline and the cost model call, each with a default that does nothing special (override
    what applies; the pipeline never probes a strategy for a member this class does not declare):
      asynchronous    servers without a global barrier (a parameter server's staleness or backups)
      step_traffic()  the traffic of one given step (default: traffic())
      pipeline_fill() the part of a sync's critical path the next bucket's sync overlaps (default: none)
      unwrapped()     the registered strategy under a wrapper (compression, local SGD); itself by default
    The runtime's (Strategy) are listed in its docstring.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    role: ClassVar[str] = GRADIENTS
    ops: ClassVar[tuple[str, ...]] = OPS
    exact: ClassVar[bool] = True
    identical: ClassVar[bool] = True
    counted: ClassVar[bool] = True
    variants: ClassVar[tuple[dict, ...]] = ({},)
    wraps_model: ClassVar[bool] = False
    step_dependent: ClassVar[bool] = False
    sends_while_receiving: ClassVar[bool] = True
    runtime: ClassVar[type[Strategy]]

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming a bad parameter value and what is accepted."""

    def num_servers(self, workers: int) -> int:
        return 0

    def world_size(self, workers: int) -> int:
        return workers + self.num_servers(workers)

    def traffic(self, workers: int, numel: int, itemsize: int = 4) -> Traffic:
        raise NotImplementedError(f"strategy {self.name!r} does not state its analytic traffic")

    def step_traffic(self, workers: int, numel: int, itemsize: int = 4, step: int = 0,
                     shapes=None) -> Traffic:
        """Step `step`'s traffic for one buffer (`shapes`: the tensors it holds, where the bytes depend on them);
        a step_dependent strategy overrides it, any other moves traffic()'s bytes on every step."""
        return self.traffic(workers, numel, itemsize)

    @property
    def asynchronous(self) -> bool:
        """True for servers without a global barrier (stale-synchronous, asynchronous, backup workers): the
        workers do not step together, and a server rank serves the whole run at once (serve_run)."""
        return False

    def pipeline_fill(self, workers: int, numel: int, itemsize: int = 4) -> tuple[int, int]:
        """(rounds, bytes) of traffic()'s critical path that the next bucket's sync overlaps, for a strategy that
        keeps syncs in flight together (isync); (0, 0) for one that syncs one bucket after another."""
        return 0, 0

    def unwrapped(self) -> StrategyConfig:
        """The registered strategy this config runs: itself, or the one a wrapper (compression, local SGD) holds."""
        return self

    def messages(self, workers: int, numel: int, itemsize: int = 4) -> int:
        """How many messages a worker sends and receives in one synchronization of numel elements, counted without
        planning them, where a setting decides it (partition_mb, chunks, pipeline_mb); 0 where only the number of
        ranks does (bounded by the sweep's rank limit)."""
        return 0

    def fewer_messages(self, workers: int, numel: int, itemsize: int = 4) -> str:
        """The setting and the values that keep messages() within MAX_MESSAGES for this array."""
        return ""

    def check_messages(self, workers: int, numel: int, itemsize: int = 4) -> None:
        """ValueError, before any work, when this array would be cut into more than MAX_MESSAGES messages per
        worker: naming the count, the array and the accepted range of the setting that decides it."""
        count = self.messages(workers, numel, itemsize)
        if count > MAX_MESSAGES:
            raise ValueError(f"{self.name} with {workers} workers cuts {numel * itemsize / 1e6:,.6g} MB into "
                             f"{count:,} messages per worker and synchronization: at most {MAX_MESSAGES:,} (each "
                             f"costs memory and a latency); accepted for this array: "
                             f"{self.fewer_messages(workers, numel, itemsize)}")

    def mixing_matrix(self, workers: int, round: int = 0) -> np.ndarray:
        """Inexact strategies: the doubly stochastic W of one round (x_i <- sum_j W_ij x_j)."""
        raise NotImplementedError(f"strategy {self.name!r} is exact: it has no mixing matrix")

    def spectral_gap(self, workers: int, round: int = 0) -> float:
        """Inexact strategies: 1 - |lambda_2(W)|; larger mixes faster, 0 never converges."""
        raise NotImplementedError(f"strategy {self.name!r} is exact: it has no spectral gap")

    def wrap(self, model, bucket_mb: float | None, device):
        """Strategies with wraps_model: the model wrapped so that its backward synchronizes gradients."""
        raise NotImplementedError(f"strategy {self.name!r} synchronizes through sync(), it does not wrap models")

    def bind(self, comm: Communicator, workers: int) -> Strategy:
        if comm.world_size != self.world_size(workers):
            raise ValueError(f"strategy {self.name!r} with {workers} workers needs world_size "
                             f"{self.world_size(workers)}, the communicator has {comm.world_size}")
        return self.runtime(self, comm, workers)

    @classmethod
    def parameters(cls) -> dict[str, object]:
        """Parameter name -> default, for `syncbench strategies` and sweep validation."""
        return {f.name: f.default for f in dataclasses.fields(cls)}


class Strategy:
    """The runtime of a strategy on one rank.

    The members the pipeline calls, in the order a run calls them (defaults that do nothing special; a runtime
    overrides what applies, and the pipeline probes for nothing else):
      start(params)        once before the first step, with the bucket's parameters (DiLoCo's first anchor)
      set_shapes(shapes)   once, the shapes of the tensors the bucket holds (PowerSGD: one matrix per tensor)
      size_checked(numel)  whether the first sync's size check for numel is done (buckets in flight wait for it)
      sync / isync         every step, worker ranks; serve (and serve_run without a barrier): server ranks
      phase_s              seconds this rank spent in each named phase, summed over syncs (hierarchical's
                           'intra' and 'nic'; empty where a strategy times no phases)
    """

    def __init__(self, config: StrategyConfig, comm: Communicator, workers: int):
        self.config = config
        self.comm = comm
        self.workers = workers
        self.rank = comm.rank
        self.is_server = comm.rank >= workers
        self.phase_s: dict[str, float] = {}
        self._checked_numel: int | None = None

    def start(self, params: torch.Tensor) -> None:
        """Before the first step: the parameters this bucket starts from (seeded, identical on every worker)."""

    def set_shapes(self, shapes) -> None:
        """The shapes of the tensors the synced buffer holds, in buffer order (training calls it once per bucket
        with its parameters' shapes); a strategy whose payload depends on them (PowerSGD) keeps them."""

    def size_checked(self, numel: int) -> bool:
        """Whether this runtime's size check (its first sync of numel elements, on every rank) is done."""
        return self._checked_numel == numel

    def sync(self, tensor: torch.Tensor, op: str = "mean") -> None:
        """Worker ranks: synchronize `tensor` in place (an allreduce, a neighbour average, a push-pull)."""
        flat = self._flat_to_sync(tensor, op, "sync")
        if flat is None:
            return
        with wire_form(flat, op) as wire:  # wide unsigned integers travel as their signed twin
            if self.config.exact:
                prescale(wire, op, self.workers)  # half-precision mean: scale before summing, never overflow
            self._sync(wire, op)

    def isync(self, tensor: torch.Tensor, op: str = "mean") -> Handle:
        """Worker ranks: start synchronizing `tensor` in place; the returned handle's wait() completes it. The
        tensor holds the result only then and must not be touched before. Several may be in flight on one rank
        (each through its own runtime, as BucketSync's buckets): the caller waits them in the order it started
        them, and every rank starts them in the same order. The default is sync() now and a done handle: a
        strategy that can keep syncs in flight together (the synchronous dedicated parameter server) overrides
        it; a handle that is not DONE may offer `wait_sent()` (see Pending)."""
        self.sync(tensor, op)
        return DONE

    def _flat_to_sync(self, tensor: torch.Tensor, op: str, call: str) -> torch.Tensor | None:
        """A worker's checks before a sync (`call`: the method's name, for the errors); the flat view to sync, or
        None when there is nothing to agree on (no elements, or one rank alone: the tensor is already the result)."""
        check_op(op, tensor.dtype, self.config.ops)
        if self.is_server:
            raise RuntimeError(f"rank {self.rank} is a server of {self.config.name!r}: call serve(), not {call}()")
        self._check_size(tensor.numel(), tensor.element_size())
        if not tensor.is_contiguous():
            raise ValueError(f"{call}() needs a contiguous tensor (flatten gradients into one buffer first)")
        flat = tensor.view(-1)
        if tensor.numel() == 0 or self.comm.world_size == 1:
            finish_reduction(flat, op, 1)
            return None
        return flat

    def serve(self, numel: int, dtype: torch.dtype, op: str = "mean",
              update: Callable[[torch.Tensor, slice], torch.Tensor] | None = None,
              device: torch.device | str = "cpu") -> None:
        """Server ranks: take part in one sync() of the workers (buffers on `device`). Servers only."""
        raise RuntimeError(f"strategy {self.config.name!r} has no server ranks")

    def _check_size(self, numel: int, itemsize: int = 4) -> None:
        # One control-plane size check on the first call (and whenever this rank's size changes):
        # ranks that disagree fail with a clear error instead of hanging or mixing wrong chunks.
        if self._checked_numel != numel:
            self.config.check_messages(self.workers, numel, itemsize)  # on every rank alike: none starts sending
            self.comm.check_same_numel(numel)
            self._checked_numel = numel

    def _sync(self, flat: torch.Tensor, op: str) -> None:
        raise NotImplementedError


class Pending(Handle):
    """A sync in flight (Strategy.isync): wait() completes it; wait_sent() waits for this rank's sends of it only,
    its receives staying posted. A transport that moves bytes only inside a wait (the sockets drive every transfer
    of the rank from the waiting thread) keeps moving through wait_sent() without waiting for any reply."""

    def __init__(self, sends: list[Handle], finish):
        super().__init__(finish)
        self._sends = sends

    def wait_sent(self) -> bool:
        """Wait for the sends not waited for yet; False if there were none."""
        sends, self._sends = self._sends, []
        for handle in sends:
            handle.wait()
        return bool(sends)


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split numel elements into `parts` contiguous chunks, balanced to within one element."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


def nonempty(*sizes: int) -> int:
    """How many of these message sizes are non-empty (empty messages are never sent)."""
    return sum(1 for s in sizes if s > 0)

"""What a simulated worker computes: its step's timeline (forward, each gradient's ready time, optimizer) spent
on the simulated clock through the step loop's Compute contract, and the optimizer time of colocated servers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from experiments.config.sweep import RunSpec
from experiments.pipeline.compute import Compute
from experiments.pipeline.train import straggler_slowdown


@dataclass(frozen=True)
class Timeline:
    """One rank's compute for one step (seconds) and the gradient layout it implies.

    ready_s[i]: when parameter i's gradient is ready, seconds after backward starts (registration order);
    numels[i]: its element count. `source` says where the numbers came from (a profile's id, or 'fixed').
    """

    forward_s: float
    backward_s: float
    optimizer_s: float
    numels: tuple[int, ...]
    ready_s: tuple[float, ...]
    source: str
    profile_id: str = ""
    profile_device: str = ""
    profile_synthetic: bool = False  # described by a user (syncbench profile --synthetic), not measured

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @classmethod
    def from_profile(cls, profile) -> Timeline:
        kind = "SYNTHETIC profile (described, not measured)" if profile.synthetic else "measured profile"
        return cls(profile.forward_s, profile.backward_s, profile.optimizer_s, tuple(profile.numels),
                   tuple(profile.ready_s), f"{kind} {profile.id} ({profile.device_name})", profile.id,
                   profile.device, bool(profile.synthetic))

    @classmethod
    def fixed(cls, forward_s: float, backward_s: float, optimizer_s: float, numels: tuple[int, ...]) -> Timeline:
        """No profile: backward produces gradients evenly, last registered parameter first."""
        total, ready, done = sum(numels), [0.0] * len(numels), 0
        for i in reversed(range(len(numels))):
            done += numels[i]
            ready[i] = backward_s * done / max(total, 1)
        return cls(forward_s, backward_s, optimizer_s, tuple(numels), tuple(ready), "fixed")


@functools.lru_cache(maxsize=4)
def _parameter_shapes(shapes: tuple[tuple[int, ...], ...]) -> tuple:
    """One shape-only stand-in per parameter, shared by every simulated rank: 161 meta tensors per rank were
    about 100 KB of tensor objects each, the largest per-rank cost at thousands of ranks."""
    return tuple(SimpleNamespace(shape=torch.Size(shape), numel=functools.partial(int, math.prod(shape)))
                 for shape in shapes)


class SimulatedCompute(Compute):
    """A simulated worker's step: the timeline's forward, backward and optimizer spent on the simulated clock
    (x the rank's straggler slowdown), gradients ready at their times; buffers are meta tensors of the real
    size. With overlap, a bucket is synced (inline, by the step loop's hook) once its last gradient is ready."""

    threaded = False  # a SimGrid actor syncs inline; backward goes on in simulated time meanwhile
    trains = False  # no values: no loss to check
    wraps = False

    def __init__(self, comm, spec: RunSpec, timeline: Timeline, buckets):
        self.comm, self.clock, self.timeline = comm, comm.now, timeline
        self.scale = straggler_slowdown(spec, comm.rank)
        self.batch_size = spec.batch_size
        self.numel = timeline.numel
        # each parameter with the workload's shape where the timeline's sizes are the workload's (PowerSGD
        # compresses per tensor: as the measured run and the model do), else one vector each (meta, no storage)
        shapes = param_shapes_of(spec, timeline.numels) or tuple((n,) for n in timeline.numels)
        self.flat = SimpleNamespace(params=torch.empty(self.numel, dtype=torch.float32, device="meta"),
                                    grads=torch.empty(self.numel, dtype=torch.float32, device="meta"),
                                    trainable=_parameter_shapes(shapes))
        self.on_ready = None
        # bucket by bucket in the order they complete: when the last of its gradients is ready
        ready = [(max(timeline.ready_s[i] for i in b.params) if b.params else 0.0, b) for b in buckets]
        self.completions = [(t, b.params) for t, b in sorted(ready, key=lambda tb: (tb[0], tb[1].index))]

    def begin_step(self) -> None:
        """Nothing to zero: meta buffers hold no values."""

    def forward_backward(self) -> tuple[float, int, float]:
        """(loss, samples, seconds of inline syncs that outlasted the backward)."""
        self.comm.compute(self.timeline.forward_s * self.scale)
        start = self.forward_end = self.comm.now()  # (forward_end: the traced steps' phases)
        end = start + self.timeline.backward_s * self.scale
        if self.on_ready is None:
            self.comm.compute(end - start)
            return math.nan, self.batch_size, 0.0
        for ready_s, params in self.completions:
            self._sleep_until(start + ready_s * self.scale)
            for i in params:
                self.on_ready(i)
        self._sleep_until(end)  # the rest of backward
        return math.nan, self.batch_size, max(0.0, self.comm.now() - end)

    def _sleep_until(self, t: float) -> None:
        if self.comm.now() < t:
            self.comm.compute(t - self.comm.now())

    def optimizer_step(self) -> None:
        self.comm.compute(self.timeline.optimizer_s * self.scale)

    def take_parameters(self) -> None:
        """The servers' parameters arrived in the (meta) buffer: nothing to copy."""

    def server_update(self):
        """The optimizer time of servers colocated with this worker (PushPull.serve_beside)."""
        return SimulatedUpdate(self.comm, self.timeline)

    def straggle(self, compute_s: float) -> None:
        """The timeline is already scaled by the slowdown."""

    def synchronize(self) -> None:
        """No device to wait for."""

    def loss_value(self, loss) -> float:
        return math.nan

    def consensus_distance(self, comm) -> float:
        return math.nan  # no values: the workers' parameters cannot drift apart

    def final(self) -> dict:
        t = self.timeline
        return {"param_norm": math.nan, "profile_id": t.profile_id, "profile_device": t.profile_device,
                "profile_synthetic": t.profile_synthetic,
                "profile_step_s": t.forward_s + t.backward_s + t.optimizer_s if t.profile_id else math.nan}


class SimulatedUpdate:
    """A simulated server's update: the optimizer's share of the timeline for the shard it owns, no values."""

    dtype, device = torch.float32, "meta"

    def __init__(self, comm, timeline: Timeline):
        self.comm, self.clock, self.timeline = comm, comm.now, timeline
        self.numel = timeline.numel
        self.busy_s = 0.0

    def __call__(self, bucket, reduced: torch.Tensor, where: slice) -> torch.Tensor:
        seconds = self.timeline.optimizer_s * (where.stop - where.start) / max(self.numel, 1)
        self.comm.compute(seconds)
        self.busy_s += seconds
        return reduced


def param_shapes_of(spec: RunSpec, numels) -> tuple | None:
    """The workload's parameter shapes when their sizes are the timeline's (a profile of this workload), else None."""
    from workloads.models import param_shapes

    try:
        shapes = param_shapes(spec.workload, spec.num_classes, spec.image_size)
    except ValueError:
        return None
    return shapes if tuple(math.prod(s) for s in shapes) == tuple(numels) else None

"""What a measured worker computes per step (`MeasuredCompute`: the model, or a profile's timeline, on the wall
clock), a measured server's update (`ShardUpdate`), and the profile a run replays; the step loop that calls them
is experiments/pipeline/train.py."""

from __future__ import annotations

import hashlib
import math
import time

import torch
import torch.nn.functional as F

from experiments.pipeline.compute import Compute
from workloads.data import make_dataset
from workloads.profile import ReplayModel, load_profile, measure_profile, profile_from_dict


def replay_problem(profile, spec, where: str) -> str:
    """'' when one replayed step fits in the run's timeout, else why not: a rank computing longer than the
    timeout leaves its peers waiting past it, and a run alone would go silent for that long."""
    slowest = float(spec.straggler["slowdown"]) if spec.straggler else 1.0
    step_s = profile.step_s * slowest
    if step_s <= spec.timeout:
        return ""
    return (f"profile {where}: one replayed step takes {step_s:g} s (forward_s {profile.forward_s:g} + backward_s "
            f"{profile.backward_s:g} + optimizer_s {profile.optimizer_s:g}"
            + (f", x{slowest:g} straggler" if slowest > 1 else "")
            + f"), longer than the run's timeout = {spec.timeout:g} s: no rank may compute longer than the timeout "
            f"its peers wait; raise timeout or use a profile whose step fits in it")


class MeasuredCompute(Compute):
    """What a measured worker computes per step: the model (`real`) or a replayed profile (`profile`), on the
    wall clock; with ddp the wrapped model also synchronizes the gradients inside backward."""

    clock = staticmethod(time.perf_counter)
    threaded = True  # overlap syncs buckets from a communication thread
    trains = True  # the loss is real: a non-finite one fails the run
    evaluates = True  # a trained model: evaluate() scores it on the held-out split

    def __init__(self, ctx, spec, config, model, flat, profile, device):
        self.spec, self.model, self.flat, self.profile, self.device = spec, model, flat, profile, device
        self.data = make_dataset(spec.dataset, batch_size=spec.batch_size, image_size=spec.image_size,
                                 num_classes=spec.num_classes, rank=ctx.rank, world_size=spec.workers,
                                 seed=spec.seed, device=device)
        self.slowdown = straggler_slowdown(spec, ctx.rank)
        self.net, self.replay, self.start_loss = model, None, math.nan
        if profile is not None:  # the timeline replaces the model's arithmetic; gradients from one real pass
            self.start_loss = _real_gradients(model, flat, self.data)
            self.replay = self.net = ReplayModel(profile, flat.trainable, [g.clone() for g in flat.grad_views],
                                                 self.slowdown)
        self.wraps = config.wraps_model and ctx.comm.world_size > 1
        if self.wraps:  # ddp: torch's DistributedDataParallel averages gradients inside backward, bucket by bucket
            self.net = config.wrap(self.net, spec.bucket_mb, device, comm=ctx.comm, workers=spec.workers)
        self.hook_state = getattr(self.net, "hook_state", None) if self.wraps else None  # ddp comm = a strategy
        self._optimizer = None  # made on first use: a parameter server's worker never steps
        self.on_ready = None  # called with i as parameter i's gradient is accumulated (bucket readiness)
        self.last_ready = math.nan
        # autograd's post-accumulate-grad hooks: backward's end, and bucket readiness. Autograd holds them in C++,
        # out of the garbage collector's sight: a hook reaching this object through its parameters is a cycle
        # nothing collects (every run's model and buffers stayed alive: ~0.5 GB per resnet18 run on thread ranks),
        # so close() removes them.
        self._hooks = [p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i))
                       for i, p in enumerate(flat.trainable)] if flat is not None else []
        model.train()

    def close(self) -> None:
        """The run is over: remove the autograd hooks (they would keep the model, buffers and data alive)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    @property
    def numel(self) -> int:
        return self.flat.numel if self.flat is not None else sum(p.numel() for p in self.model.parameters())

    def _ready(self, i: int) -> None:
        self.last_ready = time.perf_counter()
        if self.on_ready is not None:
            self.on_ready(i)

    def optimizer(self):
        if self._optimizer is None:
            params = [_as_one_parameter(self.flat)] if self.flat is not None else self.model.parameters()
            self._optimizer = _optimizer(self.spec, params)
        return self._optimizer

    def begin_step(self) -> None:
        if self.hook_state is not None:
            self.hook_state.new_step()  # the bucket sizes ddp's hook sees, per step, and its time
        if self.replay is not None:
            self.replay.begin_step()  # the replayed forward ends forward_s after this, zeroing included
        if self.flat is not None:
            self.flat.zero_grad()
        else:
            self.optimizer().zero_grad()

    def forward_backward(self) -> tuple[object, int, float]:
        """(loss, samples, seconds of communication that outlasted backward: ddp's last allreduce)."""
        if self.replay is not None:
            loss, samples = self.net(None), self.spec.batch_size
        else:
            x, y = self.data.next_batch()
            loss, samples = F.cross_entropy(self.net(x), y), int(y.shape[0])
        self.forward_end = time.perf_counter()  # where forward ended (the traced steps' phases)
        loss.backward()
        if self.replay is not None:
            self.replay.finish_backward()
        self.synchronize()
        if not self.wraps:
            return loss, samples, 0.0
        done = self.last_ready  # DDP waited for its last allreduce inside backward(): exposed communication
        if self.replay is not None:
            done = max(done, self.replay.clock.backward_start + self.profile.backward_s * self.replay.scale)
        return loss, samples, max(0.0, time.perf_counter() - done)

    def optimizer_step(self) -> None:
        if self.replay is not None:
            self.replay.optimizer_step()
        else:
            self.optimizer().step()

    def take_parameters(self) -> None:
        self.flat.params.copy_(self.flat.grads)

    def server_update(self):
        """The optimizer of the servers colocated with this worker (see PushPull.serve_beside)."""
        return ShardUpdate(self.spec, self.flat)

    @property
    def straggles(self) -> bool:
        """A straggler in real mode sleeps its extra time (the replay stretches itself)."""
        return self.slowdown > 1 and self.replay is None

    def straggle(self, compute_s: float) -> None:
        """A straggler in real mode: stretch this step's compute by the slowdown (the replay stretches itself)."""
        if self.slowdown > 1 and self.replay is None:
            time.sleep((self.slowdown - 1) * compute_s)  # a sleep leaves the shared cores to the other ranks

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def loss_value(self, loss) -> float:
        return float(loss.detach()) if self.replay is None else self.start_loss

    def consensus_distance(self, comm) -> float:
        return _consensus(comm, self.flat.params) if self.flat is not None else 0.0

    def evaluate(self, metric: str) -> float:
        """This worker's model on the held-out split: top-1 accuracy, or the mean cross-entropy loss."""
        return _accuracy(self.model, self.data) if metric == "accuracy" else _eval_loss(self.model, self.data)

    def params(self) -> torch.Tensor:
        if self.flat is not None:
            return self.flat.params
        return torch.nn.utils.parameters_to_vector(self.model.parameters()).detach()

    def final(self) -> dict:
        profile = self.profile
        final = {"param_norm": float(self.params().norm()), "params_digest": params_digest(self.params()),
                 "profile_id": profile.id if profile else "",
                 "profile_device": profile.device_name if profile else "",
                 "profile_synthetic": bool(profile and profile.synthetic),
                 "profile_step_s": profile.step_s if profile else math.nan}
        # held-out accuracy of a model that trained; a replayed (profile) step applies one fixed gradient, so its
        # model's accuracy says nothing and is left out (NaN), not printed beside the real runs'
        if hasattr(self.data, "eval_batches") and self.replay is None:
            final["accuracy"] = _accuracy(self.model, self.data)
        if self.hook_state is not None:  # ddp through a strategy: the buckets DDP's reducer handed it, per step
            final["step_bucket_numels"] = [list(sizes) for sizes in self.hook_state.steps if sizes]
            final["bucket_numels"] = final["step_bucket_numels"][-1]
        return final


class ShardUpdate:
    """A measured server's update: owns a shard of every bucket's parameters and their optimizer state."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, spec, flat):
        self.spec, self.flat = spec, flat
        self.dtype, self.device, self.numel = flat.params.dtype, flat.params.device, flat.numel
        self.shards: dict[tuple[int, int], tuple] = {}
        self.busy_s = 0.0

    def __call__(self, bucket, reduced: torch.Tensor, where: slice) -> torch.Tensor:
        start = time.perf_counter()
        key = (bucket.index, where.start)
        if key not in self.shards:  # first step: take this shard of the (seeded, identical) initial parameters
            lo = bucket.lo + where.start
            param = torch.nn.Parameter(self.flat.params[lo:lo + where.stop - where.start].detach().clone())
            self.shards[key] = (param, _optimizer(self.spec, [param]))
        param, optimizer = self.shards[key]
        param.grad = reduced
        optimizer.step()
        self.busy_s += time.perf_counter() - start
        return param.data


def straggler_slowdown(spec, rank: int) -> float:
    """How much slower this rank computes (1.0: not a straggler)."""
    if spec.straggler and rank in spec.straggler["ranks"]:
        return float(spec.straggler["slowdown"])
    return 1.0


# -- helpers ------------------------------------------------------------------------------------------------


def profile_key(spec, device: str) -> tuple:
    """What a measured profile depends on: ranks replaying the same key replay the same profile."""
    return ("profile", spec.workload, spec.batch_size, spec.image_size, spec.num_classes, device)


def profile_for(ctx, spec):
    """The run's profile: its file, else the one the runner measured at the sweep's start and installed on
    this actor (experiments/pipeline/profiles.py), else measured here on rank 0 alone and shared with every
    rank over the control plane (uncounted); each rank keeps it for the next runs of its actor."""
    if spec.profile:
        profile = load_profile(spec.profile)
        profile.check_run(spec.workload, spec.batch_size, spec.image_size, spec.num_classes, where=spec.profile)
        return profile
    key = profile_key(spec, ctx.device)
    if key not in ctx.state:
        measured = None
        if ctx.rank == 0:  # the other ranks wait in the exchange below: the measurement runs alone
            measured = measure_profile(spec.workload, spec.batch_size, spec.image_size, ctx.device,
                                       spec.num_classes, seed=spec.seed, lr=spec.lr,
                                       momentum=spec.momentum).as_dict()
        data = ctx.comm.allgather_object(measured)[0] if ctx.comm.world_size > 1 else measured
        ctx.state[key] = profile_from_dict(data, where="the profile measured at the start")
    return ctx.state[key]


def _optimizer(spec, params):
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


def _as_one_parameter(flat) -> torch.nn.Parameter:
    """The flat buffers as one parameter: SGD's elementwise update in one pass instead of one per tensor
    (the same arithmetic; resnet18's 62 small updates cost as much as the flat gradients' zeroing)."""
    param = torch.nn.Parameter(flat.params)  # shares storage: updating it updates the model
    param.grad = flat.grads
    return param


def _real_gradients(model, flat, data) -> float:
    """One real forward and backward on this rank's batch: the gradients profile mode moves. Returns the loss."""
    x, y = data.next_batch()
    flat.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach())


def _consensus(comm, params: torch.Tensor) -> float:
    """This rank's L2 distance to the workers' average parameters (backend allreduce, not counted or timed)."""
    average = params.detach().clone()
    comm.native_allreduce(average, "mean")
    return float((params - average).norm())


@torch.no_grad()
def _eval_loss(model, data) -> float:
    """Mean cross-entropy on the held-out split."""
    model.eval()
    total = count = 0.0
    for x, y in data.eval_batches():
        total += float(F.cross_entropy(model(x), y, reduction="sum"))
        count += int(y.numel())
    model.train()
    return total / max(count, 1)


@torch.no_grad()
def _accuracy(model, data) -> float:
    """Top-1 accuracy on the held-out split."""
    model.eval()
    correct = total = 0
    for x, y in data.eval_batches():
        correct += int((model(x).argmax(dim=1) == y).sum())
        total += int(y.numel())
    model.train()
    return correct / max(total, 1)


def params_digest(params: torch.Tensor) -> str:
    """A checksum of a worker's parameter bits at the end of a run (blake2b, ~0.2 s per 100 MB): the summary
    compares them, so a strategy declared exact and identical whose ranks end different is recorded failed."""
    data = params.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(data, digest_size=8).hexdigest()

"""Compute profiles: how long one training step of a model takes on one device, parameter by parameter.

A profile is measured on one rank alone (nothing to synchronize, nothing else running): the forward pass
(loss included), the moment each parameter's gradient is accumulated during backward (autograd's
post-accumulate-grad hooks, seconds after backward starts), the end of backward, and the optimizer step
(SGD with momentum on one flat parameter, as syncbench's workers run it). Each number is the median over the
timed steps after warm-up. Saved as a small JSON file that names the device, host, torch version, dtype,
batch, image size and model, with every parameter's size in registration order, so that it can be replayed
anywhere: `compute = "profile"` in a sweep sleeps through this timeline while the real strategy moves
real-sized gradient buffers, and other substrates (a simulator) can read the same file.

    from workloads.profile import load_profile, measure_profile, save_profile
    profile = measure_profile("resnet18", batch_size=16, image_size=32, device="cpu")
    save_profile(profile, "resnet18-b16.json")
    profile = load_profile("resnet18-b16.json")
    profile.step_s, profile.ready_s[-1], profile.numels[:3]

Times are seconds; ready times are relative to the start of backward; sizes are elements (dtype float32).
"""

from __future__ import annotations

import datetime as dt
import platform
import socket
import statistics
import time

import torch
import torch.nn.functional as F

from workloads.models import MODELS, build_model, check_model_args, memory_problem, param_sizes
from workloads.profile_format import (  # noqa: F401 - the profile API is imported from here (docs/measurements.md)
    DEVICES,
    FORMAT,
    MAX_NUMEL,
    MAX_PARAMS,
    MAX_PROFILE_BYTES,
    MAX_SECONDS,
    PROFILE_DIR,
    RANGES,
    ParamTiming,
    Profile,
    ProfileError,
    _seconds,
    check_profile_path,
    load_profile,
    profile_from_dict,
    save_profile,
)
from workloads.replay import ReplayModel  # noqa: F401 - ditto


def measure_profile(model: str, batch_size: int, image_size: int = 32, device: str = "cpu",
                    num_classes: int = 10, steps: int = 10, warmup_steps: int = 3, seed: int = 0,
                    threads: int | None = 1, lr: float = 0.05, momentum: float = 0.9) -> Profile:
    """Measure `model` training alone on `device`; medians over `steps` timed steps after `warmup_steps`.

    `threads`: torch intra-op threads while measuring (1, as syncbench's CPU workers run; None: leave as is).
    """
    _check_measure_args(model, batch_size, image_size, device, num_classes, steps, warmup_steps)
    if problem := memory_problem(model, num_classes, image_size, batch_size, device):
        raise ProfileError(problem)  # before measuring: the allocator's traceback came after it
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure(model, batch_size, image_size, torch.device(device), num_classes, steps, warmup_steps,
                        seed, lr, momentum)
    finally:
        torch.set_num_threads(previous_threads)


def _check_measure_args(model, batch_size, image_size, device, num_classes, steps, warmup_steps) -> None:
    if model not in MODELS:
        raise ProfileError(f"unknown workload {model!r}: accepted are {', '.join(MODELS)}")
    check_model_args(model, num_classes, image_size)
    if device not in DEVICES:
        raise ProfileError(f"device {device!r}: accepted are {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProfileError("device 'cuda': this machine has no CUDA GPU; accepted here is 'cpu'")
    for key, value, low in (("batch_size", batch_size, 1), ("steps", steps, 1), ("warmup_steps", warmup_steps, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProfileError(f"{key} = {value!r}: accepted is an integer >= {low}")


class _Clock:
    """Timestamps on the host (CPU) or as CUDA events (GPU work is asynchronous); read after a step."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        if not self.cuda:
            return end - start
        return start.elapsed_time(end) / 1e3  # ms -> s (both events completed: the caller synchronized)


def _measure(model_name, batch_size, image_size, device, num_classes, steps, warmup_steps, seed, lr,
             momentum) -> Profile:
    from workloads.flat import FlatModel

    model = build_model(model_name, num_classes=num_classes, image_size=image_size, seed=seed).to(device)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    flat = FlatModel(model)
    param = torch.nn.Parameter(flat.params)  # the workers' optimizer: one SGD step over the flat buffers
    param.grad = flat.grads
    optimizer = torch.optim.SGD([param], lr=lr, momentum=momentum)
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=generator, device=device)
    y = torch.randint(0, num_classes, (batch_size,), generator=generator, device=device)
    clock = _Clock(device)
    ready: list = [None] * len(flat.trainable)
    for i, p in enumerate(flat.trainable):
        p.register_post_accumulate_grad_hook(lambda _p, i=i: ready.__setitem__(i, clock.mark()))

    forward, backward, optim, ready_times = [], [], [], []
    model.train()
    for step in range(warmup_steps + steps):
        flat.zero_grad()
        _sync(device)
        start = clock.mark()
        loss = F.cross_entropy(model(x), y)
        backward_start = clock.mark()
        loss.backward()
        backward_end = clock.mark()
        optimizer.step()
        end = clock.mark()
        _sync(device)
        if step < warmup_steps:
            continue
        if any(r is None for r in ready):
            missing = [names[i] for i, r in enumerate(ready) if r is None]
            raise RuntimeError(f"{model_name}: no gradient reached parameter(s) {missing[:5]}: cannot profile")
        forward.append(clock.seconds(start, backward_start))
        backward.append(clock.seconds(backward_start, backward_end))
        optim.append(clock.seconds(backward_end, end))
        ready_times.append([clock.seconds(backward_start, r) for r in ready])
        ready[:] = [None] * len(ready)
    median_ready = [statistics.median(column) for column in zip(*ready_times)]
    backward_s = statistics.median(backward)
    params = tuple(ParamTiming(name, int(p.numel()), min(r, backward_s))
                   for name, p, r in zip(names, flat.trainable, median_ready))
    return Profile(model=model_name, batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                   dtype=str(flat.params.dtype).removeprefix("torch."), device=device.type,
                   device_name=_device_name(device), host=socket.gethostname(), torch_version=torch.__version__,
                   threads=torch.get_num_threads(), measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                   steps=steps, warmup_steps=warmup_steps, forward_s=statistics.median(forward),
                   backward_s=backward_s, optimizer_s=statistics.median(optim), params=params)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def cpu_model() -> str:
    """The CPU's model name, e.g. 'AMD EPYC 7B13' (platform.processor() is empty on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- synthetic profiles ----------------------------------------------------------------------------------

SYNTHETIC_SPLIT = (1.0, 2.0, 0.0)  # forward : backward : optimizer when not given (backward costs ~2x forward)


def layer_work(model: str, num_classes: int, image_size: int) -> list[tuple[tuple[int, ...], float]]:
    """Each layer that owns parameters, in forward order: (its parameters' registration indices, its backward
    work in multiply-accumulates per sample). Counted on the meta device (no memory, no init).

    Convolutions and linear layers: 2 x their forward MACs (the input's and the weights' gradients); other layers
    with parameters (batch norm): 2 x their output elements. Layers without parameters are left out."""
    from workloads.models import _construct

    check_model_args(model, num_classes, image_size)
    with torch.device("meta"):
        net = _construct(model, num_classes).eval()  # eval: batch norm accepts one sample at 1x1
    index = {id(p): i for i, p in enumerate(p for p in net.parameters() if p.requires_grad)}
    order: list[tuple[tuple[int, ...], float]] = []

    def hook(module, inputs, output):
        owned = tuple(index[id(p)] for p in module.parameters(recurse=False) if id(p) in index)
        if not owned:
            return
        if isinstance(module, torch.nn.Conv2d):
            kh, kw = module.kernel_size
            macs = output.numel() * (module.in_channels // module.groups) * kh * kw
        elif isinstance(module, torch.nn.Linear):
            macs = output.numel() * module.in_features
        else:
            macs = output.numel()
        order.append((owned, 2.0 * macs))

    handles = [m.register_forward_hook(hook) for m in net.modules()]
    try:
        with torch.device("meta"), torch.no_grad():
            net(torch.empty(1, 3, image_size, image_size))
    finally:
        for h in handles:
            h.remove()
    seen = {i for owned, _ in order for i in owned}
    if seen != set(index.values()):
        raise ProfileError(f"{model}: {len(index) - len(seen)} parameter(s) belong to no layer the forward pass "
                           f"ran: cannot spread their readiness")
    return order


def synthetic_profile(model: str, step_s: float, batch_size: int = 32, image_size: int = 224,
                      num_classes: int | None = None, split: tuple[float, float, float] = SYNTHETIC_SPLIT,
                      device: str = "cuda", describe: str = "") -> Profile:
    """A profile for hardware a user describes ("compute is 0.25 s per step on our GPUs"): forward, backward and
    optimizer are `step_s` cut by `split`, and each parameter's gradient is ready when backward has done the work
    of every layer after its own (layer_work(): backward visits layers in reverse), so VGG-16's fully connected
    layers (89% of its bytes, ~1% of its work at 224x224) are ready at once. Labelled synthetic everywhere."""
    from workloads.models import default_num_classes

    num_classes = default_num_classes(model) if num_classes is None else num_classes
    _check_measure_args(model, batch_size, image_size, "cpu", num_classes, 1, 0)
    if device not in DEVICES:
        raise ProfileError(f"device {device!r}: accepted are {', '.join(DEVICES)}")
    if not _seconds(step_s) or step_s <= 0:
        raise ProfileError(f"step time {step_s!r}: accepted are seconds > 0 and <= {MAX_SECONDS:,}")
    if (len(split) != 3 or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < float("inf")
                               for x in split) or split[1] <= 0):
        raise ProfileError(f"split {split!r}: accepted are three shares forward, backward, optimizer, each >= 0, "
                           f"backward > 0 (e.g. 1,2,0)")
    largest = float(max(split))  # shares scaled to <= 1 first: 1e308 + 1e308 overflows to inf, and every time to 0
    shares = [x / largest for x in split]
    forward_s, backward_s, optimizer_s = (step_s * x / sum(shares) for x in shares)
    zero = [part for part, x, t in zip(("forward", "backward", "optimizer"), split, (forward_s, backward_s,
                                                                                     optimizer_s)) if x > 0 and t <= 0]
    if zero:
        raise ProfileError(f"split {split!r} with step time {step_s!r}: the {zero[0]} time underflows to 0 s; "
                           f"accepted are shares whose times are > 0 (e.g. 1,2,0)")
    layers = layer_work(model, num_classes, image_size)
    work = sum(w for _, w in layers)
    ready = {}
    done = 0.0
    for owned, w in reversed(layers):  # backward: the last layer of the forward pass first
        done += w
        for i in owned:
            ready[i] = min(backward_s, backward_s * done / work)
    names = [name for name, p in _named_meta_params(model, num_classes)]
    sizes = param_sizes(model, num_classes, image_size)
    params = tuple(ParamTiming(name, numel, ready[i]) for i, (name, numel) in enumerate(zip(names, sizes)))
    shares = f"{forward_s:g} + {backward_s:g} + {optimizer_s:g} s"
    return Profile(model=model, batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                   dtype="float32", device=device,
                   device_name=f"synthetic: {describe or 'described hardware'}, step {step_s:g} s = {shares}",
                   host="synthetic", torch_version=torch.__version__, threads=1,
                   measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), steps=1, warmup_steps=0,
                   forward_s=forward_s, backward_s=backward_s, optimizer_s=optimizer_s, params=params,
                   synthetic=True)


def _named_meta_params(model: str, num_classes: int):
    from workloads.models import _construct

    with torch.device("meta"):
        net = _construct(model, num_classes)
    return [(name, p) for name, p in net.named_parameters() if p.requires_grad]



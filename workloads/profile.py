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

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from workloads.files import FileLimitError, check_depth, check_text, read_bounded
from workloads.models import MODELS, build_model, check_model_args, memory_problem, param_sizes

FORMAT = 1  # bump when the file layout changes; load_profile refuses other versions
DEVICES = ("cpu", "cuda")
PROFILE_DIR = Path(__file__).parent / "profiles"  # committed GPU profiles, usable on any machine


# The accepted values of a profile file's fields (docs/settings.md), checked when it is loaded:
# a forward_s of 1e300 failed late as an OverflowError naming neither file nor field.
MAX_SECONDS = 86_400  # forward_s, backward_s, optimizer_s and every ready_s: at most a day, a run's longest timeout
RANGES = {"batch_size": (1, 65_536), "image_size": (8, 1_024), "num_classes": (2, 100_000), "threads": (1, 4_096),
          "steps": (1, 1_000_000), "warmup_steps": (0, 1_000_000)}  # as the sweep's, where a sweep has them
MAX_PARAMS = 100_000  # parameters of one model (ResNet-50 has 161)
MAX_NUMEL = 2**40  # elements of one parameter
MAX_PROFILE_BYTES = 20_000_000  # a profile of MAX_PARAMS parameters is about 10 MB


class ProfileError(ValueError):
    """A profile file that cannot be used: missing, corrupt, or measured for another model or batch."""


@dataclass(frozen=True)
class ParamTiming:
    """One trainable parameter, in registration order: its name, size and when its gradient is ready."""

    name: str
    numel: int
    ready_s: float  # seconds after backward starts until autograd has accumulated this gradient (median)


@dataclass(frozen=True)
class Profile:
    """The measured timeline of one training step of `model` at `batch_size` on `device` (medians, seconds)."""

    model: str
    batch_size: int
    image_size: int
    num_classes: int
    dtype: str           # the parameters' and gradients' dtype, e.g. "float32"
    device: str          # "cpu" or "cuda"
    device_name: str     # the CPU model or GPU name it was measured on
    host: str
    torch_version: str
    threads: int         # torch intra-op threads during the measurement
    measured_at: str     # ISO 8601, UTC
    steps: int           # timed steps behind each median
    warmup_steps: int
    forward_s: float     # forward pass and loss
    backward_s: float    # from backward start until backward() returns
    optimizer_s: float   # one SGD (momentum) step on all parameters
    params: tuple[ParamTiming, ...]
    format: int = FORMAT
    synthetic: bool = False  # True: described by a user (synthetic_profile), not measured; labelled in its id

    @property
    def step_s(self) -> float:
        """A step with nothing to synchronize: forward + backward + optimizer."""
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(p.numel for p in self.params)

    @property
    def ready_s(self) -> tuple[float, ...]:
        return tuple(p.ready_s for p in self.params)

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def itemsize(self) -> int:
        return torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()

    @property
    def id(self) -> str:
        """Short and stable: model, batch, image size, device and a digest of the whole file's content."""
        digest = hashlib.sha1(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:8]
        source = "synthetic" if self.synthetic else self.device
        return f"{self.model}-b{self.batch_size}-s{self.image_size}-{source}-{digest}"

    def as_dict(self) -> dict:
        """The file's fields; `synthetic` only when true, so measured profiles keep their files and ids."""
        data = dataclasses.asdict(self)
        if not self.synthetic:
            del data["synthetic"]
        return data

    def check_run(self, workload: str, batch_size: int, image_size: int, num_classes: int,
                  where: str = "profile") -> None:
        """Refuse to replay this profile for a run of another model, batch, image size or parameter layout."""
        wanted = {"model": workload, "batch_size": batch_size, "image_size": image_size,
                  "num_classes": num_classes}
        for key, value in wanted.items():
            if getattr(self, key) != value:
                raise ProfileError(f"{where}: measured for {key} = {getattr(self, key)!r}, the run has "
                                   f"{key} = {value!r}: accepted is a profile of {workload} at batch "
                                   f"{batch_size}, image size {image_size}, {num_classes} classes "
                                   f"(`syncbench profile --workload {workload} --batch-size {batch_size} "
                                   f"--image-size {image_size}` measures one)")
        sizes = tuple(param_sizes(workload, num_classes))
        if self.numels != sizes:
            raise ProfileError(f"{where}: its {len(self.params)} parameter sizes ({self.numel:,} elements) are "
                               f"not those of {workload} with {num_classes} classes ({len(sizes)} parameters, "
                               f"{sum(sizes):,} elements): measure it again with this torchvision")


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


# -- files ------------------------------------------------------------------------------------------------

def check_profile_path(path: str | Path) -> Path:
    """Where a profile can be written: not a directory, no file on the way; ProfileError naming it otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ProfileError(f"--out {str(path)!r} is a directory: accepted is the path of a JSON file to write, "
                           f"e.g. {str(path / 'profile.json')!r}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ProfileError(f"--out {str(path)!r}: {str(parent)!r} is a file, not a directory")
            try:  # a real write, not os.access: a read-only file system refuses root too
                with tempfile.TemporaryFile(dir=parent):
                    pass
            except OSError as e:
                raise ProfileError(f"--out {str(path)!r}: directory {str(parent)!r} is not writable "
                                   f"({e.strerror or e})") from None
            break
    return path


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write the profile as JSON (atomically: a temporary file, then a rename; no temporary file left on failure)."""
    path = check_profile_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(profile.as_dict(), indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):  # a full or read-only disk: one line, no temporary file left
            raise ProfileError(f"cannot write the profile {str(path)!r}: {e.strerror or e}") from None
        raise
    return path


def load_profile(path: str | Path) -> Profile:
    """Read a profile written by `save_profile` / `syncbench profile`; ProfileError says what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"profile file {str(path)!r} does not exist: accepted is the path of a JSON file "
                           f"written by `syncbench profile` (committed GPU profiles: {PROFILE_DIR})")
    try:
        text = read_bounded(path, MAX_PROFILE_BYTES, "profile written by `syncbench profile`")
        check_text(text, str(path), json=True)
        data = json.loads(text)
        check_depth(data, str(path))
    except FileLimitError as e:
        raise ProfileError(str(e)) from None
    except ValueError as e:  # JSONDecodeError, or Python's limit on the digits of an integer
        raise ProfileError(f"profile file {str(path)!r} is not valid JSON ({e}): accepted is a file written by "
                           f"`syncbench profile`") from None
    return profile_from_dict(data, where=str(path))


def profile_from_dict(data, where: str = "profile") -> Profile:
    """Validate a parsed profile (types, ranges, format version) and build the Profile."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ProfileError(f"{where}: format {data.get('format')!r}; accepted is format {FORMAT} "
                           f"(measure it again with `syncbench profile`)")
    fields = {f.name: f for f in dataclasses.fields(Profile)}
    missing = sorted(set(fields) - set(data) - {"format", "synthetic"})
    unknown = sorted(set(data) - set(fields))
    if missing or unknown:
        raise ProfileError(f"{where}: missing field(s) {missing}, unknown field(s) {unknown}; accepted are "
                           f"{', '.join(fields)}")
    strings = ("model", "dtype", "device", "device_name", "host", "torch_version", "measured_at")
    integers = ("batch_size", "image_size", "num_classes", "threads", "steps", "warmup_steps")
    seconds = ("forward_s", "backward_s", "optimizer_s")
    for key in strings:
        if not isinstance(data[key], str):
            raise ProfileError(f"{where}: {key} = {data[key]!r}: expected a string")
    for key in integers:
        low, high = RANGES[key]
        if isinstance(data[key], bool) or not isinstance(data[key], int) or not low <= data[key] <= high:
            raise ProfileError(f"{where}: {key} = {data[key]!r}: accepted is an integer >= {low:,} and <= {high:,}")
    for key in seconds:
        if not _seconds(data[key]):
            raise ProfileError(f"{where}: {key} = {data[key]!r}: accepted are seconds, a number >= 0 and <= "
                               f"{MAX_SECONDS:,}")
    if data["model"] not in MODELS:
        raise ProfileError(f"{where}: model {data['model']!r}: accepted are {', '.join(MODELS)}")
    if data["device"] not in DEVICES:
        raise ProfileError(f"{where}: device {data['device']!r}: accepted are {', '.join(DEVICES)}")
    if not isinstance(getattr(torch, data["dtype"], None), torch.dtype):
        raise ProfileError(f"{where}: dtype {data['dtype']!r} is not a torch dtype (e.g. 'float32')")
    params = data["params"]
    if not isinstance(params, (list, tuple)) or not 1 <= len(params) <= MAX_PARAMS:
        raise ProfileError(f"{where}: params must be a list of 1 to {MAX_PARAMS:,} {{name, numel, ready_s}}")
    timings = []
    for i, p in enumerate(params):
        ok = (isinstance(p, dict) and set(p) == {"name", "numel", "ready_s"} and isinstance(p["name"], str)
              and isinstance(p["numel"], int) and not isinstance(p["numel"], bool) and 0 < p["numel"] <= MAX_NUMEL
              and _seconds(p["ready_s"]) and p["ready_s"] <= data["backward_s"] * (1 + 1e-9))
        if not ok:
            shown = repr(p) if len(repr(p)) <= 200 else repr(p)[:200] + "..."
            raise ProfileError(f"{where}: params[{i}] = {shown}: expected {{name: str, numel: int from 1 to "
                               f"{MAX_NUMEL:,}, ready_s: seconds <= backward_s ({data['backward_s']!r})}}")
        timings.append(ParamTiming(p["name"], p["numel"], float(p["ready_s"])))
    if not isinstance(data.get("synthetic", False), bool):
        raise ProfileError(f"{where}: synthetic = {data['synthetic']!r}: expected true or false")
    values = {k: data[k] for k in fields if k not in ("params", "format") and k in data}
    values.update({k: float(values[k]) for k in seconds})
    return Profile(**values, params=tuple(timings))


def _seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_SECONDS


# -- replay ---------------------------------------------------------------------------------------------

_EARLY_S = 1e-3  # a deadline closer than this is taken as reached: a wake-up can cost more than that on busy cores


def _sleep_until(deadline: float) -> None:
    """Sleep until a time.perf_counter() deadline (absolute deadlines: a late wake-up does not accumulate).

    Gradients whose ready times lie within 1 ms of each other are released together, without a sleep each:
    on loaded cores every sleep wakes late, and 62 late wake-ups in a row added 20-50 ms to a 180 ms backward."""
    left = deadline - time.perf_counter()
    if left > _EARLY_S:
        time.sleep(left)


class _BackwardClock:
    """Shared by one ReplayModel's autograd functions: when the current backward pass started."""

    backward_start = 0.0


class _StartBackward(torch.autograd.Function):
    """The last operation of the replayed forward, so the first of backward: it notes when backward starts."""

    @staticmethod
    def forward(ctx, x, clock):
        ctx.clock = clock
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.backward_start = time.perf_counter()
        return grad, None


class _ReleaseGradient(torch.autograd.Function):
    """One parameter's step of the replayed backward: wait until the profile says its gradient is ready, then
    hand autograd the stored real gradient. Autograd accumulates it into `param.grad` and runs the parameter's
    post-accumulate-grad hooks (syncbench's bucket readiness, DDP's reducer) exactly as in a real backward."""

    @staticmethod
    def forward(ctx, x, param, gradient, clock, ready_s):
        ctx.gradient, ctx.clock, ctx.ready_s = gradient, clock, ready_s
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _sleep_until(ctx.clock.backward_start + ctx.ready_s)
        return grad, ctx.gradient, None, None, None


class ReplayModel(torch.nn.Module):
    """Replays a profile's timeline instead of computing: forward sleeps, backward releases each parameter's
    gradient at its measured time (in the measured order), `optimizer_step()` sleeps for the optimizer.

    `params` are the real model's parameters (registration order; they stay its parameters, so flat buffers,
    optimizers and DDP see the same tensors), `gradients` a real gradient for each (from a real backward pass),
    which every replayed backward accumulates again. `slowdown` stretches every time (a straggler).
    Call `begin_step()` at the start of each step: the forward's deadline counts from there.
    """

    def __init__(self, profile: Profile, params: list[torch.nn.Parameter], gradients: list[torch.Tensor],
                 slowdown: float = 1.0):
        super().__init__()
        if [p.numel() for p in params] != list(profile.numels):
            raise ProfileError(f"profile {profile.id}: its parameter sizes do not match the model's "
                               f"({len(profile.params)} vs {len(params)} parameters)")
        self.profile = profile
        self.weights = torch.nn.ParameterList(params)
        self.gradients = [g.detach() for g in gradients]
        self.scale = float(slowdown)
        self.clock = _BackwardClock()
        # backward visits the functions in reverse order of application: apply the last-ready parameter first
        self.order = sorted(range(len(params)), key=lambda i: profile.params[i].ready_s, reverse=True)
        self.step_start = time.perf_counter()

    def begin_step(self) -> None:
        self.step_start = time.perf_counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """A scalar 'loss' whose backward replays the profile's backward; returns at the forward's deadline."""
        out = torch.zeros(1, device=self.gradients[0].device)
        for i in self.order:
            out = _ReleaseGradient.apply(out, self.weights[i], self.gradients[i], self.clock,
                                         self.profile.params[i].ready_s * self.scale)
        out = _StartBackward.apply(out, self.clock).sum()
        _sleep_until(self.step_start + self.profile.forward_s * self.scale)
        return out

    def finish_backward(self) -> None:
        """After loss.backward(): wait out the rest of the measured backward pass."""
        _sleep_until(self.clock.backward_start + self.profile.backward_s * self.scale)

    def optimizer_step(self) -> None:
        """The optimizer's measured time (the parameters are not updated: profile mode measures time)."""
        _sleep_until(time.perf_counter() + self.profile.optimizer_s * self.scale)

"""A compute profile's format (Profile, one ParamTiming per parameter, the ranges it is checked against) and its
file: checked path, atomic save, bounded load. Measuring and synthesizing one: workloads/profile.py; replaying
one: workloads/replay.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from workloads.files import FileLimitError, check_depth, check_text, read_bounded
from workloads.models import MODELS, param_sizes

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

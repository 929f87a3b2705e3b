"""The models a run trains: torchvision ResNet/VGG (random init, no downloads), a tiny CNN for fast tests and a
wide CNN whose gradients are large enough to matter on a 1 Gbit link (docs/time-to-accuracy.md).

Every model ends in an adaptive average pool, so one model serves CIFAR-sized (32) and ImageNet-sized (224)
inputs; only inputs too small for the model's downsampling are rejected.
"""

from __future__ import annotations

import functools
import math
import os
import threading

import torch
from torch import nn

MODELS = ("resnet18", "resnet50", "vgg11", "vgg16", "tiny", "wide")

# Classifier outputs when a sweep, `syncbench model` or `syncbench profile` does not say: one default per workload,
# in one place, so that a model's size is the same everywhere (10: CIFAR-sized heads, as the sweeps' 32x32 inputs;
# ImageNet's head is num_classes = 1000, e.g. VGG-16 138.4M parameters instead of 134.3M).
DEFAULT_NUM_CLASSES = dict.fromkeys(MODELS, 10)

# Smallest input side each model accepts: ResNet and VGG halve the image five times (32 -> 1x1 at the last
# stage; a VGG max pool on 1x1 fails), tiny halves it twice before a 2x2 adaptive pool, wide twice before a 4x4 one
# (below 16 pixels it would pool 2x2 maps up to 4x4: copies, no information).
MIN_IMAGE_SIZE = {"resnet18": 32, "resnet50": 32, "vgg11": 32, "vgg16": 32, "tiny": 8, "wide": 16}

# torchvision initializes from torch's global RNG: ranks that are threads of one process take turns.
_BUILD_LOCK = threading.Lock()


class TinyCNN(nn.Module):
    """Two conv layers and a linear head (about 22k parameters): a real CNN that trains in milliseconds."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(64 * 2 * 2, num_classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.pool(x).flatten(1)
        return self.fc(x)


class WideCNN(nn.Module):
    """The tiny CNN twice as wide, at a 4x4 pool, with a 512-unit hidden layer: 1,129,866 parameters (4.5 MB of
    fp32 gradients, 93% of them in fc1). At batch 32 and 16x16 a step takes ~27 ms on one quiet CPU thread and a
    4-worker ring allreduce of its gradients ~54 ms at 1 Gbit: communication about twice the compute, as for
    ResNet-50 on GPUs over 10 Gbit Ethernet (docs/time-to-accuracy.md)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(64, 128, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc1 = nn.Linear(128 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(self.pool(x).flatten(1)))
        return self.fc2(x)


def check_model_args(name, num_classes, image_size):
    """Reject an unknown model, a class count below 1 or an input too small for the model, by value."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: accepted are {', '.join(MODELS)}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    min_size = MIN_IMAGE_SIZE[name]
    if not isinstance(image_size, int) or image_size < min_size:
        raise ValueError(f"image_size {image_size!r} is too small for {name}: it needs an integer "
                         f">= {min_size} (it downsamples its input below 1x1 otherwise)")


def _construct(name, num_classes):
    if name == "tiny":
        return TinyCNN(num_classes)
    if name == "wide":
        return WideCNN(num_classes)
    import torchvision  # here, not at the top: it imports torch._dynamo (seconds); validation needs neither

    return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)


def build_model(name, num_classes=10, image_size=32, seed=0) -> nn.Module:
    """Build `name` with random weights drawn from `seed`: the same seed gives the same model on every rank.

    The global torch RNG is left as it was, so building a model does not shift the data or dropout streams.
    """
    check_model_args(name, num_classes, image_size)
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _construct(name, num_classes)


def default_num_classes(name: str) -> int:
    """The classifier outputs `name` gets when nothing says otherwise (DEFAULT_NUM_CLASSES)."""
    if name not in DEFAULT_NUM_CLASSES:
        raise ValueError(f"unknown model {name!r}: accepted are {', '.join(MODELS)}")
    return DEFAULT_NUM_CLASSES[name]


def describe_size(name: str, num_classes: int, image_size: int = 32) -> str:
    """One line for the start of a run and the model table, e.g. 'vgg16, 10 classes: 134,301,514 parameters,
    537.21 MB fp32' (MB = 10^6 bytes)."""
    numel = param_count(name, num_classes, image_size)
    return f"{name}, {num_classes:,} classes: {numel:,} parameters, {numel * 4 / 1e6:,.2f} MB fp32"


def param_count(name, num_classes=10, image_size=32) -> int:
    """Number of trainable parameters, counted on the meta device: no memory and no init (vgg16 is 138M)."""
    return sum(param_sizes(name, num_classes, image_size))


def param_sizes(name, num_classes=10, image_size=32) -> list[int]:
    """Each trainable parameter's element count in registration order (meta device: no memory, no init)."""
    return [math.prod(shape) for shape in param_shapes(name, num_classes, image_size)]


@functools.lru_cache(maxsize=64)
def param_shapes(name, num_classes=10, image_size=32) -> tuple[tuple[int, ...], ...]:
    """Each trainable parameter's shape in registration order, the flat buffer's layout (PowerSGD compresses per
    tensor; meta device: no memory, no init). Cached: a simulation asks once per rank (ResNet-50: 50-100 ms each)."""
    check_model_args(name, num_classes, image_size)
    with torch.device("meta"):
        model = _construct(name, num_classes)
    return tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad)


@functools.lru_cache(maxsize=64)
def activation_numel(name, num_classes=10, image_size=32) -> int:
    """Elements of every leaf module's output for one sample, from a forward pass on the meta device (no memory):
    roughly what training keeps for backward per sample, for refusing a batch that cannot fit before any work."""
    check_model_args(name, num_classes, image_size)
    with torch.device("meta"):
        model = _construct(name, num_classes)
        total = 0

        def count(module, inputs, output):
            nonlocal total
            if isinstance(output, torch.Tensor):
                total += output.numel()

        hooks = [m.register_forward_hook(count) for m in model.modules() if not list(m.children())]
        model(torch.empty(1, 3, image_size, image_size))
        for hook in hooks:
            hook.remove()
    return total


def training_bytes(name, num_classes=10, image_size=32, batch_size=1) -> int:
    """A lower estimate of one rank's training memory in fp32: activations (kept for backward, and their
    gradients) for the batch, plus parameters, gradients and momentum."""
    return 4 * (2 * batch_size * activation_numel(name, num_classes, image_size)
                + 3 * param_count(name, num_classes, image_size))


def memory_problem(name, num_classes, image_size, batch_size, device="cpu") -> str:
    """'' when one rank's training of this batch may fit this machine's memory (RAM, or the GPU's), else why not,
    naming the batch, the estimate (training_bytes) and the largest batch that fits: said before any work, where
    the allocator's traceback came after Ray started. Small batches are not estimated (under 2**20 pixels a batch
    of any model here needs a few GB at most)."""
    if batch_size * image_size * image_size < 2**20:
        return ""
    if device == "cuda":
        if not torch.cuda.is_available():
            return ""
        total, where = torch.cuda.get_device_properties(0).total_memory, "the GPU's memory"
    else:
        total, where = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this machine's memory"
    need = training_bytes(name, num_classes, image_size, batch_size)
    if need <= total:
        return ""
    per_sample = training_bytes(name, num_classes, image_size, 2) - training_bytes(name, num_classes, image_size, 1)
    fits = max(0, (total - training_bytes(name, num_classes, image_size, 0)) // per_sample)
    return (f"batch_size = {batch_size:,} of {name} at {image_size}x{image_size} needs about {need / 1e9:,.1f} GB to "
            f"train (activations kept for backward, parameters, gradients, momentum), more than {where} "
            f"({total / 1e9:,.1f} GB): accepted here are batches up to about {fits:,}")

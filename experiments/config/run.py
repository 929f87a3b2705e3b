"""RunSpec: one run's settings, their defaults (its fields), and the run id that names it (resume relies on it)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields

import strategies
from strategies.registry import WRAPPER_SETTINGS
from strategies.transport.link import Network


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs; picklable, sent to every actor."""

    sweep: str = "sweep"
    workload: str = "resnet18"
    dataset: str = "synthetic"
    image_size: int = 32
    num_classes: int = 10
    batch_size: int = 32
    steps: int = 20
    warmup_steps: int = 3
    device: str = "cpu"
    seed: int = 0
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    strategy: str = "ring"
    workers: int = 1
    link: dict | None = None
    straggler: dict | None = None
    # failure injection and recovery (experiments/config/faults.py: their forms; strategies/faults.py: the modes)
    failures: dict | None = None
    recovery: dict | None = None
    timeout: float = 120.0
    strategy_params: dict = field(default_factory=dict)
    bucket_mb: float | None = None  # MiB per gradient bucket (DDP's grouping); None: one flat bucket
    overlap: bool = False  # sync each bucket from a communication thread as soon as its gradients are ready
    compute: str = "real"  # "real": the model computes; "profile": a measured timeline is replayed
    profile: str | None = None  # compute = "profile": a profile JSON file; None: measured at the run's start
    # what carries the messages (strategies.transport.names.P2P); a sweep that does not say takes default_p2p(device):
    # syncbench's sockets for host tensors, gloo/NCCL for GPU ones
    p2p: str = "sockets"
    # compression of the gradients (strategies/compression.py) and its parameters
    compression: str = "none"
    powersgd_rank: int = 1
    powersgd_start: int = 10
    powersgd_warm_start: bool = True
    topk_ratio: float = 0.01
    error_feedback: bool = True
    # local SGD / DiLoCo (strategies/local_sgd.py): average parameters every sync_every steps
    sync_every: int = 1
    outer_optimizer: str = "none"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    # time to target: {"metric": "accuracy" | "loss", "value": v}, evaluated on held-out data every eval_every steps
    # (and after the last), outside the timed part of the step; None: no target
    target: dict | None = None
    eval_every: int = 10
    # nodes of this many consecutive ranks: they share one NIC (the link) and talk over link.intra_* inside the node;
    # node-aware strategies (hierarchical) group by it
    ranks_per_node: int = 1
    # the sweep's `repeats`: this run is repeat number `repeat` (0-based) of its configuration, its seed seed + repeat
    repeat: int = 0
    # the first trace_steps steps after warm-up record every rank's phases and messages (experiments/pipeline/trace.py);
    # None: DEFAULT_TRACE_STEPS in a run of at most MAX_TRACED_RANKS ranks, none in a larger one
    trace_steps: int | None = None
    # what the model says of the strategy's size knob (strategies/knobs.py KnobChoice.record(): the knob, the value
    # used, whether the model chose it because the sweep left it unset, the model's best value and the run's value's
    # price over the best's); None: no size knob or no link to price. Derived from the settings: not in the run id,
    # and a run the model set is the same run as one the sweep set to that value (listed twice, it runs once)
    knob_choice: dict | None = field(default=None, compare=False)

    @property
    def run_id(self) -> str:
        """Stable across invocations: the same configuration always gets the same id (resume relies on it).

        128 bits of SHA-256 over every setting: two different runs collide with probability ~2^-128 (the
        8-hex-digit id before it collided for seeds 13466 and 31908); parse() checks uniqueness anyway.
        """
        settings = {k: v for k, v in asdict(self).items()
                    if k != "knob_choice" and not (k in _LATER_DEFAULTS and v == _LATER_DEFAULTS[k])}
        blob = json.dumps(settings, sort_keys=True, default=str)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:32]
        link = re.sub(r"[^A-Za-z0-9.]+", "_", self.link_label).strip("_")
        return f"{self.strategy}-n{self.workers}-{self.workload}-{link}-{digest}"

    @property
    def link_label(self) -> str:
        if not self.link:
            return "full speed"
        label = str(self.link["bandwidth"])
        if self.link.get("latency"):
            label += f" {self.link['latency']}"
        if self.link.get("intra_bandwidth") or self.link.get("intra_latency"):
            label += f" intra {self.link.get('intra_bandwidth', 'unlimited')}" + (
                f" {self.link['intra_latency']}" if self.link.get("intra_latency") else "")
        if self.link.get("ranks"):
            label += " (heterogeneous)"
        if self.link.get("emulation") == "kernel":
            label += " kernel"
        return label

    def network(self) -> Network | None:
        network = Network.from_spec(self.link)
        return network.with_nodes(self.ranks_per_node) if network and self.ranks_per_node > 1 else network

    @functools.cached_property
    def config(self):
        """The strategy with the run's compression and local-SGD settings applied (a strategy's own table may
        also set them: [strategy_params.ring] compression = "fp16"): a frozen StrategyConfig made once per RunSpec,
        on first use, and carried with it (a pickled RunSpec takes it to every actor; not a field: neither the run
        id nor equality see it, and replace() makes a new one)."""
        # a node-aware strategy groups ranks by the run's nodes unless its own table says otherwise
        node_aware = "ranks_per_node" in strategies.get(self.strategy).parameters()
        nodes = {"ranks_per_node": self.ranks_per_node} if node_aware else {}
        return strategies.make(self.strategy, **{**self.wrapper_settings(), **nodes, **self.strategy_params})

    def strategy_config(self):
        """The run's strategy config (RunSpec.config), made once."""
        return self.config

    def wrapper_settings(self) -> dict:
        """The compression and local-SGD settings the run applies (the strategy's table wins over the run's)."""
        return {k: self.strategy_params.get(k, getattr(self, k)) for k in WRAPPER_SETTINGS}

    def world_size(self) -> int:
        return self.strategy_config().world_size(self.workers)


def setting(point: dict, key: str):
    """A run setting of a grid point: its value, or RunSpec's default (the one place defaults live)."""
    return point.get(key, getattr(RunSpec, key))


# keys a sweep sets per run; `repeats` expands into runs with `repeat` = 0, 1, ... (set by parse, not by the sweep)
RUN_KEYS = ({f.name for f in fields(RunSpec)} - {"sweep", "strategy_params", "repeat", "knob_choice"}) | {"repeats"}
# Settings added after results existed: at these values they stay out of the run id, so earlier results resume
# (p2p: runs before the sockets became the default were gloo's, and a gloo run keeps that id).
_LATER_DEFAULTS = {"bucket_mb": None, "overlap": False, "compute": "real", "profile": None, "p2p": "gloo",
                   "target": None, "eval_every": 10, "ranks_per_node": 1, "repeat": 0, "trace_steps": None,
                   "failures": None, "recovery": None,
                   **{f.name: f.default for f in fields(RunSpec) if f.name in WRAPPER_SETTINGS}}

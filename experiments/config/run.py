"""RunSpec: one run's settings (a field per row of the table of settings, its default the row's), and the run id
that names it (resume relies on it)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, field, make_dataclass

import strategies
from experiments.config.settings import BY_NAME, NEVER, SETTINGS
from strategies.registry import WRAPPER_SETTINGS
from strategies.transport.link import Network


class _Run:
    """What a run knows of itself beyond its settings: its id, its link, its strategy config (RunSpec's methods)."""

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


# The run's fields: its sweep's name, a field per run setting of the table (its type and default, in table order),
# and what the sweep makes of the rest: the strategy's own parameters, which repeat the run is, the model's size knob.
RunSpec = make_dataclass("RunSpec", [
    ("sweep", str, field(default="sweep")),
    *[(one.name, one.annotation, field(default=one.default)) for one in SETTINGS if one.run_field],
    ("strategy_params", dict, field(default_factory=dict)),
    # the sweep's `repeats`: this run is repeat number `repeat` (0-based) of its configuration, its seed seed + repeat
    ("repeat", int, field(default=0)),
    # what the model says of the strategy's size knob (strategies/knobs.py KnobChoice.record(): the knob, the value
    # used, whether the model chose it because the sweep left it unset, the model's best value and the run's value's
    # price over the best's); None: no size knob or no link to price. Derived from the settings: not in the run id,
    # and a run the model set is the same run as one the sweep set to that value (listed twice, it runs once)
    ("knob_choice", dict | None, field(default=None, compare=False)),
], bases=(_Run,), frozen=True, namespace={"__doc__": "Everything one run needs; picklable, sent to every actor."})
RunSpec.__module__ = __name__  # pickled by reference: experiments.config.run.RunSpec


def setting(point: dict, key: str):
    """A run setting of a grid point: its value, or its default (the table's)."""
    return point.get(key, BY_NAME[key].default)


# keys a sweep sets per run; `repeats` expands into runs with `repeat` = 0, 1, ... (set by parse, not by the sweep)
RUN_KEYS = {one.name for one in SETTINGS if "." not in one.name}
# Settings added after results existed (the table's omitted_at): at these values they stay out of the run id, so
# earlier results resume; `repeat` 0 is the run without repeats.
_LATER_DEFAULTS = {**{one.name: one.id_omitted() for one in SETTINGS if one.run_field and one.omitted_at is not NEVER},
                   "repeat": 0}

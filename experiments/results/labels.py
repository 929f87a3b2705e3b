"""Display labels made from typed values on read, never stored: a rate ('1Gbit'), a time ('50us'), a link, a
strategy with its parameters, a simulated platform; and an Arrow type as `syncbench schema` prints it.
"""

from __future__ import annotations

import math

import pyarrow as pa


def _number(value: float) -> str:
    return f"{value:g}"


def rate_label(bytes_per_s: float) -> str:
    """125e6 bytes/s -> '1Gbit' (Gbit = 10^9 bits), the way sweeps spell links."""
    bits = bytes_per_s * 8
    for unit, scale in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3)):
        if bits >= scale:
            return f"{_number(bits / scale)}{unit}"
    return f"{_number(bits)}bit"


def time_label(seconds: float) -> str:
    """50e-6 -> '50us', 0.002 -> '2ms', 1.5 -> '1.5s'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{_number(round(seconds / scale, 9))}{unit}"
    return f"{_number(round(seconds / 1e-9, 6))}ns"


def link_label(bandwidth: float, latency_s: float, heterogeneous: bool, emulation: str, ranks=()) -> str:
    """'1Gbit 50us', '1Gbit (rank 1 on its own link) kernel' or 'full speed' (no emulated link); `ranks`: those
    with a link of their own ('(heterogeneous)' when a run says it had some but not which, as older results)."""
    if bandwidth is None or not math.isfinite(bandwidth):
        return "full speed"
    label = rate_label(bandwidth)
    if latency_s and math.isfinite(latency_s):
        label += f" {time_label(latency_s)}"
    ranks = [int(r) for r in (() if ranks is None else ranks)]
    if heterogeneous and ranks:
        label += (f" (rank {ranks[0]} on its own link)" if len(ranks) == 1
                  else f" (ranks {','.join(map(str, ranks))} on their own links)")
    elif heterogeneous:
        label += " (heterogeneous)"
    if emulation == "kernel":
        label += " kernel"
    return label


def strategy_label(strategy: str, params: dict) -> str:
    """'ring' or 'decentralized (topology=torus, weights=metropolis)': the strategy with the given parameters."""
    if not params:
        return strategy
    return f"{strategy} ({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})"


def platform_label(run) -> str:
    """The simulated platform in words, e.g. 'fat_tree 16/leaf 4:1, 1Gbit 50us'."""
    link = f"{rate_label(run['link_bandwidth'])} {time_label(run['link_latency_s'] or 0.0)}"
    if run["sim_topology"] == "fat_tree":
        return f"fat_tree {run['sim_hosts_per_leaf']}/leaf {_number(run['sim_oversubscription'])}:1, {link}"
    if run["sim_topology"] == "nodes":
        return (f"nodes of {run['sim_gpus_per_node']} ({rate_label(run['sim_intra_bandwidth'])} "
                f"{time_label(run['sim_intra_latency_s'])} inside), NIC {link}")
    return f"{run['sim_topology']}, {link}"


def type_name(type_) -> str:
    """int64, double, string, bool, list<int64>, timestamp[ms, UTC], or 'int64 | string' for a union's struct."""
    if isinstance(type_, str):
        return type_
    if pa.types.is_struct(type_):
        return " | ".join(str(member.type) for member in type_) + " (struct)"
    if pa.types.is_list(type_):
        return f"list<{type_.value_type}>"
    if pa.types.is_timestamp(type_):
        return f"timestamp[{type_.unit}, {type_.tz}]"
    return str(type_)

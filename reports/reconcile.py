"""One question, one answer: for every configuration the results hold, its communication per step as the model
prices it, as SimGrid simulated it (alpha_beta and tcp network models) and as it was measured (emulated and
kernel-shaped links), side by side; which of them to trust, by one rule; and how far each is from the others.

The rule (TRUST, most trusted first): measured on kernel-shaped links (real TCP through `tc tbf`) > measured on
python-emulated links > SimGrid tcp > SimGrid alpha_beta > the model. A measurement distorted by contention for the
machine (more ranks than cores, a shared GPU) is shown, never trusted over a simulation of the same configuration.

A configuration is everything that sets its communication: the workload, the strategy with its settings (typed
strategy_key: parameters, buckets, overlap, compression), the workers, the link's bandwidth, latency and
heterogeneity, the platform (one NIC per rank, nodes of k ranks sharing one, a fat tree), the straggler, and with
overlap the compute that hides the communication. The model's price is strategies/cost.py's, re-priced here for
the configuration: the strategy's analytic traffic per bucket as `syncbench model` counts it (critical_path),
rounds x latency + critical-path bytes / bandwidth summed over the run's buckets; on nodes, node_cost.
"""

from __future__ import annotations

import math

import pandas as pd

from experiments.results.schema import link_label, rate_label
from reports.levels import run_config
from reports.load import group_key, strategy_params
from reports.model import comm_time, critical_path, node_cost, workload_shapes
from workloads.buckets import make_buckets

KERNEL, EMULATED, TCP, ALPHA_BETA, MODEL = ("measured, kernel links", "measured, emulated links", "SimGrid tcp",
                                            "SimGrid alpha_beta", "model")
TRUST = (KERNEL, EMULATED, TCP, ALPHA_BETA, MODEL)  # most trusted first
AGREE = 0.15  # sources within 15% of the trusted one agree (the tolerance docs/validation.md holds tcp to)
SHOWN_DISAGREEMENTS = 5


def source(run) -> str:
    """Which of TRUST a run is: its substrate, and its link's emulation or its simulation's network model."""
    if run["substrate"] == "simgrid":
        return TCP if run["sim_network_model"] == "tcp" else ALPHA_BETA
    return KERNEL if run["link_emulation"] == "kernel" else EMULATED


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def platform(run) -> tuple:
    """The typed platform: ('star',), ('nodes', k, intra bytes/s or None) or ('fat_tree', hosts per leaf,
    oversubscription): measured nodes (ranks_per_node) and simulated ones (the nodes topology) are one platform. A
    simulation whose NIC is not 'shared' (SimGrid's TCP-like default) adds its NIC mode: another platform."""
    base = _base_platform(run)
    if run["substrate"] == "simgrid" and run["sim_nic"] not in ("", "shared"):
        return (*base, ("nic", str(run["sim_nic"])))
    return base


def _base_platform(run) -> tuple:
    if run["substrate"] == "simgrid":
        if run["sim_topology"] == "nodes":
            intra = run["sim_intra_bandwidth"]
            return ("nodes", int(run["sim_gpus_per_node"]), float(intra) if _finite(intra) else None)
        if run["sim_topology"] == "fat_tree":
            return ("fat_tree", int(run["sim_hosts_per_leaf"]), float(run["sim_oversubscription"]))
        return ("star",)
    if int(run["ranks_per_node"]) > 1:
        intra = run["link_intra_bandwidth"]
        return ("nodes", int(run["ranks_per_node"]), float(intra) if _finite(intra) else None)
    return ("star",)


def platform_label(key: tuple) -> str:
    if isinstance(key[-1], tuple):  # ("nic", mode): a simulated NIC mode other than shared
        return f"{platform_label(key[:-1])}, {key[-1][1]} NIC (simulated)"
    if key[0] == "nodes":
        inside = f", {rate_label(key[2])} inside" if key[2] else ""
        return f"nodes of {key[1]}{inside}"
    if key[0] == "fat_tree":
        return f"fat tree, {key[1]}/leaf, {key[2]:g}:1"
    return "one NIC per rank"


def configuration_key(run) -> tuple:
    """Everything that sets a run's communication per step (see the module's docstring), typed."""
    overlap_compute = (run["compute"], run["profile_id"]) if run["overlap"] else ()
    return (run["workload"], run["strategy_key"], int(run["workers"]),
            *group_key((run["link_bandwidth"], run["link_latency_s"])), bool(run["link_heterogeneous"]),
            platform(run), tuple(run["straggler_ranks"]), float(run["straggler_slowdown"]), overlap_compute)


def model_comm_s(run) -> tuple[float, str]:
    """The model's communication per step for this run's configuration, and '' or why it has none."""
    bandwidth, latency = run["link_bandwidth"], run["link_latency_s"]
    if not _finite(bandwidth):
        return math.nan, "no emulated bandwidth to price (full-speed link)"
    if run["overlap"]:
        return math.nan, "overlapped with backward: exposed time depends on the compute (syncbench model --profile)"
    if len(run["straggler_ranks"]) and run["straggler_slowdown"] != 1.0:
        return math.nan, "a straggler: the model prices no compute imbalance"
    if bool(run["link_heterogeneous"]):
        return math.nan, "heterogeneous links: the model prices one link for every rank"
    where = platform(run)
    if where[0] == "fat_tree":
        return math.nan, "a fat tree: the model prices no oversubscribed uplinks"
    workers, numel = int(run["workers"]), int(run["numel"])
    latency = float(latency) if _finite(latency) else 0.0
    try:
        if where[0] == "nodes":
            cost = node_cost(run_config(run), workers, numel, where[1], float(bandwidth),
                             where[2] if where[2] else math.inf, latency)
            return cost.time_s, "priced for one buffer on nodes (node_cost)"
        params = strategy_params(run)
        shapes = workload_shapes(run["workload"], numel)
        bucket_mb = run["bucket_mb"]
        if _finite(bucket_mb) and shapes is not None:
            buckets = [b.numel for b in make_buckets([math.prod(s) for s in shapes], float(bucket_mb))]
            priced = [critical_path(run["strategy"], workers, b, params)[:2] for b in buckets]
            note = f"{len(buckets)} buckets of {bucket_mb:g} MiB" if len(buckets) > 1 else ""
        else:
            priced = [critical_path(run["strategy"], workers, numel, params, shapes=shapes)[:2]]
            note = "priced as one bucket (the workload's tensors are not known here)" if _finite(bucket_mb) else ""
        return sum(comm_time(rounds, path, float(bandwidth), latency) for rounds, path in priced), note
    except (ValueError, NotImplementedError, TypeError) as e:
        return math.nan, f"not priced: {str(e).split(':')[0]}"


def _label(run) -> str:
    """The configuration's display label without the substrate's mark (it is the column here)."""
    label = str(run["config_label"])
    for mark in (" [simulated]", " [profile]"):
        label = label.replace(mark, "")
    return label


def reconcile_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration with several workers: communication per step (ms) from every source that has
    it, the trusted source by TRUST and each other source as a multiple of it, the spread (largest / smallest) and
    notes (why the model has no price, a distorted measurement not trusted)."""
    runs = ok[(ok["workers"] > 1) & ~ok["bypasses_link"]]
    if runs.empty:
        return pd.DataFrame()
    keys = [configuration_key(run) for _, run in runs.iterrows()]
    sources = [source(run) for _, run in runs.iterrows()]
    runs = runs.assign(_key=keys, _source=sources)
    rows = []
    for _, group in runs.groupby("_key", sort=False):
        first = group.iloc[0]
        values: dict[str, float] = {}
        notes = []
        distorted = []
        for name in TRUST[:-1]:
            at = group[group["_source"] == name]
            if at.empty:
                continue
            values[name] = float(at["comm_s"].mean())
            if at["distorted"].any():
                distorted.append(name)
        model, why = model_comm_s(first)
        if _finite(model):
            values[MODEL] = model
        if why:
            notes.append(f"model: {why}")
        if distorted:
            notes.append(f"{', '.join(distorted)}: distorted by contention for the machine, not trusted")
        trusted = next((name for name in TRUST if name in values and name not in distorted), "")
        if not trusted and values:
            trusted = next(name for name in TRUST if name in values)
        row = {"workload": first["workload"], "configuration": _label(first), "workers": int(first["workers"]),
               "link": link_label(first["link_bandwidth"], first["link_latency_s"], first["link_heterogeneous"], "",
                                 first["link_ranks"]),
               "platform": platform_label(platform(first))}
        row |= {f"{name} ms": values.get(name, math.nan) * 1e3 for name in TRUST}
        row["trusted"] = trusted
        base = values.get(trusted, math.nan)
        row["others / trusted"] = "; ".join(f"{name} {values[name] / base:.2f}x" for name in TRUST
                                            if name in values and name != trusted and base > 0)
        finite = [v for v in values.values() if v > 0]
        row["spread"] = max(finite) / min(finite) if len(finite) > 1 else math.nan
        row["sources"] = len(values)
        row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["workload", "link", "platform", "workers", "configuration"],
                                          kind="stable").reset_index(drop=True)


def disagreements(frame: pd.DataFrame) -> list[str]:
    """The configurations whose sources disagree beyond AGREE, widest first (at most SHOWN_DISAGREEMENTS): which
    number the report trusts, by which rule, and how far the others are."""
    if frame.empty:
        return []
    wide = frame[frame["spread"] > 1 + AGREE].sort_values("spread", ascending=False)
    out = []
    for _, row in wide.head(SHOWN_DISAGREEMENTS).iterrows():
        trusted = row["trusted"]
        out.append(f"{row['configuration']}, {row['workers']} workers, {row['link']}, {row['platform']} "
                   f"({row['workload']}): the sources differ up to {row['spread']:.2f}x; trusted: {trusted}, "
                   f"{row[f'{trusted} ms']:,.2f} ms per step (the most trusted source that has it); "
                   f"{row['others / trusted']}.")
    if len(wide) > SHOWN_DISAGREEMENTS:
        out.append(f"... and {len(wide) - SHOWN_DISAGREEMENTS} more configurations beyond {AGREE:.0%} in the table.")
    return out

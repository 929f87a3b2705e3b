"""The [simulate] table of `syncbench simulate`: each key's type and range, checked before anything is simulated."""

from __future__ import annotations

from experiments.config.settings import MAX_RANKS, RANGES, Range, SweepError, report, type_problem
from strategies.transport.link import parse_bandwidth, parse_latency

# The [simulate] table of `syncbench simulate` (experiments/simulate/): each key's type and range,
# checked before anything is simulated (docs/settings.md). A list is one more grid axis (keys
# but the compute timeline's), each value checked. inf oversubscription or a 1e300 s latency crashed SimGrid.
SIMULATE_TYPES = {"topology": str, "network_model": str, "nic": str, "hosts_per_leaf": int, "oversubscription": float,
                  "gpus_per_node": int, "intra_bandwidth": "bandwidth", "intra_latency": "latency", "profile": str,
                  "forward_s": float, "backward_s": float, "optimizer_s": float, "bucket_mb": float, "overlap": bool}
SIMULATE_RANGES: dict[str, Range] = {
    "simulate.hosts_per_leaf": Range(1, MAX_RANKS),
    "simulate.gpus_per_node": Range(1, 1_024),
    "simulate.oversubscription": Range(1, 1_024),  # 1 = full bisection bandwidth, 4 = 4:1
    "simulate.intra_bandwidth": RANGES["link.bandwidth"],
    "simulate.intra_latency": RANGES["link.latency"],
    "simulate.forward_s": Range(0, 86_400),
    "simulate.backward_s": Range(0, 86_400),
    "simulate.optimizer_s": Range(0, 86_400),
    "simulate.bucket_mb": RANGES["bucket_mb"],
}
_SIMULATE_SCALARS = ("profile", "forward_s", "backward_s", "optimizer_s")  # the compute timeline: one value each


def check_simulate(table, where: str) -> None:
    """Types (strict: the string "false" is not false) and ranges of a [simulate] table; SweepError listing every
    problem with its key, its value and what is accepted. Keys it does not know are left to the caller."""
    if not isinstance(table, dict):
        raise SweepError(f"{where}: simulate = {table!r}: expected a table ([simulate])")
    errors = []
    for key, typ in SIMULATE_TYPES.items():
        if key not in table:
            continue
        values = table[key]
        if isinstance(values, list) and key not in _SIMULATE_SCALARS:
            if not values:
                errors.append(f"simulate.{key} = []: expected a value or a non-empty list of values")
        else:
            values = [values]
        for value in values:
            if problem := _simulate_problem(key, typ, value):
                errors.append(problem)
    if errors:
        raise SweepError(report(where, sorted(set(errors), key=errors.index)))


def _simulate_problem(key: str, typ, value) -> str | None:
    name = f"simulate.{key}"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ in ("bandwidth", "latency"):
        parse = parse_bandwidth if typ == "bandwidth" else parse_latency
        if not isinstance(value, str) and not number:
            example = '"150Gbit"' if typ == "bandwidth" else '"2us"'
            return f"{name} = {value!r}: expected a {typ} like {example}"
        try:
            value = parse(value)
        except ValueError as e:
            return f"{name}: {e}"
        if SIMULATE_RANGES[name].problem(name, value):
            shown = f"{value:g} bytes/s" if typ == "bandwidth" else f"{value:g} s"
            return f"{name} = {shown}: accepted are {SIMULATE_RANGES[name].describe()}"
        return None
    if problem := type_problem(name, typ, value):
        return problem + (" (not a string)" if typ is bool else "")
    if name in SIMULATE_RANGES:
        return SIMULATE_RANGES[name].problem(name, value)
    return None

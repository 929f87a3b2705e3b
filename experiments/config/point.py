"""One grid point of a sweep -> its RunSpec: every value checked against the table of settings and the run it
makes (model, link, strategy, ranks), each problem named with its key, its value and what is accepted."""

from __future__ import annotations

import functools

import strategies
from experiments.config import faults as fault_settings
from experiments.config.run import RUN_KEYS, RunSpec, setting
from experiments.config.settings import (
    BY_NAME,
    MAX_RANKS,
    MAX_TRACED_RANKS,
    RANGES,
    SETTINGS,
    TYPES,
    is_int,
    is_number,
    type_problem,
)
from strategies.base import PARAMETERS
from strategies.cost import Fabric
from strategies.knobs import choose
from strategies.registry import WRAPPER_SETTINGS
from strategies.transport.link import Network
from strategies.transport.names import P2P, default_p2p
from workloads.buckets import make_buckets
from workloads.data import DATASETS
from workloads.models import MODELS, check_model_args, memory_problem, param_count, param_sizes
from workloads.profile import ProfileError, load_profile

DEVICES = ("cpu", "cuda")
COMPUTE_MODES = ("real", "profile")
TARGET_METRICS = ("accuracy", "loss")  # target = { metric = "accuracy", value = 0.95 }: held-out top-1 or mean loss


def make_spec(name: str, point: dict, params_by_strategy: dict, errors: list[str],
              ranks_seen: dict[int, list[bool]] | None = None, measured: bool = True) -> RunSpec | None:
    """One grid point -> RunSpec, appending an error per bad value (key, value, what is accepted)."""
    start = len(errors)
    if not _check_types(point, errors):
        return None
    _check_choices(point, errors)
    _check_ranges(point, errors)
    _check_model(point, errors, measured, start)
    link = _parse_link(point, errors)
    straggler = point.get("straggler")
    if straggler is not None:
        straggler = _check_straggler(straggler, errors)
    if point.get("target") is not None:
        point["target"] = _check_target(point, errors)
    if len(errors) > start:
        return None
    made = _strategy_config(point, params_by_strategy, errors)
    if made is None:
        return None
    strategy, params, wrappers, config, world = made
    if not _check_world(point, config, world, errors):
        return None
    knob = None
    if link and len(errors) == start and setting(point, "workload") in MODELS:
        params, knob = _size_knob(strategy, params, wrappers, point, Network.from_spec(link))
    link = _link_of_run(link, world, ranks_seen)
    workers = setting(point, "workers")
    for rank in (straggler or {}).get("ranks", []):
        if rank >= workers:  # an empty straggler would record a balanced run as a straggler one
            errors.append(f"straggler.ranks = {straggler['ranks']!r}: workers = {workers} has worker ranks "
                          f"0..{workers - 1} only")
            break
    _check_compute(point, config, errors)
    if "failures" in point or "recovery" in point:
        point["failures"], point["recovery"] = fault_settings.check(point, config, workers, setting(point, "steps"),
                                                                    errors)
    if len(errors) > start:
        return None
    return _spec(name, point, link, straggler, params, knob, config)


def _check_types(point: dict, errors: list[str]) -> bool:
    """Each setting of the point has its table type (an int given for a float becomes that float); False when
    one does not."""
    start = len(errors)
    for key, typ in TYPES.items():
        if key not in point:
            continue
        if problem := type_problem(key, typ, point[key]):
            errors.append(problem)
        elif typ is float:
            point[key] = float(point[key])
    return len(errors) == start


def _check_choices(point: dict, errors: list[str]) -> None:
    """workload, dataset, device, strategy and p2p name things that exist (p2p: the device's default if unset)."""
    def bad(key, accepted):
        errors.append(f"{key} = {point[key]!r}: accepted are {accepted}")

    for key, known in (("workload", MODELS), ("dataset", DATASETS), ("device", DEVICES),
                       ("strategy", strategies.names())):
        if setting(point, key) not in known:
            bad(key, ", ".join(known))
    if "p2p" not in point:  # recorded in the run: its id and transport say which it took
        point["p2p"] = default_p2p(setting(point, "device"))
    if point["p2p"] not in P2P:
        bad("p2p", ", ".join(P2P))
    elif point["p2p"] != "gloo" and setting(point, "device") == "cuda":
        errors.append(f"p2p = {point['p2p']!r} with device = \"cuda\": syncbench's sockets carry host tensors; "
                      f"GPU runs take p2p = \"gloo\" (NCCL when every rank has its own GPU)")


def _check_ranges(point: dict, errors: list[str]) -> None:
    for one in SETTINGS:
        if one.range is not None and one.name in point and (problem := one.range.problem(one.name, point[one.name])):
            errors.append(problem)


def _check_model(point: dict, errors: list[str], measured: bool, start: int) -> None:
    """The model's arguments, a batch one rank can hold (a measured run), digits' classes, timed steps."""
    if setting(point, "workload") in MODELS:
        try:
            check_model_args(setting(point, "workload"), setting(point, "num_classes"), setting(point, "image_size"))
        except ValueError as e:
            errors.append(f"workload {point.get('workload', 'resnet18')!r}: {e}")
        else:  # a batch one rank cannot train here: said now, not by the allocator once Ray has started
            model = (setting(point, k) for k in ("workload", "num_classes", "image_size", "batch_size", "device"))
            # a replayed profile keeps no activations, but one measured at the start of the sweep does
            computes = measured and (setting(point, "compute") == "real" or point.get("profile") is None)
            if computes and len(errors) == start and (problem := memory_problem(*model)):
                errors.append(problem)
    if point.get("dataset") == "digits" and setting(point, "num_classes") < 10:
        errors.append(f"num_classes = {point['num_classes']!r}: the digits data set has 10 classes, need >= 10")
    steps, warmup = setting(point, "steps"), setting(point, "warmup_steps")
    if not 0 <= warmup < steps:
        errors.append(f"warmup_steps = {warmup!r}: must be >= 0 and less than steps ({steps}) so some steps are timed")


def _parse_link(point: dict, errors: list[str]) -> dict | None:
    """link = "1Gbit" or a table, or none; its bandwidths and latencies in their ranges."""
    link = point.get("link")
    if link in ("none", "off", False, "full speed"):
        return None
    if isinstance(link, str):
        link = {"bandwidth": link}
    if link is None:
        return None
    if not isinstance(link, dict):
        errors.append(f"link = {link!r}: expected a table like {{ bandwidth = \"1Gbit\", latency = \"50us\" }} "
                      f"or \"none\"")
        return link
    try:
        network = Network.from_spec(link)
    except ValueError as e:
        errors.append(f"link: {e}")
    else:
        _check_link_ranges(link, network, errors)
    return link


def _strategy_config(point: dict, params_by_strategy: dict, errors: list[str]):
    """(strategy, its parameters, the run's wrapper settings, its config, world size), or None after an error."""
    strategy = setting(point, "strategy")
    params = dict(params_by_strategy.get(strategy, {})) if isinstance(params_by_strategy.get(strategy), dict) else {}
    try:
        strategies.make(strategy, **params)
    except (ValueError, TypeError) as e:
        errors.append(f"strategy_params.{strategy}: {e}")
        return None
    try:  # the run's compression and local-SGD settings, applied to this strategy
        wrappers = {k: point[k] for k in WRAPPER_SETTINGS if k in point}
        config = strategies.make(strategy, **{**wrappers, **params})
    except (ValueError, TypeError) as e:
        errors.append(f"strategy {strategy!r}: {e}")
        return None
    try:
        world = config.world_size(setting(point, "workers"))
    except ValueError as e:  # a setting that does not fit this many workers (colocated servers, backups)
        errors.append(f"strategy_params.{strategy}: {e}")
        return None
    return strategy, params, wrappers, config, world


def _check_world(point: dict, config, world: int, errors: list[str]) -> bool:
    """A traced run small enough, at most MAX_RANKS ranks, and messages the model's gradients allow; False when
    the strategy's messages do not fit (the run is not made)."""
    strategy, workers = setting(point, "strategy"), setting(point, "workers")
    if point.get("trace_steps") and world > MAX_TRACED_RANKS:
        errors.append(f"trace_steps = {point['trace_steps']} with {world:,} ranks: runs of at most "
                      f"{MAX_TRACED_RANKS} ranks are traced (the events table stays bounded); set trace_steps = 0")
    if world > MAX_RANKS:
        servers = f" + {world - workers} server(s)" if world > workers else ""
        errors.append(f"{strategy} with workers = {workers}{servers} needs {world:,} ranks: at most {MAX_RANKS:,}")
    elif setting(point, "workload") in MODELS:
        try:  # a partition, chunk or pipeline setting that would cut the model's gradients into too many messages
            config.check_messages(workers, _param_count(setting(point, "workload"), setting(point, "num_classes"),
                                                        setting(point, "image_size")))
        except ValueError as e:
            errors.append(f"strategy_params.{strategy}: {e}")
            return False
    return True


def _link_of_run(link: dict | None, world: int, ranks_seen: dict[int, list[bool]] | None) -> dict | None:
    """A per-rank link applies to the runs that have that rank (a 1-worker baseline beside 4-worker runs keeps
    the default link, and its label says so); a rank no run of the sweep has is refused by parse()."""
    if not (link and link.get("ranks")):
        return link
    ranks = {r: sub for r, sub in link["ranks"].items() if int(r) < world}
    if ranks_seen is not None:
        for r in link["ranks"]:
            ranks_seen.setdefault(int(r), []).append(int(r) < world)
    return {**link, "ranks": ranks} if ranks else {k: v for k, v in link.items() if k != "ranks"}


def _spec(name: str, point: dict, link, straggler, params: dict, knob, config) -> RunSpec:
    if config.role == PARAMETERS or config.wraps_model:
        # neighbour averaging works on parameters, which exist only after the local step: it never overlaps;
        # DistributedDataParallel always does. One run each, whatever the grid says.
        point["overlap"] = config.wraps_model
    if link and link.get("emulation") == "python":  # the default: the same run id with or without it
        link = {k: v for k, v in link.items() if k != "emulation"}
    values = {k: v for k, v in point.items() if k in RUN_KEYS and k not in ("link", "straggler", "repeats")}
    if values.get("target") is None:
        values.pop("target", None)
    return RunSpec(sweep=name, link=link, straggler=straggler, strategy_params=params, knob_choice=knob, **values)


def _size_knob(strategy: str, params: dict, wrappers: dict, point: dict, network: Network) -> tuple[dict, dict | None]:
    """The run's strategy parameters with an unset size knob set to the value the model prices cheapest for its
    workers, servers, buckets and link (the default link of a heterogeneous one), and the KnobChoice record; the
    parameters unchanged and None when the strategy has no size knob or the model cannot price the run."""
    nodes = {"ranks_per_node": setting(point, "ranks_per_node")} \
        if "ranks_per_node" in strategies.get(strategy).parameters() else {}
    sizes = param_sizes(setting(point, "workload"), setting(point, "num_classes"), setting(point, "image_size"))
    buckets = [b.numel for b in make_buckets(sizes, setting(point, "bucket_mb"))]
    fabric = Fabric(network.default.bandwidth, network.default.latency, setting(point, "ranks_per_node"),
                    network.intra.bandwidth, network.intra.latency)
    choice = choose(strategy, params, setting(point, "workers"), buckets, fabric, sum(sizes),
                    make=lambda **p: strategies.make(strategy, **{**wrappers, **nodes, **p}))
    if choice is None:
        return params, None
    return {**params, choice.knob: choice.value}, choice.record()


@functools.lru_cache(maxsize=64)
def _param_count(workload: str, num_classes: int, image_size: int) -> int:
    return param_count(workload, num_classes, image_size)


def _check_compute(point: dict, config, errors: list[str]) -> None:
    """compute, profile and bucket_mb: a mode that exists, a profile file that fits the run's model and batch."""
    compute = setting(point, "compute")
    if compute not in COMPUTE_MODES:
        errors.append(f"compute = {compute!r}: accepted are {', '.join(COMPUTE_MODES)}")
        return
    path = point.get("profile")
    if path is None:
        return
    if compute != "profile":
        errors.append(f"profile = {path!r} with compute = {compute!r}: a profile is replayed only with "
                      f"compute = \"profile\" (accepted: set compute = \"profile\", or drop profile)")
        return
    try:
        profile = load_profile(path)
        profile.check_run(setting(point, "workload"), setting(point, "batch_size"), setting(point, "image_size"),
                          setting(point, "num_classes"), where=f"profile = {path!r}")
    except ProfileError as e:
        errors.append(str(e))


def _check_target(point: dict, errors: list[str]) -> dict | None:
    """target = { metric = "accuracy", value = 0.95 } (or a loss): a metric, a reachable value, held-out data to
    evaluate on and a model that trains (compute = "real")."""
    value = point["target"]
    if not isinstance(value, dict) or set(value) != {"metric", "value"} or value["metric"] not in TARGET_METRICS:
        errors.append(f"target = {value!r}: expected {{ metric = \"accuracy\", value = 0.95 }} or {{ metric = "
                      f"\"loss\", value = 0.3 }} (metrics: {', '.join(TARGET_METRICS)})")
        return None
    number = value["value"]
    high = 1.0 if value["metric"] == "accuracy" else 1e6
    if not is_number(number) or not 0 < number <= high:
        errors.append(f"target.value = {number!r}: accepted for {value['metric']} are numbers > 0 and <= {high:g}")
        return None
    if setting(point, "dataset") != "digits":
        errors.append(f"target with dataset = {point.get('dataset', 'synthetic')!r}: a target is evaluated on held-out "
                      f"data (accepted: dataset = \"digits\")")
    if setting(point, "compute") != "real":
        errors.append(f"target with compute = {point.get('compute')!r}: a replayed profile does not train "
                      f"(accepted: compute = \"real\"; or [grid] compute = [\"real\", \"profile\"]: the profile "
                      f"runs become the real ones' twins, without a target, and give the seconds per step)")
    return {"metric": value["metric"], "value": float(number)}


def _check_straggler(value, errors: list[str]) -> dict | None:
    if not isinstance(value, dict) or set(value) - {"ranks", "slowdown"} or "ranks" not in value:
        errors.append(f"straggler = {value!r}: expected {{ ranks = [1], slowdown = 2.0 }}")
        return None
    ranks, slowdown = value["ranks"], value.get("slowdown", BY_NAME["straggler.slowdown"].default)
    if not isinstance(ranks, list) or not ranks or not all(is_int(r) and r >= 0 for r in ranks):
        errors.append(f"straggler.ranks = {ranks!r}: expected a non-empty list of worker ranks (integers >= 0)")
        return None
    if problem := BY_NAME["straggler.slowdown"].problem(slowdown):
        errors.append(problem + " (2.0 = compute takes twice as long)")
        return None
    return {"ranks": ranks, "slowdown": float(slowdown)}


def _check_link_ranges(link: dict, network: Network, errors: list[str]) -> None:
    """Bandwidth and latency of the default link and of every per-rank override, against RANGES."""
    links = [("link", network.default)] + [(f"link.ranks.{rank}", one) for rank, one in network.overrides]
    for where, one in links:
        for name, value, shown in (("bandwidth", one.bandwidth, f"{one.bandwidth:g} bytes/s"),
                                   ("latency", one.latency, f"{one.latency:g} s")):
            if RANGES[f"link.{name}"].problem(name, value):
                errors.append(f"{where}.{name} = {shown}: accepted are {RANGES[f'link.{name}'].describe()}")
    # the link inside a node: the NIC's ranges (a 1 bit/s or 2 s intra-node link sat silent past the timeout)
    for name, value, unit in (("bandwidth", network.intra.bandwidth, "bytes/s"),
                              ("latency", network.intra.latency, "s")):
        if f"intra_{name}" in link and RANGES[f"link.{name}"].problem(name, value):
            errors.append(f"link.intra_{name} = {value:g} {unit}: accepted are {RANGES[f'link.{name}'].describe()}")

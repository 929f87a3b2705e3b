"""The strategy registry: built-ins register in strategies/__init__.py, plug-ins through entry points.

A third-party package exposes `StrategyConfig` subclasses in the entry-point group `syncbench.strategies`:

    [project.entry-points."syncbench.strategies"]
    my_ring = "my_package.my_ring:MyRingConfig"
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

from strategies.base import MAX_MESSAGES, ROLES, Strategy, StrategyConfig, Traffic
from strategies.ops import OPS

ENTRY_POINT_GROUP = "syncbench.strategies"

_REGISTRY: dict[str, type[StrategyConfig]] = {}
_entry_points_loaded = False
_SKIPPED: dict[str, str] = {}  # plug-ins that failed to load: name -> why (one line)


def contract_problems(config_cls: type[StrategyConfig]) -> list[str]:
    """What a strategy class lacks or gets wrong of the plug-in contract (see StrategyConfig); [] if none."""
    problems = []
    name = getattr(config_cls, "name", "")
    if not isinstance(config_cls, type) or not issubclass(config_cls, StrategyConfig):
        return [f"{config_cls!r} is not a StrategyConfig subclass"]
    if not name or not name.isidentifier():
        problems.append(f"a `name` that is an identifier (got {name!r})")
    if not config_cls.summary:
        problems.append("a one-line `summary`")
    if config_cls.role not in ROLES:
        problems.append(f"a `role` among {', '.join(ROLES)} (got {config_cls.role!r})")
    runtime = getattr(config_cls, "runtime", None)
    if not (isinstance(runtime, type) and issubclass(runtime, Strategy)):
        problems.append(f"a `runtime` that is a Strategy subclass (got {runtime!r})")
    if config_cls.traffic is StrategyConfig.traffic:
        problems.append("a `traffic(workers, numel, itemsize)` method stating its analytic cost")
    bad_ops = [op for op in config_cls.ops if op not in OPS]
    if not config_cls.ops or bad_ops:
        problems.append(f"`ops` drawn from {', '.join(OPS)} (got {config_cls.ops!r})")
    if config_cls.exact and not config_cls.identical:
        problems.append("`identical = True`: an exact strategy must leave every rank bitwise identical")
    if not config_cls.exact:
        for method in ("mixing_matrix", "spectral_gap"):
            if getattr(config_cls, method) is getattr(StrategyConfig, method):
                problems.append(f"a `{method}` method (it is not exact: exact = False)")
    if config_cls.wraps_model and config_cls.wrap is StrategyConfig.wrap:
        problems.append("a `wrap(model, bucket_mb, device)` method (it declares wraps_model = True)")
    if not config_cls.variants or not all(isinstance(v, dict) for v in config_cls.variants):
        problems.append(f"`variants`: a non-empty tuple of parameter dicts (got {config_cls.variants!r})")
    elif not problems:
        for params in config_cls.variants:
            try:
                config = config_cls(**params)
                traffic = config.traffic(2, 8)
            except Exception as e:  # noqa: BLE001 - reported as a contract problem
                problems.append(f"variant {params!r} to build and state its traffic ({type(e).__name__}: {e})")
                continue
            if traffic.counted != config_cls.counted:
                problems.append(f"`counted = {config_cls.counted}` to agree with traffic().counted "
                                f"({traffic.counted}) for variant {params!r}")
            if problem := _traffic_probe(config, params):
                problems.append(problem)
    return problems


# Sizes every variant's traffic() is asked about at registration (2 workers, as above): empty, one element, odd,
# a prime past a million, and past 2**31 elements (8 GiB of fp32, an int32 index overflows). `model`, the report
# and a sweep price any of them after the run's work: a traffic() that raises there must not pass registration.
PROBE_NUMELS = (0, 1, 7, 1_000_003, 2**31 + 11)


def _traffic_probe(config: StrategyConfig, params: dict) -> str | None:
    """The first size at which the variant's traffic() fails or returns no Traffic, as a contract problem."""
    for numel in PROBE_NUMELS:
        try:
            if config.messages(2, numel) > MAX_MESSAGES:  # refused by check_messages before anyone prices it
                continue
            traffic = config.traffic(2, numel)
        except Exception as e:  # noqa: BLE001 - reported as a contract problem
            return (f"variant {params!r} to state its traffic for 2 workers and numel = {numel:,} "
                    f"({type(e).__name__}: {' '.join(str(e).split())[:200]})")
        if not isinstance(traffic, Traffic):
            return (f"variant {params!r}: traffic(2, {numel:,}) to return a Traffic (got "
                    f"{type(traffic).__name__})")
    return None


def register(config_cls: type[StrategyConfig]) -> type[StrategyConfig]:
    """Register a strategy's config class under its `name`; a duplicate name or a broken contract is an error."""
    problems = contract_problems(config_cls)
    if problems:
        who = getattr(config_cls, "__qualname__", repr(config_cls))
        raise ValueError(f"strategy class {who} ({getattr(config_cls, 'name', '')!r}) cannot be registered; "
                         f"it needs " + "; ".join(problems))
    name = config_cls.name
    if name in _REGISTRY and _REGISTRY[name] is not config_cls:
        raise ValueError(f"strategy name {name!r} is already registered by {_REGISTRY[name].__module__}; "
                         f"choose another name")
    _REGISTRY[name] = config_cls
    return config_cls


def settings() -> list[tuple[str, dict]]:
    """Every registered strategy with each of its declared variants: what the generic tests cover."""
    return [(name, dict(params)) for name in names() for params in get(name).variants]


def _load_entry_points() -> None:
    """Register every plug-in of the entry-point group; one that fails to import or to register is skipped and
    reported in one line (on stderr, and by `skipped_plugins()` for `syncbench strategies`), never raised: a
    broken third-party package must not break commands that do not use it."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
            if getattr(cls, "name", None) != ep.name:
                raise ValueError(f"it loads a strategy named {getattr(cls, 'name', None)!r}: the two names must "
                                 f"match")
            register(cls)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure of foreign code: skip the plug-in
            detail = " ".join(str(e).split()) or "no message"
            where = f" (package {ep.dist.name} {ep.dist.version})" if getattr(ep, "dist", None) else ""
            _SKIPPED[ep.name] = (f"plug-in strategy {ep.name!r} = {ep.value}{where} skipped: "
                                 f"{type(e).__name__}: {detail}")
            print(f"syncbench: {_SKIPPED[ep.name]}", file=sys.stderr)


def skipped_plugins() -> dict[str, str]:
    """Plug-ins of the entry-point group that failed to import or register: name -> one line saying why."""
    _load_entry_points()
    return dict(_SKIPPED)


def names() -> list[str]:
    """Every registered strategy, in registration order."""
    _load_entry_points()
    return list(_REGISTRY)


def get(name: str) -> type[StrategyConfig]:
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        skipped = f" ({_SKIPPED[name]})" if name in _SKIPPED else ""
        raise ValueError(f"unknown strategy {name!r}: known are {', '.join(_REGISTRY)}{skipped}") from None


def make(name: str, **params) -> StrategyConfig:
    """Build a strategy's settings; an unknown parameter names the accepted ones. The run settings of
    compression (strategies/compression.py) and local SGD (strategies/local_sgd.py) wrap it, applied here once
    for every strategy: at their defaults the strategy is returned as it is."""
    from strategies.compression import Compression, compress
    from strategies.local_sgd import LocalSgd, local_sgd

    cls = get(name)
    wrappers = {k: params.pop(k) for k in list(params) if k in WRAPPER_SETTINGS}
    accepted = cls.parameters()
    unknown = set(params) - set(accepted)
    if unknown:
        listed = ", ".join(f"{k} (default {v!r})" for k, v in accepted.items()) or "none"
        raise ValueError(f"unknown parameter(s) {sorted(unknown)} for strategy {name!r}: accepted are {listed} "
                         f"(and the run settings {', '.join(WRAPPER_SETTINGS)})")
    config = cls(**params)
    compression = Compression(**{k: v for k, v in wrappers.items() if k in COMPRESSION_SETTINGS})
    local = LocalSgd(**{k: v for k, v in wrappers.items() if k in LOCAL_SGD_SETTINGS})
    if compression.compression != "none" and local.sync_every != 1:
        raise ValueError(f"compression = {compression.compression!r} with sync_every = {local.sync_every}: "
                         f"compression applies to gradients, local SGD averages parameters (accepted: one of them)")
    return local_sgd(compress(config, compression), local)


COMPRESSION_SETTINGS = ("compression", "powersgd_rank", "powersgd_start", "powersgd_warm_start", "topk_ratio",
                        "error_feedback")
LOCAL_SGD_SETTINGS = ("sync_every", "outer_optimizer", "outer_lr", "outer_momentum")
WRAPPER_SETTINGS = COMPRESSION_SETTINGS + LOCAL_SGD_SETTINGS

"""The strategy registry: built-ins register in strategies/__init__.py, plug-ins through entry points.

A third-party package exposes `StrategyConfig` subclasses in the entry-point group `syncbench.strategies`:

    [project.entry-points."syncbench.strategies"]
    my_ring = "my_package.my_ring:MyRingConfig"
"""

from __future__ import annotations

from importlib.metadata import entry_points

from strategies.base import ROLES, StrategyConfig

ENTRY_POINT_GROUP = "syncbench.strategies"

_REGISTRY: dict[str, type[StrategyConfig]] = {}
_entry_points_loaded = False


def register(config_cls: type[StrategyConfig]) -> type[StrategyConfig]:
    """Register a strategy's config class under its `name`; a duplicate name is an error."""
    name = getattr(config_cls, "name", "")
    if not name or not name.isidentifier():
        raise ValueError(f"strategy class {config_cls.__qualname__} needs a `name` that is an identifier, "
                         f"got {name!r}")
    if config_cls.role not in ROLES:
        raise ValueError(f"strategy {name!r} has role {config_cls.role!r}: accepted are {', '.join(ROLES)}")
    if name in _REGISTRY and _REGISTRY[name] is not config_cls:
        raise ValueError(f"strategy name {name!r} is already registered by {_REGISTRY[name].__module__}; "
                         f"choose another name")
    _REGISTRY[name] = config_cls
    return config_cls


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if getattr(cls, "name", None) != ep.name:
            raise ValueError(f"entry point {ep.name!r} in {ENTRY_POINT_GROUP} loads a strategy named "
                             f"{getattr(cls, 'name', None)!r}: the two names must match")
        register(cls)


def names() -> list[str]:
    """Every registered strategy, in registration order."""
    _load_entry_points()
    return list(_REGISTRY)


def get(name: str) -> type[StrategyConfig]:
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}: known are {', '.join(_REGISTRY)}") from None


def make(name: str, **params) -> StrategyConfig:
    """Build a strategy's settings; an unknown parameter names the accepted ones."""
    cls = get(name)
    accepted = cls.parameters()
    unknown = set(params) - set(accepted)
    if unknown:
        listed = ", ".join(f"{k} (default {v!r})" for k, v in accepted.items()) or "none"
        raise ValueError(f"unknown parameter(s) {sorted(unknown)} for strategy {name!r}: accepted are {listed}")
    return cls(**params)

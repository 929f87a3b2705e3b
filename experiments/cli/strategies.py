"""The `syncbench strategies` command: the registered strategies and their parameters."""

from __future__ import annotations


def add_arguments(p) -> None:
    """No arguments."""


def run(args) -> int:
    import strategies
    from strategies.registry import skipped_plugins

    for name in strategies.names():
        cls = strategies.get(name)
        params = ", ".join(f"{k}={v!r}" for k, v in cls.parameters().items()) or "-"
        print(f"{name:18s} {cls.summary}\n{'':18s} role: {cls.role}; ops: {', '.join(cls.ops)}; params: {params}")
    for name, why in skipped_plugins().items():  # already said once on stderr; listed here with the others
        print(f"{name:18s} SKIPPED: {why}")
    return 0

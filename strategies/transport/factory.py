"""One factory for every transport: build(name, control) -> the Communicator that carries a run's point to point.

A control plane is the substrate's own communicator of the rank (queues between threads, gloo between Ray
actors, the simulation's board between SimGrid actors): it knows the rank and world size and carries
`allgather_object` and the backend's `native_allreduce`. The transport named `name` is built over it and carries
the counted point to point, with the link emulation and the timeout. A transport is one module with a
`build(name, control, *, timeout, network, address)` function and one line in TRANSPORTS (or `register`); it
refuses a control plane it cannot work over, naming what it needs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from strategies.transport.communicator import DEFAULT_TIMEOUT_S, Communicator
from strategies.transport.link import Network
from strategies.transport.names import SOCKETS

Builder = Callable[..., Communicator]

# name -> the module whose build() makes it (imported when first used: gloo's and SimGrid's cost nothing until then)
TRANSPORTS: dict[str, str | Builder] = {
    "threads": "strategies.transport.threads",
    "gloo": "strategies.transport.torch_dist",
    **{name: "strategies.transport.sockets" for name in SOCKETS},
    "simgrid": "strategies.transport.simgrid",
}


def register(name: str, builder: Builder) -> None:
    """Add a transport: builder(name, control, *, timeout, network, address) -> Communicator."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"transport name {name!r}: expected a non-empty string")
    if name in TRANSPORTS:
        raise ValueError(f"transport {name!r} is already registered (registered: {', '.join(TRANSPORTS)})")
    TRANSPORTS[name] = builder


def names() -> tuple[str, ...]:
    return tuple(TRANSPORTS)


def check(name: str) -> None:
    """ValueError naming the registered transports if `name` is not one of them."""
    if name not in TRANSPORTS:
        raise ValueError(f"p2p {name!r}: expected one of {', '.join(TRANSPORTS)}")


def build(name: str, control: Communicator, *, timeout: float = DEFAULT_TIMEOUT_S, network: Network | None = None,
          address: str = "127.0.0.1") -> Communicator:
    """The communicator `name` over `control` (this rank's control plane); `address`: the IP this rank's node is
    reached at, for transports that listen (the sockets' TCP pairs)."""
    check(name)
    builder = TRANSPORTS[name]
    if isinstance(builder, str):
        builder = importlib.import_module(builder).build
    return builder(name, control, timeout=timeout, network=network, address=address)


def require(name: str, control: Communicator, kind: type, what: str) -> None:
    """For builders: a TypeError if `control` is not the control plane `name` works over."""
    if not isinstance(control, kind):
        raise TypeError(f"p2p {name!r} needs {what} as its control plane, got a {type(control).__name__}")

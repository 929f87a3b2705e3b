"""How workers agree on a gradient: the algorithms, the plug-in API, the transport and analytic costs.

Built-in strategies register here, one line each; plug-ins register through the entry-point group
`syncbench.strategies` (see registry.py).
"""

from strategies.registry import get, make, names, register

from strategies.ring import RingConfig

register(RingConfig)

__all__ = ["get", "make", "names", "register"]

"""How workers agree on a gradient: the algorithms, the plug-in API, the transport and analytic costs.

Built-in strategies register here, one line each; plug-ins register through the entry-point group
`syncbench.strategies` (see registry.py).
"""

from strategies.all_to_all import AllToAllConfig
from strategies.ddp import DdpConfig
from strategies.decentralized import DecentralizedConfig
from strategies.double_binary_tree import DoubleBinaryTreeConfig
from strategies.halving_doubling import HalvingDoublingConfig
from strategies.hierarchical import HierarchicalConfig
from strategies.naive_ring import NaiveRingConfig
from strategies.native import NativeConfig
from strategies.node_parameter_server import NodeParameterServerConfig
from strategies.parameter_server import ParameterServerConfig
from strategies.reduce_broadcast import ReduceBroadcastConfig
from strategies.registry import get, make, names, register
from strategies.ring import RingConfig

register(ParameterServerConfig)
register(ReduceBroadcastConfig)
register(AllToAllConfig)
register(HalvingDoublingConfig)
register(RingConfig)
register(NaiveRingConfig)
register(DecentralizedConfig)
register(NativeConfig)
register(DdpConfig)
register(HierarchicalConfig)
register(DoubleBinaryTreeConfig)
register(NodeParameterServerConfig)

__all__ = ["get", "make", "names", "register"]

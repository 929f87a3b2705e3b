"""The names of the transports and of their modes, written once (no imports: the command line reads this file
without importing torch)."""

# syncbench's own sockets: "sockets" pairs over Unix + single copy within a network namespace, else TCP;
# "sockets-unix" keeps every payload in the Unix stream; "sockets-tcp" takes TCP for every pair
SOCKETS = ("sockets", "sockets-unix", "sockets-tcp")
# what can carry a Ray worker group's point to point (a sweep's `p2p`, `--p2p` of bench and verify);
# "gloo" is torch.distributed's backend: gloo for host tensors, NCCL where every rank owns its own GPU
P2P = ("gloo",) + SOCKETS
# how a simulated rank's concurrent sends share its NIC (strategies.transport.simgrid.Cluster)
NIC_MODES = ("shared", "fifo", "buffered")


def default_p2p(device: str) -> str:
    """The p2p a run takes when its sweep does not say: the sockets for host tensors, gloo/NCCL for GPU ones."""
    return "gloo" if device == "cuda" else "sockets"


def socket_mode(p2p: str) -> str:
    """The SocketCommunicator mode a p2p name asks for: "sockets" -> "auto", "sockets-unix" -> "unix", ..."""
    if p2p not in SOCKETS:
        raise ValueError(f"p2p {p2p!r} is not one of the socket transports: expected one of {', '.join(SOCKETS)}")
    return p2p.removeprefix("sockets").removeprefix("-") or "auto"

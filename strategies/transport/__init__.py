"""How ranks move bytes: the Communicator interface, its transports and the link emulation.

Algorithms in `strategies/` import only the interface (`strategies.transport.communicator`); everything that
moves, counts, delays or simulates bytes lives here: threads (tests), gloo/NCCL (`torch_dist`), syncbench's own
stream sockets (`sockets`), SimGrid (`simgrid`) and the python link emulation (`link`).
"""

"""How ranks move bytes: the Communicator interface, its transports, one factory and the link emulation.

Algorithms in `strategies/` import only the interface (`strategies.transport.communicator`); everything that
moves, counts, delays or simulates bytes lives here: threads (tests), gloo/NCCL (`torch_dist`), syncbench's own
stream sockets (`sockets`), SimGrid (`simgrid`) and the python link emulation (`link`). `factory.build(name,
control)` makes any of them; `names` lists them once; `wire` is the one check of a received message; `ranks` the
board and the run of fn on N in-process ranks that threads and SimGrid share.
"""

"""The socket transport's parts (strategies/transport/sockets.py is its communicator), as gloo's transport/tcp/:
cma.py (single-copy reads of a peer's memory), address.py (where a rank listens, and the handshakes that pair
ranks up), pair.py (one socket to one peer: its header, its queues of sends and receives).
"""

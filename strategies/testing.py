"""A harness for strategy authors: run a collective on thread ranks, no Ray needed.

    outputs, traffic = run_collective("ring", [np.ones(10), np.arange(10.0)], op="sum")

`outputs` holds one array per worker rank; `traffic` one dict per rank (workers, then servers) with the
rank's `role`, measured `bytes_sent`, `bytes_recv`, `msgs_sent`, `msgs_recv`.
"""

from __future__ import annotations

import numpy as np
import torch

import strategies
from strategies.communicator import DEFAULT_TIMEOUT_S
from strategies.link import Network
from strategies.threads import run_threads


def run_collective(name: str, inputs, op: str = "sum", *, timeout: float = DEFAULT_TIMEOUT_S,
                   network: Network | None = None, repeat: int = 1, **params):
    """Run strategy `name` once (or `repeat` times, feeding outputs back in) on len(inputs) worker threads."""
    config = strategies.make(name, **params)
    workers = len(inputs)
    if workers < 1:
        raise ValueError("run_collective needs at least one input array (one per worker rank)")
    tensors = [torch.as_tensor(np.array(a, copy=True)) for a in inputs]

    def body(comm):
        runtime = config.bind(comm, workers)
        if runtime.is_server:
            for _ in range(repeat):
                runtime.serve(tensors[0].numel(), tensors[0].dtype, op)
            out = None
        else:
            out = tensors[comm.rank].clone().reshape(-1)
            for _ in range(repeat):
                runtime.sync(out, op)
            out = out.reshape(tensors[comm.rank].shape).numpy()
        counters = comm.counters()
        role = "server" if runtime.is_server else "worker"
        return out, {"role": role, **counters.as_dict()}

    results = run_threads(config.world_size(workers), body, timeout=timeout, network=network)
    outputs = [out for out, _ in results[:workers]]
    traffic = [t for _, t in results]
    return outputs, traffic

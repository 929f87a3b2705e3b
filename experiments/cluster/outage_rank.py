"""One rank of a link-outage run on the kernel-shaped network (experiments/cluster/outages.py starts it inside its
node's namespace): torch.distributed's gloo as the control plane, the sockets transport over TCP for the payload
(spec "p2p": "sockets-tcp"; or "gloo" itself, which a barrier-free server's threads need), so every byte crosses
the node's tbf-shaped veth.

    python -m experiments.cluster.outage_rank SPEC_JSON

Prints one JSON line at the end: {"start": monotonic seconds once every rank is connected, "ends": [monotonic
seconds at the end of each step]} (worker ranks; CLOCK_MONOTONIC
is one clock for every namespace of the machine). The rank whose link goes down at step s prints {"down": s} and
waits for a line on stdin (the driver has taken its link down) before the step's synchronization.

With spec "isolated": true (validate's kernel substrate: experiments/validate_kernel.py) every step is one
synchronization of its own: the ranks meet at a barrier before it (the servers too), each worker's gradient is
rank + 1 everywhere, and the line adds "starts" (monotonic seconds after each step's barrier) and "error" (the
largest distance of the synchronized gradient from the workers' mean, (workers + 1) / 2: a sync that lost or
double-counted a contribution shows here).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta


def main(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    import strategies
    from strategies.transport import factory
    from strategies.transport.torch_dist import TorchCommunicator

    torch.set_num_threads(1)
    rank, world, timeout = spec["rank"], spec["world"], spec["timeout"]
    dist.init_process_group("gloo", init_method=f"tcp://{spec['master']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))
    try:
        control = TorchCommunicator(rank, world, timeout)
        comm = control if spec["p2p"] == "gloo" else factory.build(spec["p2p"], control, timeout=timeout, network=None,
                                                                     address=spec["address"])
        config = strategies.make(spec["strategy"], **spec["params"])
        runtime = config.bind(comm, spec["workers"])
        grads = torch.ones(spec["numel"], dtype=torch.float32)
        down = spec.get("down")  # the step this rank's link goes down at, or None
        if runtime.is_server and config.asynchronous:
            comm.allgather_object(None)  # every rank connected: the clock starts together
            start = time.monotonic()
            runtime.serve_run(spec["steps"], spec["numel"], torch.float32)
            ends = []
        else:
            comm.allgather_object(None)
            start = time.monotonic()
            ends = _steps(spec, runtime, grads, down) if not spec.get("isolated") else None
        out = {"start": start, "ends": ends} if ends is not None else _isolated(spec, comm, runtime)
        comm.allgather_object(None)  # nobody closes a connection a peer still reads
        comm.close()
        print(json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


def _steps(spec: dict, runtime, grads, down) -> list[float]:
    import torch

    ends = []
    for step in range(spec["steps"]):
        if step == down:
            print(json.dumps({"down": step}), flush=True)
            sys.stdin.readline()  # the driver has taken the link down
        if runtime.is_server:
            runtime.serve(spec["numel"], torch.float32, "mean")
            continue
        runtime.sync(grads, "mean")
        ends.append(time.monotonic())
    return ends


def _isolated(spec: dict, comm, runtime) -> dict:
    """spec["steps"] synchronizations, each begun together after a barrier: their starts, ends and error."""
    import torch

    starts, ends, error = [], [], 0.0
    grads = torch.empty(spec["numel"], dtype=torch.float32)
    mean = (spec["workers"] + 1) / 2
    for _ in range(spec["steps"]):
        if not runtime.is_server:
            grads.fill_(comm.rank + 1)
        comm.allgather_object(None)
        starts.append(time.monotonic())
        if runtime.is_server:
            runtime.serve(spec["numel"], torch.float32, "mean")
        else:
            runtime.sync(grads, "mean")
            error = max(error, float((grads - mean).abs().max()))
        ends.append(time.monotonic())
    return {"start": starts[0] if starts else time.monotonic(), "starts": starts, "ends": ends, "error": error}


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

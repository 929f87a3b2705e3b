"""The servers' compute in a parameter server's sync (update mode: the optimizer applied on the servers), priced
beside its bytes: synchronous servers a partition at a time, barrier-free ones a push at a time. strategies.cost's
step_timeline calls them; they are also reachable as cost.server_update_seconds and cost.barrier_free_update_seconds."""

from __future__ import annotations


def server_update_seconds(comm_s: float, fill_s: float, parts: list[int], seconds_per_element: float) -> float:
    """A bucket's sync when its servers apply the optimizer to each partition before answering it (a parameter
    server in update mode; SimGrid charges the profile's optimizer time per element, as compute on the server):
    partition r's pushes are in at r / R of the streaming part (comm_s - fill_s), its update starts then or when
    the update before it ends, and its answer (fill_s, the fan-out of a partition) leaves when its update has
    ended and the answer before it has left. Without updates, the last answer leaves at comm_s."""
    if not parts:
        return comm_s
    stream, count = comm_s - fill_s, len(parts)
    updated = answered = 0.0
    for r, numel in enumerate(parts, 1):
        updated = max(stream * r / count, updated) + numel * seconds_per_element
        answered = max(updated, answered) + fill_s
    return max(answered, comm_s)


def barrier_free_update_seconds(comm_s: float, parts: list[int], workers: int, servers: int, bandwidth: float,
                                latency: float, seconds_per_element: float, itemsize: int = 4) -> float:
    """A bucket's sync on barrier-free servers in update mode (staleness s or async; push_updates): every worker
    pushes partition r of each of the k shards at once, so r's pushes are all in at latency + the bytes of
    partitions 0..r through the busier of a server's download (n of each) and a worker's upload (k of each).
    The server takes the pushes in the order they come in (partition by partition, worker after worker) and
    applies the optimizer to each on its own (its CPU one update after another; SimGrid charges the profile's
    optimizer per element); each push's reply leaves once its update is done: through the server's upload after
    the replies before it (a partition each), and into its worker's download beside the other k - 1 servers'
    replies of the same partition (the servers work in step: k partitions), after that worker's earlier replies;
    the last lands a latency after the later of the two. Worked from the simulator's message log at n = 2, k = 2
    (tests/experiments/test_validate.py). A sync is never faster than its bytes (comm_s). Without parts: comm_s."""
    if not parts:
        return comm_s
    fan = max(workers, servers) * itemsize / bandwidth  # seconds a partition's element takes in, the busier side
    pushed = updated = uplink = 0.0
    download = [0.0] * workers
    for numel in parts:
        pushed += numel * fan
        one = numel * itemsize / bandwidth
        for w in range(workers):
            updated = max(latency + pushed, updated) + numel * seconds_per_element
            uplink = max(updated, uplink) + one
            download[w] = max(uplink, max(updated, download[w]) + servers * one)
    return max(max(download) + latency, comm_s)

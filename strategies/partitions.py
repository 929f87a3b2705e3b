"""How a parameter server cuts a buffer: per server a shard, each cut into partitions of at most partition_mb MiB.

One cut for the synchronous servers (parameter_server.py), the ones without a barrier (parameter_server_async.py)
and the node-aware one (node_parameter_server.py): kept here, below all three, so none imports another for it.
"""

from __future__ import annotations

import math

from strategies.base import MAX_MESSAGES, chunk_bounds

MIB = 2**20


def partitions(numel: int, servers: int, itemsize: int, partition_mb: float) -> list[list[tuple[int, int]]]:
    """Per server: its shard cut into balanced partitions of at most partition_mb MiB, as (lo, hi) of the buffer."""
    limit = max(1, int(partition_mb * MIB) // itemsize)
    out = []
    for lo, hi in chunk_bounds(numel, servers):
        count = math.ceil((hi - lo) / limit)
        out.append([(lo + a, lo + b) for a, b in chunk_bounds(hi - lo, count)] if count else [])
    return out


MAX_PARTITION_MB = 1e6  # a partition of 1 TiB: one per shard of any array that fits a machine


def partition_count(numel: int, servers: int, itemsize: int, partition_mb: float) -> int:
    """len() of every server's partitions(...) summed, counted without cutting them."""
    limit = max(1, int(partition_mb * MIB) // itemsize)
    base, extra = divmod(numel, servers)
    return extra * -(-(base + 1) // limit) + (servers - extra) * -(-base // limit)


def least_partition_mb(numel: int, servers: int, itemsize: int, most: int) -> str:
    """The partition_mb range that cuts numel elements over `servers` shards into at most `most` partitions."""
    limit = -(-numel // max(1, most - servers))  # partitions <= numel / limit + servers
    low = max(limit * itemsize / MIB * 1.001, 1e-6)
    return f"partition_mb from {low:.3g} to {MAX_PARTITION_MB:,.0f} MiB"


def check_partition_mb(shown: str, value) -> None:
    """A number of MiB > 0 and at most MAX_PARTITION_MB (how small: check_messages, for the array it cuts);
    `shown` names the setting and its value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_PARTITION_MB:
        raise ValueError(f"{shown}: use a number of MiB > 0 and at most "
                         f"{MAX_PARTITION_MB:,.0f} (BytePS uses 4; how small depends on the array: at most "
                         f"{MAX_MESSAGES:,} messages per worker and synchronization)")

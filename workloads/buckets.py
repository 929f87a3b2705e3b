"""Gradient buckets as PyTorch DDP groups them: reverse registration order, a small first bucket.

Backward produces gradients roughly from the last registered parameter to the first, so DDP walks the
parameters in reverse and closes a bucket once it holds at least its size limit: the first bucket 1 MiB (its
gradients are ready first and a small bucket starts communication early), every later one `bucket_mb` MiB.
Sizes are MiB (2^20 bytes), as DDP's `bucket_cap_mb`, so that `ddp` and the strategies group identically.

Parameters live in one flat buffer in registration order (workloads/flat.py), so a run of consecutive
parameters in reverse order is one contiguous slice of that buffer: a bucket is an element range [lo, hi).
Bucket 0 holds the last parameters (the highest offsets) and is synchronized first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIB = 2**20
FIRST_BUCKET_MB = 1.0  # DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB)


@dataclass(frozen=True)
class Bucket:
    """One bucket: the parameters it holds (registration indices, in the order backward produces them)
    and the element range [lo, hi) they occupy in the flat buffer."""

    index: int
    params: tuple[int, ...]
    lo: int
    hi: int

    @property
    def numel(self) -> int:
        return self.hi - self.lo


def check_bucket_mb(bucket_mb) -> None:
    """None (one flat bucket) or a finite number of MiB > 0; anything else is refused by value."""
    if bucket_mb is None:
        return
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not 0 < bucket_mb < float("inf"):
        raise ValueError(f"bucket_mb = {bucket_mb!r}: accepted is a number of MiB > 0 (DDP uses 25), or leaving "
                         f"it out for one flat bucket")


def make_buckets(numels: Sequence[int], bucket_mb: float | None = None, itemsize: int = 4,
                 first_bucket_mb: float = FIRST_BUCKET_MB) -> tuple[Bucket, ...]:
    """Group parameters of these sizes (registration order) into buckets; None: one flat bucket of all."""
    check_bucket_mb(bucket_mb)
    total = sum(numels)
    if bucket_mb is None:
        return (Bucket(0, tuple(reversed(range(len(numels)))), 0, total),)
    offsets = [0]
    for n in numels:
        offsets.append(offsets[-1] + n)
    limit = min(first_bucket_mb, bucket_mb) * MIB
    buckets, current, size = [], [], 0
    for i in reversed(range(len(numels))):
        current.append(i)
        size += numels[i] * itemsize
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, bucket_mb * MIB
    if current:
        buckets.append(current)
    return tuple(Bucket(k, tuple(params), offsets[params[-1]], offsets[params[0] + 1])
                 for k, params in enumerate(buckets))

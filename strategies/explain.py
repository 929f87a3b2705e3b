"""One sync of a strategy's real code on thread ranks with every message recorded: what `syncbench explain` and the
report's drawn strategies (reports/explain.py) draw.

Each rank's communicator carries one shared MessageRecorder (strategies/transport/recorder.py); beside it, each
rank notes which element range of its synced buffer every message moved, where the message is a contiguous view of
that buffer (a worker's chunk of ring, a push of a partition, a pull into it). A message moved through a copy (a
scratch buffer, a compressed form, a server's own arrays) has no range on that side; the other side's is used.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

MAX_WORKERS = 32  # a table of every message per round: beyond this it is no longer a picture
MAX_NUMEL = 1_000_000
DEFAULT_NUMEL = 1000
ITEMSIZE = 4  # float32


@dataclass(frozen=True)
class Recording:
    """One sync's messages: every rank's MessageEvents, the element range each carried where it was a view of the
    rank's synced buffer ((rank, direction, peer, k) -> (lo, hi), k counting that rank's messages of that direction
    and peer in posting order), each rank's role and counters."""

    strategy: str
    events: list
    chunks: dict
    roles: tuple[str, ...]
    counters: list
    numel: int
    itemsize: int


def check(name: str, params: dict, workers: int, numel: int):
    """The strategy's config, or ValueError naming what is wrong and what is accepted, before any work."""
    import strategies

    if isinstance(workers, bool) or not isinstance(workers, int) or not 2 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers {workers!r}: accepted is an integer from 2 to {MAX_WORKERS}")
    if isinstance(numel, bool) or not isinstance(numel, int) or not 1 <= numel <= MAX_NUMEL:
        raise ValueError(f"--numel {numel!r}: accepted is an integer from 1 to {MAX_NUMEL:,}")
    config = strategies.make(name, **params)
    if not config.counted or config.wraps_model:
        raise ValueError(f"{name!r} moves its bytes inside the backend (gloo/NCCL), where no message is seen: "
                         f"nothing to draw; explain a strategy written over send/recv (ring is what gloo and NCCL "
                         f"run for large messages)")
    if getattr(config, "staleness", 0) != 0 or getattr(config, "backups", 0):
        raise ValueError(f"{name} with staleness = {config.staleness!r}, backups = {config.backups}: a parameter "
                         f"server without a barrier serves a whole run, not one sync: explain draws one "
                         f"synchronous sync (staleness = 0, backups = 0)")
    return config


def record(name: str, params: dict, workers: int, numel: int = DEFAULT_NUMEL, timeout: float = 30.0) -> Recording:
    """Run one sync of strategy `name` (with `params`) on `workers` thread ranks (and its servers), every message
    recorded. The recorder and the counters see the same isend calls: their byte totals are checked equal."""
    import torch

    from strategies.transport.recorder import MessageRecorder
    from strategies.transport.threads import run_threads

    config = check(name, params, workers, numel)
    torch.set_num_threads(1)
    op = "sum" if "sum" in config.ops else config.ops[0]
    recorder = MessageRecorder()
    chunks: dict = {}
    lock = threading.Lock()

    def body(comm):
        comm.recorder = recorder
        runtime = config.bind(comm, workers)
        buffer = None if runtime.is_server else torch.arange(numel, dtype=torch.float32) + 1000.0 * comm.rank
        _watch_ranges(comm, buffer, chunks, lock)
        if runtime.is_server:
            runtime.serve(numel, torch.float32, op)
        else:
            runtime.sync(buffer, op)
        return ("server" if runtime.is_server else "worker"), comm.counters()

    results = run_threads(config.world_size(workers), body, timeout=timeout)
    events = recorder.events()
    sent = sum(e.nbytes for e in events if e.direction == "send")
    counted = sum(c.bytes_sent for _, c in results)
    if sent != counted:
        raise RuntimeError(f"explain {name}: the recorder saw {sent:,} bytes sent, the counters {counted:,}")
    return Recording(name, events, chunks, tuple(role for role, _ in results), [c for _, c in results], numel,
                     ITEMSIZE)


def _watch_ranges(comm, buffer, chunks: dict, lock) -> None:
    """Note, for each non-empty isend/irecv of this rank, the element range of `buffer` it moves (when it is a
    contiguous view of it), keyed (rank, direction, peer, k) as reports.explain.pair expects."""
    counts: dict = {}
    real_isend, real_irecv = comm.isend, comm.irecv

    def note(direction: str, tensor, peer: int) -> None:
        if tensor.numel() == 0:
            return
        with lock:
            k = counts.get((direction, peer), 0)
            counts[direction, peer] = k + 1
            if (buffer is not None and tensor.is_contiguous() and tensor.dtype == buffer.dtype
                    and tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()):
                lo = tensor.storage_offset() - buffer.storage_offset()
                chunks[comm.rank, direction, peer, k] = (lo, lo + tensor.numel())

    def isend(tensor, dst):
        note("send", tensor, dst)
        return real_isend(tensor, dst)

    def irecv(tensor, src):
        note("recv", tensor, src)
        return real_irecv(tensor, src)

    comm.isend, comm.irecv = isend, irecv  # this rank's instance only: send/recv go through them too

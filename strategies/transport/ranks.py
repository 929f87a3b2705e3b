"""What every in-process substrate of N ranks shares: the control-plane board and the run of fn on every rank.

Threads (tests) and SimGrid actors (simulation) both run fn(comm) once per rank inside this process; both
exchange small objects on a board guarded by a barrier; both report the root cause of a failed run.
"""

from __future__ import annotations

from collections.abc import Callable

from strategies.transport.communicator import CommError, Communicator, RankAborted


class Board:
    """Every rank's object in rank order: each posts its own, then all read (two barrier waits: all posted, all
    read, so that a fast rank's next post cannot overwrite what a slow one has yet to read).

    `barrier`: anything with wait(*args) that returns once every rank has called it (threading.Barrier,
    SimGrid's Barrier)."""

    def __init__(self, world_size: int, barrier):
        self._posted: list = [None] * world_size
        self.barrier = barrier

    def exchange(self, rank: int, obj, *wait_args) -> list:
        self._posted[rank] = obj
        self.barrier.wait(*wait_args)
        board = list(self._posted)
        self.barrier.wait(*wait_args)
        return board


class RankRun:
    """fn(comm) on every rank of one run: each rank's result or error, and the outcome of the whole run.

    `start(rank)` builds the rank's communicator (closed when fn returns or raises); `on_error(rank, error)` is
    told of each failure at once (threads abort their fabric with it). Errors of the types in `ignore` (how a
    simulator ends a deadlocked rank) leave the rank unfinished instead of failed. `keep`: leave the communicator
    open when fn returns, for the next run of a pool of ranks (threads.ThreadRanks); it is closed if fn fails, so
    that peers waiting on this rank fail at once.
    """

    def __init__(self, world_size: int, fn: Callable[[Communicator], object],
                 start: Callable[[int], Communicator], on_error: Callable[[int, BaseException], None] | None = None,
                 ignore: tuple[type[BaseException], ...] = (), keep: bool = False):
        self.world_size, self.fn, self.start, self.on_error, self.ignore = world_size, fn, start, on_error, ignore
        self.keep = keep
        self.results: list = [None] * world_size
        self.finished = [False] * world_size
        self.failures: list[tuple[int, BaseException]] = []  # in the order they happened

    def rank(self, rank: int) -> None:
        """What rank `rank` runs (on its thread or actor)."""
        comm, failed = None, True
        try:
            comm = self.start(rank)
            self.results[rank] = self.fn(comm)
            failed = False
        except BaseException as e:  # noqa: BLE001 - reported by outcome()
            if isinstance(e, self.ignore) or isinstance(e.__cause__, self.ignore):
                return  # stays unfinished: outcome() names it
            self.failures.append((rank, e))
            if self.on_error is not None:
                self.on_error(rank, e)
        finally:
            if comm is not None and (failed or not self.keep):
                comm.close()
        self.finished[rank] = True

    def outcome(self, unfinished: Callable[[list[int]], str]) -> list:
        """Every rank's result in rank order; else the root cause re-raised: the first failure that was not
        another rank's consequence (RankAborted), else the first failure, else a CommError naming the ranks
        that never finished (`unfinished(ranks)` says why)."""
        roots = [e for _, e in self.failures if not isinstance(e, RankAborted)]
        if roots or self.failures:
            raise (roots or [e for _, e in self.failures])[0]
        stuck = [r for r in range(self.world_size) if not self.finished[r]]
        if stuck:
            raise CommError(unfinished(stuck))
        return self.results

"""How a rank runs loops side by side and tells the time: its communicator's `concurrency`.

A parameter server without a global barrier (strategies/parameter_server_async.py) serves each worker from a
loop of its own, waits on a condition (the staleness bound, a step's backups) and times those waits. Every
measured transport runs those loops as OS threads on the wall clock (`THREADS`, the Communicator's default). A
simulated rank cannot: SimGrid runs its actors one at a time and an OS thread it does not know must never call
into it, nor may an actor block on a lock SimGrid cannot see; its communicator supplies actors, a condition made
of SimGrid's mutex and semaphores, and the simulated clock instead (strategies/transport/simgrid.py).

The interface, three members:
  clock() -> float            seconds, for durations
  condition()                 a context manager (the lock) with wait_for(predicate, timeout) -> bool and
                              notify_all(), as threading.Condition
  start(fn, name) -> handle   runs fn() beside the caller; handle.join() waits for it to end
"""

from __future__ import annotations

import threading
import time


class Threads:
    """OS threads on the wall clock."""

    clock = staticmethod(time.perf_counter)

    @staticmethod
    def condition() -> threading.Condition:
        return threading.Condition()

    @staticmethod
    def start(fn, name: str) -> threading.Thread:
        thread = threading.Thread(target=fn, name=name, daemon=True)
        thread.start()
        return thread


THREADS = Threads()

"""Rank 0 reports its finished steps without waiting for the progress queue: Ray's Queue.put_nowait waits for its
actor's reply, a round trip rank 0 spent between two steps (outside every timed interval) and every other rank then
waited out inside its next step's communication time (a second on the first timed step of a loaded 2-core
machine, on the sockets and on gloo alike)."""

from experiments.pipeline.ray_substrate import StepProgress


class _Method:
    def __init__(self, calls):
        self.calls = calls

    def remote(self, *args):
        self.calls.append(args)
        return object()  # an ObjectRef nobody waits for


class _Queue:
    """Ray's Queue as StepProgress sees it: `actor.put_nowait.remote`; its own blocking put_nowait must not run."""

    def __init__(self):
        self.calls = []
        self.actor = type("Actor", (), {})()
        self.actor.put_nowait = _Method(self.calls)

    def put_nowait(self, item):
        raise AssertionError("Queue.put_nowait waits for the queue actor's reply (ray.get)")


def test_steps_are_posted_to_the_queue_actor_and_never_waited_for():
    queue = _Queue()
    progress = StepProgress(queue)
    for step in (1, 2, 3):
        progress.put_nowait(step)
    assert queue.calls == [(1,), (2,), (3,)]

"""What a sweep's run with failures keeps in memory on thread ranks: one state per slot (and the checkpoint), not a
copy per step; a failed segment's models go with its threads; nothing of a run outlives it.

Python's cycle collector is switched off in each case, so that only what holds an object keeps it alive (with it
on, a cycle is freed whenever the collector happens to run, which with torch loaded can be many runs later).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import experiments.pipeline.sweep_faults as sweep_faults
from experiments.config.sweep import RunSpec
from experiments.pipeline.sweep_faults import SweepSegments, execute

BASE = dict(workload="tiny", image_size=16, batch_size=8, warmup_steps=1, workers=3, lr=0.05, momentum=0.9,
            timeout=60)
META = {"started_at": "2026-01-01T00:00:00+00:00", "transport": "threads", "gpu": "", "cores": 2, "host": "test",
        "substrate": "threads"}


class _Counted(sweep_faults.SlotState):
    """SlotState, each one made remembered (weakly): how many were made, how many are alive."""

    made: list = []

    def __init__(self, *args):
        super().__init__(*args)
        _Counted.made.append(weakref.ref(self))


def _alive(refs) -> int:
    return sum(ref() is not None for ref in refs)


def _without_cycle_collector(fn):
    """fn() with the cycle collector off (what it returns must be counted inside: once the collector is back, its
    first pass frees every cycle made meanwhile)."""
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)  # torch's lazy imports done first
    gc.collect()
    gc.disable()
    try:
        return fn()
    finally:
        gc.enable()


def test_each_slot_keeps_one_state_whatever_the_number_of_steps(monkeypatch):
    monkeypatch.setattr(sweep_faults, "SlotState", _Counted)
    kept = []  # states alive at each step's end
    end = sweep_faults._Hooks.end

    def counting_end(self, step, row):
        end(self, step, row)
        kept.append(_alive(_Counted.made))

    monkeypatch.setattr(sweep_faults._Hooks, "end", counting_end)
    made = {}
    for steps in (2, 4):
        _Counted.made = []
        spec = RunSpec(strategy="ring", steps=steps, recovery={"mode": "elastic"}, **BASE)
        run = _without_cycle_collector(lambda spec=spec: SweepSegments(spec, schedule=[]).run())
        assert run.completed_steps == steps
        made[steps] = len(_Counted.made)
    assert made == {2: 3, 4: 3}  # one per slot, at its first step; every later step overwrites it
    assert max(kept) == 3

    _Counted.made, kept[:] = [], []  # a restart: the kept states and the last checkpoint, however many steps ran
    spec = RunSpec(strategy="ring", steps=4, failures={"schedule": [[3, 2]]},
                   recovery={"mode": "checkpoint_restart", "checkpoint_every": 2}, **BASE)
    run = _without_cycle_collector(lambda: SweepSegments(spec).run())
    assert (run.completed_steps, run.steps_run, [f.steps_lost for f in run.failures]) == (4, 5, [1])
    assert max(kept) == 2 * 3


def test_a_failed_segments_models_are_freed_with_its_threads(monkeypatch):
    built = []  # (segment's first step, its model)
    build = sweep_faults.build

    def remembering_build(comm, slot, spec, config):
        compute, buckets = build(comm, slot, spec, config)
        built.append(weakref.ref(compute.model))
        return compute, buckets

    monkeypatch.setattr(sweep_faults, "build", remembering_build)
    left = []  # the first segment's models alive when the second begins
    segment = SweepSegments._segment

    def second_segment(self, start, end, joining, ready):
        if start > 0:
            left.append(_alive(built))
        return segment(self, start, end, joining, ready)

    monkeypatch.setattr(SweepSegments, "_segment", second_segment)
    spec = RunSpec(strategy="ring", steps=3, failures={"schedule": [[1, 1]]}, recovery={"mode": "elastic"}, **BASE)
    run, after = _without_cycle_collector(lambda: (SweepSegments(spec).run(), _alive(built)))
    assert run.completed_steps == 3 and len(built) == 3 + 2
    assert left == [0]  # the failed members' frames no longer hold their models
    assert after == 0


@pytest.mark.parametrize("recovery, status", [({"mode": "checkpoint_restart", "checkpoint_every": 1}, "ok"),
                                              ({"mode": "none"}, "failed")])
def test_nothing_of_a_run_with_a_failure_outlives_it(monkeypatch, recovery, status):
    """(A run without recovery keeps the error that ended it, whose traceback passed through the segments.)"""
    monkeypatch.setattr(sweep_faults, "SlotState", _Counted)
    _Counted.made = []
    spec = RunSpec(strategy="ring", steps=3, failures={"schedule": [[2, 1]]}, recovery=recovery, **BASE)
    (row, steps, _), after = _without_cycle_collector(lambda: (execute(spec, META), _alive(_Counted.made)))
    assert row["status"] == status, row["error"]
    assert row["completed_steps"] == (3 if status == "ok" else 2) and len(_Counted.made) >= 3
    assert after == 0

"""ddp comm = a strategy (issue 23.1): DDP's reducer moves each bucket through the strategy over syncbench's counted
communicator (thread ranks: each rank's DDP runs over a local one-rank group, the hook does the averaging)."""

import dataclasses

import pytest
import torch

from experiments.pipeline.summary import summarize
from strategies import registry
from tests.experiments.test_overlap import META, on_threads, spec_for


@pytest.mark.parametrize("workers, bucket_mb", [(2, None), (3, 0.01)])
def test_ddp_through_ring_trains_as_ring_and_counts_its_bytes(workers, bucket_mb):
    ring = on_threads(spec_for("ring", workers=workers, steps=3, bucket_mb=bucket_mb))
    spec = dataclasses.replace(spec_for("ddp", workers=workers, steps=3, bucket_mb=bucket_mb),
                               strategy_params={"comm": "ring"})
    hooked = on_threads(spec)
    for a, b in zip(ring, hooked):
        assert float((a["params"] - b["params"]).abs().max()) <= 1e-6
    row, steps = summarize(spec, hooked, "", META)
    assert row["status"] == "ok", row["error"]
    assert row["bytes_counted"] and not row["bypasses_link"] and row["param_comm"] == "ring"
    # ok above: every rank's counted bytes in every step equal ring's traffic summed over DDP's buckets
    assert all(s["bytes_sent"] > 0 for s in steps)
    if bucket_mb is not None:
        assert len(hooked[0]["final"]["bucket_numels"]) > 1


def test_ddp_over_gloo_bypasses_the_link_and_bad_comm_is_refused():
    assert registry.make("ddp").counted is False and registry.get("ddp").counted is False
    assert registry.make("ddp", comm="ring").counted is True
    with pytest.raises(ValueError, match="'nope'.*accepted.*'ring'"):
        registry.make("ddp", comm="nope")
    assert torch is not None


def test_the_summary_types_ddp_over_gloo_as_bypassing_a_python_link_and_hooked_ddp_as_crossing_it():
    link = {"bandwidth": 125e6}
    for params, bypasses in (({}, True), ({"comm": "ring"}, False)):
        spec = dataclasses.replace(spec_for("ddp", workers=2, link=link), strategy_params=params)
        row, _ = summarize(spec, None, "stopped", META)
        assert row["link_emulation"] == "python" and row["bypasses_link"] is bypasses
        assert row["bytes_counted"] is not bypasses

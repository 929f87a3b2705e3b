"""ddp comm = a strategy (issue 23.1): DDP's reducer moves each bucket through the strategy over syncbench's counted
communicator (thread ranks: each rank's DDP runs over a local one-rank group, the hook does the averaging)."""

import dataclasses
import os

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
    # through a strategy, DDP's buckets cost what that strategy declares for them; over gloo nothing is counted
    ring = registry.make("ring").traffic(5, 1031)
    assert registry.make("ddp", comm="ring").traffic(5, 1031) == ring and ring.counted
    assert not registry.make("ddp").traffic(5, 1031).counted


def test_the_summary_types_ddp_over_gloo_as_bypassing_a_python_link_and_hooked_ddp_as_crossing_it():
    link = {"bandwidth": 125e6}
    for params, bypasses in (({}, True), ({"comm": "ring"}, False)):
        spec = dataclasses.replace(spec_for("ddp", workers=2, link=link), strategy_params=params)
        row, _ = summarize(spec, None, "stopped", META)
        assert row["link_emulation"] == "python" and row["bypasses_link"] is bypasses
        assert row["bytes_counted"] is not bypasses


# ---- on Ray (the check): one sweep, shared by a functional and a timing test -------------------------

@pytest.fixture(scope="module")
def hook_sweep(ray_session, tmp_path_factory):
    """ring, native, ddp over gloo and ddp through ring: 2 workers, a python-emulated 1 Gbit/s link, ResNet-18's
    real gradients moved over a synthetic (known) compute timeline, 25 MiB buckets overlapped with backward."""
    import io

    from experiments.config.sweep import parse
    from experiments.pipeline.runner import run_sweep
    from reports.page import build
    from tests.experiments.test_overlap import synthetic_profile

    out = tmp_path_factory.mktemp("ddp-hook")
    profile = synthetic_profile(out / "p.json")
    sweep = parse({"name": "ddp-hook", "defaults": {
        "workload": "resnet18", "image_size": 32, "batch_size": 16, "steps": 3, "warmup_steps": 1,
        "compute": "profile", "profile": str(out / "p.json"), "bucket_mb": 25, "overlap": True,
        "link": {"bandwidth": "1Gbit", "latency": "50us"}},
        "grid": {"strategy": ["ring", "native", "ddp"], "workers": [2]},
        "strategy_params": {"ddp": {"comm": ["gloo", "ring"]}}})
    runs = run_sweep(sweep, out, log=io.StringIO())
    return runs, profile, sweep, build(out)


def test_on_ray_hooked_ddp_is_counted_as_ring_and_gloo_is_kept_out_of_the_shaped_figures(hook_sweep):
    from workloads.buckets import make_buckets
    from workloads.models import param_sizes

    runs, _, _, report = hook_sweep
    assert (runs["status"] == "ok").all(), runs[["strategy", "param_comm", "error"]].to_string()
    by = {(s, c if s == "ddp" else ""): r for (s, c), r in zip(zip(runs["strategy"], runs["param_comm"]),
                                                               runs.to_dict("records"))}
    ring, hooked, gloo, native = by[("ring", "")], by[("ddp", "ring")], by[("ddp", "gloo")], by[("native", "")]
    # ring's traffic summed over the buckets (DDP's grouping: 1 MiB first, then 25 MiB), by hand from traffic()
    per_bucket = [strategies_ring().traffic(2, b.numel, 4).worker_bytes_sent
                  for b in make_buckets(param_sizes("resnet18"), 25)]
    assert len(per_bucket) > 1 and hooked["buckets"] == len(per_bucket)
    assert hooked["bytes_sent_per_worker"] == sum(per_bucket) == ring["bytes_sent_per_worker"]
    assert not hooked["bypasses_link"] and hooked["bytes_counted"]
    assert gloo["bypasses_link"] and native["bypasses_link"] and gloo["bytes_sent_per_worker"] == 0
    # the report: gloo and native only in the loopback reference, hooked ddp beside ring
    from tests.reports.test_honest import page_figures, section

    html = report.read_text()

    def names(section_id):
        return {t.get("name") for f in page_figures(section(html, section_id)) for t in f["data"]} - {None}

    shaped = {n for n in names("throughput") if not n.startswith("ideal")}
    assert shaped == {"ring", "ddp (comm=ring)"}, shaped
    assert names("loopback") == {"native", "ddp (comm=gloo)"}, names("loopback")


@pytest.mark.timing
def test_on_ray_hooked_ddp_communicates_within_20_percent_of_the_timeline(hook_sweep):
    from experiments.bench.overlap import predict_step

    runs, profile, sweep, _ = hook_sweep
    hooked = runs[(runs["strategy"] == "ddp") & (runs["param_comm"] == "ring")].iloc[0]
    spec = next(s for s in sweep.runs if s.strategy == "ddp" and s.strategy_params.get("comm") == "ring")
    predicted = predict_step(profile, "ring", 2, 25, True, spec.network())
    ratio = hooked["comm_s"] / predicted.exposed_s
    assert 0.8 <= ratio <= 1.2, (f"hooked ddp waited {hooked['comm_s']:.3f} s per step for communication, the "
                                 f"timeline predicts {predicted.exposed_s:.3f} s (x{ratio:.2f}; load average "
                                 f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


def strategies_ring():
    return registry.make("ring")


def test_after_a_bucket_fails_every_later_bucket_of_the_hook_fails_at_once():
    """One failed bucket leaves the ranks unmatched on the wire: the later buckets must not each wait out the
    timeout (a run that lost a peer failed after buckets x timeout)."""
    import threading

    from strategies.ddp import HookState

    calls, released = [], threading.Event()

    class Runtime:
        def sync(self, buffer, op):
            calls.append(buffer.numel())
            if len(calls) == 1:
                raise TimeoutError("peer 1 did not answer")
            released.wait(30)  # a later bucket reaching the wire would hang here

    state = HookState(Runtime)
    futures = [torch.futures.Future() for _ in range(3)]
    try:
        for size, future in zip((4, 5, 6), futures):
            state.submit(state.runtime(size, size), torch.zeros(size), future)
        with pytest.raises(TimeoutError, match="peer 1"):
            futures[0].wait()
        for future in futures[1:]:
            with pytest.raises(RuntimeError, match=r"earlier bucket failed \(TimeoutError: peer 1"):
                future.wait()
        assert calls == [4]
    finally:
        released.set()
        state.close()

"""The simulator at scale: its memory estimated before a simulation starts, a refusal instead of a kill, the peak
watched while it runs. Skipped, with the reason, where SimGrid's Python module is not installed."""

from __future__ import annotations

import os
import signal
import time

import pytest

from experiments.simulate import memory
from experiments.simulate.substrate import run_child
from strategies.transport.communicator import Communicator
from strategies.transport.simgrid import simgrid_available

needs_simgrid = pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")


@needs_simgrid
@pytest.mark.parametrize("ranks", [256, 1024])
def test_the_memory_estimate_is_within_30_percent_of_the_measured_peak(ranks):
    """Halving-doubling at 256 and 1,024 ranks (bench's link, 10 Gbit/s and 20 us, SimGrid's corrections off): the
    memory estimate within 30% of the peak, and the simulated sync within 5% of the alpha-beta model (the model's
    check at scale)."""
    from experiments.simulate.bench import bench

    (row,) = bench([ranks], ["halving_doubling"], log=open(os.devnull, "w"), network_model="alpha_beta")
    assert not row["error"], row["error"]
    assert row["sim_sync_s"] == pytest.approx(row["model_sync_s"], rel=0.05), row
    assert row["peak_bytes"] > 0
    ratio = row["estimate_bytes"] / row["peak_bytes"]
    assert 0.7 <= ratio <= 1.3, (ranks, row["estimate_bytes"] / 2**20, row["peak_bytes"] / 2**20)


@needs_simgrid
def test_a_sweep_over_the_memory_limit_is_refused_in_seconds_naming_the_estimate(tmp_path):
    from experiments.simulate.substrate import simulate_sweep
    from workloads.models import param_sizes

    param_sizes("resnet50", 1000)  # torchvision's import (seconds on a loaded machine) is not the check's time
    sweep = tmp_path / "huge.toml"
    sweep.write_text('name = "huge"\n[defaults]\nworkload = "resnet50"\nimage_size = 224\nnum_classes = 1000\n'
                     'batch_size = 8\nsteps = 1\nwarmup_steps = 0\nlink = { bandwidth = "10Gbit", latency = "20us" }\n'
                     '[grid]\nstrategy = ["halving_doubling"]\nworkers = [16384]\n'
                     '[simulate]\nforward_s = 0.01\nbackward_s = 0.02\noptimizer_s = 0.0\n')
    start = time.perf_counter()
    with pytest.raises(ValueError) as refused:
        simulate_sweep(sweep, tmp_path / "out", max_memory=memory.parse_memory("1GB"))
    assert time.perf_counter() - start < 10
    text = str(refused.value)
    assert "16,384 ranks x 115 KiB" in text and "over --max-memory 954 MiB" in text, text
    assert not (tmp_path / "out" / "runs").exists() or not any((tmp_path / "out" / "runs").iterdir())


def test_the_estimate_grows_with_ranks_and_messages_and_the_machine_limit_applies():
    small, large = memory.estimate(256, 4096), memory.estimate(16384, 458752)
    assert large.growth_bytes == 16384 * memory.PER_RANK + 458752 * memory.PER_MESSAGE
    assert small.peak_bytes < large.peak_bytes
    assert memory.refusal(small, limit=large.peak_bytes) is None
    assert "over --max-memory" in memory.refusal(large, limit=small.peak_bytes)
    available = memory.available_bytes()
    if available is not None:  # a growth past everything the machine has is refused without a limit given
        bomb = memory.MemoryEstimate(0, ranks=2 * available // memory.PER_RANK + 1, messages=0)
        assert "this machine can give it" in memory.refusal(bomb)


@pytest.mark.parametrize("text, expected", [("8GB", 8 * 10**9), ("512MiB", 512 << 20), ("2G", 2 << 30),
                                            ("1.5GiB", 3 << 29), ("1000000", 10**6)])
def test_memory_sizes_parse(text, expected):
    assert memory.parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "-1GB", "0", "lots", "8XB", "inf", "nanGB"])
def test_bad_memory_sizes_are_refused_naming_the_value(text):
    with pytest.raises(ValueError, match="memory .*expected a positive size"):
        memory.parse_memory(text)


def test_a_child_the_kernel_kills_is_reported_with_the_memory_it_reached():
    def grow_then_die():
        ballast = bytearray(200 << 20)  # touched: resident
        ballast[:: 4096] = b"x" * len(ballast[:: 4096])
        time.sleep(1.2)  # the parent reads the high-water mark every 0.5 s
        os.kill(os.getpid(), signal.SIGKILL)

    done = run_child(grow_then_die)
    assert done.result is None
    assert "died (exit code -9) at" in done.error and "MiB resident" in done.error and "killed" in done.error
    assert done.peak_bytes >= 200 << 20


def test_a_rank_keeps_counters_only_for_the_peers_it_talks_to():
    class Loop(Communicator):  # the counters are the base class's: any transport's raw operations will do
        transport = "loop"

        def _raw_isend(self, tensor, dst, stamp):
            return lambda timeout: None

        def _raw_irecv(self, tensor, src, stamped):
            return lambda timeout: None

        def allgather_object(self, obj):
            return [obj]

        def native_allreduce(self, tensor, op):
            raise NotImplementedError

    import torch

    comm = Loop(0, 16384)
    comm.isend(torch.zeros(3), 5).wait()
    comm.irecv(torch.zeros(2), 16383).wait()
    comm.isend(torch.zeros(1), 5).wait()
    snap = comm.reset_counters()
    assert sorted(snap.per_peer) == [5, 16383]
    assert (snap.bytes_sent, snap.bytes_recv, snap.msgs_sent, snap.msgs_recv) == (16, 8, 2, 1)
    assert len(comm._peers) == 0 and comm.counters().per_peer == {}

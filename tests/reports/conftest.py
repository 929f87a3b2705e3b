"""A small fake results directory in the results schema (experiments/results/schema.py): 3 strategies, workers 1/2/4,
two links. Rows are built with schema.row, so the fixture has exactly the columns the runner writes (plus the display
labels readers derive, written into the one runs.parquet file the tests edit)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import strategies
from experiments.results import schema

NUMEL = 11_689_512  # resnet18
CORES = 2
EVIL_SWEEP = "demo <script>alert(1)</script>"
LINKS = {"1Gbit": 125e6, "full speed": math.nan}
STRATEGIES = [("ring", {}, 0), ("parameter_server", {"servers": 1}, 1),
              ("decentralized", {"topology": "ring"}, 0)]


def analytic(strategy: str, workers: int) -> tuple[float, float, float]:
    """(bytes sent per worker, rounds, path bytes): ring's real traffic; simple stand-ins for the others."""
    d = NUMEL * 4
    if workers == 1:
        return 0.0, 0.0, 0.0
    if strategy == "ring":
        t = strategies.make("ring").traffic(workers, NUMEL)
        return float(t.worker_bytes_sent), float(t.rounds), float(t.path_bytes)
    if strategy == "parameter_server":
        return float(d), 2.0, float(d * workers)
    return float(2 * d), 1.0, float(2 * d)  # decentralized ring: one exchange with each of two neighbours


def make_results(path, sweep: str = "fixture-sweep", with_steps: bool = True) -> None:
    """Write runs.parquet (and steps.parquet, sweep.toml) under path."""
    rng = np.random.default_rng(0)
    runs, steps = [], []
    compute = 0.20
    for link, bandwidth in LINKS.items():
        for strategy, params, servers_per in STRATEGIES:
            for workers in (1, 2, 4):
                run_id = f"{strategy}-{workers}-{link.replace(' ', '')}"
                servers = servers_per if workers > 1 else 0
                sent, rounds, path_bytes = analytic(strategy, workers)
                beta = 1 / bandwidth if bandwidth == bandwidth else 1 / 2e9
                comm = rounds * 50e-6 + path_bytes * beta * (1.05 + 0.05 * rng.random())
                over = workers + servers > CORES
                compute_s = compute * (1.6 if over else 1.0)
                step_s = compute_s + comm
                batch = 32
                decentral = strategy == "decentralized"
                runs.append(schema.row(
                    schema.RUNS, run_id=run_id, sweep=sweep, substrate="ray", workload="resnet18", image_size=32,
                    batch_size=batch, steps=8, warmup_steps=2, device="cpu", seed=0, lr=0.1,
                    strategy=strategy, **{f"param_{k}": v for k, v in params.items()},
                    workers=workers, servers=servers, bytes_counted=True,
                    link_bandwidth=bandwidth, link_latency_s=0.0,
                    link_emulation="python" if bandwidth == bandwidth else "", straggler_slowdown=1.0,
                    compute="real", status="ok", throughput=workers * batch / step_s, step_time_s=step_s,
                    compute_s=compute_s, comm_s=comm, comm_fraction=comm / step_s, exposed_comm_s=comm,
                    bytes_sent_per_worker=sent, bytes_recv_per_worker=sent,
                    bytes_sent_per_server=float(NUMEL * 4 * workers) if servers else math.nan,
                    bytes_recv_per_server=float(NUMEL * 4 * workers) if servers else math.nan,
                    analytic_bytes_sent_per_worker=sent, analytic_rounds=rounds,
                    analytic_path_bytes=path_bytes, numel=NUMEL, model_bytes=NUMEL * 4,
                    final_loss=2.0, param_norm=30.0,
                    consensus_distance=0.01 if decentral and workers > 1 else math.nan,
                    spectral_gap=(1 - math.cos(2 * math.pi / workers)) / 3 if decentral and workers > 1
                    else math.nan,
                    transport="gloo", cores=CORES, gpu="", cores_oversubscribed=over, host="testhost",
                    started_at="2025-01-01T00:00:00", duration_s=10.0,
                ))
                for step in range(8):
                    for rank in range(workers + servers):
                        worker = rank < workers
                        steps.append(schema.row(
                            schema.STEPS, run_id=run_id, step=step, rank=rank,
                            role="worker" if worker else "server", timed=step >= 2,
                            compute_s=compute_s, comm_s=comm, bytes_sent=int(sent), bytes_recv=int(sent),
                            loss=2.3 * math.exp(-0.05 * step * workers) + 0.01 * rng.random()
                            if worker else math.nan,
                            samples=batch if worker else 0,
                            consensus_distance=0.1 / (step + 1) if decentral and worker and workers > 1
                            else math.nan,
                            wall_s=step * step_s, backward_end_s=compute_s, comm_busy_s=comm,
                        ))
    # One failed run: NaN metrics, shown in the table, skipped in figures.
    failed = dict(runs[0], run_id="ring-8-1Gbit", workers=8, status="failed",
                  error="RuntimeError: peer 5 timed out after 60 s <b>")
    for key in ("throughput", "step_time_s", "compute_s", "comm_s", "comm_fraction", "bytes_sent_per_worker",
                "bytes_recv_per_worker", "final_loss", "param_norm"):
        failed[key] = math.nan
    runs.append(failed)
    # one runs.parquet as readers see it (typed, display labels derived), so that tests can edit it as a frame
    schema.conform(pd.DataFrame(runs), schema.RUNS).to_parquet(path / "runs.parquet")
    if with_steps:
        pd.DataFrame(steps).to_parquet(path / "steps.parquet")
    (path / "sweep.toml").write_text(f'name = {json.dumps(sweep)}\ndescription = "fixture sweep"\n')


@pytest.fixture
def fake_results():
    """make_results(path, sweep=..., with_steps=...) for tests that vary the fixture."""
    return make_results


@pytest.fixture
def evil_sweep():
    return EVIL_SWEEP


@pytest.fixture
def results_dir(tmp_path):
    make_results(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def built_report(tmp_path_factory):
    """One report built once for the whole session (the Chromium and content tests share it)."""
    from reports.page import build

    path = tmp_path_factory.mktemp("report")
    make_results(path, sweep=EVIL_SWEEP)
    return build(path)

"""Run a sweep: one run at a time on Ray actors, each finished run appended to the results store.

Runs that share a world size reuse one worker group (an actor holding torch costs seconds to start), so
runs are executed grouped by world size, in file order within a group. A failing run records its error
and the sweep goes on; SIGINT/SIGTERM stop between writes, never inside one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import signal
import sys
import threading
import time
from pathlib import Path

import pandas as pd

import strategies
from experiments.cluster import placement
from experiments.cluster.group import GroupError, WorkerGroup
from experiments.cluster.limits import check_capacity, cluster_capacity, local_capacity
from experiments.cluster.ray_runtime import ensure_ray, stop_ray
from experiments.config.sweep import RunSpec, Sweep
from experiments.pipeline.profiles import install_profile
from experiments.pipeline.store import Store, StoreError
from experiments.pipeline.summary import summarize
from experiments.pipeline.train import train


def run_sweep(sweep: Sweep, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
              address: str | None = None, log=sys.stderr, train_fn=train, oversubscribe: bool = False) -> pd.DataFrame:
    """Run every run of the sweep that is not already done; return runs.parquet as a DataFrame.

    `train_fn(ctx, spec[, progress])` is what every rank executes (experiments.pipeline.train.train; tests substitute
    their own; `progress` is passed only when the log is a terminal). Before any actor starts, the runs are
    checked against the machine (or cluster): experiments.cluster.limits; `oversubscribe` lifts its ranks-per-core
    limit.
    """
    store = Store(out_dir)
    store.start(resume, overwrite)
    if resume and not overwrite:
        check_same_sweep(store, sweep)
    store.write_text("sweep.toml", sweep.source)
    store.write_text("sweep.resolved.json", resolved(sweep))
    done = store.done() if resume else set()
    todo = sorted((s for s in sweep.runs if s.run_id not in done), key=lambda s: s.world_size())
    print(f"sweep {sweep.name!r}: {len(sweep.runs)} runs, {len(sweep.runs) - len(todo)} already done, "
          f"results in {store.dir}", file=log)
    if not todo:
        return store.runs()

    # kernel-emulated links need the namespace cluster: refused here, before any work, when there is none
    address = placement.connect_address([s.network() for s in todo], address)
    import ray

    embedded = not ray.is_initialized() and not (address or os.environ.get("RAY_ADDRESS"))
    if embedded:  # this machine's limits, before Ray starts
        check_capacity(todo, local_capacity(), oversubscribe)
    # an embedded Ray gets a logical CPU per rank: oversubscribing the cores is allowed, and reported
    started_ray = ensure_ray(address, num_cpus=max(os.cpu_count() or 1, max(s.world_size() for s in todo)))
    if not embedded:  # the cluster's limits, before any actor starts
        try:
            check_capacity(todo, cluster_capacity(), oversubscribe)
        except ValueError:
            if started_ray:
                stop_ray()
            raise
    previous = _stop_on_signals()
    group: WorkerGroup | None = None
    measured_profiles: dict = {}  # compute = "profile" without a file: measured once per sweep
    started = time.perf_counter()
    try:
        for spec in todo:  # every kernel-emulated run placeable on the cluster's shaped nodes, or no run starts
            placement.check(spec.world_size(), spec.network())
        for i, spec in enumerate(todo, 1):
            world, cuda = spec.world_size(), spec.device == "cuda"
            eta = _eta(started, i - 1, len(todo))
            straggler = (f" straggler=ranks {spec.straggler['ranks']} x{spec.straggler['slowdown']:g}"
                         if spec.straggler and spec.straggler["ranks"] else "")
            print(f"[run {i}/{len(todo)}] {spec.strategy} workers={spec.workers} {spec.workload} "
                  f"link={spec.link_label}{straggler} steps={spec.steps}  (ETA sweep {eta})", file=log, flush=True)
            try:
                nodes = placement.bundles(world, spec.network())
            except placement.NodeLost as e:  # a node lost mid-sweep: this run refused at once, the sweep goes on
                run_row, _ = summarize(spec, None, str(e), _no_group_meta())
                with _signals_held():
                    store.append(run_row, [])
                print(f"           -> FAILED: {run_row['error'][:300]}", file=log, flush=True)
                continue
            if (group is None or group.broken or group.world_size != world or group.uses_gpu != cuda
                    or group.node_resources != nodes):
                if group is not None:
                    group.shutdown()
                    group = None
                try:
                    group = WorkerGroup(world, num_gpus=_gpus_per_actor(world) if cuda else 0,
                                        timeout=spec.timeout, node_resources=nodes)
                except (RuntimeError, ValueError) as e:
                    run_row, _ = summarize(spec, None, f"worker group did not start: {e}", _no_group_meta())
                    with _signals_held():
                        store.append(run_row, [])
                    print(f"           -> FAILED: {run_row['error'][:300]}", file=log, flush=True)
                    continue
            try:
                install_profile(group, spec, measured_profiles, store)
            except GroupError as e:
                print(f"           -> profile measurement failed: {str(e)[:300]}", file=log, flush=True)
            run_row, step_rows = _run_one(group, spec, train_fn, log)
            with _signals_held():
                store.append(run_row, step_rows)
            status = (f"{run_row['throughput']:.1f} samples/s, step {run_row['step_time_s'] * 1e3:.0f} ms, "
                      f"comm {run_row['comm_fraction'] * 100:.0f}%" if run_row["status"] == "ok"
                      else f"FAILED: {run_row['error'][:300]}")
            print(f"           -> {status}", file=log, flush=True)
    finally:
        if group is not None:
            group.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if started_ray:
            stop_ray()
    return store.runs()


def resolved(sweep: Sweep) -> str:
    """Every run of the sweep with every setting spelled out (defaults included) and its run id, as JSON."""
    runs = [{"run_id": spec.run_id, **dataclasses.asdict(spec)} for spec in sweep.runs]
    return json.dumps({"name": sweep.name, "description": sweep.description, "runs": runs}, indent=1) + "\n"


def check_same_sweep(store: Store, sweep: Sweep) -> None:
    """--resume only into a directory holding this same sweep: StoreError naming the settings that differ.

    Merging two sweeps would mix their runs and overwrite the only record of the first one's configuration.
    """
    new = {spec.run_id: {"sweep": sweep.name, **dataclasses.asdict(spec)} for spec in sweep.runs}
    path = store.dir / "sweep.resolved.json"
    if path.exists():
        try:
            recorded = json.loads(path.read_text())
            old = {run["run_id"]: {k: v for k, v in run.items() if k != "run_id"} for run in recorded["runs"]}
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path} is not a syncbench sweep record ({e}): choose another --out") from None
    else:  # no record: the run ids on disk must all belong to this sweep
        foreign = set(store.runs().get("run_id", [])) - set(new)
        if foreign:
            raise StoreError(f"{store.dir} holds {len(foreign)} run(s) that are not in sweep {sweep.name!r} and no "
                             f"sweep.resolved.json to say what they were: choose another --out, or --overwrite to "
                             f"discard them")
        return
    if set(old) == set(new):
        return
    differ = []
    for key in sorted({k for run in [*old.values(), *new.values()] for k in run}):
        before = sorted({json.dumps(run.get(key), sort_keys=True) for run in old.values()})
        after = sorted({json.dumps(run.get(key), sort_keys=True) for run in new.values()})
        if before != after:
            differ.append(f"{key}: {_values(before)} there, {_values(after)} in this sweep")
    if not differ:
        differ.append(f"the runs: {len(set(old) - set(new))} there are not in this sweep, "
                      f"{len(set(new) - set(old))} here are not there")
    raise StoreError(f"{store.dir} holds a different sweep ({recorded.get('name', '?')!r}), --resume would mix "
                     f"the two: " + "; ".join(differ) + ". Choose another --out, or --overwrite to discard it")


def _values(dumped: list[str]) -> str:
    shown = ", ".join(dumped[:4]) + (f", ... ({len(dumped)} values)" if len(dumped) > 4 else "")
    return shown.replace("null", "(not set)")


def _run_one(group: WorkerGroup, spec: RunSpec, train_fn, log=None) -> tuple[dict, list[dict]]:
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    start = time.perf_counter()
    try:
        if log is not None and log.isatty():  # a live step counter for a person watching a terminal
            results = _with_step_progress(group, spec, train_fn, log)
        else:  # the communicator timeout bounds every wait
            results = group.run(train_fn, spec, network=spec.network(), p2p=spec.p2p)
        error = ""
    except GroupError as e:
        results, error = None, str(e)
    # what carried the strategy's bytes: the sweep's p2p, except for a backend's own allreduce (native, ddp)
    transport = spec.p2p if spec.p2p != "gloo" and strategies.get(spec.strategy).counted else group.backend
    meta = {"started_at": started_at, "duration_s": time.perf_counter() - start, "transport": transport,
            "gpu": group.gpu_name or "", "cores": group.cores, "host": group.host or platform.node()}
    return summarize(spec, results, error, meta)


def _with_step_progress(group: WorkerGroup, spec: RunSpec, train_fn, log) -> list:
    """group.run in a thread while rank 0 reports finished steps through a Ray queue; redraw one line."""
    from ray.util.queue import Queue

    queue = Queue(actor_options={"num_cpus": 0})
    outcome: dict = {}

    def call():
        try:
            outcome["result"] = group.run(train_fn, spec, queue, network=spec.network(), p2p=spec.p2p)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            outcome["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    start = time.perf_counter()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
            step = None
            while not queue.empty():
                step = queue.get_nowait()
            if step:
                elapsed = time.perf_counter() - start
                eta = elapsed / step * (spec.steps - step)
                print(f"\r           step {step}/{spec.steps}, {elapsed:.0f} s, ETA run {eta:.0f} s   ",
                      end="", file=log, flush=True)
    except BaseException:
        group.broken = True  # interrupted: shutdown kills the busy ranks instead of waiting for them
        raise
    finally:
        print("\r" + " " * 60 + "\r", end="", file=log, flush=True)
        queue.shutdown()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _no_group_meta() -> dict:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return {"started_at": now, "duration_s": 0.0, "transport": "", "gpu": "", "cores": os.cpu_count() or 1,
            "host": platform.node()}


def _gpus_per_actor(world: int) -> float:
    """One GPU each when there are enough, else an equal share of the GPUs there are."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus < 1:
        raise RuntimeError("device = 'cuda' but the Ray cluster has no GPU: use device = 'cpu'")
    return 1.0 if gpus >= world else math.floor(gpus / world * 100) / 100


def _eta(started: float, finished: int, total: int) -> str:
    if finished == 0:
        return "unknown"
    left = (time.perf_counter() - started) / finished * (total - finished)
    return f"{int(left // 60)}m{int(left % 60):02d}s"


_HOLD = {"holding": False, "signum": None}


def _stop_on_signals() -> dict:
    """SIGINT and SIGTERM stop the sweep (KeyboardInterrupt): the run in flight is abandoned, everything
    finished stays on disk; one that arrives while a run is being stored stops the sweep right after."""
    def handler(signum, frame):
        if _HOLD["holding"]:
            _HOLD["signum"] = signum
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    try:
        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        return {}


@contextlib.contextmanager
def _signals_held():
    """Defer SIGINT/SIGTERM to the end of the block, so that a run is stored whole or not at all."""
    _HOLD["holding"], _HOLD["signum"] = True, None
    try:
        yield
    finally:
        _HOLD["holding"] = False
    if _HOLD["signum"] is not None:
        raise KeyboardInterrupt(signal.Signals(_HOLD["signum"]).name)

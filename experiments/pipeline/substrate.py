"""Where a sweep's runs execute: a substrate, chosen by the runner, accepting a run by its capabilities.

A substrate turns one run into rows: it starts what it needs for the sweep (`session`), then executes runs one
at a time and summarizes each (experiments/pipeline/summary.py). Substrates: Ray actors over gloo/NCCL or
sockets (experiments/pipeline/ray_substrate.py, measured), thread ranks in this process (ThreadSubstrate below,
measured, for tests) and SimGrid (experiments/simulate/substrate.py, simulated).

What a substrate accepts is decided by what a strategy declares, never by its name:
- `counted = False` (its bytes move inside a backend's allreduce): needs a substrate with a backend allreduce;
- `wraps_model` (DDP): needs ranks joined by torch.distributed;
- server ranks (num_servers > 0): needs a substrate that runs them;
- a straggler: needs a substrate that can slow one rank's compute.
A setting a substrate cannot apply is refused before any run starts, naming the run and the setting; so is, on
the wall clock, a replayed step longer than the run's timeout (its peers would time out waiting, and a rank
alone would go silent for that long).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """One run of a sweep on a substrate: its id in the results, its RunSpec, the substrate's own settings."""

    run_id: str
    spec: object  # experiments.config.sweep.RunSpec
    settings: object = None

    def world_size(self) -> int:
        return self.spec.world_size()


class Substrate(ABC):
    """The interface and the capability checks every substrate shares."""

    name = ""
    heading = "sweep"  # the first line's word: sweep 'name': 8 runs, ...
    verb = "run"  # the progress lines' word: [run 3/8], [sim 3/8]
    backend_allreduce = True  # runs strategies whose bytes bypass the counters (counted = False)
    model_wrappers = False  # runs strategies that wrap the model (wraps_model: DDP)
    servers = True  # runs strategies with server ranks
    stragglers = True  # can slow one rank's compute
    wall_clock = True  # runs in real time: a replayed step longer than the run's timeout is refused
    failures = False  # injects failures and recovers as the run's recovery says (experiments/config/faults.py)
    failures_refusal = "its ranks cannot lose one and go on"  # why not, where failures is False
    nodes = False  # places ranks in nodes of ranks_per_node > 1 (a shared NIC, an intra-node link); a substrate
    # that can for some runs only (Ray: kernel-shaped links) says so and refuses the others in its problems()

    def runs(self, sweep) -> list[Run]:
        """Every run of the sweep, as this substrate executes it (one per RunSpec unless it adds axes)."""
        return [Run(spec.run_id, spec) for spec in sweep.runs]

    def problems(self, run: Run) -> list[str]:
        """What this substrate cannot apply in `run`: one line each, naming the setting; [] when it can run it."""
        spec = run.spec
        config = spec.strategy_config()
        what = f"run {spec.strategy} x {spec.workers} workers"
        found = []
        if not config.counted and not self.backend_allreduce:
            found.append(f"{what}: strategy {spec.strategy!r} declares counted = False (its bytes move inside a "
                         f"backend's allreduce) and the {self.name} substrate has no backend allreduce; accepted are "
                         f"strategies written over send/recv")
        if config.wraps_model and not self.model_wrappers:
            found.append(f"{what}: strategy {spec.strategy!r} wraps the model (wraps_model, as DDP does) and needs "
                         f"ranks joined by torch.distributed, which the {self.name} substrate does not have")
        if config.num_servers(spec.workers) and not self.servers:
            found.append(f"{what}: strategy {spec.strategy!r} needs server ranks, which the {self.name} substrate "
                         f"does not run")
        if spec.ranks_per_node > 1 and not self.nodes:
            found.append(f"{what}: ranks_per_node = {spec.ranks_per_node} cannot be applied on the {self.name} "
                         f"substrate (nodes of several ranks run on thread ranks, on SimGrid and on Ray with "
                         f"kernel-shaped links); accepted there is ranks_per_node = 1")
        if (spec.failures or spec.recovery) and not self.failures:
            found.append(f"{what}: failures = {spec.failures!r} cannot be applied on the {self.name} substrate "
                         f"({self.failures_refusal}); a sweep's training loses a rank and goes on with `syncbench run "
                         f"--substrate threads` (or ray, on strategies without servers); `syncbench faults` runs "
                         f"failures on Ray actors (--substrate ray), on SimGrid (--simulate) and in the model "
                         f"(strategies/fault_cost.py)")
        if spec.straggler and not self.stragglers:
            found.append(f"{what}: straggler = {spec.straggler!r} cannot be applied on the {self.name} substrate")
        if self.wall_clock and spec.compute == "profile" and spec.profile:
            from experiments.pipeline.train import replay_problem
            from workloads.profile import load_profile

            if problem := replay_problem(load_profile(spec.profile), spec, spec.profile):
                found.append(problem)
        return found

    def check(self, runs: list[Run]) -> None:
        """Refuse, before any work, a sweep with a run this substrate cannot apply (ValueError naming each)."""
        found = list(dict.fromkeys(p for run in runs for p in self.problems(run)))
        if found:
            shown = found[:10] + ([f"... and {len(found) - 10} more"] if len(found) > 10 else [])
            raise ValueError(f"the {self.name} substrate cannot run this sweep:\n  " + "\n  ".join(shown))

    def order(self, runs: list[Run]) -> list[Run]:
        """The order runs execute in (file order unless the substrate saves by grouping)."""
        return runs

    @abstractmethod
    def session(self, runs: list[Run], store, log):
        """A context manager: start what the sweep's runs need, yield a function run -> (run_row, step_rows),
        stop it all on the way out. `store` (experiments/pipeline/store.py) takes files a run leaves beside
        the results, `log` the progress lines."""

    def describe(self, run: Run) -> str:
        spec = run.spec
        straggler = (f" straggler=ranks {spec.straggler['ranks']} x{spec.straggler['slowdown']:g}"
                     if spec.straggler and spec.straggler["ranks"] else "")
        # every setting a sweep may vary: the strategy's parameters, buckets and overlap (runs differing only there
        # looked identical)
        params = "".join(f" {k}={v}" for k, v in spec.strategy_params.items())
        params += "".join(f" {k}={v}" for k, v in spec.wrapper_settings().items()  # compression, local SGD
                          if k not in spec.strategy_params and v != getattr(type(spec), k))
        buckets = (f" bucket_mb={spec.bucket_mb:g}" if spec.bucket_mb is not None else "") + (
            " overlap" if spec.overlap else "")
        return (f"{spec.strategy}{params} workers={spec.workers} {spec.workload} link={spec.link_label}{straggler}"
                f"{buckets} compute={spec.compute} steps={spec.steps}")

    def outcome(self, row: dict) -> str:
        if row["status"] != "ok":
            return f"FAILED: {row['error'][:300]}"
        target = ""
        if row.get("target_metric"):
            target = (f", {row['target_metric']} target at step {row['steps_to_target']:.0f} "
                      f"({row['time_to_target_s']:.2f} s)" if row["target_reached"] else ", target not reached")
        return (f"{row['throughput']:.1f} samples/s, step {row['step_time_s'] * 1e3:.0f} ms, "
                f"comm {row['comm_fraction'] * 100:.0f}%{target}")


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ThreadSubstrate(Substrate):
    """Every rank a thread of this process, messages through queues (strategies/transport/threads.py): the
    measured pipeline without Ray (tests, and the GPU check where Ray is not installed). Link emulation applies; the
    threads share this process's cores, and with device = "cuda" its one GPU."""

    name = "threads"
    failures = True  # a rank's thread stops, the survivors recover (experiments/pipeline/sweep_faults.py)
    nodes = True  # run_threads places the ranks in nodes; the emulated network shares each node's NIC

    def __init__(self, train_fn=None):
        from experiments.pipeline.train import train

        self.train_fn = train_fn or train

    def problems(self, run: Run) -> list[str]:
        from experiments.pipeline.sweep_faults import problems as fault_problems

        found = super().problems(run) + fault_problems(run.spec)
        if run.spec.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                found.append(f"run {run.spec.strategy} x {run.spec.workers} workers: device = 'cuda' but torch sees "
                             f"no CUDA GPU on this machine; accepted here is device = 'cpu'")
        return found

    @contextlib.contextmanager
    def session(self, runs: list[Run], store, log):
        yield self._execute

    def _execute(self, run: Run) -> tuple[dict, list[dict]]:
        from types import SimpleNamespace

        from experiments.pipeline.summary import summarize
        from experiments.pipeline.trace import run_events
        from strategies.transport.threads import run_threads

        spec = run.spec
        cuda = spec.device == "cuda"
        if spec.failures:  # the run loses ranks and recovers: segments of the training (sweep_faults.py)
            from experiments.pipeline.sweep_faults import execute
            from experiments.pipeline.sweep_outages import segments_for

            meta = {"started_at": now_utc(), "transport": "threads", "gpu": _gpu_name() if cuda else "",
                    "cores": os.cpu_count() or 1, "host": platform.node(), "substrate": "threads"}
            return execute(spec, meta, segments_for(spec))

        def body(comm):  # every thread rank computes on the run's device (all of them share one GPU)
            ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device=spec.device, state={})
            return self.train_fn(ctx, spec)

        started_at, start = now_utc(), time.perf_counter()
        try:
            # the timeout bounds every wait and the whole run: a run past it stops and fails, the sweep goes on
            results, error = run_threads(run.world_size(), body, timeout=spec.timeout, network=spec.network(),
                                         ranks_per_node=spec.ranks_per_node, run_timeout=spec.timeout), ""
        except Exception as e:  # noqa: BLE001 - the run fails, the sweep goes on
            results, error = None, f"{type(e).__name__}: {e}"
        meta = {"started_at": started_at, "duration_s": time.perf_counter() - start, "transport": "threads",
                "gpu": _gpu_name() if cuda else "", "cores": os.cpu_count() or 1, "host": platform.node(),
                "substrate": "threads"}
        row, steps = summarize(spec, results, error, meta)
        return row, steps, run_events(row["run_id"], results)


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())

"""`syncbench simulate --bench`: how long simulating one ResNet-50 training step takes, per strategy and rank count.

Every cell is one fresh process running one step (no warm-up) of the committed ResNet-50 profile on a star of
10 Gbit/s, 20 us NICs under SimGrid's default TCP model. `wall s` is the simulation alone (platform, actors,
the step); `total s` adds the process start (Python, torch). The simulated step time and the messages moved
are printed beside them: wall time grows with messages, not bytes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import strategies
from experiments.config.sweep import RunSpec
from experiments.simulate.platform import Platform
from experiments.simulate.substrate import SimSpec, Timeline, simulate_in_child

PROFILE = Path(__file__).resolve().parents[1] / "config" / "profiles" / "resnet50-b8-s224-cpu.json"
DEFAULT = (("halving_doubling", {}), ("parameter_server", {"servers": 8}), ("decentralized", {}), ("ring", {}),
           ("all_to_all", {}))
LINK = {"bandwidth": "10Gbit", "latency": "20us"}


def bench(workers: list[int], names: list[str] | None = None, log=sys.stderr,
          network_model: str = "tcp") -> list[dict]:
    """One row per (strategy, ranks): wall seconds to simulate one step, and what the step was."""
    from workloads.profile import load_profile

    profile = load_profile(PROFILE)
    timeline = Timeline.from_profile(profile)
    chosen = DEFAULT if names is None else [(n, {"servers": 8} if n == "parameter_server" else {}) for n in names]
    rows = []
    for n in workers:
        for name, params in chosen:
            config = strategies.make(name, **params)
            spec = RunSpec(sweep="bench", workload=profile.model, image_size=profile.image_size,
                           num_classes=profile.num_classes, batch_size=profile.batch_size, steps=1, warmup_steps=0,
                           strategy=name, workers=n, link=LINK, strategy_params=params)
            sim = SimSpec(Platform.parse({**LINK, "network_model": network_model}), timeline)
            traffic = config.traffic(n, timeline.numel, 4)
            messages = sum(r.msgs_sent for r in traffic.ranks)
            print(f"[bench] {name} ranks={config.world_size(n)} messages={messages:,} ...", file=log, flush=True)
            start = time.perf_counter()
            results, error, wall = simulate_in_child(spec, sim)
            total = time.perf_counter() - start
            workers = [r["steps"][0] for r in results or [] if r["steps"][0]["role"] == "worker"]
            step = max((w["compute_s"] + w["comm_s"] for w in workers), default=float("nan"))
            sync = max((w["comm_busy_s"] for w in workers), default=float("nan"))
            model = traffic.rounds * sim.platform.latency + traffic.path_bytes / sim.platform.bandwidth
            rows.append({"network_model": network_model,
                         "strategy": name + (f"({params['servers']} servers)" if params else ""), "workers": n,
                         "ranks": config.world_size(n), "messages": messages, "wall_s": wall, "total_s": total,
                         "sim_step_s": step, "sim_sync_s": sync, "model_sync_s": model, "error": error})
            print(f"        -> {wall:.1f} s" + (f"  FAILED: {error}" if error else ""), file=log, flush=True)
    return rows


def format_bench(rows: list[dict]) -> str:
    import os
    import platform

    models = ", ".join(sorted({r["network_model"] for r in rows})) or "tcp"
    lines = [f"# syncbench simulate --bench: one ResNet-50 step ({PROFILE.name}), star of {LINK['bandwidth']} / "
             f"{LINK['latency']} NICs, SimGrid {_simgrid_version()}, network model {models} "
             f"(tcp = SimGrid's default LV08, alpha_beta = its corrections off)",
             f"# host {platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
             f"wall s = the simulation, total s = with the process start",
             "# sim step s = the simulated step (compute + exposed sync), sim sync s = the simulated gradient sync, "
             "alpha-beta s = rounds x latency + path bytes / bandwidth",
             f"{'strategy':>28s} {'workers':>7s} {'ranks':>6s} {'messages':>10s} {'wall s':>8s} {'total s':>8s} "
             f"{'sim step s':>10s} {'sim sync s':>10s} {'alpha-beta s':>12s}"]
    for r in rows:
        lines.append(f"{r['strategy']:>28s} {r['workers']:7d} {r['ranks']:6d} {r['messages']:10,d} {r['wall_s']:8.1f} "
                     f"{r['total_s']:8.1f} {r['sim_step_s']:10.3f} {r['sim_sync_s']:10.3f} {r['model_sync_s']:12.3f}"
                     + (f"  FAILED: {r['error']}" if r["error"] else ""))
    return "\n".join(lines)


def _simgrid_version() -> str:
    from strategies.transport.simgrid import load_simgrid

    version = load_simgrid().simgrid_version
    return ".".join(map(str, version)) if isinstance(version, (tuple, list)) else str(version)


# -- the parameter-server family (issue 22.8): every mode, and k servers against BytePS's optimum ------------

PS_MODES = (("dedicated update", {}), ("dedicated summation", {"mode": "summation"}),
            ("colocated update", {"placement": "colocated"}),
            ("colocated summation", {"placement": "colocated", "mode": "summation"}),
            ("SSP s=2", {"staleness": 2}), ("async", {"staleness": "async"}), ("backups=1", {"backups": 1}))
PS_PLATFORMS = {"star": {}, "fat_tree": {"topology": "fat_tree", "oversubscription": 4}}


def bench_ps(cells: list[tuple[int, int, str]], modes: list[str] | None = None, log=sys.stderr,
             network_model: str = "tcp", nic: str = "shared") -> list[dict]:
    """One row per (workers n, servers k, platform, mode): one synchronization of ResNet-50's gradients (one
    flat bucket, no compute: the step is the sync) on a 10 Gbit/s, 20 us star or 4:1 fat tree (16 hosts per
    leaf): wall seconds, the simulated sync, its bytes against traffic(), BytePS's optimum (colocated: k = 0)
    and the alpha-beta time of traffic(). A run the simulator refuses (SimGridSubstrate.problems) is a row
    saying why, never simulated."""
    from experiments.simulate.substrate import SimGridSubstrate, summarize_simulated
    from strategies.cost import byteps_optimum
    from workloads.profile import load_profile

    profile = load_profile(PROFILE)
    numel = Timeline.from_profile(profile).numel
    timeline = Timeline(0.0, 0.0, 0.0, (numel,), (0.0,), "ResNet-50's gradients, no compute")
    chosen = [(name, params) for name, params in PS_MODES if modes is None or name in modes]
    rows = []
    for n, k, topology in cells:
        plat = Platform.parse({**LINK, "network_model": network_model, "nic": nic, **PS_PLATFORMS[topology]})
        for name, params in chosen:
            params = {"servers": k, **params}
            spec = RunSpec(sweep="bench", workload=profile.model, image_size=profile.image_size,
                           num_classes=profile.num_classes, batch_size=profile.batch_size, steps=1,
                           warmup_steps=0, strategy="parameter_server", workers=n, link=LINK,
                           strategy_params=params)
            config = spec.strategy_config()
            row = {"network_model": network_model, "nic": nic, "mode": name, "workers": n, "servers": k,
                   "platform": topology, "ranks": 0, "messages": 0,
                   "wall_s": float("nan"), "sim_sync_s": float("nan"), "optimum_s": float("nan"),
                   "model_s": float("nan"), "bytes_ok": False, "error": ""}
            substrate = SimGridSubstrate([(spec, SimSpec(plat, timeline))])
            (run,) = substrate.runs()
            problems = substrate.problems(run)
            try:
                config.check_workers(n)
            except ValueError as e:
                problems.append(str(e))
            if problems:
                rows.append({**row, "error": "refused: " + "; ".join(problems)})
                print(f"[bench-ps] {name} n={n} k={k} {topology}: refused", file=log, flush=True)
                continue
            traffic = config.traffic(n, numel, 4)
            row["ranks"], row["messages"] = config.world_size(n), sum(r.msgs_sent for r in traffic.ranks)
            row["optimum_s"] = byteps_optimum(n, config.num_servers(n), numel * 4, plat.bandwidth)
            row["model_s"] = traffic.rounds * plat.latency + traffic.path_bytes / plat.bandwidth
            print(f"[bench-ps] {name} n={n} k={k} {topology} ranks={row['ranks']} messages={row['messages']:,} ...",
                  file=log, flush=True)
            results, error, wall = simulate_in_child(run.spec, run.settings)
            summary, _ = summarize_simulated(run.spec, run.settings, results, error, wall, "now", run.run_id)
            row["wall_s"], row["error"] = wall, summary["error"]
            if summary["status"] == "ok":
                row["sim_sync_s"] = summary["comm_s"]
                row["bytes_ok"] = summary["bytes_sent_per_worker"] == summary["analytic_bytes_sent_per_worker"]
            rows.append(row)
            print("        -> " + format_bench_ps([row]).splitlines()[-1].strip(), file=log, flush=True)
    return rows


def format_bench_ps(rows: list[dict]) -> str:
    import os

    lines = [f"# syncbench simulate --bench --ps: one sync of ResNet-50's gradients ({PROFILE.name}: one flat bucket, "
             f"no compute), {LINK['bandwidth']} / {LINK['latency']} NICs, SimGrid {_simgrid_version()}, network model "
             f"{', '.join(sorted({r['network_model'] for r in rows}))}, "
             f"nic {', '.join(sorted({r['nic'] for r in rows}))}",
             f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; optimum s = BytePS's "
             f"2n(n-1)M/((n^2+kn-2k)B) (colocated: k = 0), alpha-beta s = traffic()'s rounds x latency + path "
             f"bytes / bandwidth; bytes = every rank's counted bytes equal traffic()",
             f"{'mode':>20s} {'n':>5s} {'k':>4s} {'platform':>8s} {'ranks':>5s} {'messages':>9s} {'wall s':>7s} "
             f"{'sim sync s':>10s} {'optimum s':>9s} {'alpha-beta s':>12s} {'bytes':>5s}"]
    for r in rows:
        if r["error"].startswith("refused"):
            lines.append(f"{r['mode']:>20s} {r['workers']:5d} {r['servers']:4d} {r['platform']:>8s}  "
                         f"{r['error'][:150]}")
            continue
        lines.append(f"{r['mode']:>20s} {r['workers']:5d} {r['servers']:4d} {r['platform']:>8s} {r['ranks']:5d} "
                     f"{r['messages']:9,d} {r['wall_s']:7.1f} {r['sim_sync_s']:10.4f} {r['optimum_s']:9.4f} "
                     f"{r['model_s']:12.4f} {'ok' if r['bytes_ok'] else 'DIFF':>5s}"
                     + (f"  FAILED: {r['error'][:200]}" if r["error"] else ""))
    return "\n".join(lines)

"""`syncbench simulate --bench`: how long simulating one ResNet-50 training step takes, per strategy and rank count.

Every cell is one fresh process running one step (no warm-up) of the committed ResNet-50 profile on a star of
10 Gbit/s, 20 us NICs under SimGrid's default TCP model. `wall s` is the simulation alone (platform, actors,
the step); `total s` adds the process start (Python, torch). The simulated step time and the messages moved
are printed beside them: wall time grows with messages, not bytes.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from pathlib import Path

import strategies
from experiments.config.sweep import RunSpec
from experiments.simulate.platform import Platform
from experiments.simulate.substrate import SimSpec, Timeline, run_in_child

PROFILE = Path(__file__).resolve().parents[1] / "config" / "profiles" / "resnet50-b8-s224-cpu.json"
DEFAULT = (("halving_doubling", {}), ("parameter_server", {"servers": 8}), ("decentralized", {}), ("ring", {}),
           ("all_to_all", {}))
LINK = {"bandwidth": "10Gbit", "latency": "20us"}


def bench(workers: list[int], names: list[str] | None = None, log=None,
          network_model: str = "tcp", max_memory: int | None = None) -> list[dict]:
    """One row per (strategy, ranks): wall and CPU seconds and peak memory to simulate one step, and what the
    step was. A cell over the actor limit or whose estimated memory does not fit (memory.refusal: this machine's,
    or `max_memory` bytes) is a row saying why, never started."""
    from experiments.simulate import memory
    from experiments.simulate.substrate import MAX_ACTORS, model_comm_s, simulate_child

    log = sys.stderr if log is None else log  # the stderr of now: a default bound at import may be closed
    from workloads.profile import load_profile

    profile = load_profile(PROFILE)
    timeline = Timeline.from_profile(profile)
    chosen = DEFAULT if names is None else [(n, {"servers": 8} if n == "parameter_server" else {}) for n in names]
    rows = []
    for n in workers:
        for name, params in chosen:
            config = strategies.make(name, **params)
            row = {"network_model": network_model, "strategy": name + (f"({params['servers']} servers)" if params
                                                                        else ""),
                   "workers": n, "ranks": config.world_size(n), "messages": 0, "wall_s": math.nan,
                   "total_s": math.nan, "cpu_s": math.nan, "peak_bytes": 0, "estimate_bytes": 0,
                   "sim_step_s": math.nan, "sim_sync_s": math.nan, "model_sync_s": math.nan, "error": ""}
            if row["ranks"] > MAX_ACTORS:
                rows.append({**row, "error": f"refused: {row['ranks']:,} ranks exceed the simulator's {MAX_ACTORS:,} "
                                            f"(each an OS thread)"})
                print(f"[bench] {name} ranks={row['ranks']:,}: refused", file=log, flush=True)
                continue
            spec = RunSpec(sweep="bench", workload=profile.model, image_size=profile.image_size,
                           num_classes=profile.num_classes, batch_size=profile.batch_size, steps=1, warmup_steps=0,
                           strategy=name, workers=n, link=LINK, strategy_params=params)
            sim = SimSpec(Platform.parse({**LINK, "network_model": network_model}), timeline)
            traffic = config.traffic(n, timeline.numel, 4)
            row["messages"] = messages = sum(r.msgs_sent for r in traffic.ranks)
            row["model_sync_s"] = model_comm_s(spec, sim)
            needed = memory.estimate(row["ranks"], messages)
            row["estimate_bytes"] = needed.peak_bytes
            refused = memory.refusal(needed, max_memory, f"{name} at {row['ranks']:,} ranks")
            if refused:
                rows.append({**row, "error": "refused: " + refused})
                print(f"[bench] {refused}", file=log, flush=True)
                continue
            print(f"[bench] {name} ranks={row['ranks']} messages={messages:,}, estimated peak "
                  f"{needed.peak_bytes / memory.MiB:,.0f} MiB ...", file=log, flush=True)
            start = time.perf_counter()
            done = simulate_child(spec, sim)
            workers_ = [r["steps"][0] for r in done.result or [] if r["steps"][0]["role"] == "worker"]
            row.update(wall_s=done.wall_s, total_s=time.perf_counter() - start, cpu_s=done.cpu_s,
                       peak_bytes=done.peak_bytes, error=done.error,
                       sim_step_s=max((w["compute_s"] + w["comm_s"] for w in workers_), default=math.nan),
                       sim_sync_s=max((w["comm_busy_s"] for w in workers_), default=math.nan))
            rows.append(row)
            print(f"        -> {done.wall_s:.1f} s, {done.cpu_s:.1f} CPU s, peak {done.peak_bytes / memory.MiB:,.0f} "
                  f"MiB" + (f"  FAILED: {done.error}" if done.error else ""), file=log, flush=True)
    return rows


def format_bench(rows: list[dict]) -> str:
    import os
    import platform

    models = ", ".join(sorted({r["network_model"] for r in rows})) or "tcp"
    lines = [f"# syncbench simulate --bench: one ResNet-50 step ({PROFILE.name}), star of {LINK['bandwidth']} / "
             f"{LINK['latency']} NICs, SimGrid {_simgrid_version()}, network model {models} "
             f"(tcp = SimGrid's default LV08, alpha_beta = its corrections off)",
             f"# host {platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
             f"wall s = the simulation, total s = with the process start, CPU s = the simulation's process",
             "# peak MiB = the simulation process's peak resident memory (it starts with this process's, forked), "
             "estimate MiB = what was predicted before it started",
             "# sim step s = the simulated step (compute + exposed sync), sim sync s = the simulated gradient sync, "
             "alpha-beta s = rounds x latency + path bytes / bandwidth",
             f"{'strategy':>28s} {'workers':>7s} {'ranks':>6s} {'messages':>11s} {'wall s':>8s} {'total s':>8s} "
             f"{'CPU s':>8s} {'peak MiB':>9s} {'estimate MiB':>12s} {'sim step s':>10s} {'sim sync s':>10s} "
             f"{'alpha-beta s':>12s}"]
    for r in rows:
        lines.append(f"{r['strategy']:>28s} {r['workers']:7d} {r['ranks']:6d} {r['messages']:11,d} "
                     f"{r['wall_s']:8.1f} {r['total_s']:8.1f} {r['cpu_s']:8.1f} {r['peak_bytes'] / 2**20:9,.0f} "
                     f"{r['estimate_bytes'] / 2**20:12,.0f} {r['sim_step_s']:10.3f} {r['sim_sync_s']:10.3f} "
                     f"{r['model_sync_s']:12.3f}" + _bench_error(r["error"]))
    return "\n".join(lines)


def _bench_error(error: str) -> str:
    if not error:
        return ""
    return f"  NOT RUN: {error.removeprefix('refused: ')}" if error.startswith("refused: ") else f"  FAILED: {error}"


def _simgrid_version() -> str:
    from strategies.transport.simgrid import load_simgrid

    version = load_simgrid().simgrid_version
    return ".".join(map(str, version)) if isinstance(version, (tuple, list)) else str(version)


# -- the parameter-server family: every mode, and k servers against BytePS's optimum ------------

PS_MODES = (("dedicated update", {}), ("dedicated summation", {"mode": "summation"}),
            ("colocated update", {"placement": "colocated"}),
            ("colocated summation", {"placement": "colocated", "mode": "summation"}),
            ("SSP s=2", {"staleness": 2}), ("async", {"staleness": "async"}), ("backups=1", {"backups": 1}))
PS_PLATFORMS = {"star": {}, "fat_tree": {"topology": "fat_tree", "oversubscription": 4}}


def bench_ps(cells: list[tuple[int, int, str]], modes: list[str] | None = None, log=None,
             network_model: str = "tcp", nic: str = "shared") -> list[dict]:
    """One row per (workers n, servers k, platform, mode): one synchronization of ResNet-50's gradients (one
    flat bucket, no compute: the step is the sync) on a 10 Gbit/s, 20 us star or 4:1 fat tree (16 hosts per
    leaf): wall seconds, the simulated sync, its bytes against traffic(), BytePS's optimum (colocated: k = 0)
    and the alpha-beta time of traffic(). A run the simulator refuses (SimGridSubstrate.problems) is a row
    saying why, never simulated."""
    log = sys.stderr if log is None else log  # the stderr of now: a default bound at import may be closed
    from experiments.simulate.substrate import SimGridSubstrate, run_in_child_timed, simulate, summarize_simulated
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
                   "wall_s": float("nan"), "cpu_s": float("nan"), "sim_sync_s": float("nan"), "optimum_s": float("nan"),
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
            results, error, wall, cpu = run_in_child_timed(functools.partial(simulate, run.spec, run.settings))
            summary, _ = summarize_simulated(run.spec, run.settings, results, error, wall, "now", run.run_id)
            row["wall_s"], row["cpu_s"], row["error"] = wall, cpu, summary["error"]
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
             f"bytes / bandwidth; bytes = every rank's counted bytes equal traffic(); cpu s = the simulation process's "
             f"CPU seconds (on a loaded machine nearer a quiet one's wall s)",
             f"{'mode':>20s} {'n':>5s} {'k':>4s} {'platform':>8s} {'ranks':>5s} {'messages':>9s} {'wall s':>7s} "
             f"{'cpu s':>7s} "
             f"{'sim sync s':>10s} {'optimum s':>9s} {'alpha-beta s':>12s} {'bytes':>5s}"]
    for r in rows:
        if r["error"].startswith("refused"):
            lines.append(f"{r['mode']:>20s} {r['workers']:5d} {r['servers']:4d} {r['platform']:>8s}  "
                         f"{r['error'][:150]}")
            continue
        lines.append(f"{r['mode']:>20s} {r['workers']:5d} {r['servers']:4d} {r['platform']:>8s} {r['ranks']:5d} "
                     f"{r['messages']:9,d} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['sim_sync_s']:10.4f} "
                     f"{r['optimum_s']:9.4f} {r['model_s']:12.4f} {'ok' if r['bytes_ok'] else 'DIFF':>5s}"
                     + (f"  FAILED: {r['error'][:200]}" if r["error"] else ""))
    return "\n".join(lines)


# -- nodes of several ranks: flat ring vs hierarchical vs double binary tree ------------------------

NODE_STRATEGIES = ("ring", "hierarchical", "double_binary_tree")
INTRA = {"intra_bandwidth": "100Gbit", "intra_latency": "2us"}


def node_model(config, n: int, k: int, numels: list[int], plat: Platform) -> dict:
    """The cost model of syncing buckets of `numels` elements (float32) one after another on nodes of k ranks: per
    bucket strategies.cost.node_cost, the one price (the busiest node NIC's bytes / the NIC bandwidth, each rank's
    intra-node bytes / the intra-node bandwidth, rounds x the latency of the route they cross; hierarchical's
    pipeline stage by stage), summed; model_nic_s and model_intra_s are each level's own seconds."""
    from strategies import cost

    nic_s = intra_s = total = 0.0
    for numel in numels:
        price = cost.node_cost(config, n, numel, k, plat.bandwidth, plat.intra_bandwidth, plat.latency,
                               plat.intra_latency)
        nic_s, intra_s, total = nic_s + price.nic_s, intra_s + price.intra_s, total + price.time_s
    return {"model_nic_s": nic_s, "model_intra_s": intra_s, "model_s": total}


def bench_nodes(n: int, k: int, names: list[str] | None = None, log=None, network_model: str = "tcp",
                nic: str = "shared", bucket_mb: float = 25.0) -> list[dict]:
    """One row per strategy: ResNet-50's gradients in DDP buckets of `bucket_mb` MiB, synced one after another (no
    compute), by n ranks in nodes of k (the `nodes` platform: 10 Gbit/s, 20 us NICs, 100 Gbit/s, 2 us inside),
    against node_model(); for hierarchical the simulated time of its across-node phase (its `phase_s`, the
    slowest rank's) beside the model's NIC level. Bytes: every rank's counted bytes equal traffic()'s, summed
    over the buckets."""
    log = sys.stderr if log is None else log  # the stderr of now: a default bound at import may be closed
    import torch

    from strategies.transport.simgrid_run import run_simgrid
    from workloads.buckets import make_buckets
    from workloads.profile import load_profile

    profile = load_profile(PROFILE)
    numels = [b.numel for b in make_buckets(profile.numels, bucket_mb)]
    plat = Platform.parse({**LINK, **INTRA, "topology": "nodes", "gpus_per_node": k, "network_model": network_model,
                           "nic": nic})
    rows = []
    for name in names or NODE_STRATEGIES:
        node_aware = "ranks_per_node" in strategies.get(name).parameters()  # grouped by the platform's nodes
        config = strategies.make(name, **({"ranks_per_node": k} if node_aware else {}))
        world = config.world_size(n)
        traffic = [config.traffic(n, numel, 4) for numel in numels]
        messages = sum(r.msgs_sent for t in traffic for r in t.ranks)
        expected = [sum(t.ranks[rank].bytes_sent for t in traffic) for rank in range(n)]
        row = {"strategy": name, "workers": n, "ranks_per_node": k, "buckets": len(numels), "messages": messages,
               "network_model": network_model, "nic": nic, "platform": plat.label(),
               **node_model(config, n, k, numels, plat)}

        def rank_main(comm, config=config):
            comm.set_nodes(k)
            runtime = config.bind(comm, n)
            buffers = [torch.empty(numel, dtype=torch.float32, device="meta") for numel in numels]
            start = comm.now()
            for flat in buffers:
                runtime.sync(flat, "mean")
            phases = runtime.phase_s
            return comm.now() - start, phases.get("nic", math.nan), comm.counters().bytes_sent

        print(f"[bench-nodes] {name} n={n} k={k} buckets={len(numels)} messages={messages:,} ...", file=log,
              flush=True)
        results, error, wall = run_in_child(functools.partial(
            run_simgrid, world, rank_main, functools.partial(plat.build, ranks=world), plat.config, plat.nic))
        row.update(wall_s=wall, error=error, sim_s=math.nan, sim_nic_s=math.nan, bytes_ok=False)
        if not error:
            row["sim_s"] = max(r[0] for r in results)
            row["sim_nic_s"] = max(r[1] for r in results)
            row["bytes_ok"] = [r[2] for r in results[:n]] == expected
        rows.append(row)
        print("        -> " + format_bench_nodes([row]).splitlines()[-1].strip(), file=log, flush=True)
    return rows


def format_bench_nodes(rows: list[dict]) -> str:
    import os

    head = rows[0] if rows else {"platform": "", "network_model": "", "nic": ""}
    lines = [f"# syncbench simulate --bench --ranks-per-node: ResNet-50's gradients ({PROFILE.name}) in "
             f"{head.get('buckets', '?')} buckets synced one after another, no compute; {head['platform']}; "
             f"SimGrid {_simgrid_version()}, network model {head['network_model']}, nic {head['nic']}",
             f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; model = cost.node_cost, "
             f"the one price (busiest node NIC's bytes / NIC bandwidth, intra-node bytes / intra bandwidth, + rounds "
             f"x latency; hierarchical: its pipeline stage by stage)"
             f"; sim nic s = hierarchical's across-node phase",
             f"{'strategy':>18s} {'n':>5s} {'k':>3s} {'messages':>10s} {'wall s':>7s} {'sim s':>8s} {'model s':>8s} "
             f"{'sim nic s':>9s} {'model nic s':>11s} {'model intra s':>13s} {'bytes':>5s}"]
    for r in rows:
        nic = f"{r['sim_nic_s']:9.4f}" if r["sim_nic_s"] == r["sim_nic_s"] else f"{'-':>9s}"
        lines.append(f"{r['strategy']:>18s} {r['workers']:5d} {r['ranks_per_node']:3d} {r['messages']:10,d} "
                     f"{r['wall_s']:7.1f} {r['sim_s']:8.4f} {r['model_s']:8.4f} {nic} {r['model_nic_s']:11.4f} "
                     f"{r['model_intra_s']:13.4f} {'ok' if r['bytes_ok'] else 'DIFF':>5s}"
                     + (f"  FAILED: {r['error'][:200]}" if r["error"] else ""))
    return "\n".join(lines)

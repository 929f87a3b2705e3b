"""`syncbench validate`: the validation matrix. Every registered strategy and its variants, priced by the cost model
(strategies.cost: the one price `syncbench model` and the simulator's alpha-beta column use) and simulated on SimGrid
(`alpha_beta`: the model's own physics; `tcp`: SimGrid's LV08), side by side with their ratio.

A cell is (strategy variant, workers n, NIC bandwidth, latency, nodes of k ranks or none, overlap off or on, network
model). Without overlap a cell is one synchronization of ResNet-50's gradients (one flat bucket, no compute); with
overlap, a step of the committed ResNet-50 profile in 25 MiB buckets overlapped with backward, and the communication
the step waited for. A cell that a side cannot price or run is listed as "not run" with the reason, never as an
agreement: the model's refusal (a strategy without per-level traffic on nodes), the simulator's (a backend that hides
its bytes), the strategy's (colocated servers outnumbering workers).

It prints a plain table and writes DIR/validation.csv (one row per cell, every column) and DIR/validation.txt (the
table). Agreement: model / SimGrid alpha_beta within 5% (`agree`); a tcp cell is priced by the model's tcp option
(`syncbench model --network tcp`: LV08's corrections) and shows SimGrid tcp / that price and its distance from
alpha_beta.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import platform as platform_mod
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import strategies
from experiments.config.sweep import RunSpec
from experiments.simulate.child import FORK_LOCK
from experiments.validate_docs import BEGIN, END, check_docs, write_docs  # noqa: F401 - validate.* names

PROFILE = Path(__file__).resolve().parent / "config" / "profiles" / "resnet50-b8-s224-cpu.json"
TOLERANCE = 0.05  # model / alpha_beta within 5%: agreement
TCP_NOTE = 0.15  # tcp farther than 15% from alpha_beta: docs/validation.md names the effect
DEFAULT_WORKERS = (2, 3, 4, 8, 16, 64)
DEFAULT_LINKS = (("1Gbit", "50us"), ("10Gbit", "5us"), ("100Gbit", "0us"))
INTRA = {"intra_bandwidth": "100Gbit", "intra_latency": "2us"}
BUCKET_MB = 25.0


@dataclass(frozen=True)
class Variant:
    """A strategy with settings: its parameters (a value "n" stands for the cell's workers), the run's compression
    and local SGD settings, and the node sizes it is validated on (() = one rank per NIC)."""

    label: str
    strategy: str
    params: tuple = ()
    run: tuple = ()  # RunSpec fields: compression, powersgd_rank, sync_every, ...
    nodes: tuple[int, ...] = ()

    def strategy_params(self, workers: int) -> dict:
        return {key: workers if value == "n" else value for key, value in self.params}


VARIANTS = (
    Variant("ring", "ring"),
    Variant("naive_ring", "naive_ring"),
    Variant("all_to_all", "all_to_all"),
    Variant("halving_doubling", "halving_doubling"),
    Variant("reduce_broadcast tree", "reduce_broadcast"),
    Variant("reduce_broadcast flat", "reduce_broadcast", (("tree", False),)),
    Variant("ps dedicated k=1", "parameter_server"),
    Variant("ps dedicated k=2 summation", "parameter_server", (("servers", 2), ("mode", "summation"))),
    Variant("ps dedicated k=n", "parameter_server", (("servers", "n"),)),
    Variant("ps colocated k=n", "parameter_server", (("servers", "n"), ("placement", "colocated"),
                                                     ("mode", "summation"))),
    Variant("ps colocated k=1", "parameter_server", (("placement", "colocated"), ("mode", "summation"))),
    Variant("ps SSP s=2 k=2", "parameter_server", (("servers", 2), ("staleness", 2))),
    Variant("decentralized ring", "decentralized"),
    Variant("decentralized exponential", "decentralized", (("topology", "exponential"),)),
    Variant("double_binary_tree", "double_binary_tree"),
    Variant("ring + powersgd r=4", "ring", run=(("compression", "powersgd"), ("powersgd_rank", 4),
                                               ("powersgd_start", 0))),
    Variant("ring + topk 1%", "ring", run=(("compression", "topk"),)),
    Variant("ring + local SGD H=4", "ring", run=(("sync_every", 4),)),
    Variant("native", "native"),
    Variant("ddp", "ddp"),
    Variant("ring on nodes", "ring", nodes=(3, 4)),
    Variant("hierarchical ring", "hierarchical", nodes=(3, 4)),
    Variant("hierarchical halving_doubling", "hierarchical", (("inner", "halving_doubling"),), nodes=(4,)),
    Variant("double_binary_tree on nodes", "double_binary_tree", nodes=(3, 4)),
    Variant("node_ps colocated", "node_parameter_server", nodes=(3, 4)),
    Variant("node_ps dedicated k=2", "node_parameter_server", (("servers", 2), ("placement", "dedicated")),
            nodes=(4,)),
)


@dataclass(frozen=True)
class Cell:
    variant: Variant
    workers: int
    bandwidth: str
    latency: str
    ranks_per_node: int = 1
    overlap: bool = False
    network_model: str = "alpha_beta"

    def spec(self) -> RunSpec:
        params = self.variant.strategy_params(self.workers)
        if self.ranks_per_node > 1 and "ranks_per_node" in strategies.get(self.variant.strategy).parameters():
            params = {"ranks_per_node": self.ranks_per_node, **params}
        link = {"bandwidth": self.bandwidth, "latency": self.latency}
        if self.ranks_per_node > 1:
            link.update(INTRA)
        run = dict(self.variant.run)
        steps = int(run.get("sync_every", 1))  # local SGD: one whole period, its sync spread over its steps
        return RunSpec(sweep="validate", workload="resnet50", image_size=224, num_classes=1000, batch_size=8,
                       steps=steps, warmup_steps=0, strategy=self.variant.strategy, workers=self.workers, link=link,
                       strategy_params=params, ranks_per_node=self.ranks_per_node, overlap=self.overlap,
                       bucket_mb=BUCKET_MB if self.overlap else None, compute="profile", p2p="gloo", **run)


def cells(variants=VARIANTS, workers=DEFAULT_WORKERS, links=DEFAULT_LINKS, overlap=(False,),
          network_models=("alpha_beta",)) -> list[Cell]:
    """The grid: every variant x n x link x overlap x network model; node variants on each of their node sizes."""
    out = []
    for variant in variants:
        for n in workers:
            for bandwidth, latency in links:
                for over in overlap:
                    for model in network_models:
                        for k in variant.nodes or (1,):
                            out.append(Cell(variant, n, bandwidth, latency, k, over, model))
    return out


# The committed matrix (docs/validation.md, `syncbench validate --docs`): every variant at n = 2..64 on the three
# links without compute; overlap with the profile on the middle link; n = 256 for the strategies that simulate in
# seconds there and n = 1,024 for the O(n log n)-message ones (ring's 2,046 rounds x 1,024 ranks take over 10 CPU
# minutes); SimGrid tcp beside alpha_beta on the middle link.
SCALE_256 = ("ring", "halving_doubling", "reduce_broadcast tree", "ps dedicated k=n", "double_binary_tree",
             "ring + local SGD H=4", "ring on nodes", "double_binary_tree on nodes")
SCALE_1024 = ("halving_doubling", "reduce_broadcast tree", "double_binary_tree")
MIDDLE = (("10Gbit", "5us"),)


def docs_grid() -> list[Cell]:
    """The matrix docs/validation.md shows, one command: `syncbench validate --docs`."""
    by = {v.label: v for v in VARIANTS}
    grid = cells(VARIANTS, DEFAULT_WORKERS, DEFAULT_LINKS)
    grid += cells(VARIANTS, (2, 3, 4, 8, 16), MIDDLE, overlap=(True,))
    grid += cells(tuple(by[label] for label in SCALE_256), (256,), MIDDLE)
    grid += cells(tuple(by[label] for label in SCALE_1024), (1024,), MIDDLE)
    grid += cells(VARIANTS, (2, 4, 8, 16), MIDDLE, network_models=("tcp",))
    return grid


# -- one cell ----------------------------------------------------------------------------------------------


def _timeline(overlap: bool):
    from experiments.simulate.substrate import Timeline
    from workloads.profile import load_profile

    profile = load_profile(PROFILE)
    full = Timeline.from_profile(profile)
    if overlap:
        return full
    return Timeline(0.0, 0.0, 0.0, full.numels, (0.0,) * len(full.numels),
                    "ResNet-50's gradients, one bucket, no compute")


def _platform(cell: Cell):
    from experiments.simulate.platform import Platform

    spec = {"bandwidth": cell.bandwidth, "latency": cell.latency, "network_model": cell.network_model}
    if cell.ranks_per_node > 1:
        spec.update(topology="nodes", gpus_per_node=cell.ranks_per_node, **INTRA)
    return Platform.parse(spec)


def refusal(cell: Cell) -> str:
    """Why the simulator cannot run this cell ('' if it can): the substrate's checks, the strategy's."""
    from experiments.simulate.substrate import SimGridSubstrate, SimSpec

    try:
        spec = cell.spec()
        config = spec.strategy_config()
        config.world_size(cell.workers)  # e.g. colocated servers outnumbering workers, dedicated nodes
    except (ValueError, TypeError) as e:
        return str(e)
    sim = SimSpec(_platform(cell), _timeline(cell.overlap), overlap=cell.overlap)
    substrate = SimGridSubstrate([(spec, sim)])
    (run,) = substrate.runs()
    problems = substrate.problems(run)
    if not config.counted:
        problems.append(f"{spec.strategy} moves its bytes inside the backend (gloo/NCCL), where no simulator sees "
                        f"them")
    return "; ".join(problems)


def model_cell(cell: Cell) -> tuple[float, str]:
    """(seconds, '') the cost model's communication for the cell on the cell's network model, or (NaN, why not)."""
    from experiments.simulate.substrate import SimSpec, _effective, model_comm_s

    try:
        spec = cell.spec()
        config = spec.strategy_config()
        if not config.counted:
            return math.nan, f"{spec.strategy}: the backend hides its bytes (the model would price it as a ring)"
        sim = SimSpec(_platform(cell), _timeline(cell.overlap), overlap=cell.overlap)
        seconds = model_comm_s(_effective(spec, sim), sim, cell.network_model)
    except (ValueError, TypeError, NotImplementedError) as e:
        return math.nan, str(e)
    if math.isnan(seconds):
        from strategies import cost

        try:  # the reason the price is missing
            cost.sync_seconds(config, cell.workers, 1000, cost.Fabric(1e9, 0.0, cell.ranks_per_node))
        except (ValueError, NotImplementedError) as e:
            return math.nan, str(e)
        return math.nan, "no price"
    return seconds, ""


def simulate_cell(cell: Cell) -> dict:
    """Simulate the cell in a fresh process: {'sim_s', 'error', 'wall_s', 'bytes_ok'}."""
    with FORK_LOCK:  # no fork while this thread imports or prices (--jobs: experiments/simulate/child.py)
        from experiments.simulate.substrate import (
            SimGridSubstrate,
            SimSpec,
            run_in_child_timed,
            simulate,
            summarize_simulated,
        )
        spec = cell.spec()
        sim = SimSpec(_platform(cell), _timeline(cell.overlap), overlap=cell.overlap)
        (run,) = SimGridSubstrate([(spec, sim)]).runs()
    results, error, wall, cpu = run_in_child_timed(functools.partial(simulate, run.spec, run.settings))
    with FORK_LOCK:
        row, _ = summarize_simulated(run.spec, run.settings, results, error, wall, "now", run.run_id)
    ok = row["status"] == "ok"
    return {"sim_s": float(row["comm_s"]) if ok else math.nan, "error": "" if ok else str(row["error"])[:300],
            "wall_s": wall, "cpu_s": cpu}


def run_cell(cell: Cell) -> dict:
    row = {"strategy": cell.variant.label, "workers": cell.workers, "bandwidth": cell.bandwidth,
           "latency": cell.latency, "ranks_per_node": cell.ranks_per_node, "overlap": cell.overlap,
           "network_model": cell.network_model}
    with FORK_LOCK:
        model_s, model_why = model_cell(cell)
        why = refusal(cell)
    sim = {"sim_s": math.nan, "error": "", "wall_s": 0.0, "cpu_s": 0.0}
    if not why:
        sim = simulate_cell(cell)
    ratio = sim["sim_s"] / model_s if model_s > 0 else (1.0 if model_s == 0 and sim["sim_s"] == 0 else math.nan)
    if why:
        status = "not run: simulator: " + why
    elif sim["error"]:
        status = "FAILED: " + sim["error"]
    elif model_why:
        status = "not run: model: " + model_why
    elif cell.network_model == "alpha_beta":
        status = "agree" if abs(ratio - 1) <= TOLERANCE else "DIFF"
    else:
        status = "tcp"
    return row | {"model_s": model_s, "sim_s": sim["sim_s"], "sim_over_model": ratio, "status": status,
                  "wall_s": sim["wall_s"], "cpu_s": sim["cpu_s"]}


# -- PS sizing: how many dedicated servers tie ring ---------------------------------------------------------


@dataclass(frozen=True)
class Sizing:
    """The fewest dedicated servers k at which the parameter server's sync is no slower than ring's, by the model,
    and SimGrid's alpha_beta times at k - 1, k and k + 1 over its ring's (the model's ratios beside them)."""

    workers: int
    bandwidth: str
    latency: str
    model_k: int | None  # None: no k up to n ties ring in the model
    model_ratio: dict[int, float]  # k -> PS time / ring time, model
    sim_ratio: dict[int, float]    # k -> PS time / ring time, SimGrid alpha_beta (k - 1, k, k + 1)

    @property
    def agree(self) -> bool:
        """SimGrid ties at the model's k too: slower than ring at k - 1 (or k = 1), no slower at k; or, where the
        model finds no k up to n, SimGrid's PS is slower than ring at k = n too."""
        k = self.model_k
        if k is None:
            return self.sim_ratio[self.workers] > 1
        return self.sim_ratio[k] <= 1 and (k == 1 or self.sim_ratio[k - 1] > 1)


def _ps(k: int) -> Variant:
    return Variant(f"ps dedicated k={k}", "parameter_server", (("servers", k),))


def ps_sizing(workers: int, bandwidth: str = "25Gbit", latency: str = "5us") -> Sizing:
    """The model's k (every k from 1 to n priced, the smallest with PS <= ring), then SimGrid around it."""
    ring = Variant("ring", "ring")
    ring_model, why = model_cell(Cell(ring, workers, bandwidth, latency))
    if why:
        raise ValueError(f"ps_sizing: ring has no price at {workers} workers: {why}")
    model = {k: model_cell(Cell(_ps(k), workers, bandwidth, latency))[0] / ring_model for k in range(1, workers + 1)}
    tie = next((k for k, r in model.items() if r <= 1), None)
    ring_sim = run_cell(Cell(ring, workers, bandwidth, latency))["sim_s"]
    sim = {k: run_cell(Cell(_ps(k), workers, bandwidth, latency))["sim_s"] / ring_sim
           for k in ((tie - 1, tie, tie + 1) if tie else (workers,)) if 1 <= k <= workers}
    return Sizing(workers, bandwidth, latency, tie, model, sim)


def format_sizing(sizing: Sizing) -> str:
    s = sizing
    around = ", ".join(f"k = {k}: model {s.model_ratio[k]:.3f}, SimGrid {r:.3f}" for k, r in s.sim_ratio.items())
    found = (f"the model's fewest dedicated servers tying ring k = {s.model_k} ({s.model_k / s.workers:.2f} n)"
             if s.model_k else f"no k up to n = {s.workers} ties ring in the model")
    return (f"{s.workers} workers, {s.bandwidth} {s.latency}, ResNet-50's 102 MB: {found}; PS / ring {around}: "
            f"{('SimGrid ties at the same k' if s.model_k else 'SimGrid agrees') if s.agree else 'SimGrid DIFFERS'}")


# -- the matrix -------------------------------------------------------------------------------------------


def validate(grid: list[Cell], jobs: int = 1, log=None) -> pd.DataFrame:
    """Every cell, `jobs` simulations at a time; one row per cell, in grid order."""
    log = sys.stderr if log is None else log  # the stderr of now: a default bound at import may be closed
    rows: list[dict | None] = [None] * len(grid)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_cell, cell): i for i, cell in enumerate(grid)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            i = futures[future]
            rows[i] = future.result()
            r = rows[i]
            with FORK_LOCK:
                print(f"[validate {done}/{len(grid)}] {r['strategy']} n={r['workers']} k={r['ranks_per_node']} "
                      f"{r['bandwidth']} {r['latency']} overlap={r['overlap']} {r['network_model']}: "
                      f"{r['status'][:120]} ({r['sim_over_model']:.3f})", file=log, flush=True)
    frame = pd.DataFrame(rows)
    frame["tcp_over_alpha_beta"] = math.nan
    if (frame["network_model"] == "tcp").any():  # tcp against alpha_beta, cell by cell
        keys = ["strategy", "workers", "bandwidth", "latency", "ranks_per_node", "overlap"]
        ab = frame[frame["network_model"] == "alpha_beta"].set_index(keys)["sim_s"]
        frame["tcp_over_alpha_beta"] = [
            r.sim_s / ab.get(tuple(getattr(r, k) for k in keys), math.nan) if r.network_model == "tcp" else math.nan
            for r in frame.itertuples()]
    return frame


def format_table(frame: pd.DataFrame, wall_s: float) -> str:
    ab = frame[frame["network_model"] == "alpha_beta"]
    priced = ab[ab["status"].isin(["agree", "DIFF"])]
    lines = [f"# syncbench validate: model (strategies.cost) vs SimGrid, ResNet-50 ({PROFILE.name}: one flat bucket, "
             f"no compute; overlap: its profile in {BUCKET_MB:g} MiB buckets); nodes: 100 Gbit/s, 2 us inside",
             f"# host {platform_mod.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, wall {wall_s:.0f} s for {len(frame)} cells, "
             f"simulations' CPU {frame['cpu_s'].sum():.0f} s",
             f"# alpha_beta cells: {len(ab)}, priced and simulated {len(priced)}, agree within {TOLERANCE:.0%} "
             f"{int((priced['status'] == 'agree').sum())}, DIFF {int((priced['status'] == 'DIFF').sum())}, "
             f"not run {int(ab['status'].str.startswith('not run').sum())}, "
             f"failed {int(ab['status'].str.startswith('FAILED').sum())}"]
    if len(priced):
        lines.append(f"# sim / model over the priced alpha_beta cells: min {priced['sim_over_model'].min():.3f}, "
                     f"max {priced['sim_over_model'].max():.3f}")
    for overlap in (False, True):
        part = priced[priced["overlap"] == overlap]
        if len(part) and frame["overlap"].nunique() > 1:
            lines.append(f"# overlap {'on' if overlap else 'off'}: {len(part)} priced, "
                         f"{int((part['status'] == 'agree').sum())} agree, {int((part['status'] == 'DIFF').sum())} "
                         f"DIFF")
    tcp = frame[frame["network_model"] == "tcp"]
    if len(tcp):
        far = tcp[(tcp["tcp_over_alpha_beta"] - 1).abs() > TCP_NOTE]
        lines.append(f"# tcp cells (model: --network tcp): {len(tcp)}, priced and simulated "
                     f"{int(tcp['sim_over_model'].notna().sum())}, sim / model min "
                     f"{tcp['sim_over_model'].min():.3f}, max {tcp['sim_over_model'].max():.3f}, within "
                     f"{TOLERANCE:.0%} {int(((tcp['sim_over_model'] - 1).abs() <= TOLERANCE).sum())}")
        if tcp["tcp_over_alpha_beta"].notna().any():  # only where the alpha_beta twins ran too
            lines.append(f"# tcp / alpha_beta min {tcp['tcp_over_alpha_beta'].min():.3f}, max "
                         f"{tcp['tcp_over_alpha_beta'].max():.3f}, farther than {TCP_NOTE:.0%}: {len(far)}"
                         + "".join(f"\n#   {r.strategy} n={r.workers} k={r.ranks_per_node} {r.bandwidth} "
                                   f"{r.latency}: {r.tcp_over_alpha_beta:.3f}" for r in far.itertuples()))
    head = (f"{'strategy':>30s} {'n':>4s} {'k':>2s} {'link':>14s} {'ovl':>3s} {'network':>10s} {'model s':>9s} "
            f"{'sim s':>9s} {'sim/model':>9s}  status")
    lines.append(head)
    for r in frame.itertuples():
        extra = ""
        if r.network_model == "tcp" and not math.isnan(getattr(r, "tcp_over_alpha_beta", math.nan)):
            extra = f" tcp/alpha_beta {r.tcp_over_alpha_beta:.3f}"
        lines.append(f"{r.strategy:>30s} {r.workers:4d} {r.ranks_per_node:2d} {r.bandwidth + ' ' + r.latency:>14s} "
                     f"{'on' if r.overlap else 'off':>3s} {r.network_model:>10s} {r.model_s:9.4f} {r.sim_s:9.4f} "
                     f"{r.sim_over_model:9.3f}  {r.status[:150]}{extra}")
    return "\n".join(lines)


def write(frame: pd.DataFrame, table: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "validation.csv", index=False)
    (out / "validation.txt").write_text(table + "\n")


# -- the command line --------------------------------------------------------------------------------------


def add_arguments(p) -> None:
    p.add_argument("--out", default="results/validation", help="results directory (default results/validation)")
    p.add_argument("--workers", default=",".join(map(str, DEFAULT_WORKERS)),
                   help="worker counts n (default 2,3,4,8,16,64; the full matrix adds 256 and 1024)")
    p.add_argument("--links", default=",".join(f"{b}/{lat}" for b, lat in DEFAULT_LINKS),
                   help="NIC bandwidth/latency pairs (default 1Gbit/50us,10Gbit/5us,100Gbit/0us); --full: every "
                        "bandwidth 1,10,100 Gbit with every latency 0,5,50 us")
    p.add_argument("--full", action="store_true", help="every bandwidth {1,10,100} Gbit x latency {0,5,50} us")
    p.add_argument("--overlap", choices=("off", "on", "both"), default="off",
                   help="without compute (off, default), a ResNet-50 profile step overlapped with backward (on), "
                        "or both")
    p.add_argument("--network-models", default="alpha_beta",
                   help="SimGrid network models, comma-separated: alpha_beta (the model's physics) and/or tcp")
    p.add_argument("--strategies", help="only the variants whose label starts with one of these, comma-separated")
    p.add_argument("--jobs", type=int, default=1, help="simulations at a time (default 1)")
    p.add_argument("--ps-sizing", metavar="N[,N...]",
                   help="instead of the matrix: for each worker count, the fewest dedicated parameter servers that "
                        "tie ring by the model, checked on SimGrid alpha_beta at that k and its neighbours "
                        "(the link: the first of --links)")
    p.add_argument("--docs", nargs="?", const="docs/validation.md", metavar="FILE",
                   help="the committed matrix (every variant at n = 2..64 on three links; overlap, n = 256 and 1,024 "
                        "and tcp on 10Gbit/5us) instead of the grid options, its table written into FILE between "
                        "its markers (default docs/validation.md)")


def run(args) -> int:
    from strategies.transport.simgrid import simgrid_available

    missing = simgrid_available()
    if missing:
        print(f"syncbench validate: error: {missing}", file=sys.stderr)
        return 2
    if args.ps_sizing is not None:
        counts = [w.strip() for w in args.ps_sizing.split(",") if w.strip()]
        if not counts or not all(w.isdigit() and int(w) >= 2 for w in counts):
            raise ValueError(f"validate --ps-sizing {args.ps_sizing!r}: accepted are worker counts >= 2, e.g. 16,32")
        link = args.links.split(",")[0].split("/", 1)
        if len(link) != 2:
            raise ValueError(f"validate --links {args.links!r}: accepted are BANDWIDTH/LATENCY pairs, e.g. 25Gbit/5us")
        bandwidth, latency = link
        results = []
        for w in counts:
            results.append(ps_sizing(int(w), bandwidth, latency))
            print(format_sizing(results[-1]), flush=True)
        return 0 if all(s.agree for s in results) else 1
    if args.docs:
        docs = Path(args.docs)
        check_docs(docs)  # before any work
        return _finish(docs_grid(), args, docs)
    workers = tuple(int(w) for w in args.workers.split(",") if w.strip())
    bad = [w for w in workers if w < 1]
    if bad:
        raise ValueError(f"validate --workers {args.workers!r}: accepted are whole numbers >= 1")
    if args.full:
        links = tuple((f"{b}Gbit", f"{lat}us") for b in (1, 10, 100) for lat in (0, 5, 50))
    else:
        links = tuple(tuple(item.split("/", 1)) for item in args.links.split(",") if item.strip())
        if any(len(link) != 2 for link in links):
            raise ValueError(f"validate --links {args.links!r}: accepted are BANDWIDTH/LATENCY pairs, e.g. "
                             f"10Gbit/5us,1Gbit/50us")
    models = tuple(m.strip() for m in args.network_models.split(",") if m.strip())
    unknown = [m for m in models if m not in ("alpha_beta", "tcp")]
    if unknown:
        raise ValueError(f"validate --network-models: {unknown} not accepted: alpha_beta, tcp")
    variants = VARIANTS
    if args.strategies:
        wanted = [w.strip() for w in args.strategies.split(",") if w.strip()]
        variants = tuple(v for v in VARIANTS if any(v.label.startswith(w) for w in wanted))
        if not variants:
            raise ValueError(f"validate --strategies {args.strategies!r}: no variant's label starts with any of them; "
                             f"labels: {', '.join(v.label for v in VARIANTS)}")
    overlap = {"off": (False,), "on": (True,), "both": (False, True)}[args.overlap]
    return _finish(cells(variants, workers, links, overlap, models), args)


def _finish(grid: list[Cell], args, docs: Path | None = None) -> int:
    start = time.perf_counter()
    frame = validate(grid, args.jobs)
    table = format_table(frame, time.perf_counter() - start)
    if getattr(args, "measure", None):  # --substrates emulated,kernel: the n <= 8 cells measured (validate_runs)
        frame, table = args.measure(grid, frame, table)
    write(frame, table, Path(args.out))
    if docs is not None:
        write_docs(docs, f"syncbench validate --docs --jobs {args.jobs}", table)
    print(table)
    print(f"results: {args.out}")
    alpha_beta = frame[frame["network_model"] == "alpha_beta"]
    return 1 if (alpha_beta["status"].isin(["DIFF"]) | alpha_beta["status"].str.startswith("FAILED")).any() else 0


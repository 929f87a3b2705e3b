"""The report's sections, in page order: each turns the results into what its template shows (tables, figures,
numbers, sentences), or says in one line why this sweep has nothing for it.

A section is a function Results -> dict (the context of templates/sections/<id>.html.j2) or Absent(reason); the
page lists absent sections once, at the end, under "Not in this sweep". SECTIONS is the order of the page.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from reports import (
    calibration,
    explain_section,
    faults,
    faults_measured,
    figures,
    levels,
    ps,
    reconcile,
    tables,
    teaching,
    timeline,
    tta,
    verdicts,
)
from reports.distributions import section as distributions_section
from reports.map_section import section as strategy_map_section
from reports.section_parts import Absent, Results, Table, figure


def _values(runs: pd.DataFrame, col: str) -> str:
    return ", ".join(v for v in runs[col].dropna().astype(str).unique() if v) or "none"


def warnings(r: Results) -> list[tuple[str, str]]:
    """(title, text) of each warning that concerns many figures, said once under the answer; the affected runs
    are marked in the tables."""
    out = []
    distorted = r.ok[r.ok["distorted"]]
    if not distorted.empty:
        parts = []
        over = distorted[distorted["cores_oversubscribed"]]
        if not over.empty:
            configs = sorted({f"{x.workers} workers + {x.servers} servers on {x.cores} cores"
                              for x in over.itertuples()})
            parts.append(f"{len(over)} run(s) had more ranks than CPU cores ({'; '.join(configs)})")
        shared = distorted[distorted["gpu_shared"]]
        if not shared.empty:
            parts.append(f"{len(shared)} run(s) had several workers share a GPU "
                         f"(n = {', '.join(map(str, sorted(shared['workers'].unique())))})")
        out.append(("Distorted measurements:", f"{'; '.join(parts)} of the {len(r.ok)} successful runs. Their "
                    "compute and communication times include contention for the machine, not only the network; "
                    "they are marked in the tables and left out of the cost model's calibration."))
    if r.ok["bypasses_link"].any():
        labels = ", ".join(r.ok.loc[r.ok["bypasses_link"], "label"].unique())
        out.append(("Not on the emulated link:", f"{labels} moved their bytes inside the backend (gloo), so the "
                    "python-emulated link did not shape them: they ran at loopback speed. They are kept out of "
                    "every comparison, figure and verdict with the shaped runs and shown apart in the loopback "
                    "reference; compare them on full-speed or kernel-shaped links."))
    profiled = r.ok[r.ok["compute"] == "profile"]
    if not profiled.empty:
        synthetic = profiled[profiled["profile_synthetic"]]
        measured = profiled[~profiled["profile_synthetic"]]
        kinds = [(measured, "a measured compute profile"),
                 (synthetic, "a SYNTHETIC compute profile (described by a user, not measured)")]
        parts = [f"{len(runs)} replayed {kind} "
                 f"({', '.join(sorted({f'{x.profile_id} ({x.profile_device})' for x in runs.itertuples()}))})"
                 for runs, kind in kinds if not runs.empty]
        out.append(("Replayed compute:", f"of the {len(r.ok)} successful runs, {'; '.join(parts)} instead of "
                    "computing: their compute times are the profile's and their parameters did not train."))
    failed = int((~r.runs["ok"]).sum())
    if failed:
        out.append(("Failed runs:", f"{failed} run(s) failed; they are left out of the figures (see the runs "
                    "table)."))
    if r.skipped:
        out.append(("Not run:", f"{len(r.skipped)} grid point(s) were skipped as invalid (--skip-invalid): "
                    + "; ".join(f"[{point}] {reason}" for point, reason in r.skipped)))
    return out


def machines(runs: pd.DataFrame) -> dict:
    """What the runs ran on: the measured runs' machine (host, cores, GPU, device, transport, compute), None when
    every run was simulated; and the simulated runs' platforms (SimGrid's network model, and where the compute
    times came from), '' when none was: a simulated run's times are its platform's, not this machine's cores."""
    measured = runs[runs["substrate"] != "simgrid"]
    simulated = runs[runs["substrate"] == "simgrid"]
    machine = ({c: _values(measured, c) for c in ("host", "cores", "gpu", "device", "transport", "compute")}
               if not measured.empty else None)
    platforms = []
    for (platform, network, source), _ in simulated.groupby(["sim_platform", "sim_network_model", "compute_source"],
                                                             sort=False):
        compute = "fixed compute times" if source in ("", "fixed") else f"compute from the {source}"
        platforms.append(f"{platform or 'a platform'} (SimGrid {network or 'default'} network model, {compute})")
    return {"machine": machine, "simulated": "; ".join(platforms),
            "simulated_host": _values(simulated, "host") if not simulated.empty else ""}


# ---- the sections, in page order --------------------------------------------------------------------------

def summary(r: Results) -> dict:
    """The answer first (which strategy, by how much and how sure, why), the warnings that concern many figures,
    then the sweep, the machine and the best strategy per condition."""
    best = verdicts.best_strategies(r.ok, r.links)
    description = ""
    if r.sweep_text:
        try:
            parsed = tomllib.loads(r.sweep_text)
        except (tomllib.TOMLDecodeError, ValueError, RecursionError):  # a crafted file: nested deep, long numbers
            parsed = {}
        description = parsed.get("description") if isinstance(parsed.get("description"), str) else ""
    shown = best.drop(columns=["_best", "_next", "_tied", "_knobs", "link"]) if not best.empty else best
    return {"answers": verdicts.verdicts(best), "warnings": warnings(r), "description": description,
            "sweep_text": r.sweep_text,
            "sweeps": ", ".join(r.runs["sweep"].astype(str).unique()),
            **machines(r.runs),
            "runs": len(r.runs), "ok": int(r.runs["ok"].sum()), "failed": int((~r.runs["ok"]).sum()),
            "workloads": _values(r.runs, "workload"), "strategies": ", ".join(r.runs["label"].unique()),
            "links": ", ".join(r.links), "simulated_tie": f"{verdicts.SIMULATED_TIE:.0%}",
            "best": Table(shown, {"workers": "d", "runs": "d", "samples/s": ",.1f", "step time s": ".3f",
                                  "comm share %": ".1f", "lead over next %": "+.1f"}) if not best.empty else None}


def throughput(r: Results) -> dict | Absent:
    fig = figures.throughput_figure(r.ok, r.links)
    return {"figure": figure(fig)} if not figures.shaped(r.ok).empty else Absent("every run bypassed its link")


def loopback(r: Results) -> dict | Absent:
    """Runs whose bytes moved unshaped inside a backend, on their own axes."""
    fig = figures.loopback_figure(r.ok)
    if fig is None:
        return Absent("every run's bytes crossed the link it is labelled with")
    return {"figure": figure(fig), "labels": ", ".join(r.ok.loc[r.ok["bypasses_link"], "label"].unique())}


def scaling(r: Results) -> dict | Absent:
    base = tables.per_worker_baseline(figures.shaped(r.ok))
    if base["per_worker"].isna().all():
        return Absent("no 1-worker baseline: scaling efficiency = throughput(n) / (n x throughput(1)) needs a run "
                      "with workers = 1 (or, in profile mode, a compute profile's single-rank step time)")
    without = base[base["per_worker"].isna()]
    profiled = base[base["baseline"].str.startswith("the compute profile")]
    return {"figure": figure(figures.scaling_figure(r.ok, r.links)),
            "without": ", ".join(sorted(set(without["workload"] + " on " + without["link"]))),
            "profiled": ", ".join(sorted(set(profiled["workload"] + " on " + profiled["link"])))}


def step_time(r: Results) -> dict | Absent:
    return {"figure": figure(figures.step_time_figure(r.ok, r.links))}


def traffic(r: Results) -> dict | Absent:
    same, compared, differ, hidden = tables.traffic_agreement(r.ok)
    if compared == 0 and not hidden:
        return Absent("no multi-worker run has measured and analytic bytes to compare")
    return {"same": same, "compared": compared, "differ": ", ".join(differ), "hidden": ", ".join(hidden),
            "figure": figure(figures.traffic_figure(r.ok))}


def bandwidth(r: Results) -> dict | Absent:
    fig = figures.bandwidth_figure(r.ok)
    if fig is None:
        return Absent("no measured strategy has an analytic traffic to size a link from")
    ts = tables.compute_time_per_workload(r.ok)
    measured = r.ok[r.ok["workers"] > 1]["workers"]
    shown = tables.REQUIREMENT_WORKERS
    rule = (f"Rule: the formula above at every n, with the strategy's analytic bytes at that n and the Ts below; "
            f"nothing else is fitted. The runs measured n = {measured.min()}-{measured.max()}; the figure shows "
            f"n = {min(shown)}-{max(shown):,}, up to {max(shown) / measured.max():,.0f}x beyond the largest n "
            f"measured: there it is the model's, not a measurement's." if not measured.empty else
            f"Rule: the formula above at every n (n = {min(shown)}-{max(shown):,}); no multi-worker run measured it.")
    return {"ts": "; ".join(f"{w}: Ts = {t:.4g} s ({how})" for w, (t, how) in ts.items()), "rule": rule,
            "not_modelled": "; ".join(tables.strategy_specs(r.ok)[1]), "figure": figure(fig)}


def teaching_question(r: Results) -> dict:
    """Bytes per worker and communication time against n for the classic four (reports/teaching.py): the model's
    curves, the runs of these results that answer the same question drawn through them."""
    model_bytes, bandwidth, latency, runs = teaching.condition(r.ok)
    model = teaching.model_frame(model_bytes, bandwidth, latency)
    points = teaching.with_model_ratio(teaching.points_table(runs), model)
    numbers = {"workers": "d", "MB sent per worker": ",.1f", "MB through the busiest NIC": ",.1f", "comm s": ".3f",
               "model comm s": ".3f", "comm / model": ".2f"}
    return {"figure": figure(teaching.teaching_figure(model, runs, model_bytes, bandwidth, latency)),
            "asked": runs.empty, "model_mb": f"{model_bytes / 1e6:,.2f}", "gbit": f"{bandwidth * 8 / 1e9:g}",
            "table": Table(teaching.table(model), numbers, sortable=True, id="teaching-model"),
            "points": Table(points, numbers, sortable=True, id="teaching-runs") if not points.empty else None}


def cost_model(r: Results) -> dict | Absent:
    """Calibration from the runs the model describes, the parity plot, and the extrapolation with the alpha it
    may use (the links' own latency, said so, when no fit is plausible)."""
    fits, predicted = calibration.calibration(r.ok)
    alpha = calibration.extrapolation_alpha(fits, r.ok)
    extrapolation = figures.extrapolation_figure(r.ok, alpha.alpha, alpha.calibrated)
    rule = calibration.extrapolation_rule(fits, r.ok, alpha)
    if fits.empty and extrapolation is None:
        return Absent("no multi-worker run has analytic rounds and bytes")
    bad = fits[fits["plausible"] == "no"] if not fits.empty else fits
    return {"fits": Table(fits.drop(columns=["alpha", "beta", "latency"]),
                          {"runs": "d", "alpha us": ",.1f", "alpha bound us": ",.0f", "fitted MB/s": ",.1f",
                           "link MB/s": ",.1f", "rmse ms": ",.2f"}) if not fits.empty else None,
            "bad_links": ", ".join(bad["link"]) if not bad.empty else "",
            "bad_why": " | ".join(bad["why not"]) if not bad.empty else "",
            "alpha": alpha, "rule": rule, "not_modelled": "; ".join(tables.strategy_specs(r.ok)[1]),
            "parity": figure(figures.parity_figure(predicted, r.ok)), "extrapolation": figure(extrapolation)}


def overlap(r: Results) -> dict | Absent:
    """Exposed vs hidden communication, P with overlap, and what overlap buys in bandwidth (shaped runs only)."""
    if not r.ok["overlap"].any():
        return Absent("no run overlapped communication with backward (overlap = true)")
    frame = tables.overlap_frame(figures.shaped(r.ok))
    return {"table": Table(frame, {"workers": "d", "step s": ".3f", "Ts s": ".3f", "exposed s": ".3f",
                                   "busy s": ".3f", "hidden s": ".3f", "overlap fraction": ".2f", "P": ".3f",
                                   "S for P=0.9, no overlap MB/s": ",.1f",
                                   "S for P=0.9, measured overlap MB/s": ",.1f"}, sortable=True, id="overlap")}


def emulations(r: Results) -> dict | Absent:
    df = tables.emulations_frame(r.ok)
    if df.empty:
        return Absent("no configuration ran on both a python-emulated and a kernel-shaped link of the same bandwidth "
                      "(link = { bandwidth = \"1Gbit\", emulation = \"kernel\" } on a syncbench cluster up cluster)")
    return {"table": Table(df, {"workers": "d", "comm s, python": ".3f", "comm s, kernel": ".3f",
                                "python / kernel": ".2f"}, sortable=True, id="emulations")}


def substrates(r: Results) -> dict | Absent:
    df = tables.substrates_frame(r.ok)
    if df.empty:
        return Absent("no simulated runs (syncbench simulate SWEEP.toml runs the same strategy code on a SimGrid "
                      "platform; a results directory holding both kinds shows them beside the measured and modelled)")
    return {"table": Table(df, {"workers": "d", "measured comm ms": ",.1f", "simulated comm ms": ",.1f",
                                "simulated step ms": ",.1f", "modelled comm ms": ",.1f"}),
            "figure": figure(figures.substrates_figure(df))}


def one_answer(r: Results) -> dict | Absent:
    """Every configuration's communication per step from the model, SimGrid and the measurements, the one the
    report trusts (reports/reconcile.py TRUST) and how far the others are from it."""
    frame = reconcile.reconcile_frame(r.ok)
    if frame.empty:
        return Absent("no multi-worker run whose bytes crossed its link")
    formats = {f"{name} ms": ",.2f" for name in reconcile.TRUST} | {"workers": "d", "spread": ".2f", "sources": "d"}
    return {"trust": reconcile.TRUST, "agree": f"{reconcile.AGREE:.0%}",
            "disagreements": reconcile.disagreements(frame),
            "agreeing": int((frame["spread"] <= 1 + reconcile.AGREE).sum()),
            "compared": int(frame["spread"].notna().sum()), "configurations": len(frame),
            "table": Table(frame, formats, sortable=True, id="one-answer")}


def convergence(r: Results) -> dict | Absent:
    """Loss vs step and wall time of the runs that trained; consensus distance and spectral gap (decentralized).
    Profile-mode runs replay a compute timeline: their parameters do not learn, so they get no loss curve."""
    if r.steps is None:
        return Absent("no steps recorded (no steps.parquet), so no convergence")
    trained = r.ok[r.ok["compute"] != "profile"]
    if trained.empty:
        return Absent("profile mode: the runs replayed a compute profile, so their parameters did not train and "
                      "their loss says nothing about convergence")
    df = tables.loss_frame(trained, r.steps)
    figs = []
    if df["loss"].notna().any():
        figs += [figures.loss_figure(df, trained, "step"), figures.loss_figure(df, trained, "wall_s")]
    if df["consensus_distance"].notna().any():
        figs.append(figures.consensus_figure(df, trained))
    if trained["spectral_gap"].notna().any():
        figs.append(figures.spectral_gap_figure(trained))
    if not figs:
        return Absent("the steps carry no loss, so no convergence")
    return {"figures": [figure(f) for f in figs], "has_loss": bool(df["loss"].notna().any()),
            "profiled": int((r.ok["compute"] == "profile").sum())}


def time_to_target(r: Results) -> dict | Absent:
    """Runs with a target: time to target as steps to target x seconds per step, each with its spread."""
    df = tta.tta_frame(r.ok)
    if df.empty:
        return Absent("no run names a target (target = { metric = \"accuracy\", value = 0.9 } in the sweep)")
    shown = df[[c for c in df.columns if not c.startswith("_")]]
    return {"table": Table(shown, {"MB sent/worker/step": ",.4f", "runs": "d", "reached": "d",
                                   "rank by time to target": "d", "rank by throughput": "d"}),
            "verdicts": tta.tta_verdicts(df)}


def parameter_server(r: Results) -> dict | Absent:
    """PS runs beside BytePS's formula and the allreduce of the same sweep and link; stragglers; the verdict."""
    if not ps.has_ps(r.ok):
        return Absent("no parameter_server run on a shaped link (strategy = \"parameter_server\" with "
                      "link = { bandwidth = ... })")
    comm, slow = ps.comm_frame(r.ok), ps.straggler_frame(r.ok, r.steps)
    return {"verdicts": ps.ps_verdicts(r.ok),
            "comm": Table(comm, {"workers": "d", "k": "d", "runs": "d", "partition MB": "g", "comm s": ".4f",
                                 "BytePS formula s": ".4f", "measured / formula": ".2f", "allreduce comm s": ".4f",
                                 "PS / allreduce": ".2f"}, sortable=True, id="ps-comm") if not comm.empty else None,
            "slow": Table(slow, {"workers": "d", "runs": "d", "samples/s": ",.1f", "slowest rank s/step": ".4f",
                                 "fastest worker s/step": ".4f", "workers idle %": ".1f",
                                 "held at bound s/step": ".4f", "dropped pushes/step": ".2f",
                                 "staleness mean": ".2f", "staleness max": "g"}) if not slow.empty else None}


def stragglers(r: Results) -> dict | Absent:
    if not tables.has_imbalance(r.ok):
        return Absent("no straggler and no slower link: every rank had the same compute and NIC")
    df = tables.stragglers_frame(r.ok)
    return {"figure": figure(figures.stragglers_figure(df, r.ok))}


def all_runs(r: Results) -> dict:
    return {"table": Table(tables.runs_frame(r.runs), {"sent MB/worker": ",.3f", "recv MB/worker": ",.3f",
                                                        "comm share": ".2f", "workers": "d", "servers": "d",
                                                        "seed": "d"}, sortable=True, id="runs")}


@dataclass(frozen=True)
class Section:
    id: str  # also the template's name: templates/sections/<id>.html.j2
    title: str
    body: Callable[[Results], dict | Absent]
    needs_runs: bool = True  # False: written even when no run succeeded


SECTIONS: tuple[Section, ...] = (
    Section("summary", "Summary", summary, needs_runs=False),
    Section("throughput", "Throughput vs workers", throughput),
    Section("loopback", "Loopback reference: runs not on the emulated link", loopback),
    Section("scaling", "Scaling efficiency", scaling),
    Section("step-time", "Step time: compute and communication", step_time),
    Section("distributions", "Per-step distributions: p50, p99, spikes and stragglers", distributions_section),
    Section("traffic", "Traffic: measured vs analytic", traffic),
    Section("levels", "Traffic per level: node NICs and inside the nodes", levels.section),
    Section("bandwidth", "Bandwidth requirement", bandwidth),
    Section("cost-model", "Cost model (alpha-beta)", cost_model),
    Section("strategy-map", "Where each strategy wins (the model, around this sweep)", strategy_map_section),
    Section("teaching", "Bytes and time against n: naive ring, ring, parameter server, reduce + broadcast",
            teaching_question),
    Section("explain", "Each strategy drawn round by round", explain_section.section),
    Section("overlap", "Overlap: exposed vs hidden communication", overlap),
    Section("emulations", "Python-emulated vs kernel-shaped links", emulations),
    Section("substrates", "Simulated, measured and modelled", substrates),
    Section("one-answer", "One answer: which number to trust", one_answer),
    Section("parameter-server", "Parameter server vs allreduce", parameter_server),
    Section("time-to-target", "Time to target: steps to target x seconds per step", time_to_target),
    Section("convergence", "Convergence", convergence),
    Section("stragglers", "Stragglers and slow links", stragglers),
    Section("timeline", "One step, rank by rank: timeline and critical path", timeline.section),
    Section("faults-measured", "Failures measured: a rank lost in training, strategy x recovery mode",
            faults_measured.section),
    Section("faults", "Failures: time to a step under a failure rate (model)", faults.section),
    Section("runs", "All runs", all_runs, needs_runs=False),
)

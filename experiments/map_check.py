"""SimGrid spot checks of a strategy map: at a few cells, the winner and the runner-up (each at the knob the map
chose) simulated on SimGrid's alpha_beta network model through `syncbench validate`'s cells (one synchronization of
ResNet-50's gradients, one flat bucket, no compute), and whether the simulation agrees on which is faster.

Only maps of one sync of ResNet-50's 1,000-class gradients on one NIC per rank can be checked this way (the cells
`validate` simulates); anything else is refused before any simulation."""

from __future__ import annotations

import math

from experiments.validate import TOLERANCE as BAND  # model and SimGrid agree within it
from reports.model import model_numel
from reports.strategy_map import StrategyMap

MAX_CHECK_WORKERS = 64  # a ResNet-50 sync on SimGrid: seconds at 16 ranks, about a minute at 256


def check_problem(m: StrategyMap, count: int) -> str:
    """Why this map cannot be spot-checked ('' if it can)."""
    return request_problem(count, m.axis, m.measure, m.meta.get("numel"), int(m.cells["ranks_per_node"].iloc[0]),
                           list(m.cells["workers"]))


def request_problem(count, axis: str, measure: str, numel: int, ranks_per_node: int, workers) -> str:
    """Why a map of this kind cannot be spot-checked ('' if it can), asked before the map is priced."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
        return f"bad check count {count!r}: accepted are whole numbers from 1 to 64"
    if axis != "bandwidth" or measure != "sync" or numel != model_numel("resnet50", 1000):
        return ("SimGrid spot checks simulate one sync of ResNet-50's 1,000-class gradients: accepted with --model "
                "resnet50 --num-classes 1000 and no --step-time, --profile or --collective")
    if ranks_per_node != 1:
        return "SimGrid spot checks run one NIC per rank: accepted without --ranks-per-node"
    if not any(n <= MAX_CHECK_WORKERS for n in workers):
        return f"SimGrid spot checks run up to {MAX_CHECK_WORKERS} workers: the map has none that small"
    return ""


def chosen_cells(m: StrategyMap, count: int) -> list[int]:
    """Row indices of `count` cells with at most MAX_CHECK_WORKERS workers: the cells with a winner (not a tie)
    first, those where the winner changes along a row before the others, spread evenly over them (the first and
    last included); tied cells only when the winners are fewer than `count`."""
    df = m.cells
    small = [i for i in df.index if df.at[i, "workers"] <= MAX_CHECK_WORKERS and df.at[i, "runner_up"]]
    picked: list[int] = []
    for cells in ([i for i in small if not df.at[i, "tie"]], [i for i in small if df.at[i, "tie"]]):
        changes = [i for i in cells if i + 1 in df.index and df.at[i + 1, "workers"] == df.at[i, "workers"]
                   and df.at[i + 1, "winner"] != df.at[i, "winner"]]
        picked += changes[:count - len(picked)]
        rest = [i for i in cells if i not in picked]
        need = count - len(picked)
        take = min(need, len(rest))
        if take > 0:
            step = (len(rest) - 1) / max(take - 1, 1)
            picked += sorted({rest[round(j * step)] for j in range(take)})
    return sorted(picked)


def spot_check(m: StrategyMap, count: int, simulate=None) -> StrategyMap:
    """Add columns check ('agree', 'DIFFERS', 'tie' where the map calls the cell a tie (its lead under the map's
    tie band), 'not run: ...', or '' for an unchecked cell), sim_winner_s and
    sim_runner_up_s at `count` chosen cells. `simulate(strategy, params, workers, bandwidth, latency)` -> seconds
    (default: SimGrid through experiments.validate)."""
    why = check_problem(m, count)
    if why:
        raise ValueError(why)
    simulate = simulate or simulate_sync
    df = m.cells
    df["check"], df["sim_winner_s"], df["sim_runner_up_s"] = "", math.nan, math.nan
    for i in chosen_cells(m, count):
        r = df.loc[i]
        try:
            win = simulate(r["winner"], r["winner_params"], int(r["workers"]), r["bandwidth_bytes_per_s"],
                           r["latency_s"])
            second = simulate(r["runner_up"], r["runner_up_params"], int(r["workers"]), r["bandwidth_bytes_per_s"],
                              r["latency_s"])
        except RuntimeError as e:
            df.at[i, "check"] = f"not run: {e}"
            continue
        df.at[i, "sim_winner_s"], df.at[i, "sim_runner_up_s"] = win, second
        if r["tie"]:  # the model names no winner (its lead is under the map's tie band): nothing to agree with
            df.at[i, "check"] = "tie"
        elif win <= second:
            df.at[i, "check"] = "agree"
        elif r["margin"] < BAND:
            df.at[i, "check"] = (f"DIFFERS (the model's lead {r['margin']:.2%} is inside validate's {BAND:.0%} "
                                 f"agreement band between the model and SimGrid: not a verdict)")
        else:  # the reason: which strategy's price the simulation puts outside the band
            ratios = {r["winner"]: win / r["time_s"], r["runner_up"]: second / r["runner_up_time_s"]}
            off = [f"{name} {ratio:.2f}x" for name, ratio in ratios.items() if abs(ratio - 1) > BAND]
            df.at[i, "check"] = (f"DIFFERS (SimGrid / model: {', '.join(off)}, outside validate's {BAND:.0%} band: "
                                 f"the model's price of {'these' if len(off) > 1 else 'it'} is wrong here, so is the "
                                 f"winner)" if off else "DIFFERS")
    return m


def simulate_sync(strategy: str, params: dict, workers: int, bandwidth: float, latency: float) -> float:
    """One sync of ResNet-50's gradients on SimGrid's alpha_beta model: the simulated communication seconds;
    RuntimeError with the simulator's reason if it cannot run."""
    from experiments.validate import Cell, Variant, refusal, simulate_cell

    variant = Variant(strategy, strategy, tuple(sorted(params.items())))
    cell = Cell(variant, workers, f"{bandwidth * 8 / 1e9:.12g}Gbit", f"{latency * 1e6:.12g}us")
    why = refusal(cell)
    if why:
        raise RuntimeError(why)
    out = simulate_cell(cell)
    if out["error"]:
        raise RuntimeError(out["error"])
    return out["sim_s"]


def check_lines(m: StrategyMap) -> list[str]:
    """One line per checked cell, for the terminal."""
    df = m.cells
    if "check" not in df:
        return []
    out = []
    for r in df[df["check"] != ""].to_dict("records"):
        where = f"{r['workers']} workers, {r['bandwidth_bytes_per_s'] * 8 / 1e9:g} Gbit/s"
        if r["check"].startswith("not run"):
            out.append(f"{where}: {r['check']}")
            continue
        sim_margin = r["sim_runner_up_s"] / r["sim_winner_s"] - 1
        out.append(f"{where}: model {r['winner']} {r['time_s']:.6g} s vs {r['runner_up']} "
                   f"{r['runner_up_time_s']:.6g} s ({r['margin']:+.2%}); SimGrid {r['sim_winner_s']:.6g} s vs "
                   f"{r['sim_runner_up_s']:.6g} s ({sim_margin:+.2%}): {r['check']}")
    return out

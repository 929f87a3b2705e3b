"""Alpha and beta of the cost model, fitted per link only to runs the model describes, and judged before use.

The alpha-beta model is the communication time of a synchronous collective: it describes runs without overlap
(with overlap the exposed time is not the collective's), without servers (a parameter server's incast and its
optimizer are not rounds x alpha + bytes x beta), undistorted (more ranks than cores: communication waits on
ranks still computing), on a shaped link. A fit that does not describe its link is shown, never extrapolated from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from reports.load import is_server
from reports.model import EXTRAPOLATION_LINKS, EXTRAPOLATION_WORKERS, GBIT, MB, calibrate

# A fit is implausible when its bandwidth is this far from the emulated link's, or its residuals this large.
PLAUSIBLE_BANDWIDTH_RATIO = 2.0
PLAUSIBLE_RMSE_SHARE = 0.25
# ... or when alpha exceeds this many times the link's latency plus the transport's own per-message cost.
PLAUSIBLE_ALPHA_RATIO = 10.0
# Per-message cost of each transport between two actors on one host, seconds: `syncbench bench --transport`
# measured gloo's 4-byte latency at 217 us (README, "make bench"); the others are taken as no cheaper.
TRANSPORT_MESSAGE_S = {"gloo": 217e-6}
DEFAULT_MESSAGE_S = 217e-6


def describes(ok: pd.DataFrame) -> pd.Series:
    """Runs the alpha-beta model describes: several workers, analytic rounds and bytes, no overlap, no servers,
    not distorted, bytes through the emulated link."""
    has_analytic = ok[["analytic_rounds", "analytic_path_bytes", "comm_s"]].notna().all(axis=1)
    servers = ok["strategy"].map(is_server)
    return (has_analytic & (ok["workers"] > 1) & ~ok["overlap"] & ~servers & ~ok["distorted"]
            & ~ok["bypasses_link"])


def calibration(ok: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per link, alpha and beta fitted to the measured communication time of the runs the model describes,
    whether the fit is plausible and, if not, why; and each of those runs' predicted communication time."""
    usable = ok[describes(ok)]
    fits, predicted = [], []
    for link, g in usable.groupby("link", sort=False):
        fit = calibrate(g["analytic_rounds"], g["analytic_path_bytes"], g["comm_s"])
        link_bw, latency = float(g["link_bandwidth"].iloc[0]), float(g["link_latency_s"].iloc[0])
        message_s = TRANSPORT_MESSAGE_S.get(g["transport"].iloc[0], DEFAULT_MESSAGE_S)
        problem = _implausible(fit, link_bw, latency + message_s, float(g["comm_s"].mean()))
        fits.append({"link": link, "runs": fit.runs, "alpha us": fit.alpha * 1e6,
                     "alpha bound us": PLAUSIBLE_ALPHA_RATIO * (latency + message_s) * 1e6,
                     "fitted MB/s": fit.bandwidth / MB if math.isfinite(fit.bandwidth) else math.nan,
                     "link MB/s": link_bw / MB, "rmse ms": fit.rmse * 1e3,
                     "plausible": "no" if problem else "yes", "why not": problem,
                     "alpha": fit.alpha, "beta": fit.beta, "latency": latency})
        predicted.append(g.assign(predicted_s=fit.predict(g["analytic_rounds"], g["analytic_path_bytes"])))
    return pd.DataFrame(fits), (pd.concat(predicted) if predicted else usable.assign(predicted_s=[]))


def _implausible(fit, link_bandwidth: float, per_message_s: float, mean_comm_s: float) -> str:
    """'' for a fit that describes the link; else what is wrong."""
    problems = []
    if math.isfinite(link_bandwidth) and link_bandwidth > 0:
        ratio = fit.bandwidth / link_bandwidth if math.isfinite(fit.bandwidth) else math.inf
        if not 1 / PLAUSIBLE_BANDWIDTH_RATIO <= ratio <= PLAUSIBLE_BANDWIDTH_RATIO:
            problems.append(f"fitted bandwidth {ratio:.2g}x the emulated link's")
    if fit.alpha > PLAUSIBLE_ALPHA_RATIO * per_message_s:
        problems.append(f"alpha {fit.alpha * 1e6:,.0f} us is over {PLAUSIBLE_ALPHA_RATIO:g}x the link's latency plus "
                        f"the transport's per-message cost ({per_message_s * 1e6:,.0f} us)")
    if mean_comm_s > 0 and fit.rmse > PLAUSIBLE_RMSE_SHARE * mean_comm_s:
        problems.append(f"residuals {fit.rmse / mean_comm_s:.0%} of the mean communication time")
    if fit.runs < 3:
        problems.append(f"only {fit.runs} run(s) to fit two parameters")
    if not problems:
        return ""
    return "; ".join(problems) + ("; likely cause: the transport's own costs (per-message overhead, loopback "
                                  "bandwidth), not the link, dominate")


@dataclass(frozen=True)
class ExtrapolationAlpha:
    """The alpha the extrapolation uses and where it comes from, in a sentence for the page."""

    alpha: float
    calibrated: bool
    source: str


def extrapolation_alpha(fits: pd.DataFrame, ok: pd.DataFrame) -> ExtrapolationAlpha:
    """The median alpha of the plausible fits; without one, the links' own latency (uncalibrated, and said so)."""
    plausible = fits[fits["plausible"] == "yes"] if not fits.empty else fits
    if not plausible.empty:
        alpha = float(plausible["alpha"].median())
        return ExtrapolationAlpha(alpha, True, f"alpha = {alpha * 1e6:,.1f} us, the median of the plausible fits "
                                               f"({', '.join(plausible['link'])})")
    shaped = ok.loc[ok["link_emulation"] != "", "link_latency_s"]
    alpha = float(shaped.median()) if not shaped.empty else 0.0
    why = "no fit is plausible" if not fits.empty else "no run the model describes could be fitted"
    return ExtrapolationAlpha(alpha, False, f"UNCALIBRATED ({why}): alpha = {alpha * 1e6:,.1f} us, the links' own "
                                            f"latency, and no per-message cost of the transport")


def extrapolation_rule(fits: pd.DataFrame, ok: pd.DataFrame, alpha: ExtrapolationAlpha,
                       workers=EXTRAPOLATION_WORKERS, links: dict[str, float] | None = None) -> str:
    """The rule that produced the extrapolated figure, in a sentence: the formula, what it was fitted on (runs,
    their worker counts and links) and how far beyond that range the figure goes (in workers and in bandwidth)."""
    links = EXTRAPOLATION_LINKS if links is None else links
    shown = (f"shown for n = {min(workers):,}-{max(workers):,} workers at {min(links.values()) / GBIT:g}-"
             f"{max(links.values()) / GBIT:g} Gbit/s")
    rule = ("Rule: communication per step = rounds x alpha + critical-path bytes / bandwidth, rounds and bytes from "
            "each strategy's analytic traffic")
    plausible = fits[fits["plausible"] == "yes"] if not fits.empty else fits
    fitted = ok[describes(ok) & ok["link"].isin(set(plausible["link"]))] if not plausible.empty else ok.iloc[0:0]
    if fitted.empty:
        measured = ok[(ok["workers"] > 1) & ok["link_bandwidth"].notna()]
        seen = (f"; the runs measured n = {measured['workers'].min()}-{measured['workers'].max()}"
                if not measured.empty else "")
        return (f"{rule}; fitted on nothing ({alpha.source}): every point is the formula alone{seen}; {shown}.")
    n_lo, n_hi = int(fitted["workers"].min()), int(fitted["workers"].max())
    bw_lo, bw_hi = float(fitted["link_bandwidth"].min()), float(fitted["link_bandwidth"].max())
    beyond_n = max(workers) / n_hi
    beyond_bw = max(links.values()) / bw_hi
    return (f"{rule}; alpha fitted on {len(fitted)} runs at n = {n_lo}-{n_hi} workers on links of "
            f"{bw_lo / MB:,.1f}-{bw_hi / MB:,.1f} MB/s ({alpha.source}), beta = 1/bandwidth of each link shown; "
            f"{shown}: up to {beyond_n:,.0f}x the largest n fitted and {beyond_bw:,.0f}x the fastest link fitted. "
            f"Beyond the fitted range the figure is the model's, not a measurement's.")

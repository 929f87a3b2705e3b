"""Compression's break-even: the NIC bandwidth below which a codec (fp16, bf16, PowerSGD, top-k) or local SGD
shortens the step, and, given how many more steps it needs to reach the same target (steps-to-target ratio), the
bandwidth below which it shortens the time to that target.

One NIC per rank, priced by the one price of a sync (strategies.cost: rounds x latency + path bytes / bandwidth,
the path from each config's traffic()), plus the codec's seconds per step on the compressing side. With the exact
strategy's (R_e, P_e), the compressed one's (R_c, P_c), latency a, codec seconds c, compute Ts and ratio rho, the
compressed run reaches the target first when

    rho (Ts + c + R_c a + P_c / B) < Ts + R_e a + P_e / B,  i.e.  D < N / B,
    N = P_e - rho P_c,  D = rho (Ts + c + R_c a) - Ts - R_e a,

so it pays below B* = N / D when N, D > 0, always when N > 0 >= D, never when N <= 0 <= D, above B* when both are
negative. The step alone is rho = 1 (Ts cancels). Units: bytes, seconds, bytes/s; MB = 10^6 bytes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import strategies as registry
from strategies.cost import GBIT, config_path

# the codecs tabulated, each a wrapper setting of the exact strategy (strategies.make applies it)
CODECS = (("fp16", {"compression": "fp16"}),
          ("bf16", {"compression": "bf16"}),
          ("powersgd_r4", {"compression": "powersgd", "powersgd_rank": 4}),
          ("topk_1%", {"compression": "topk", "topk_ratio": 0.01}),
          ("local_sgd_H8", {"sync_every": 8}))
NO_CODEC = {"local_sgd_H8"}  # local SGD compresses nothing: it skips syncs (its averaging is not priced)
MEASURE_NUMEL = 2**22  # the codec is timed on a 16 MiB fp32 buffer (one tensor)


@dataclass(frozen=True)
class BreakEven:
    """Where one codec pays at one worker count: side 'below' / 'above' bandwidth_bytes_per_s, 'always' or
    'never' (bandwidth NaN)."""

    codec: str
    workers: int
    codec_s: float          # codec seconds per step (compressing and decompressing the whole gradient)
    steps_ratio: float      # steps to target, compressed / exact (1: the step alone)
    side: str
    bandwidth_bytes_per_s: float

    def words(self) -> str:
        what = "the step" if self.steps_ratio == 1 else f"time to target (x{self.steps_ratio:g} steps)"
        if self.side in ("always", "never"):
            return f"{'shortens' if self.side == 'always' else 'never shortens'} {what} at any bandwidth"
        return f"shortens {what} {self.side} {self.bandwidth_bytes_per_s / GBIT:.3g} Gbit/s"


def _check(workers, numel, latency, codec_s, steps_ratio, compute_s) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 2 <= workers <= 1024:
        raise ValueError(f"bad workers {workers!r}: accepted are whole numbers from 2 to 1,024")
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"bad numel {numel!r}: accepted are whole numbers >= 1")
    for name, value, low in (("latency", latency, 0.0), ("codec seconds", codec_s, 0.0),
                             ("compute seconds", compute_s, 0.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
            raise ValueError(f"bad {name} {value!r}: accepted are seconds >= 0")
    if isinstance(steps_ratio, bool) or not isinstance(steps_ratio, (int, float)) or not 0 < steps_ratio < math.inf:
        raise ValueError(f"bad steps-to-target ratio {steps_ratio!r}: accepted are numbers > 0 (1.2: 20% more "
                         f"steps than the exact run)")


def break_even(exact: str, codec: str, workers: int, numel: int, latency: float, codec_s: float,
               steps_ratio: float = 1.0, compute_s: float = 0.0, shapes=None) -> BreakEven:
    """Where `codec` (a name of CODECS) around the exact strategy `exact` pays, at `workers` ranks for a gradient of
    numel fp32 elements (see the module's formula)."""
    settings = dict(CODECS).get(codec)
    if settings is None:
        raise ValueError(f"unknown codec {codec!r}: accepted are {', '.join(c for c, _ in CODECS)}")
    _check(workers, numel, latency, codec_s, steps_ratio, compute_s)
    base = registry.make(exact)
    if not base.exact:
        raise ValueError(f"strategy {exact!r} is not an exact allreduce: accepted are exact strategies, e.g. ring")
    r_e, p_e, _ = config_path(base, workers, numel, 4, shapes)
    r_c, p_c, _ = config_path(registry.make(exact, **settings), workers, numel, 4, shapes)
    rho = float(steps_ratio)
    n = p_e - rho * p_c
    d = rho * (compute_s + codec_s + r_c * latency) - compute_s - r_e * latency
    if n > 0:
        side, b = ("always", math.nan) if d <= 0 else ("below", n / d)
    elif n == 0:
        side, b = ("always" if d < 0 else "never"), math.nan
    else:
        side, b = ("never", math.nan) if d >= 0 else ("above", n / d)
    return BreakEven(codec, workers, codec_s, rho, side, b)


def measure_codec_s_per_mb(codec: str, numel: int = MEASURE_NUMEL, repeats: int = 3) -> float:
    """Seconds per MB of fp32 gradient the codec takes on this machine, one thread: the strategy's own compress and
    decompress (strategies/compression.py) on one rank, its collective a no-op, timed after one warm call."""
    import torch

    from strategies.transport.threads import run_threads

    settings = dict(CODECS)[codec]
    if codec in NO_CODEC:
        return 0.0
    settings = settings | ({"powersgd_start": 0} if settings.get("compression") == "powersgd" else {})

    def timed(comm):
        torch.set_num_threads(1)
        sync = registry.make("ring", **settings).bind(comm, 1)
        buffer = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        sync.sync(buffer)
        started = time.perf_counter()
        for _ in range(repeats):
            sync.sync(buffer)
        return (time.perf_counter() - started) / repeats / (numel * 4 / 1e6)

    return run_threads(1, timed)[0]


def table(exact: str, workers, numel: int, latency: float, codec_s_per_mb: dict, steps_ratio: dict | None = None,
          compute_s: float = 0.0, shapes=None) -> list[dict]:
    """One row per (workers, codec): the codec's seconds per step, where it shortens the step, and, for the codecs
    with a steps-to-target ratio, where it shortens time to target."""
    steps_ratio = steps_ratio or {}
    rows = []
    mb = numel * 4 / 1e6
    for n in workers:
        for codec, _ in CODECS:
            if codec not in codec_s_per_mb:
                continue
            codec_s = codec_s_per_mb[codec] * mb
            step = break_even(exact, codec, n, numel, latency, codec_s, 1.0, compute_s, shapes)
            row = {"workers": n, "codec": codec, "codec_ms_per_step": codec_s * 1e3, "step": step.words(),
                   "step_side": step.side, "step_gbit": step.bandwidth_bytes_per_s / GBIT,
                   "steps_ratio": steps_ratio.get(codec, math.nan), "target": "", "target_side": "",
                   "target_gbit": math.nan}
            if codec in steps_ratio:
                tta = break_even(exact, codec, n, numel, latency, codec_s, steps_ratio[codec], compute_s, shapes)
                row |= {"target": tta.words(), "target_side": tta.side,
                        "target_gbit": tta.bandwidth_bytes_per_s / GBIT}
            rows.append(row)
    return rows

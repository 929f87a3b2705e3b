"""`syncbench break-even`: the command line of reports/break_even.py (the bandwidth below which each compression,
or local SGD, shortens the step, and time to target given a steps-to-target ratio)."""

from __future__ import annotations

import math
import os

DEFAULT_WORKERS = "8,16,64"


def add_arguments(p) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="resnet18 | resnet50 | vgg11 | vgg16 (fp32 parameters)")
    what.add_argument("--model-bytes", help="gradient size instead of a model, e.g. 553.36MB")
    p.add_argument("--num-classes", type=int, help="with --model: classifier outputs (default: the workload's)")
    p.add_argument("--strategy", default="ring", help="the exact strategy the codecs wrap (default ring)")
    p.add_argument("--workers", default=DEFAULT_WORKERS, help=f"comma-separated worker counts (default "
                                                              f"{DEFAULT_WORKERS})")
    p.add_argument("--latency", default="0s", help="per-message latency, e.g. 20us (default 0s)")
    p.add_argument("--step-time", type=float, default=0.0,
                   help="compute seconds per step Ts (only time to target depends on it; default 0)")
    p.add_argument("--codec-ms-per-mb", default=None,
                   help="each codec's milliseconds per MB of fp32 gradient, e.g. fp16=0.8,powersgd_r4=2.9 (default: "
                        "measured now on this machine, one thread; a codec not given is measured)")
    p.add_argument("--steps-ratio", default=None,
                   help="steps to target, compressed / exact, per codec, e.g. powersgd_r4=1.1,local_sgd_H8=1.5 "
                        "(from a time-to-accuracy sweep or entered); adds the time-to-target break-even")


def _pairs(option: str, text: str | None, accepted: list[str]) -> dict[str, float]:
    out = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in accepted:
            raise ValueError(f"{option}: unknown codec {name!r}: accepted are {', '.join(accepted)}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{option}: bad value {value!r} for {name}: accepted is a number, e.g. {name}=1.2") \
                from None
        if not 0 <= number < math.inf or (option == "--steps-ratio" and number == 0):
            raise ValueError(f"{option}: bad value {value!r} for {name}: accepted are numbers "
                             f"{'> 0' if option == '--steps-ratio' else '>= 0'}")
        out[name] = number
    return out


def run(args) -> int:
    from reports.break_even import CODECS, NO_CODEC, measure_codec_s_per_mb, table
    from reports.model import model_numel, workload_shapes
    from strategies.transport.link import parse_latency

    codecs = [c for c, _ in CODECS]
    workers = []
    for item in args.workers.split(","):
        try:
            workers.append(int(item))
        except ValueError:
            raise ValueError(f"--workers: bad item {item!r}: accepted are whole numbers from 2 to 1,024") from None
    latency = parse_latency(args.latency)
    given = {k: v / 1e3 for k, v in _pairs("--codec-ms-per-mb", args.codec_ms_per_mb, codecs).items()}
    ratios = _pairs("--steps-ratio", args.steps_ratio, codecs)
    if args.model:
        numel = model_numel(args.model, args.num_classes)
        shapes, label = workload_shapes(args.model, numel, args.num_classes), args.model
    else:
        from experiments.cli.common import MAX_MODEL_BYTES, size_arg

        nbytes = size_arg("--model-bytes", args.model_bytes, MAX_MODEL_BYTES)
        numel, shapes, label = round(nbytes / 4), None, f"{nbytes:,} bytes"
    # every value checked (break_even refuses a bad one) before any codec is timed
    from reports.break_even import break_even

    for n in workers:
        break_even(args.strategy, "fp16", n, numel, latency, 0.0, 1.0, args.step_time, shapes)
    measured = {c: measure_codec_s_per_mb(c) for c in codecs if c not in given}
    rows = table(args.strategy, workers, numel, latency, given | measured, ratios, args.step_time, shapes)
    print(f"# {label}: {numel * 4 / 1e6:,.2f} MB fp32 gradients around {args.strategy}, latency {latency * 1e6:g} us, "
          f"one NIC per rank; Ts {args.step_time:g} s; priced by the model (strategies.cost)")
    source = {c: "given" if c in given else "none" if c in NO_CODEC else "measured here" for c in codecs}
    print("# codec ms/MB: " + ", ".join(f"{c} {(given | measured)[c] * 1e3:.3g} ({source[c]})" for c in codecs)
          + (f" (measured: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, one thread, a 16 MiB buffer)"
             if set(measured) - NO_CODEC else ""))
    width = max(len(r["step"]) for r in rows)
    print(f"{'workers':>7}  {'codec':<13} {'codec ms/step':>13}  {'the step':<{width}}  time to target")
    for r in rows:
        print(f"{r['workers']:>7}  {r['codec']:<13} {r['codec_ms_per_step']:>13.3g}  {r['step']:<{width}}  "
              f"{r['target'] or 'no steps-to-target ratio given'}")
    print("# local_sgd_H8 syncs one step in 8 (no codec); its averaging's cost is not priced")
    return 0

"""The GPU check's summary as plain tables, to paste into an issue."""

from __future__ import annotations


def format_summary(summary: dict) -> str:
    """The summary as plain tables to paste into an issue."""
    lines = [f"# syncbench GPU check on {summary['device']} (started {summary['started_at']})", ""]
    for name, entry in summary["steps"].items():
        seconds = entry.get("seconds")
        lines.append(f"## {name}: {entry.get('status')}" + (f" ({seconds:.1f} s)" if seconds is not None else ""))
        if entry.get("error"):
            lines.append("    " + entry["error"].strip().splitlines()[-1])
        result = entry.get("result") or {}
        if name == "environment":
            lines += [f"    {k}: {v}" for k, v in result.items()]
        elif name == "collectives" and "cases" in result:
            lines.append(f"    {result['cases'] - len(result['failed'])} of {result['cases']} cases ok: "
                         f"{len(result.get('settings', []))} strategy settings x world sizes "
                         f"{result.get('world_sizes')} x sizes {result.get('numels')} x ops {result.get('ops')}; "
                         f"max |error| {result.get('max_abs_error', float('nan')):.3g}")
            lines += [f"    FAILED {c['setting']} workers={c['workers']} numel={c['numel']} op={c['op']}: "
                      f"{c['problems'][:200]}" for c in result["failed"]]
        elif name == "harness" and "ratio_fp32" in result:
            lines += [f"    plain bf16 + channels_last: {result['plain_bf16_channels_last_images_per_s']:.1f} images/s",
                      f"    plain fp32 (TF32):          {result['plain_fp32_images_per_s']:.1f} images/s",
                      f"    syncbench fp32 (TF32):      {result['syncbench_fp32_images_per_s']:.1f} images/s",
                      f"    ratio syncbench / plain, fp32: {result['ratio_fp32']:.3f} (target >= 0.95)"]
        elif name == "profiles":
            lines += [f"    {p['file']:<28} step {p['step_ms']:8.2f} ms  fwd {p['forward_ms']:7.2f}  "
                      f"bwd {p['backward_ms']:7.2f}  opt {p['optimizer_ms']:6.2f}  {p['images_per_s']:8.1f} img/s"
                      for p in result.get("profiles", [])]
        elif name == "strategies":
            for r in result.get("strategies", []):
                diff = r.get("params_max_abs_diff")
                lines.append(f"    {r['strategy']:<22} {r['status']:<24} params {r.get('params', '-'):<13} "
                             f"{'' if diff is None else f'max|diff| {diff:.2e}'} {r.get('message', '')[:160]}")
            for r in result.get("world_size_1", []):
                lines.append(f"    world size 1 {r['backend']} {r['strategy']:<8} {r['status']} "
                             f"{r.get('message', '')[:200]}")
        elif name == "scaling" and "runs" in result:
            lines.append(f"    {result['ok']} of {result['runs']} runs ok {result['stopped']}")
            lines += [f"    {k:<28} {v:10.1f} images/s" for k, v in result["images_per_s"].items()]
            lines += [f"    FAILED {f}" for f in result["failed"]]
        lines.append("")
    return "\n".join(lines)



"""The GPU check's collectives step: every strategy's one sync on tensors that live on the device, at the awkward
world sizes (1, 2, 3, 5, 7, 8) and sizes (shorter than the world, not divisible by it), checked as
`syncbench verify` checks them: a float64 reference, worker ranks agreeing bit for bit, and every rank's bytes and
messages equal to `traffic()`. Unlike the strategies step, nothing trains: a difference here is the collective's,
not training's amplification of the float32 sums' order."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import strategies
from experiments.bench.verify_rank import check_setting, setting_label, verify_on_rank, world_groups
from strategies.transport.threads import run_threads

OPS = ("sum", "max")


def collectives(check) -> dict:
    """Each declared strategy setting (model-wrapping ones aside) for every world size, size and op of the sizes."""
    s = check.sizes
    settings = [(n, p) for n, p in strategies.registry.settings() if not strategies.get(n).wraps_model]
    cases = []
    for workers in s.collective_workers:
        for numel in s.collective_numels:
            for op in OPS:
                usable = [(n, p) for n, p in settings if not strategies.get(n).exact or op in strategies.get(n).ops]
                for world, group in world_groups(usable, workers):
                    check.spend()
                    per_rank = run_threads(world, lambda comm, group=group, numel=numel, op=op, workers=workers:
                                           verify_on_rank(SimpleNamespace(rank=comm.rank, comm=comm), group,
                                                           workers, numel, op, "float32", check.device),
                                           timeout=s.timeout_s)
                    for name, params in group:
                        label = setting_label(name, params)
                        rows = [r for ranks in per_rank for r in ranks if r["setting"] == label]
                        ok, error, why = check_setting(name, params, workers, numel, op, np.dtype(np.float32), rows)
                        cases.append({"setting": label, "workers": workers, "numel": numel, "op": op, "ok": ok,
                                      "max_abs_error": error, "problems": why})
            check.partial(_summary(cases))
    return _summary(cases)


def _summary(cases: list[dict]) -> dict:
    """What the cases so far cover (a budget spent keeps this), and which failed."""
    return {"cases": len(cases), "settings": sorted({c["setting"] for c in cases}),
            "world_sizes": sorted({c["workers"] for c in cases}), "numels": sorted({c["numel"] for c in cases}),
            "ops": sorted({c["op"] for c in cases}),
            "max_abs_error": max((c["max_abs_error"] for c in cases), default=0.0),
            "failed": [c for c in cases if not c["ok"]], "all_ok": all(c["ok"] for c in cases)}

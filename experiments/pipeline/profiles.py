"""Profiles measured at the start of a sweep: once per (workload, batch, image size, classes, device), on one
worker actor while the others wait, installed on every actor that replays it, and saved beside the results
(DIR/profile-<id>.json) so that every run's `profile_id` names a file.
"""

from __future__ import annotations

import json

from experiments.pipeline.train import profile_key
from workloads.profile import measure_profile, profile_from_dict


def _measure_on_rank0(ctx, spec):
    if ctx.rank != 0:
        return None
    return measure_profile(spec.workload, spec.batch_size, spec.image_size, ctx.device, spec.num_classes,
                           seed=spec.seed, lr=spec.lr, momentum=spec.momentum).as_dict()


def _install(ctx, key, data):
    ctx.state[key] = profile_from_dict(data, where="the profile measured at the sweep's start")


def install_profile(group, spec, measured: dict, store) -> None:
    """Before a profile-mode run without a profile file: measure its profile once per sweep (`measured`
    caches them by key), write it to the store, and put it on every actor of `group`."""
    if spec.compute != "profile" or spec.profile:
        return
    key = profile_key(spec, "cuda" if group.uses_gpu else "cpu")
    if key not in measured:
        data = group.run(_measure_on_rank0, spec)[0]
        profile = profile_from_dict(data, where="the profile measured at the sweep's start")
        store.write_text(f"profile-{profile.id}.json", json.dumps(data, indent=1) + "\n")
        measured[key] = data
    group.run(_install, key, measured[key])

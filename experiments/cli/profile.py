"""The `syncbench profile` command: measure a compute profile on one rank alone, or describe one (--synthetic)."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--workload", required=True, help="resnet18 | resnet50 | vgg11 | vgg16 | tiny | wide")
    p.add_argument("--batch-size", type=int, help="per-worker batch size (required to measure; synthetic: 32)")
    p.add_argument("--image-size", type=int, help="input side in pixels (default 32; synthetic: 224)")
    p.add_argument("--num-classes", type=int, help="classifier outputs (default: the workload's, 10)")
    p.add_argument("--device", help="cpu or cuda (default cpu; synthetic: cuda)")
    p.add_argument("--synthetic", action="store_true",
                   help="describe hardware instead of measuring: --step-time split by --split, each gradient ready "
                        "by its layer's share of backward work (FLOPs from the layer shapes); labelled synthetic")
    p.add_argument("--step-time", type=float, help="with --synthetic: seconds per step on the described hardware")
    p.add_argument("--split", default="1,2,0",
                   help="with --synthetic: forward,backward,optimizer shares of the step (default 1,2,0)")
    p.add_argument("--describe", default="", help="with --synthetic: the hardware, e.g. 'A100, bf16 AMP'")
    p.add_argument("--steps", type=int, default=10, help="timed steps behind each median (default 10)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--out", help="JSON file to write (default: profiles/<profile id>.json)")


def run(args) -> int:
    from workloads.models import default_num_classes, describe_size
    from workloads.profile import ProfileError, check_profile_path, measure_profile, save_profile, synthetic_profile

    # refused before measuring (an existing directory was found only after it, leaving <dir>.tmp); the default
    # profiles/ too (its file name is the profile's id, known once measured)
    check_profile_path(args.out or Path("profiles") / "profile.json")
    num_classes = default_num_classes(args.workload) if args.num_classes is None else args.num_classes
    if args.synthetic:
        if args.step_time is None:
            raise ProfileError("--synthetic needs --step-time: the described hardware's seconds per step, e.g. 0.25")
        profile = synthetic_profile(args.workload, args.step_time, batch_size=args.batch_size or 32,
                                    image_size=args.image_size or 224, num_classes=num_classes,
                                    split=_split(args.split), device=args.device or "cuda", describe=args.describe)
    else:
        given = [f"--{k.replace('_', '-')}" for k in ("step_time", "describe") if getattr(args, k)]
        if given or args.split != "1,2,0":
            raise ProfileError(f"{', '.join(given) or '--split'}: only with --synthetic (a measured profile times "
                               f"the model on this machine)")
        if args.batch_size is None:
            raise ProfileError("--batch-size is required to measure a profile (the per-worker batch, e.g. 16)")
        profile = measure_profile(args.workload, batch_size=args.batch_size, image_size=args.image_size or 32,
                                  device=args.device or "cpu", num_classes=num_classes, steps=args.steps,
                                  warmup_steps=args.warmup_steps)
    path = save_profile(profile, args.out or Path("profiles") / f"{profile.id}.json")
    half = _half_ready(profile)
    print(f"# {describe_size(profile.model, profile.num_classes, profile.image_size)}")
    if profile.synthetic:
        print(f"# SYNTHETIC (not measured): batch {profile.batch_size} {profile.image_size}x{profile.image_size}, "
              f"{profile.device_name}; readiness spread by each layer's share of backward FLOPs")
    else:
        print(f"# {profile.model} batch {profile.batch_size} {profile.image_size}x{profile.image_size} on "
              f"{profile.device_name} ({profile.device}, {profile.threads} thread(s)), torch "
              f"{profile.torch_version}; medians of {profile.steps} steps")
    print(f"forward    {profile.forward_s * 1e3:9.2f} ms")
    print(f"backward   {profile.backward_s * 1e3:9.2f} ms  ({len(profile.params)} parameters, "
          f"{profile.numel * profile.itemsize / 1e6:.2f} MB of {profile.dtype} gradients; half of the bytes "
          f"ready {half * 1e3:.2f} ms = {half / max(profile.backward_s, 1e-12):.0%} into backward)")
    print(f"optimizer  {profile.optimizer_s * 1e3:9.2f} ms")
    print(f"step       {profile.step_s * 1e3:9.2f} ms")
    print(f"profile {profile.id}: {path}")
    return 0


def _split(text: str) -> tuple[float, ...]:
    """--split 'F,B,O': three shares of the step; ProfileError naming the text otherwise."""
    from workloads.profile import ProfileError

    try:
        shares = tuple(float(x) for x in text.split(","))
    except ValueError:
        shares = ()
    if len(shares) != 3:
        raise ProfileError(f"--split {text!r}: accepted are three numbers forward,backward,optimizer, e.g. 1,2,0")
    return shares


def _half_ready(profile) -> float:
    """When half of the gradient bytes have been accumulated, seconds after backward starts."""
    done = 0
    for ready, numel in sorted(zip(profile.ready_s, profile.numels)):
        done += numel
        if 2 * done >= profile.numel:
            return ready
    return profile.backward_s

"""The `syncbench` command line (also `python -m experiments`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from experiments.cli.common import MAX_MESSAGE_BYTES, MAX_MODEL_BYTES, closing_report, size_arg

# the transports' names, read from their one list without importing the strategies package (that imports torch)
_TRANSPORT_NAMES = runpy.run_path(str(Path(__file__).resolve().parents[2] / "strategies" / "transport" / "names.py"))
P2P_CHOICES = _TRANSPORT_NAMES["P2P"]
P2P_DEFAULT = _TRANSPORT_NAMES["default_p2p"]("cpu")  # bench and verify move host tensors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="syncbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a sweep file and write its results to --out: runs/ and steps/ (one Parquet "
                                   "part per run; `syncbench export` or experiments.results.load_runs to read "
                                   "them), sweep.toml and report.html")
    p.add_argument("sweep", help="a sweep TOML file, e.g. experiments/config/sweeps/quick.toml")
    p.add_argument("--out", help="results directory (default: results/<sweep name>/)")
    p.add_argument("--resume", action="store_true", help="run only what is missing or failed in --out")
    p.add_argument("--overwrite", action="store_true", help="discard results already in --out")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)")
    p.add_argument("--no-report", action="store_true", help="skip writing report.html")
    p.add_argument("--skip-invalid", action="store_true",
                   help="run the valid grid points and list every invalid one with its reason (here and in the "
                        "report), instead of refusing the sweep")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more than 4 ranks per core (times then measure core contention)")
    p.add_argument("--substrate", default="ray", choices=("ray", "threads"),
                   help="where the ranks run: Ray actors (default) or threads of this process, which can share a "
                        "node's NIC (ranks_per_node > 1; no --address)")

    p = sub.add_parser("simulate", help="run a sweep on a simulated cluster (SimGrid), up to thousands of ranks")
    from experiments.cli.simulate import add_arguments as _simulate_arguments

    _simulate_arguments(p)

    p = sub.add_parser("validate", help="the validation matrix: every strategy and variant priced by the model and "
                                        "simulated on SimGrid (alpha_beta, tcp), side by side with their ratio")
    from experiments.validate import add_arguments as _validate_arguments

    _validate_arguments(p)

    p = sub.add_parser("report", help="(re)build DIR/report.html from DIR's results")
    p.add_argument("dir")

    p = sub.add_parser("export", help="DIR's runs and steps as one file per table (every column, each run's latest "
                                      "attempt): OUT/runs.parquet and OUT/steps.parquet, or .csv")
    p.add_argument("dir", help="a results directory (the --out of run or simulate)")
    p.add_argument("--out", required=True, help="directory to write runs.<format> and steps.<format> into")
    p.add_argument("--format", default="parquet", choices=("parquet", "csv"), help="file format (default parquet)")

    from experiments.cli import trace as _trace  # syncbench trace: a run's traced steps for Perfetto or ASTRA-sim

    _trace.add_arguments(sub.add_parser("trace", help="a run's traced steps as Chrome trace JSON or Chakra ETs"))

    p = sub.add_parser("model", help="the analytic model: communication time, efficiency, bandwidth needed")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="resnet18 | resnet50 | vgg11 | vgg16 (fp32 parameters)")
    what.add_argument("--model-bytes", help="message size instead of a model, e.g. 553.36MB")
    what.add_argument("--profile", help="a profile JSON (`syncbench profile`, measured or --synthetic): its model "
                                        "and step time, buckets overlapped with backward as its gradients are ready")
    p.add_argument("--num-classes", type=int,
                   help="with --model: classifier outputs (default: the workload's, as sweeps; ImageNet: 1000)")
    p.add_argument("--workers", action="append", required=True,
                   help="worker counts, comma-separated or repeated, e.g. 4,8,16,32: one table over them")
    p.add_argument("--bandwidth", required=True, help="per-worker link, e.g. 125MB/s, 1Gbit, 25Gbit")
    p.add_argument("--step-time", type=float,
                   help="compute time per step Ts, seconds (not with --profile); without it: bytes and times only")
    p.add_argument("--overlap", action="store_true",
                   help="with --model: overlap buckets with backward on a synthetic profile of --step-time "
                        "(forward:backward 1:2, 224x224, readiness by each layer's backward FLOPs)")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="with --profile or --overlap: MiB per bucket (default 25, DDP's)")
    p.add_argument("--latency", default="0s", help="per-message latency, e.g. 50us (default 0s)")
    p.add_argument("--ranks-per-node", type=int, default=1,
                   help="workers per node sharing one NIC of --bandwidth (default 1): prices each level, e.g. 8")
    p.add_argument("--intra-bandwidth", help="with --ranks-per-node: the link inside a node, e.g. 100Gbit "
                                             "(default unlimited)")
    p.add_argument("--target-efficiency", type=float, default=0.9)
    p.add_argument("--nccl-reference", action="store_true",
                   help="also print NCCL's own model of an allreduce (ring, tree) beside syncbench's ring and tree")
    p.add_argument("--strategy", action="append",
                   help="limit to these strategies (repeatable), each a name or name:key=value,..., e.g. "
                        "parameter_server:servers=4,placement=colocated")

    p = sub.add_parser("map", help="which strategy wins where: workers x bandwidth (or x message size), from the "
                                   "model, each strategy at its best knob; the crossovers in words")
    from experiments.cli.map import add_arguments as _map_arguments
    _map_arguments(p)

    from experiments.cli.explain import add_arguments as _explain_arguments
    _explain_arguments(sub.add_parser("explain", help="one sync of a strategy's real code on thread ranks, drawn "
                                                      "round by round from its messages: a table, SVG or HTML"))

    p = sub.add_parser("break-even", help="the NIC bandwidth below which each compression (or local SGD) shortens "
                                          "the step, and time to target given a steps-to-target ratio")
    from experiments.cli.break_even import add_arguments as _break_even_arguments
    _break_even_arguments(p)

    p = sub.add_parser("faults", help="a scripted failure on thread ranks for each strategy and recovery mode: "
                                      "steps lost, recovery seconds, the survivors' result checked")
    from experiments.cli.faults import add_arguments as _faults_arguments
    _faults_arguments(p)

    sub.add_parser("strategies", help="list the registered strategies and their parameters")
    sub.add_parser("schema", help="the columns of the runs and steps tables: name, type, meaning")

    p = sub.add_parser("profile", help="measure a compute profile: forward, per-parameter gradient readiness, "
                                       "optimizer (one rank alone); or describe one (--synthetic)")
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

    p = sub.add_parser("verify", help="check every strategy against a reference on Ray actors (over --p2p)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--numel", type=int, default=100_003)
    p.add_argument("--op", default="sum", help="the reduction op (see `syncbench strategies`; default sum)")
    p.add_argument("--dtype", default="float32", help="float16/32/64, int8/32/64, uint8/16/32/64 or bool "
                                                       "(default float32)")
    p.add_argument("--strategies", help="comma-separated names (default: all)")
    p.add_argument("--address", help="Ray cluster address")
    p.add_argument("--oversubscribe", action="store_true", help="allow more than 4 ranks per core")
    p.add_argument("--p2p", default=P2P_DEFAULT, choices=P2P_CHOICES,
                   help=f"what carries the strategies' messages: syncbench's own sockets or gloo (default "
                        f"{P2P_DEFAULT})")

    p = sub.add_parser("bench", help="nccl-tests-style table of allreduce time, algbw and busbw per strategy")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="message sizes in bytes, e.g. 4K,64K,1M,16M")
    p.add_argument("--strategies", help="comma-separated names (default: all exact allreduces)")
    p.add_argument("--bandwidth", help="emulate links of this bandwidth, e.g. 1Gbit")
    p.add_argument("--latency", default="0s", help="emulated per-message latency, e.g. 50us")
    p.add_argument("--emulation", default="python", choices=("python", "kernel"),
                   help="who shapes --bandwidth: the communicator (python, default) or the kernel, on the cluster "
                        "of `syncbench cluster up` (one rank per node, or k per namespace with --ranks-per-node k; "
                        "native is shaped too)")
    p.add_argument("--ranks-per-node", type=int, default=1,
                   help="nodes of this many ranks sharing one NIC of --bandwidth: thread ranks with python emulation, "
                        "Ray actors k per namespace with --emulation kernel (default strategies: ring, hierarchical, "
                        "double_binary_tree, node_parameter_server)")
    p.add_argument("--intra-bandwidth", help="with --ranks-per-node: the link inside a node, e.g. 100Gbit "
                                             "(default unlimited)")
    p.add_argument("--intra-latency", help="with --ranks-per-node: its per-message latency, e.g. 2us (default 0)")
    p.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: by size)")
    p.add_argument("--p2p", default=P2P_DEFAULT, choices=P2P_CHOICES + ("threads",),
                   help=f"what carries the strategies' messages: syncbench's own sockets (Unix within a network "
                        f"namespace, else TCP) or torch.distributed's gloo (default {P2P_DEFAULT}); native is gloo's "
                        f"either way; with --ranks-per-node also threads (the thread ranks' queues)")
    p.add_argument("--transport", action="store_true",
                   help="instead: point-to-point bandwidth and latency of the transport between 2 actors")
    p.add_argument("--harness", action="store_true",
                   help="instead: 1-worker training through syncbench vs a plain PyTorch loop (overhead)")
    p.add_argument("--overlap", action="store_true",
                   help="instead: profile-mode training, overlap off/on x bucket_mb 1, 25, flat, per strategy and "
                        "link, measured beside the timeline prediction")
    p.add_argument("--ps", action="store_true",
                   help="instead: the parameter server's communication time (k = 1, 2, 4 x dedicated, colocated x "
                        "summation, update) beside ring and BytePS's optimum, then samples/s with one worker 2x and 3x "
                        "slower (synchronous, SSP 2 and 8, async, 1 backup); 4 workers, resnet18 profile, 1 Gbit")
    p.add_argument("--partition-mb", default="4,1", help="with --ps: partition sizes in MiB (default 4,1)")
    p.add_argument("--models", default="resnet18,resnet50", help="with --overlap: models to profile")
    p.add_argument("--links", default="1Gbit,10Gbit", help="with --overlap: emulated links ('none': full speed)")
    p.add_argument("--steps", type=int, default=4, help="with --overlap: steps per run, 1 of them warm-up")
    p.add_argument("--out", help="with --overlap: keep the profiles and results here (default: a temp dir)")
    p.add_argument("--workload", default="resnet18", help="with --harness: the model (default resnet18)")
    p.add_argument("--batch-size", type=int, default=32, help="with --harness: batch size (default 32)")
    p.add_argument("--image-size", type=int, default=32, help="with --harness: input size (default 32)")
    p.add_argument("--device", default="cpu", help="with --harness: cpu or cuda")
    p.add_argument("--address", help="Ray cluster address")
    p.add_argument("--oversubscribe", action="store_true", help="allow more than 4 ranks per core")

    p = sub.add_parser("cluster", help="a Ray cluster on this machine: nodes in network namespaces, links shaped "
                                       "by the kernel (root only)")
    action = p.add_subparsers(dest="action", required=True)
    q = action.add_parser("up", help="create the namespaces, bridge and shaped links; start Ray in them")
    q.add_argument("--nodes", type=int, required=True, help="Ray worker nodes, one rank each")
    q.add_argument("--bandwidth", required=True, help="every node's NIC, each way, e.g. 1Gbit")
    q.add_argument("--latency", default="0s", help="one-way delay per packet (needs the kernel's netem), e.g. 50us")
    q.add_argument("--node-bandwidth", action="append", default=[], metavar="I=BW",
                   help="node I's own bandwidth, e.g. 2=100Mbit (repeatable)")
    q.add_argument("--node-latency", action="append", default=[], metavar="I=LAT",
                   help="node I's own latency, e.g. 2=1ms (repeatable)")
    q.add_argument("--node-cpus", type=int, default=1, help="Ray CPUs per worker node (default 1: one rank each)")
    q.add_argument("--head-cpus", type=int, default=8, help="Ray CPUs of the head, where python-emulated runs go")
    action.add_parser("status", help="the cluster's nodes, links, Ray nodes and processes")
    action.add_parser("down", help="stop what `up` started and remove the namespaces (also after a crash)")
    for q in action.choices.values():
        q.add_argument("--name", default="sb", help="cluster name, 1-6 lowercase letters/digits (default sb)")
        q.add_argument("--state-dir", help="where cluster state lives, a directory of this user with mode 0700 "
                                           "(default: $SYNCBENCH_CLUSTER_DIR, else /run/syncbench for root)")

    args = parser.parse_args(argv)
    from experiments.cluster.netns import ClusterError

    try:
        # `cluster` is left to finish its own way out: a forced exit could strand half-removed namespaces
        with _bounded_by_signals(args.command, deadline=args.command != "cluster"):
            return COMMANDS[args.command](args) or 0
    except (ValueError, FileExistsError, FileNotFoundError, ClusterError, ConnectionError) as e:
        print(f"syncbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # (an exception is always true: its text is what may be empty, as Ctrl-C's is)
        print(f"syncbench {args.command}: interrupted ({str(e) or 'SIGINT, Ctrl-C'}); finished runs are saved",
              file=sys.stderr)
        return 128 + (signal.SIGTERM if str(e) == "SIGTERM" else signal.SIGINT)


INTERRUPT_DEADLINE_S = 5.0  # after SIGTERM or SIGINT, how long the orderly way out may take (timeout, systemd and
# Slurm send SIGKILL ~10 s after SIGTERM); then the Ray processes this command started are ended and it exits


@contextlib.contextmanager
def _bounded_by_signals(command: str, deadline: bool = True):
    """SIGTERM and SIGINT end the command like Ctrl-C (KeyboardInterrupt naming the signal: finished runs saved, Ray
    shut down on the way out), and within INTERRUPT_DEADLINE_S whatever the way out waits on: a watcher sees the
    signal through signal.set_wakeup_fd (whichever Python handler is installed: the runner has its own), and at
    the deadline ends this command's embedded Ray (its reapers), removes its temp dir and exits with 128 + the
    signal. Only while the command runs: main() called in-process (tests) leaves nothing armed. Without
    `deadline`, only the first part: SIGTERM raises KeyboardInterrupt naming it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    if not deadline:
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=_deadline_after_signal, args=(reader, command), daemon=True,
                               name="syncbench-signal-deadline")
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(OSError):
            reader.shutdown(socket.SHUT_RDWR)  # the watcher sees the end and returns
        watcher.join(1.0)
        reader.close()
        writer.close()


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _deadline_after_signal(reader, command: str) -> None:
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return  # the command ended: disarmed
        stops = [n for n in data if n in (signal.SIGTERM, signal.SIGINT)]
        if stops:
            break
    end = time.monotonic() + INTERRUPT_DEADLINE_S
    while time.monotonic() < end:  # returns early if the command ends first
        ready, _, _ = select.select([reader], [], [], max(0.0, end - time.monotonic()))
        if ready:
            try:
                if not reader.recv(64):
                    return
            except OSError:
                return
    name = signal.Signals(stops[0]).name
    print(f"syncbench {command}: {name}: not stopped within {INTERRUPT_DEADLINE_S:g} s: ending the Ray processes "
          f"it started and exiting; finished runs are saved", file=sys.stderr, flush=True)
    runtime = sys.modules.get("experiments.cluster.ray_runtime")
    if runtime is not None:
        runtime.force_stop()
    os._exit(128 + stops[0])


def _run(args) -> int:
    from experiments.config import sweep as sweep_mod
    from experiments.pipeline.runner import run_sweep
    from experiments.pipeline.store import default_dir

    sweep = sweep_mod.load(args.sweep, progress=_expansion_progress, skip_invalid=args.skip_invalid)
    for point, reason in sweep.skipped:
        print(f"syncbench run: skipped grid point [{point}]: {reason}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
    else:  # the sweep file's name never chooses a path outside results/
        out, note = default_dir(sweep.name)
        if note:
            print(f"syncbench run: {note}", file=sys.stderr)
    substrate = None  # Ray's
    if args.substrate == "threads":
        from experiments.pipeline.substrate import ThreadSubstrate

        if args.address:
            raise ValueError(f"--substrate threads with --address {args.address}: thread ranks run in this process, "
                             f"not on a Ray cluster (accepted: one of them)")
        substrate = ThreadSubstrate()
    runs = run_sweep(sweep, out, resume=args.resume, overwrite=args.overwrite, address=args.address,
                     oversubscribe=args.oversubscribe, substrate=substrate)
    _print_runs(runs)
    if not args.no_report:
        closing_report(out)
    failed = int((runs["status"] != "ok").sum()) if not runs.empty else 0
    return 1 if failed else 0


def _expansion_progress(done: int, total: int) -> None:
    print(f"\rexpanding the grid: {done:,}/{total:,} points", end="\n" if done == total else "",
          file=sys.stderr, flush=True)


# the compression settings a column belongs to (the printed table leaves it blank on other runs)
APPLIES_TO = {"powersgd_rank": ("powersgd",), "topk_ratio": ("topk",), "error_feedback": ("powersgd", "topk")}


def _print_runs(runs) -> None:
    import pandas as pd

    if runs.empty:
        return
    cols = ["strategy", "workers", "link", "status", "throughput", "step_time_s", "compute_s", "comm_s",
            "bytes_sent_per_worker"]
    if "accuracy" in runs and runs["accuracy"].notna().any():  # a real data set: held-out accuracy too
        cols += ["final_loss", "accuracy"]
    if "target_metric" in runs and (runs["target_metric"].fillna("") != "").any():  # time to target: both factors
        cols += ["steps_to_target", "time_to_target_s"]
    order = ["link", "workers", "strategy"]
    # every setting that varies between the runs gets a column (strategy parameters by their param_ name), or
    # rows of different runs would look identical
    candidates = ["bucket_mb", "overlap", "compute", "link_latency_s", "link_heterogeneous", "link_emulation",
                  "straggler_ranks", "straggler_slowdown", "p2p", "seed", "compression", "powersgd_rank",
                  "topk_ratio", "error_feedback", "sync_every", "outer_optimizer"]
    # a compression's own parameter means something on the runs with that compression only: blank elsewhere, and
    # an axis only when it varies among those runs (powersgd_rank = 1 beside compression = "none" is no setting)
    runs = runs.copy()
    for column, uses in APPLIES_TO.items():
        if column in runs and "compression" in runs:
            runs[column] = runs[column].astype(object).where(runs["compression"].isin(uses), "")
    varying = [c for c in candidates if c in runs and
               (runs[c][runs[c].map(str) != ""] if c in APPLIES_TO else runs[c]).map(str).nunique() > 1]
    # a strategy parameter is an axis when it varies between runs of one strategy; a column only one strategy
    # fills (NaN or '' for the others) does not vary by being unused, and unused cells print blank
    params = sorted(c for c in runs if c.startswith("param_") and c != "param_norm")
    varying += [c for c in params if (runs.groupby("strategy")[c].agg(lambda v: v.map(str).nunique()) > 1).any()]
    cols[cols.index("strategy") + 1:cols.index("strategy") + 1] = varying
    order += varying
    if "overlap" in varying:  # buckets synced during backward: exposed vs busy
        cols += ["comm_busy_s"]
    table = runs[cols].copy()
    for c in (c for c in varying if c.startswith("param_")):
        table[c] = table[c].map(lambda v: "" if v is None or v != v or v == "" else v).astype(object)
        if "knob_chosen" in runs and "knob" in runs:  # a size knob the sweep left unset: the model's choice
            chosen = runs["knob_chosen"].astype(bool) & (runs["knob"] == c[len("param_"):])
            if chosen.any():
                table[c] = [f"{v:g}" + (" (model)" if by_model else "") if isinstance(v, (int, float)) else v
                            for v, by_model in zip(table[c], chosen)]
    table = table.iloc[sorted(range(len(table)), key=lambda i: [str(v) for v in table[order].iloc[i]])]
    table["bytes_sent_per_worker"] = table["bytes_sent_per_worker"] / 1e6
    table = table.rename(columns={"throughput": "samples/s", "step_time_s": "step s", "compute_s": "compute s",
                                  "comm_s": "comm s", "bytes_sent_per_worker": "MB sent/worker",
                                  "comm_busy_s": "busy s", "steps_to_target": "steps to target",
                                  "time_to_target_s": "s to target"})
    with pd.option_context("display.width", 160, "display.max_rows", 500, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))


def _report(args) -> int:
    from reports.page import build

    print(build(Path(args.dir)))
    return 0


def _export(args) -> int:
    from experiments.results.export import export

    for path in export(args.dir, args.out, args.format):
        print(path)
    return 0


def _model(args) -> int:
    from reports.model import format_model_table, model_table
    from strategies.transport.link import parse_bandwidth, parse_latency

    model_bytes = size_arg("--model-bytes", args.model_bytes, MAX_MODEL_BYTES) if args.model_bytes else None
    if args.nccl_reference and (args.ranks_per_node or 1) != 1:
        raise ValueError("--nccl-reference compares one GPU per node: accepted without --ranks-per-node")
    _check_link("--bandwidth", args.bandwidth, "--latency", args.latency)
    _check_link("--intra-bandwidth", args.intra_bandwidth, "--intra-latency", None)
    profile, model, step_time = None, args.model, args.step_time
    if args.num_classes is not None and args.model_bytes:
        raise ValueError("--num-classes sizes a --model; with --model-bytes the size is given (accepted: one of them)")
    if args.profile is not None:
        if args.step_time is not None or args.num_classes is not None or args.overlap:
            raise ValueError("--profile gives the model, its classes and Ts: accepted without --step-time, "
                             "--num-classes and --overlap")
        from workloads.profile import load_profile

        profile = load_profile(args.profile)
    elif args.step_time is None and args.overlap:
        raise ValueError("--overlap needs --step-time (the compute the buckets overlap with, seconds, e.g. 0.25)")
    elif args.overlap:
        if args.model is None:
            raise ValueError("--overlap needs --model (a synthetic profile spreads readiness over its layers)")
        from workloads.profile import synthetic_profile

        profile = synthetic_profile(args.model, args.step_time, num_classes=args.num_classes,
                                    describe="model --overlap")
    if profile is not None:
        model = step_time = None
    import math

    import pandas as pd

    no_ts = profile is None and step_time is None  # bytes and times only: Ts 1 s priced, its columns dropped
    tables = [model_table(model=model, model_bytes=model_bytes, workers=n, bandwidth=parse_bandwidth(args.bandwidth),
                          step_time=1.0 if no_ts else step_time, latency=parse_latency(args.latency),
                          target_efficiency=args.target_efficiency, strategies=args.strategy,
                          num_classes=None if profile is not None else args.num_classes, profile=profile,
                          bucket_mb=args.bucket_mb, ranks_per_node=args.ranks_per_node,
                          intra_bandwidth=parse_bandwidth(args.intra_bandwidth) if args.intra_bandwidth
                          else float("inf"))
              for n in _workers_list(args.workers)]
    table = pd.concat(tables, ignore_index=True)
    table.attrs = dict(tables[0].attrs)
    if no_ts:
        table[["efficiency", "step_s", "bandwidth_needed"]] = math.nan
        table.attrs["step_time"] = math.nan
    print(format_model_table(table))
    if args.nccl_reference:  # NCCL's own model beside syncbench's ring and tree (reports/nccl_model.py)
        from reports.nccl_model import format_reference

        cells = [(n, 4 * int(table.attrs["numel"]), parse_bandwidth(args.bandwidth), parse_latency(args.latency))
                 for n in _workers_list(args.workers) if n > 1]
        print("\n" + "\n".join(format_reference(cells)))
    return 0


def _workers_list(values: list[str]) -> list[int]:
    """--workers 4,8 --workers 16: the counts in order, each once; one line naming a value that is not a count."""
    counts = []
    for text in values:
        for item in (w.strip() for w in text.split(",")):
            if not item.isdigit():
                raise ValueError(f"--workers {item!r}: accepted are whole numbers >= 1, comma-separated or "
                                 f"repeated, e.g. 4,8,16")
            counts.append(int(item))
    return list(dict.fromkeys(counts))


def _strategies(args) -> int:
    import strategies
    from strategies.registry import skipped_plugins

    for name in strategies.names():
        cls = strategies.get(name)
        params = ", ".join(f"{k}={v!r}" for k, v in cls.parameters().items()) or "-"
        print(f"{name:18s} {cls.summary}\n{'':18s} role: {cls.role}; ops: {', '.join(cls.ops)}; params: {params}")
    for name, why in skipped_plugins().items():  # already said once on stderr; listed here with the others
        print(f"{name:18s} SKIPPED: {why}")
    return 0


def _schema(args) -> int:
    from experiments.results.describe import describe

    print(describe())
    return 0


def _profile(args) -> int:
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


def _verify(args) -> int:
    from experiments.bench.collectives import verify

    return 0 if verify(workers=args.workers, numel=args.numel, op=args.op, names=_names(args.strategies),
                       address=args.address, oversubscribe=args.oversubscribe, dtype=args.dtype,
                       p2p=args.p2p) else 1


def _bench(args) -> int:
    if args.ps:
        from experiments.bench.parameter_server import format_straggler, format_table, ps_bench, straggler_bench

        parts = [float(p) for p in args.partition_mb.split(",") if p]
        link = {"bandwidth": args.bandwidth or "1Gbit", "latency": args.latency if args.latency != "0s" else "50us"}
        print(format_table(ps_bench(workers=args.workers, partition_mb=parts, steps=args.steps, out=args.out, **link)),
              flush=True)
        print(format_straggler(straggler_bench(workers=args.workers, out=args.out and f"{args.out}/straggler",
                                               **link)))
        return 0
    if args.overlap:
        from experiments.bench.overlap import DEFAULT_STRATEGIES, format_overlap, overlap_bench

        table = overlap_bench(models=_names(args.models), links=_names(args.links),
                              names=_names(args.strategies) or DEFAULT_STRATEGIES, workers=args.workers,
                              batch_size=args.batch_size, image_size=args.image_size, steps=args.steps,
                              out=args.out, address=args.address)
        print(format_overlap(table))
        return 0
    if args.harness:
        from experiments.bench.transport import format_harness, harness_bench

        print(format_harness(harness_bench(workload=args.workload, batch_size=args.batch_size,
                                           image_size=args.image_size, device=args.device)))
        return 0
    if args.transport:
        from experiments.bench.transport import format_table, transport_bench
        from experiments.cluster.ray_runtime import ensure_ray

        ensure_ray(args.address)
        print(format_table(transport_bench()))
        return 0
    sizes = [size_arg("--sizes", s, MAX_MESSAGE_BYTES) for s in args.sizes.split(",") if s]
    if args.bandwidth:
        _check_link("--bandwidth", args.bandwidth, "--latency", args.latency)
    from experiments.bench.collectives import bench

    link = {"bandwidth": args.bandwidth, "latency": args.latency, "emulation": args.emulation} if args.bandwidth \
        else None
    if args.emulation == "kernel" and not link:
        raise ValueError("--emulation kernel: give the cluster's --bandwidth too (the links the run expects)")
    for key in ("intra_bandwidth", "intra_latency"):
        if getattr(args, key) is not None:
            if not link:
                raise ValueError(f"--{key.replace('_', '-')}: give the node NIC's --bandwidth too")
            link[key] = getattr(args, key)
    if link:
        _check_link("--intra-bandwidth", link.get("intra_bandwidth"), "--intra-latency", link.get("intra_latency"))
    bench(workers=args.workers, sizes=sizes, names=_names(args.strategies), link=link, iters=args.iters,
          address=args.address, oversubscribe=args.oversubscribe, p2p=args.p2p, ranks_per_node=args.ranks_per_node)
    return 0


def _cluster(args) -> int:
    from experiments.cluster import netns

    if args.state_dir:  # for this command only (main() may run in-process, as in tests)
        with netns.using_state_dir(args.state_dir):
            return _cluster(argparse.Namespace(**{**vars(args), "state_dir": None}))
    if args.action == "up":
        cluster = netns.up(args.name, _node_links(args), node_cpus=args.node_cpus, head_cpus=args.head_cpus)
        print(netns.status(cluster))
        print(f"address: {cluster.address}  (`syncbench run` and `syncbench bench --emulation kernel` find it "
              f"by itself; other Ray clients: export RAY_ADDRESS={cluster.address} "
              + " ".join(f"{k}={v}" for k, v in cluster.env().items()) + ")")
        return 0
    cluster = netns.Cluster.load(netns.check_name(args.name))
    if args.action == "status":
        if cluster is None:
            print(f"no cluster {args.name!r} (no state file {netns.state_path(args.name)})")
            return 1
        print(netns.status(cluster))
        return 0
    if not netns.down(args.name):
        print(f"cluster {args.name!r}: nothing to remove")
    return 0


def _node_links(args) -> list:
    """Every node's Link: --bandwidth/--latency, overridden per node by --node-bandwidth/--node-latency I=VALUE."""
    from strategies.transport.link import Link, parse_bandwidth, parse_latency

    if args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: expected at least 1")
    bandwidth = [parse_bandwidth(args.bandwidth)] * args.nodes
    latency = [parse_latency(args.latency)] * args.nodes
    for option, values, parse in (("--node-bandwidth", bandwidth, parse_bandwidth),
                                  ("--node-latency", latency, parse_latency)):
        for item in getattr(args, option[2:].replace("-", "_")):
            index, _, value = item.partition("=")
            if not index.strip().isdigit() or not 0 <= int(index) < args.nodes or not value:
                raise ValueError(f"{option} {item!r}: expected I=VALUE with a node index I in 0..{args.nodes - 1}")
            values[int(index)] = parse(value)
    return [Link(b, lat) for b, lat in zip(bandwidth, latency)]


def _check_link(bandwidth_option: str, bandwidth: str | None, latency_option: str, latency: str | None) -> None:
    """A bandwidth and latency within the sweep's link ranges (1Mbit: a 1bit link hung `bench` for ever); None:
    not given."""
    from experiments.config.sweep import RANGES
    from strategies.transport.link import parse_bandwidth, parse_latency

    for option, text, parse, key, unit in ((bandwidth_option, bandwidth, parse_bandwidth, "link.bandwidth", "bytes/s"),
                                          (latency_option, latency, parse_latency, "link.latency", "s")):
        if text is None:
            continue
        value = parse(text)
        if RANGES[key].problem(key, value):
            shown = repr(text) if len(text) <= 40 else repr(text[:40] + "...")
            raise ValueError(f"{option} {shown} ({value:g} {unit}): accepted are {RANGES[key].describe()}")


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def _validate(args) -> int:
    from experiments.validate import run

    return run(args)


def _map(args) -> int:
    from experiments.cli.map import run

    return run(args)


def _explain(args) -> int:
    from experiments.cli.explain import run

    return run(args)


def _break_even(args) -> int:
    from experiments.cli.break_even import run

    return run(args)


def _trace_run(args) -> int:
    from experiments.cli.trace import run

    return run(args)


def _faults(args) -> int:
    from experiments.cli.faults import run

    return run(args)


def _simulate(args) -> int:
    from experiments.cli.simulate import run

    return run(args)


COMMANDS = {"run": _run, "report": _report, "export": _export, "model": _model, "strategies": _strategies,
            "schema": _schema, "verify": _verify,
            "bench": _bench, "profile": _profile, "cluster": _cluster,
            "simulate": _simulate, "validate": _validate, "map": _map, "explain": _explain,
            "break-even": _break_even, "trace": _trace_run,
            "faults": _faults}

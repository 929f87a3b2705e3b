"""A node's link down for t seconds on the kernel-shaped network: what the outage costs a strategy over real TCP.

    ends = kernel_outage_run("ring", {}, workers=4, steps=8, numel=250_000, outage=LinkOutage(5, 2, 1.0),
                             bandwidth=parse_bandwidth("100Mbit"))

Builds the cluster's network only (a namespace per rank, each behind a tbf-shaped veth on one bridge, as
`syncbench cluster up` does; no Ray), starts one process per rank inside its namespace
(experiments/cluster/outage_rank.py: gloo's rendezvous, the sockets transport over TCP), and when the outage's rank
reaches step s takes its veth's bridge end down (`ip link set <veth> down`: nothing in or out), brings it up t
seconds later, and lets TCP find out: its retransmission timer backs off (200 ms, 400 ms, 800 ms, ...) while the
link is down, so the stall can outlast the outage. Returns each worker rank's step ends (seconds from the first
step's start, one clock for every namespace).

With `probe` (a list), the run also says what TCP's timers were: `ss -tino` in every rank's namespace PROBE_AFTER_S
after the link went down (before any retransmission: RTO_MIN is 200 ms) and, for outages over 0.5 s, 0.25 s before
it comes back (on a timer of its own: the link's return never waits for it), each connection's RTO, smoothed RTT
and its variation, the retransmission timer's remaining time and count (tcp_probe), and the link's down and up
times on the run's clock: what strategies/fault_tcp.py's price takes as input, and when each connection would
resend.

Cleanup is guaranteed: whatever fails (a rank, a timeout, Ctrl-C), the link is brought up, every rank process is
killed and the namespaces, veths and bridge this call made are removed; a crash of this process itself leaves a
state file that `syncbench cluster down --name NAME` reads to remove them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import strategies
from experiments.cluster import netns
from experiments.cluster.host import support_problem
from experiments.cluster.network import _make_network
from experiments.cluster.shell import ClusterError
from experiments.cluster.state import Cluster, _write_state
from strategies.faults import LinkOutage, check_outages
from strategies.transport.link import Link

REPO = Path(__file__).resolve().parents[2]
PORT = 29_517  # rank 0's rendezvous port, inside its own namespace
PROBE_AFTER_S = 0.1  # when the TCP probe reads the timers, after the link went down (before RTO_MIN's 200 ms)


@contextmanager
def shaped_network(name: str, ranks: int, bandwidth: float):
    """The namespaces, veths and bridge of cluster `name` with `ranks` shaped nodes, removed on the way out
    whatever happened (their processes killed first)."""
    problem = support_problem()
    if problem:
        raise ClusterError(f"cannot build the kernel-shaped network here: {problem}")
    if netns.Cluster.load(name) is not None:
        raise ClusterError(f"cluster {name!r} is already up: choose another name, or `syncbench cluster down --name "
                           f"{name}` first")
    cluster = netns.plan(name, [Link(bandwidth)] * ranks)
    made: list[tuple[str, str]] = []
    try:
        _write_state(name, json.dumps(asdict(cluster), indent=1) + "\n", new=True)  # first: `down` knows it
        made.append(("state", name))
        _make_network(cluster, made)
        yield cluster
    finally:
        netns._undo(cluster, made)


def kernel_outage_run(strategy: str, params: dict, workers: int, steps: int, numel: int, outage: LinkOutage | None,
                      bandwidth: float, timeout: float = 60.0, name: str = "sbout",
                      probe: list | None = None) -> dict[int, list[float]]:
    """Each worker rank's step ends (seconds from the start) of `steps` synchronizations of `numel` float32 with
    rank outage.rank's link down for outage.seconds from the start of step outage.step (None: no outage).
    `probe`: a list that gets one dict, the link's "down" and "up" seconds on the same clock and the TCP timers
    read PROBE_AFTER_S after the link went down ("tcp": tcp_probe's connections, each with its "rank")."""
    config = strategies.make(strategy, **params)
    world = config.world_size(workers)
    if outage is not None:
        check_outages([outage], workers, steps, world - workers)
        if outage.seconds >= timeout:
            raise ValueError(f"link outage seconds = {outage.seconds:g} with timeout = {timeout:g} s: on the kernel "
                             f"cluster this measures stalls; accepted are outages shorter than the timeout (longer "
                             f"ones fail the run: tests/experiments/test_cluster_netns.py)")
    p2p = "gloo" if config.asynchronous else "sockets-tcp"
    with shaped_network(name, world, bandwidth) as cluster:
        procs = [_start_rank(cluster, rank, world, strategy, params, workers, steps, numel, timeout, p2p,
                             outage.step if outage is not None and outage.rank == rank else None)
                 for rank in range(world)]
        try:
            return _collect(cluster, procs, outage, workers, timeout + 60, probe)
        finally:
            if outage is not None:
                netns.set_link(cluster, cluster.nodes[outage.rank].name, up_=True)
            stop_ranks(procs)


def _start_rank(cluster: Cluster, rank, world, strategy, params, workers, steps, numel, timeout, p2p, down):
    return start_rank(cluster, rank, {"world": world, "strategy": strategy, "params": params, "workers": workers,
                                      "steps": steps, "numel": numel, "timeout": timeout, "p2p": p2p, "down": down})


def start_rank(cluster: Cluster, rank: int, spec: dict):
    """Rank `rank`'s process (experiments/cluster/outage_rank.py with `spec`, its rank, rendezvous and address added)
    inside its node's namespace; its stderr in a file (gloo's chatter must never fill a pipe nobody reads)."""
    node = cluster.nodes[rank]
    spec = {**spec, "rank": rank, "master": f"{cluster.nodes[0].ip}:{PORT}", "address": node.ip}
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(["ip", "netns", "exec", node.namespace, sys.executable, "-m",
                             "experiments.cluster.outage_rank", json.dumps(spec)], cwd=REPO, text=True,
                            env={**os.environ, "GLOO_SOCKET_IFNAME": node.veth_node, "OMP_NUM_THREADS": "1"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    proc.log = log
    return proc


def stop_ranks(procs) -> None:
    """Every rank process killed (if still running) and reaped."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _collect(cluster: Cluster, procs, outage: LinkOutage | None, workers: int, limit: float,
             probe: list | None = None) -> dict:
    """Serve the outage when its rank asks, then every rank's result; ClusterError naming a rank that failed."""
    seen: dict = {}
    results = collect_ranks(procs, limit, lambda proc, message: _outage(cluster, outage, proc,
                                                                        seen if probe is not None else None))
    start = min(results[rank]["start"] for rank in range(workers))
    if probe is not None and seen:
        probe.append({"down": seen["down"] - start, "up": seen["up"] - start, "tcp": seen["tcp"],
                      "before_up": seen.get("before_up", [])})
    return {rank: [t - start for t in results[rank]["ends"]] for rank in range(workers)}


def collect_ranks(procs, limit: float, on_request=None) -> dict[int, dict]:
    """Every rank's final JSON line, by rank, within `limit` seconds; a line that is a request ({"down": step})
    goes to on_request(proc, message). ClusterError naming each rank that failed, with its stderr's tail."""
    results: dict[int, dict] = {}
    errors: dict[int, str] = {}

    def read(rank: int, proc) -> None:
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            message = json.loads(line)
            if "down" in message:
                on_request(proc, message)
            else:
                results[rank] = message
        proc.log.seek(0)
        errors[rank] = proc.log.read()[-2000:]

    readers = [threading.Thread(target=read, args=(rank, proc), daemon=True) for rank, proc in enumerate(procs)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + limit
    for t in readers:
        t.join(max(deadline - time.monotonic(), 0))
    failed = [rank for rank, proc in enumerate(procs) if rank not in results or _exit(proc) != 0]
    if failed:
        raise ClusterError(f"rank(s) {failed} of the kernel-shaped run failed: "
                           + "; ".join(f"rank {r}: {errors.get(r, '(still running)').strip()[-600:]}" for r in failed))
    return results


def _exit(proc) -> int | None:
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return None


def _outage(cluster: Cluster, outage: LinkOutage, proc, seen: dict | None = None) -> None:
    """Take the rank's link down, let it go on, and bring the link up `outage.seconds` later (on a timer: this
    reader keeps reading). `seen`: gets the link's down and up times (monotonic) and the TCP probe."""
    node = cluster.nodes[outage.rank].name
    netns.set_link(cluster, node, up_=False)
    down = time.monotonic()
    proc.stdin.write("\n")
    proc.stdin.flush()

    def up() -> None:
        netns.set_link(cluster, node, True)
        if seen is not None:
            seen["up"] = time.monotonic()

    def before_up() -> None:  # the timers just before the link comes back: when each connection would resend
        seen["before_up"] = _probe_all(cluster, down)

    timer = threading.Timer(max(0.0, down + outage.seconds - time.monotonic()), up)
    timer.daemon = True
    timer.start()
    # on a timer of its own, so that a slow probe never delays the link's return
    late = threading.Timer(max(0.0, down + outage.seconds - 0.25 - time.monotonic()), before_up)
    late.daemon = True
    if seen is not None and outage.seconds > 0.5:
        late.start()
    if seen is not None:
        seen["down"] = down
        time.sleep(max(0.0, down + min(PROBE_AFTER_S, outage.seconds / 2) - time.monotonic()))
        seen["tcp"] = _probe_all(cluster, down)
    if late.is_alive():
        late.join()
    timer.join()  # the rank's later lines wait (it prints only at its end)


def _probe_all(cluster: Cluster, down: float) -> list[dict]:
    """tcp_probe in every rank's namespace, each connection with its rank and the seconds since the link went down."""
    return [{**c, "rank": rank, "after_s": at - down} for rank, node in enumerate(cluster.nodes)
            for at, found in [(time.monotonic(), tcp_probe(node.namespace))] for c in found]


_SS_FIELDS = {"rto": r"\brto:([\d.]+)", "rtt": r"\brtt:([\d.]+)/", "rttvar": r"\brtt:[\d.]+/([\d.]+)",
              "backoff": r"\bbackoff:(\d+)", "unacked": r"\bunacked:(\d+)"}
_TIMER = re.compile(r"timer:\((\w+),([^,]*),(\d+)\)")
# ss's print_ms_timer: "204ms", "1.376ms" (1 s 376 ms), "12sec", "2min", "1min5sec"
_SS_TIME = re.compile(r"(?:(\d+)min)?(?:(\d+)sec)?(?:(\d+)\.)?(?:(\d+)ms)?$")


def tcp_probe(namespace: str) -> list[dict]:
    """Every TCP connection of `namespace` as `ss -tino` shows it: peer, rto/rtt/rttvar (seconds), backoff,
    unacked segments, and its timer: kind ("on" = retransmission), seconds left, retransmissions so far."""
    text = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-tino"], capture_output=True, text=True,
                          timeout=10).stdout
    found = []
    for block in re.split(r"\n(?=\S)", text)[1:]:  # a connection: its line, then its indented details
        head = block.split()
        item: dict = {"local": head[3], "peer": head[4]} if len(head) > 4 else {}
        for key, pattern in _SS_FIELDS.items():
            m = re.search(pattern, block)
            item[key] = (float(m.group(1)) / (1000 if key in ("rto", "rtt", "rttvar") else 1)) if m else None
        m = _TIMER.search(block)
        if m:
            item.update(timer=m.group(1), timer_left_s=ss_seconds(m.group(2)), retransmits=int(m.group(3)))
        found.append(item)
    return found


def ss_seconds(text: str) -> float:
    """ss's timer text in seconds: "204ms" 0.204, "1.376ms" 1.376 (seconds, a dot, milliseconds), "12sec", "2min",
    "1min5sec"; NaN for anything else."""
    m = _SS_TIME.match(text)
    if not text or not m or not any(m.groups()):
        return float("nan")
    minutes, secs, dotted, ms = (int(g) if g else 0 for g in m.groups())
    return minutes * 60 + secs + dotted + ms / 1000

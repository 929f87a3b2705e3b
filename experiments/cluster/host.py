"""What this machine can do for a namespace cluster: Linux, root, iproute2, network namespaces, tbf and netem."""

from __future__ import annotations

import os
import shutil
import sys

from experiments.cluster.shell import _sh

# -- what this machine can do --------------------------------------------------------------------------


def support_problem() -> str | None:
    """Why this machine cannot build a namespace cluster (not root, no `ip`/`tc`, no netns), or None."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return f"network namespaces and tc need root (this process runs as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command (iproute2) is not installed"
    probe = f"sbprobe-{os.getpid()}"
    made = _sh(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or made.returncode}"
    try:
        shaped = _sh(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate",
                      "1gbit", "burst", "256kb", "latency", "20ms"], check=False)
        if shaped.returncode != 0:
            return f"tc cannot add a tbf qdisc: {shaped.stderr.strip()}"
    finally:
        _sh(["ip", "netns", "del", probe], check=False)
    return None


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (per-packet delay), probed in a throwaway namespace."""
    probe = f"sbprobe-{os.getpid()}"
    if _sh(["ip", "netns", "add", probe], check=False).returncode != 0:
        return False
    try:
        return _sh(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                    "1ms"], check=False).returncode == 0
    finally:
        _sh(["ip", "netns", "del", probe], check=False)

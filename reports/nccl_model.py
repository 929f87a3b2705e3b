"""NCCL's own cost model, as a reference beside syncbench's: the latency and bandwidth terms NCCL's tuner gives an
allreduce by ring or tree with the Simple protocol (src/graph/tuning.cc of NVIDIA/nccl, commit b6475625fbca:
ncclTopoTuneModel's latencies and bandwidths, ncclTopoGetAlgoTime's time = latency + bytes / (1000 x algbw)). It is a
model syncbench did not write, so where syncbench's ring or double binary tree and NCCL's disagree, one of them is
wrong, or prices something the other leaves out; the table says which term differs.

Transcribed facts (microseconds; GB/s = 10^9 bytes/s):
- base latency, Simple: ring 8.4, tree 0.
- hardware latency, Simple (NVLink / PCI / network): ring 3.4 / 5.7 / 14.0, tree 28 / 28 / 28.
- network post overhead 1 us (Intel or unknown CPU; 2 on AMD), x3 for Simple; it floors a multi-node ring's
  intra-node step latency.
- allreduce steps: nsteps = 2 (n - 1); inter-node steps 2 x nodes when nodes > 1, else 0 (as the code has it, so
  one rank per node gives nsteps - 2 x nodes = -2 intra steps).
- ring latency = 8.4 + (nsteps - inter steps) x intra + inter steps x network; x1.4 (compute capability >= 8.0,
  1.9 below) when the buffer per channel per rank is >= 64 bytes on several nodes (the ring's "plateau").
- tree latency = 2 x ((ranks per node - 1) x intra + floor(log2 nodes) x network).
- bus bandwidth = channels x the link's per-channel bandwidth; ring algbw = busbw x n / nsteps; tree: busbw x 0.92
  capped at channels x the per-channel tree maximum (Hopper, by nodes 1 / 2 / more: 38.7 / 41.4 / 36.0 GB/s),
  x 0.5, x the tree correction factor of the size (Simple, by log2(bytes / 64) from 0 to 22).
Assumed here: Simple protocol (the large-message one); the inter-node graph's own latency 0; a balanced tree (not
NCCL's TREE pattern, which takes 0.85 more); the NIC's bandwidth is all the channels' together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SOURCE = "NVIDIA/nccl src/graph/tuning.cc (commit b6475625fbca), allreduce, Simple protocol"
BASE_LAT = {"ring": 8.4, "tree": 0.0}
HW_LAT = {"nvlink": {"ring": 3.4, "tree": 28.0}, "pci": {"ring": 5.7, "tree": 28.0},
          "net": {"ring": 14.0, "tree": 28.0}}
NET_OVERHEAD_US = 1.0        # getNetOverhead: Intel (or unknown) CPU
SIMPLE_OVERHEAD_FACTOR = 3   # Simple protocol: three network posts per step
PLATEAU = {True: 1.4, False: 1.9}  # compute capability >= 8.0, below
PER_CHANNEL_MAX_TREE_HOPPER = (38.7, 41.4, 36.0)  # GB/s, by nodes 1, 2, more
TREE_CORRECTION_SIMPLE = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)
ALGOS = ("ring", "tree")
DISAGREE = 0.15  # syncbench / NCCL beyond 1 +- this: the table names the term that differs
INTRA = ("nvlink", "pci")


def _log2i(n: int) -> int:
    return int(n).bit_length() - 1


def _check(algo: str, ranks: int, nodes: int, intra: str) -> None:
    if algo not in ALGOS:
        raise ValueError(f"bad algorithm {algo!r}: accepted are {', '.join(ALGOS)}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(f"bad ranks {ranks!r}: accepted are whole numbers >= 2")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= ranks or ranks % nodes:
        raise ValueError(f"bad nodes {nodes!r} for {ranks} ranks: accepted are whole numbers from 1 to the ranks "
                         f"that divide them (NCCL's model takes equal nodes)")
    if intra not in INTRA:
        raise ValueError(f"bad intra-node link {intra!r}: accepted are {', '.join(INTRA)}")


def latency_us(algo: str, ranks: int, nodes: int, intra: str = "nvlink") -> float:
    """NCCL's latency term of one allreduce (Simple protocol), microseconds, before the ring's plateau factor."""
    _check(algo, ranks, nodes, intra)
    intra_lat = HW_LAT[intra][algo]
    inter_lat = HW_LAT["net"][algo]  # + the graph's inter latency, twice for Simple (taken 0)
    if algo == "ring":
        nsteps = 2 * (ranks - 1)
        inter_steps = 2 * nodes if nodes > 1 else 0
        if nodes == 1:
            return BASE_LAT[algo] + nsteps * intra_lat  # one node: every step on the intra-node link
        intra_lat = max(intra_lat, NET_OVERHEAD_US * SIMPLE_OVERHEAD_FACTOR)
        return BASE_LAT[algo] + (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
    return BASE_LAT[algo] + 2 * ((ranks // nodes - 1) * intra_lat + _log2i(nodes) * inter_lat)


@dataclass(frozen=True)
class NcclTime:
    """One allreduce priced by NCCL's model: its latency and bandwidth terms in seconds."""

    algo: str
    latency_s: float
    bandwidth_s: float

    @property
    def seconds(self) -> float:
        return self.latency_s + self.bandwidth_s


def allreduce_time(algo: str, ranks: int, nodes: int, nbytes: int, bus_bytes_per_s: float, channels: int = 2,
                   intra: str = "nvlink", ampere_or_newer: bool = True) -> NcclTime:
    """ncclTopoGetAlgoTime for one allreduce of nbytes on `ranks` in `nodes` equal nodes, each rank's network
    bandwidth bus_bytes_per_s spread over `channels` channels (the tree's per-channel cap applies per channel)."""
    _check(algo, ranks, nodes, intra)
    if not 0 < bus_bytes_per_s < math.inf:
        raise ValueError(f"bad bandwidth {bus_bytes_per_s!r}: accepted are bytes/s greater than zero")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 64:
        raise ValueError(f"bad size {nbytes!r}: accepted are whole numbers of bytes >= 64")
    bus = bus_bytes_per_s / 1e9  # GB/s, as NCCL's tables
    lat = latency_us(algo, ranks, nodes, intra)
    if algo == "ring":
        algbw = bus * ranks / (2 * (ranks - 1))
        if nodes > 1 and nbytes / (channels * ranks) >= 64:
            lat *= PLATEAU[ampere_or_newer]
    else:
        cap = channels * PER_CHANNEL_MAX_TREE_HOPPER[min(nodes, 3) - 1]
        algbw = min(bus * 0.92, cap) * 0.5
        log_size = _log2i(nbytes >> 6)
        if log_size < len(TREE_CORRECTION_SIMPLE):
            algbw *= TREE_CORRECTION_SIMPLE[log_size]
    return NcclTime(algo, lat * 1e-6, nbytes / (1000 * algbw) * 1e-6)


def reference_rows(workers: int, nbytes: int, bandwidth: float, latency: float) -> list[dict]:
    """syncbench's ring and double binary tree beside NCCL's ring and tree for one allreduce, one rank per node
    (one NIC each): each one's latency and bandwidth terms, and, where the totals differ by more than 15%, which
    term differs (the one farther apart)."""
    import strategies
    from strategies.cost import config_path

    nodes, intra = workers, "nvlink"  # one GPU per node: no step is intra-node but the ring's -2 (see latency_us)
    numel = nbytes // 4
    rows = []
    for ours, algo in (("ring", "ring"), ("double_binary_tree", "tree")):
        rounds, path, _ = config_path(strategies.make(ours), workers, numel, 4)
        mine = (rounds * latency, path / bandwidth)
        nccl = allreduce_time(algo, workers, nodes, numel * 4, bandwidth, intra=intra)
        ratio = (mine[0] + mine[1]) / nccl.seconds
        differs = ""
        if abs(ratio - 1) > DISAGREE:
            lat_gap = abs(mine[0] - nccl.latency_s)
            bw_gap = abs(mine[1] - nccl.bandwidth_s)
            differs = "latency" if lat_gap > bw_gap else "bandwidth"
        rows.append({"workers": workers, "nodes": nodes, "bytes": numel * 4, "syncbench": ours, "nccl": algo,
                     "syncbench_latency_s": mine[0], "syncbench_bandwidth_s": mine[1],
                     "nccl_latency_s": nccl.latency_s, "nccl_bandwidth_s": nccl.bandwidth_s,
                     "syncbench_over_nccl": ratio, "term_that_differs": differs})
    return rows


def format_reference(cells) -> list[str]:
    """The reference table for `model` and `map`: for each (workers, nbytes, bandwidth, latency) cell, syncbench's
    ring and double binary tree beside NCCL's ring and tree, labelled as NCCL's, never ranked."""
    out = [f"Reference, NCCL's model (not syncbench's; {SOURCE}): one allreduce, one GPU per node; "
           f"ms = latency term + bandwidth term",
           f"{'workers':>7} {'Gbit/s':>7}  {'syncbench':<18} {'ms':>14}  {'NCCL':<5} {'ms':>14}  ratio  "
           f"term beyond {DISAGREE:.0%}"]
    for workers, nbytes, bandwidth, latency in cells:
        for row in reference_rows(int(workers), int(nbytes), bandwidth, latency):
            ours = f"{row['syncbench_latency_s'] * 1e3:.3g}+{row['syncbench_bandwidth_s'] * 1e3:.4g}"
            theirs = f"{row['nccl_latency_s'] * 1e3:.3g}+{row['nccl_bandwidth_s'] * 1e3:.4g}"
            out.append(f"{row['workers']:>7} {bandwidth * 8 / 1e9:>7g}  {row['syncbench']:<18} {ours:>14}  "
                       f"{row['nccl']:<5} {theirs:>14}  {row['syncbench_over_nccl']:5.2f}  {row['term_that_differs']}")
    return out

"""NCCL's own cost model as a reference (reports/nccl_model.py): its latency terms worked by hand from the constants
of NCCL's tuning code, its bandwidth terms, and the reference rows beside syncbench's ring and tree."""

from __future__ import annotations

import pytest

from experiments.cli.main import main
from reports import nccl_model as nccl


@pytest.mark.parametrize("algo, ranks, nodes, intra, us", [
    # ring, 2 nodes of 8: 8.4 base + (30 steps - 4 inter-node) x max(NVLink 3.4, 3 x 1 us post) + 4 x 14 network
    ("ring", 16, 2, "nvlink", 8.4 + 26 * 3.4 + 4 * 14.0),          # 152.8
    # ring, one GPU per node, 8 nodes on PCI: nsteps 14 - 16 inter steps = -2 intra steps of 5.7, + 16 x 14
    ("ring", 8, 8, "pci", 8.4 - 2 * 5.7 + 16 * 14.0),              # 221.0
    # ring on one node of 8 over NVLink: every one of the 14 steps at 3.4
    ("ring", 8, 1, "nvlink", 8.4 + 14 * 3.4),                      # 56.0
    # ring, 4 nodes of 2 over NVLink: 14 - 8 = 6 intra steps of 3.4 (above the Simple protocol's 3 us of posts)
    ("ring", 8, 4, "nvlink", 8.4 + 6 * 3.4 + 8 * 14.0),
    # tree, 2 nodes of 8: 2 x (7 x 28 intra + log2(2) x 28 network)
    ("tree", 16, 2, "nvlink", 2 * (7 * 28.0 + 1 * 28.0)),          # 448
    # tree, 8 nodes of 1: 2 x (0 + 3 x 28)
    ("tree", 8, 8, "pci", 2 * 3 * 28.0),                           # 168
    # tree, 12 nodes of 1: floor(log2 12) = 3
    ("tree", 12, 12, "nvlink", 2 * 3 * 28.0),
])
def test_latency_terms_worked_from_the_published_constants(algo, ranks, nodes, intra, us):
    assert nccl.latency_us(algo, ranks, nodes, intra) == pytest.approx(us, abs=1e-9)


def test_ring_1pt4_plateau_and_the_bandwidth_terms():
    # ring, 16 ranks in 2 nodes, 1 GB, 25 GB/s: the plateau 1.4 x 152.8 us; algbw 25 x 16 / 30 GB/s
    t = nccl.allreduce_time("ring", 16, 2, 10**9, 25e9)
    assert t.latency_s == pytest.approx(1.4 * 152.8e-6)
    assert t.bandwidth_s == pytest.approx(10**9 / (25e9 * 16 / 30))
    # a Volta-era GPU: 1.9; a buffer under 64 bytes per channel per rank: no plateau
    assert nccl.allreduce_time("ring", 16, 2, 10**9, 25e9, ampere_or_newer=False).latency_s == \
        pytest.approx(1.9 * 152.8e-6)
    assert nccl.allreduce_time("ring", 16, 2, 1024, 25e9).latency_s == pytest.approx(152.8e-6)
    # tree, 2^26 bytes: log2(2^26 / 64) = 20, correction 0.8; min(25 x 0.92, 2 channels x 41.4) x 0.5 x 0.8
    t = nccl.allreduce_time("tree", 16, 2, 2**26, 25e9)
    assert t.bandwidth_s == pytest.approx(2**26 / (23e9 * 0.5 * 0.8))
    # the per-channel cap binds on a fast link: 400 GB/s x 0.92 > 2 x 36.0 (more than 2 nodes)
    t = nccl.allreduce_time("tree", 32, 4, 2**30, 400e9)
    assert t.bandwidth_s == pytest.approx(2**30 / (72e9 * 0.5))  # 1 GiB: log2 24 >= 23, no correction


def test_reference_rows_name_the_term_that_differs():
    rows = nccl.reference_rows(8, 100_000_000, 12.5e9, 5e-6)
    ring = rows[0]
    # the same bytes through a rank's NIC: 2 (n-1)/n x 100 MB on both sides
    assert ring["syncbench_bandwidth_s"] == pytest.approx(ring["nccl_bandwidth_s"]) == pytest.approx(0.014)
    assert ring["syncbench_latency_s"] == pytest.approx(14 * 5e-6)
    assert ring["term_that_differs"] == ""  # within 15%
    # 512 ranks at 100 Gbit/s: NCCL's ring pays 20 ms of latency (1.4 x 14.35 ms) where syncbench's 1,022 rounds
    # of 5 us pay 5.1 ms: the latency term differs
    far = nccl.reference_rows(512, 100_000_000, 12.5e9, 5e-6)[0]
    assert far["term_that_differs"] == "latency" and far["syncbench_over_nccl"] < 1 - nccl.DISAGREE


@pytest.mark.parametrize("args, message", [
    (("bus", 8, 8), "bad algorithm 'bus'"),
    (("ring", 1, 1), "bad ranks 1"),
    (("ring", 12, 5), "bad nodes 5 for 12 ranks"),
    (("ring", 8, 2, "ethernet"), "bad intra-node link 'ethernet'"),
])
def test_bad_input_refused(args, message):
    with pytest.raises(ValueError, match=message):
        nccl.latency_us(*args)


def test_map_prints_the_reference_labelled_as_nccls(capsys):
    assert main(["map", "--model-bytes", "4MB", "--workers", "8", "--bandwidth", "10Gbit", "--latency", "5us",
                 "--nccl-reference"]) == 0
    out = capsys.readouterr().out
    assert "Reference, NCCL's model (not syncbench's;" in out and " ring " in out and " tree " in out
    assert main(["map", "--model-bytes", "4MB", "--step-time", "0.1", "--nccl-reference"]) == 2
    assert "--nccl-reference prices one allreduce" in capsys.readouterr().err


def test_model_prints_the_reference_beside_its_table(capsys):
    assert main(["model", "--model-bytes", "4MB", "--workers", "8", "--bandwidth", "10Gbit", "--latency", "5us",
                 "--nccl-reference"]) == 0
    out = capsys.readouterr().out
    reference = out[out.index("Reference, NCCL's model"):].splitlines()
    assert len(reference) == 4  # title, header, ring, tree
    row = nccl.reference_rows(8, 4_000_000, 1.25e9, 5e-6)[0]
    assert reference[2].split()[:3] == ["8", "10", "ring"] and f"{row['syncbench_over_nccl']:5.2f}" in reference[2]
    assert main(["model", "--model-bytes", "4MB", "--workers", "8", "--bandwidth", "10Gbit", "--ranks-per-node", "2",
                 "--nccl-reference"]) == 2
    assert "--nccl-reference compares one GPU per node" in capsys.readouterr().err

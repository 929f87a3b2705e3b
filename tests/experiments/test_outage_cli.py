"""`syncbench faults --outage RANK@STEP:SECONDS`: its arguments checked before any work, and a small table."""

from __future__ import annotations

import argparse

import pytest

from experiments.cli import faults, outages
from strategies.faults import FaultSettingError, LinkOutage


def args(*argv: str):
    p = argparse.ArgumentParser()
    faults.add_arguments(p)
    return p.parse_args(list(argv))


def test_parse_outage():
    assert outages.parse_outage("2@5:1.5") == LinkOutage(step=5, rank=2, seconds=1.5)
    with pytest.raises(ValueError, match=r"--outage '2@5': expected RANK@STEP:SECONDS"):
        outages.parse_outage("2@5")


@pytest.mark.parametrize("argv, error, fragment", [
    (("--outage", "4@1:0.1"), FaultSettingError, "link = 4: the run has ranks 0..3"),
    (("--outage", "1@12:0.1"), FaultSettingError, "step = 12: the run has steps 0..11"),
    (("--outage", "1@1:30"), ValueError, "not shorter than the timeout (20 s)"),
    (("--outage", "1@1:0.1", "--repeat", "0"), ValueError, "--repeat 0"),
    (("--outage", "1@1:0.1", "--bandwidth", "fast"), ValueError, "bad bandwidth 'fast'"),
])
def test_bad_arguments_are_refused_before_any_work(argv, error, fragment, capsys):
    with pytest.raises(error) as info:
        faults.run(args(*argv))
    assert fragment in str(info.value)
    assert capsys.readouterr().out == ""  # nothing ran, nothing printed


def test_a_small_table_on_emulated_links(capsys):
    assert faults.run(args("--outage", "1@1:0.1", "--steps", "3", "--numel", "100", "--repeat", "1",
                           "--strategy", "ring", "--strategy", "parameter_server:staleness=async")) == 0
    out = capsys.readouterr().out
    ring = next(line for line in out.splitlines() if line.startswith("ring "))
    assert ring.split()[7:9] == ["all", "0.100"], ring  # the model: every rank stalls by the outage
    ps = next(line for line in out.splitlines() if line.startswith("parameter_server:staleness=async"))
    assert ps.split()[7] == "1", ps  # only worker 1


@pytest.mark.skipif(__import__("experiments.cluster.host", fromlist=["support_problem"]).support_problem() is not None,
                    reason="no kernel-shaped network here")
@pytest.mark.parametrize("argv, fragment", [
    (("--rto", "0"), "--rto 0.0: accepted are seconds in (0, 120]"),
    # 25 s outage, RTO 20 s: the retransmissions at 20 (link still down) and 60 s; the timeout is 60 s
    (("--outage", "1@1:25", "--rto", "20", "--timeout", "60"), "comes 60 s into the outage, not before the timeout"),
])
def test_over_tcp_a_retransmission_past_the_timeout_is_refused_before_any_work(argv, fragment, capsys):
    argv = ("--outage", "1@1:0.5", "--on", "kernel", *argv) if argv[0] != "--outage" else (*argv, "--on", "kernel")
    with pytest.raises(ValueError) as info:
        faults.run(args(*argv))
    assert fragment in str(info.value)
    assert capsys.readouterr().out == ""


def test_ss_timer_texts_are_read_as_seconds():
    from experiments.cluster.outages import ss_seconds

    # iproute2's print_ms_timer: seconds and milliseconds joined by a dot still end in "ms"
    assert [ss_seconds(t) for t in ("204ms", "1.376ms", "12sec", "2min", "1min5sec")] == [0.204, 1.376, 12.0, 120.0,
                                                                                         65.0]
    assert all(ss_seconds(t) != ss_seconds(t) for t in ("", "soon"))  # NaN

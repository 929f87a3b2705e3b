"""Compression's break-even (reports/break_even.py): bandwidths worked by hand from the traffic, put back into the
model's price of a sync they give equal times, each side classified as the direct comparison says, bad input
refused before any codec is timed."""

from __future__ import annotations

import math

import pytest

import strategies
from experiments.cli.main import main
from reports import break_even as be
from strategies.cost import Fabric, sync_seconds

NUMEL, N, LAT = 1_000_000, 8, 20e-6  # 4 MB of gradients; a ring of 8: 14 rounds, 2 (n-1)/n x 4 MB = 7 MB on its path


def test_bandwidths_worked_by_hand():
    # fp16 halves the path (3.5 MB), same rounds: it pays while 3.5e6 / B > codec 2 ms, below 1.75e9 bytes/s
    fp16 = be.break_even("ring", "fp16", N, NUMEL, LAT, 2e-3)
    assert (fp16.side, fp16.bandwidth_bytes_per_s) == ("below", pytest.approx(1.75e9, rel=1e-12))
    assert fp16.words() == "shortens the step below 14 Gbit/s"
    # PowerSGD r=4 on a 1,000 x 1,000 view: P and Q, 4,000 floats each -> 2 x 14 rounds, 2 x 7/8 x 2 x 16,000 B =
    # 56,000 B on the path; pays while (7e6 - 56e3) / B > 2 ms + 14 x 20 us
    ps = be.break_even("ring", "powersgd_r4", N, NUMEL, LAT, 2e-3)
    assert ps.bandwidth_bytes_per_s == pytest.approx(6.944e6 / 2.28e-3, rel=1e-12)
    # local SGD H=8 needing 2x the steps, Ts = 0.1 s: N = 7e6 - 2 x 7e6/8, D = 2 (0.1 + 1.75 x 20 us) - 0.1 - 14 x 20 us
    local = be.break_even("ring", "local_sgd_H8", N, NUMEL, LAT, 0.0, 2.0, 0.1)
    assert local.bandwidth_bytes_per_s == pytest.approx(5.25e6 / (0.2 + 7e-5 - 0.1 - 2.8e-4), rel=1e-12)
    assert local.words() == f"shortens time to target (x2 steps) below {5.25e6 / 0.09979 * 8 / 1e9:.3g} Gbit/s"
    # and the step alone: local SGD moves fewer bytes in fewer rounds, with no codec it always pays
    assert be.break_even("ring", "local_sgd_H8", N, NUMEL, LAT, 0.0).side == "always"


@pytest.mark.parametrize("codec", ["fp16", "bf16", "powersgd_r4", "topk_1%", "local_sgd_H8"])
@pytest.mark.parametrize("workers", [2, 8, 64])
@pytest.mark.parametrize("ratio, ts", [(1.0, 0.0), (1.3, 0.05), (0.7, 0.02)])
def test_the_break_even_put_back_into_the_model_gives_equal_times_and_each_side_is_right(codec, workers, ratio, ts):
    codec_s = 0.0 if codec == "local_sgd_H8" else 3e-3
    got = be.break_even("ring", codec, workers, NUMEL, LAT, codec_s, ratio, ts)
    exact, compressed = strategies.make("ring"), strategies.make("ring", **dict(be.CODECS)[codec])

    def times(bandwidth):  # (exact, compressed) seconds to target, straight from the model's price of a sync
        f = Fabric(bandwidth, LAT)
        return (ts + sync_seconds(exact, workers, NUMEL, f),
                ratio * (ts + codec_s + sync_seconds(compressed, workers, NUMEL, f)))

    if got.side in ("below", "above"):
        e, c = times(got.bandwidth_bytes_per_s)
        assert c == pytest.approx(e, rel=0.01)  # equal at the break-even (here to rounding)
        slow, fast = got.bandwidth_bytes_per_s / 2, got.bandwidth_bytes_per_s * 2
        pays_at = slow if got.side == "below" else fast
        other = fast if got.side == "below" else slow
        assert times(pays_at)[1] < times(pays_at)[0] and times(other)[1] > times(other)[0]
    else:
        for bandwidth in (1e6, 1e8, 1e10, 1e12):
            e, c = times(bandwidth)
            assert (c < e) == (got.side == "always"), (bandwidth, e, c)


def test_top_k_never_pays_where_its_gathered_pairs_outweigh_the_gradient():
    # a ring carrying n x 2k words for k = 1% of the entries: at 64 workers 1.28x the gradient's own bytes
    assert be.break_even("ring", "topk_1%", 64, NUMEL, LAT, 1e-3).side == "never"


@pytest.mark.parametrize("args, message", [
    (("ring", "zstd", 8, NUMEL, LAT, 1e-3), "unknown codec 'zstd': accepted are fp16"),
    (("ring", "fp16", 1, NUMEL, LAT, 1e-3), "bad workers 1: accepted are whole numbers from 2"),
    (("ring", "fp16", 8, NUMEL, -1.0, 1e-3), "bad latency -1.0"),
    (("ring", "fp16", 8, NUMEL, LAT, -1e-3), "bad codec seconds -0.001"),
    (("ring", "fp16", 8, NUMEL, LAT, 1e-3, 0.0), "bad steps-to-target ratio 0.0"),
    (("decentralized", "fp16", 8, NUMEL, LAT, 1e-3), "'decentralized' is not an exact allreduce"),
])
def test_bad_input_is_refused_naming_the_value(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        be.break_even(*args)


def test_the_codec_is_timed_through_the_strategys_own_code():
    assert be.measure_codec_s_per_mb("fp16", numel=2**16, repeats=1) > 0
    assert be.measure_codec_s_per_mb("local_sgd_H8") == 0.0


def test_cli_table_with_given_codec_costs(capsys, monkeypatch):
    monkeypatch.setattr(be, "measure_codec_s_per_mb", lambda c, *a, **k: 0.0 if c in be.NO_CODEC else 1e-3)
    assert main(["break-even", "--model-bytes", "4MB", "--workers", "8", "--latency", "20us",
                 "--codec-ms-per-mb", "fp16=0.5", "--steps-ratio", "powersgd_r4=1.1", "--step-time", "0.1"]) == 0
    out = capsys.readouterr().out
    # fp16: 0.5 ms/MB x 4 MB = 2 ms per step: below 14 Gbit/s, as worked by hand above
    assert "fp16 0.5 (given)" in out and "shortens the step below 14 Gbit/s" in out
    assert "shortens time to target (x1.1 steps) below" in out
    assert main(["break-even", "--model-bytes", "4MB", "--steps-ratio", "zip=2"]) == 2
    assert "--steps-ratio: unknown codec 'zip'" in capsys.readouterr().err
    assert main(["break-even", "--model-bytes", "4MB", "--workers", "1"]) == 2
    assert "bad workers 1" in capsys.readouterr().err
    assert not math.isnan(be.table("ring", [8], NUMEL, LAT, {"fp16": 5e-4})[0]["step_gbit"])

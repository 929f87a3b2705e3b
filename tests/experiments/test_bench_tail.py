"""`syncbench bench`'s per-iteration tail, without Ray: the nearest-rank p99 of scripted times (the report's rule),
and the line under the table for a row whose p99 is over 1.5x its median; none for an even row."""

from __future__ import annotations

from experiments.bench.collectives import TAIL, format_bench, nearest_rank, tail_lines
from reports.distributions import percentile


def test_nearest_rank_matches_the_reports_rule_on_scripted_times():
    times = [0.010] * 97 + [0.011, 0.030, 0.050]  # 100 iterations: the 99th smallest is 0.030
    assert nearest_rank(times, 99) == 0.030 == percentile(times, 99)
    assert nearest_rank(times, 50) == 0.010 == percentile(times, 50)
    assert nearest_rank([3.0, 1.0, 2.0], 99) == 3.0


def test_a_heavy_tail_is_said_under_the_table_and_an_even_row_is_not():
    rows = [{"size": 1024, "strategy": "ring", "time_ms": 10.0, "p99_ms": 30.0, "max_ms": 50.0, "algbw_GBps": 1.0,
             "busbw_GBps": 1.5, "vs_native": 1.0, "model_ms": 9.0},
            {"size": 1024, "strategy": "halving_doubling", "time_ms": 10.0, "p99_ms": 14.0, "max_ms": 15.0,
             "algbw_GBps": 1.0, "busbw_GBps": 1.5, "vs_native": 1.0, "model_ms": 9.0}]
    assert TAIL == 1.5
    assert tail_lines(rows) == ["# heavy tail: 1024 bytes, ring: p99 30.000 ms, max 50.000 ms = 3.00x the median "
                                "(over 1.5x)"]
    printed = format_bench(rows, 4, None).splitlines()
    assert printed[-1] == tail_lines(rows)[0] and "halving_doubling" in printed[-2]

"""Progress logs go to the stderr of the call, not to the one the module saw at import: a default argument
`log=sys.stderr` binds the stream of import time, which pytest's capture (or any redirection) may have closed
since; `syncbench simulate` then failed with "I/O operation on closed file" after another test imported it."""

from __future__ import annotations

import inspect

import pytest

from experiments.pipeline.runner import run_sweep
from experiments.simulate.bench import bench, bench_nodes, bench_ps
from experiments.simulate.substrate import simulate_sweep
from experiments.validate import validate


@pytest.mark.parametrize("fn", [run_sweep, simulate_sweep, bench, bench_ps, bench_nodes, validate],
                         ids=lambda f: f.__name__)
def test_no_log_default_binds_a_stream_at_import(fn):
    assert inspect.signature(fn).parameters["log"].default is None


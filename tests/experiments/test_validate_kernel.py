"""validate's kernel substrate (root, iproute2): a ring of 2 processes in namespaces over tbf-shaped veths measures
one synchronization within a loose band of the model, and leaves no namespace, veth or bridge behind."""

from __future__ import annotations

import pytest

from experiments.cluster import netns
from experiments.validate import VARIANTS, Cell
from experiments.validate_kernel import measure_kernel
from experiments.validate_runs import model_s, run_spec, scaled
from tests.helpers import netns_left_behind

PROBLEM = netns.support_problem()

pytestmark = [pytest.mark.netns, pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces here: {PROBLEM}")]
NAME = "sbtval"


def left_behind() -> list[str]:
    return netns_left_behind(NAME)


def test_a_ring_of_two_over_tbf_is_near_its_model_and_nothing_is_left_behind():
    """ResNet-50's gradients / 100 (1 MB) over 10 Mbit/s: the model's 0.82 s; TCP's headers (about 5% of the
    rate) and the tbf burst (32 KB, 3% of the payload) move it by less than the band."""
    cell = Cell(next(v for v in VARIANTS if v.label == "ring"), 2, "1Gbit", "0us")
    out = measure_kernel(cell, run_spec(cell, 100), scaled(cell, 100)[1], repeats=1, timeout=30, name=NAME)
    model = model_s(cell, 100)
    assert 0.75 * model < out["measured_s"] < 1.5 * model, (out, model)
    assert out["repeats"] == 1 and out["measured_min_s"] == out["measured_max_s"] == out["measured_s"]
    assert left_behind() == []
    assert netns.Cluster.load(NAME) is None

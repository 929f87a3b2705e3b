"""The model's tcp option (`syncbench model --network tcp`) against SimGrid's tcp (LV08) on small cells: within 5%,
the window-bound case and the one where LV08's latency made hierarchical 1.27x its alpha_beta twin included."""

from __future__ import annotations

import pytest

from experiments.validate import VARIANTS, Cell, run_cell
from strategies.transport.simgrid import simgrid_available

pytestmark = [pytest.mark.simgrid,
              pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "simgrid present")]
BY_LABEL = {v.label: v for v in VARIANTS}


@pytest.mark.parametrize("label,workers,k,bandwidth,latency", [
    ("ring", 4, 1, "10Gbit", "5us"),
    ("reduce_broadcast tree", 4, 1, "1Gbit", "50us"),  # one way at a time: no ACK load
    ("ps dedicated k=1", 4, 1, "10Gbit", "5us"),
    ("hierarchical ring", 4, 3, "10Gbit", "5us"),  # many small inner messages: 13.01 x latency each
    ("ring", 2, 1, "10Gbit", "5ms"),  # the TCP window: 4 MiB per 10 ms route round trip, a third of the link
])
def test_model_tcp_agrees_with_simgrid_tcp(label, workers, k, bandwidth, latency):
    row = run_cell(Cell(BY_LABEL[label], workers, bandwidth, latency, k, network_model="tcp"))
    assert row["status"] == "tcp", row
    assert row["sim_over_model"] == pytest.approx(1.0, abs=0.05), row

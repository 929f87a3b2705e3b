"""Every results column's Arrow type, frozen here by hand: a change of type (an int stored as float64, a flag
as text) changes what every reader and every old results file sees, so it must be made here too, on purpose.
Compared with the schema's definition and with what a written Parquet file holds."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq

from experiments.results import schema

FROZEN_RUNS = """
run_id string
sweep string
substrate string
workload string
dataset string
image_size int64
batch_size int64
steps int64
warmup_steps int64
device string
seed int64
repeat int64
lr double
strategy string
workers int64
servers int64
bytes_counted bool
bypasses_link bool
link_bandwidth double
link_latency_s double
link_emulation string
link_heterogeneous bool
link_ranks list<item: int64>
ranks_per_node int64
link_intra_bandwidth double
link_intra_latency_s double
knob string
knob_chosen bool
knob_best double
knob_slowdown double
straggler_ranks list<item: int64>
straggler_slowdown double
compute string
profile_id string
profile_device string
profile_synthetic bool
profile_step_s double
bucket_mb double
overlap bool
trace_steps int64
compression string
powersgd_rank int64
powersgd_start int64
powersgd_warm_start bool
topk_ratio double
error_feedback bool
sync_every int64
outer_optimizer string
outer_lr double
outer_momentum double
target_metric string
target_value double
eval_every int64
target_reached bool
steps_to_target double
time_to_target_s double
sim_topology string
sim_network_model string
sim_nic string
sim_oversubscription double
sim_hosts_per_leaf int64
sim_gpus_per_node int64
sim_intra_bandwidth double
sim_intra_latency_s double
compute_source string
sim_wall_s double
model_comm_s double
status string
error string
transport string
gpu string
cores int64
host string
cores_oversubscribed bool
gpu_shared bool
started_at timestamp[ms, tz=UTC]
duration_s double
throughput double
step_time_s double
fast_step_s double
compute_s double
comm_s double
comm_fraction double
backward_end_s double
exposed_comm_s double
comm_busy_s double
overlap_fraction double
buckets double
bytes_sent_per_worker double
bytes_recv_per_worker double
bytes_sent_per_server double
bytes_recv_per_server double
analytic_bytes_sent_per_worker double
analytic_rounds double
analytic_path_bytes double
numel int64
model_bytes int64
final_loss double
param_norm double
accuracy double
consensus_distance double
spectral_gap double
recovery_mode string
failure_setting string
failure_mtbf_s double
recovery_checkpoint_every int64
recovery_rejoin_steps int64
failure_count int64
failure_steps list<item: int64>
failure_ranks list<item: int64>
completed_steps int64
steps_run int64
steps_lost int64
detection_s double
recovery_s double
recovery_max_s double
time_to_step_s double
run_throughput double
outage_count int64
outage_held_s double
outage_failures int64
"""

FROZEN_STEPS = """
run_id string
step int64
rank int64
role string
timed bool
compute_s double
comm_s double
bytes_sent int64
bytes_recv int64
loss double
samples int64
consensus_distance double
wall_s double
backward_end_s double
comm_busy_s double
exposed_comm_s double
overlap_fraction double
staleness list<item: int64>
bound_wait_s double
dropped_pushes int64
eval_value double
"""

def _frozen(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split(" ", 1)) for line in text.strip().splitlines()]


def test_every_column_has_its_frozen_arrow_type():
    for table, frozen in ((schema.RUNS, FROZEN_RUNS), (schema.STEPS, FROZEN_STEPS)):
        assert [(c.name, str(c.type)) for c in table] == _frozen(frozen)


def test_the_frozen_types_are_what_a_written_results_file_holds_and_a_reader_gets(tmp_path):
    """One row of each table through the writer's path (schema.row, Arrow, Parquet), read back as the file's
    schema and as the frame readers get (conform): integers stay int64, flags bool."""
    for name, table, frozen in (("runs", schema.RUNS, FROZEN_RUNS), ("steps", schema.STEPS, FROZEN_STEPS)):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(schema.to_arrow([schema.row(table)], table), path)
        written = pq.read_schema(path)
        # Parquet names a list's items 'element' where Arrow says 'item': the same type
        assert [(n, str(written.field(n).type).replace("<element:", "<item:")) for n, _ in _frozen(frozen)] \
            == _frozen(frozen)
        frame = schema.conform(pd.read_parquet(path), table)
        for column, type_ in _frozen(frozen):
            if type_ in ("int64", "bool", "double"):
                assert str(frame[column].dtype) == {"double": "float64"}.get(type_, type_), (name, column)


def test_batch_size_and_the_counts_are_integers_and_the_measures_floats():
    """The columns a reader does arithmetic on, spelled out (a float batch size prints as 32.0 and breaks joins)."""
    types = {c.name: str(c.type) for c in schema.RUNS}
    assert {types[c] for c in ("batch_size", "workers", "servers", "steps", "numel", "model_bytes")} == {"int64"}
    assert {types[c] for c in ("throughput", "step_time_s", "analytic_path_bytes", "comm_fraction")} == {"double"}

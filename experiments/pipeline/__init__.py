"""Running a sweep: the runner, one training run per rank, per-run summaries and the results store."""

"""Publishing results: a sweep's files land under docs/results/<gpu name>/<sweep>/."""

import pandas as pd

from experiments.pipeline.publish import publish
from experiments.pipeline.store import Store
from experiments.results import schema


def test_publish_names_the_gpu(tmp_path):
    results = tmp_path / "results" / "scaling"
    Store(results).append(schema.row(schema.RUNS, run_id="a", status="ok", gpu="NVIDIA H100 80GB HBM3",
                                     host="node1"), [])
    (results / "report.html").write_text("<html></html>")
    target = publish(results, tmp_path / "docs")
    assert target == tmp_path / "docs" / "NVIDIA-H100-80GB-HBM3" / "scaling"
    assert sorted(p.name for p in target.iterdir()) == ["report.html", "runs"]
    assert len(list((target / "runs").iterdir())) == 1


def test_publish_without_a_gpu_uses_the_host(tmp_path):
    """Results written before the one-file-per-run layout: runs.parquet, copied as it is."""
    results = tmp_path / "quick"
    results.mkdir()
    pd.DataFrame([{"run_id": "a", "status": "ok", "gpu": "", "host": "my host"}]).to_parquet(results / "runs.parquet")
    assert publish(results, tmp_path / "docs") == tmp_path / "docs" / "my-host" / "quick"

"""A train function for runner tests: fails on the ranks of runs named in a marker file, else trains."""

import json
import os

from experiments.pipeline.train import train


def train_unless_marked(ctx, spec):
    marker = os.environ.get("SYNCBENCH_TEST_FAIL_FILE", "")
    if marker and os.path.exists(marker) and spec.strategy in json.load(open(marker)):
        raise RuntimeError(f"injected failure for {spec.strategy}")
    return train(ctx, spec)


def compute_forever(ctx, spec):
    """A step whose compute never ends (a real-mode model far too big for its timeout, say): no peer waits on it."""
    import time

    while True:
        time.sleep(1)

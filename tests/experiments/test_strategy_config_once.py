"""A run's strategy config is made once per RunSpec and carried with it (to every actor, in its pickle)."""

from __future__ import annotations

import dataclasses
import pickle

import strategies
from experiments.config.sweep import RunSpec


def test_the_config_is_made_once_and_carried_in_the_pickle(monkeypatch):
    made = []
    real = strategies.make
    monkeypatch.setattr(strategies, "make", lambda *a, **k: made.append(a) or real(*a, **k))
    spec = RunSpec(strategy="hierarchical", workers=4, ranks_per_node=2, compression="fp16", sync_every=1)
    run_id = spec.run_id
    config = spec.strategy_config()
    assert spec.strategy_config() is config and spec.config is config and spec.world_size() == 4
    assert len(made) == 1
    assert config.name == "hierarchical" and config.unwrapped().ranks_per_node == 2  # the run's nodes applied
    assert config.compression.compression == "fp16"  # compression nested in it
    carried = pickle.loads(pickle.dumps(spec))
    assert carried.__dict__["config"] == config and carried.strategy_config() == config and len(made) == 1
    assert spec.run_id == carried.run_id == run_id and carried == spec  # not a field: ids and equality unchanged


def test_a_replaced_spec_makes_its_own_config():
    spec = RunSpec(strategy="ring", workers=4, compression="fp16")
    assert spec.strategy_config().compression.compression == "fp16"
    plain = dataclasses.replace(spec, compression="none")
    assert plain.strategy_config() == strategies.make("ring") and "config" not in dataclasses.asdict(plain)

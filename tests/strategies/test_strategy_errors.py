"""Bad input fails fast with an error that names the bad value and what is accepted, never a hang."""

from __future__ import annotations

import numpy as np
import pytest

import strategies
from strategies.testing import run_collective
from strategies.transport.communicator import CommError


@pytest.mark.parametrize("name", strategies.names())
@pytest.mark.parametrize("sizes", [(10, 10, 11), (5, 0, 5, 5)])
def test_different_sizes_are_a_clear_error(name, sizes):
    config = strategies.make(name)
    inputs = [np.ones(s, dtype=np.float32) for s in sizes]
    with pytest.raises(CommError, match="different sizes"):
        run_collective(name, inputs, op=config.ops[0], timeout=5)


@pytest.mark.parametrize("name", strategies.names())
def test_unknown_op_lists_accepted(name):
    config = strategies.make(name)
    with pytest.raises(ValueError, match=r"'median'.*accepted are " + ", ".join(config.ops)):
        run_collective(name, [np.ones(4, dtype=np.float32)] * 2, op="median", timeout=5)


def test_unsupported_op_for_decentralized():
    with pytest.raises(ValueError, match=r"'sum'.*accepted are mean"):
        run_collective("decentralized", [np.ones(4, dtype=np.float32)] * 3, op="sum", timeout=5)


def test_mean_of_integers_is_rejected():
    with pytest.raises(ValueError, match="'mean' does not apply to int64.*use 'sum'"):
        run_collective("ring", [np.ones(4, dtype=np.int64)] * 2, op="mean", timeout=5)


def test_unknown_strategy_lists_known():
    with pytest.raises(ValueError, match="unknown strategy 'nope'.*parameter_server.*halving_doubling.*native"):
        strategies.make("nope")


def test_unknown_parameter_lists_accepted():
    with pytest.raises(ValueError, match=r"\['server'\].*parameter_server.*servers \(default 1\)"):
        strategies.make("parameter_server", server=2)
    with pytest.raises(ValueError, match=r"\['tree'\].*'ring'.*none"):
        strategies.make("ring", tree=False)


@pytest.mark.parametrize("name,params,pattern", [
    ("parameter_server", {"servers": 0}, r"servers=0.*integer >= 1"),
    ("parameter_server", {"servers": "2"}, r"servers='2'.*integer >= 1"),
    ("reduce_broadcast", {"tree": "yes"}, r"tree='yes'.*true or false"),
    ("decentralized", {"topology": "star"}, r"'star'.*ring, torus, exponential, complete, one_peer_exponential"),
    ("decentralized", {"weights": "max"}, r"'max'.*uniform, metropolis"),
])
def test_bad_parameter_values(name, params, pattern):
    with pytest.raises(ValueError, match=pattern):
        strategies.make(name, **params)


def test_registry_names_and_roles():
    assert set(strategies.names()) >= {"parameter_server", "reduce_broadcast", "all_to_all", "halving_doubling",
                                       "ring", "naive_ring", "decentralized", "native"}
    for name in strategies.names():
        cls = strategies.get(name)
        assert cls.summary, name
    assert strategies.get("decentralized").role == "parameters"
    assert strategies.get("parameter_server").role == "server"
    assert strategies.make("parameter_server", servers=3).world_size(4) == 7

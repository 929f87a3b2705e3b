"""A transport written in one small file and registered through the factory runs every strategy's matrix test
unchanged: the strategies see only the Communicator interface, and the factory is the one place transports plug in.

The fake moves each message through a queue.Queue per (sender, receiver) pair; the ranks find each other's queues
through the control plane (the thread ranks' own allgather_object), as the sockets find each other's addresses.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import torch

import strategies
from strategies.ops import reference
from strategies.testing import WORLD_SIZES, check_strategy, check_traffic, make_inputs, run_collective
from strategies.transport import factory
from strategies.transport.communicator import Communicator, completed
from strategies.transport.threads import run_threads
from strategies.transport.wire import check_received


class QueueCommunicator(Communicator):
    """Point to point over one queue per (src, dst) pair; the control plane carries everything else."""

    transport = "fake-queues"

    def __init__(self, control: Communicator, timeout: float, network):
        super().__init__(control.rank, control.world_size, timeout, network)
        self.control = control
        mine = {src: queue.Queue() for src in range(self.world_size) if src != self.rank}
        self.inboxes = control.allgather_object(mine)  # inboxes[dst][src]: every rank's queues, by reference

    def _raw_isend(self, tensor, dst, stamp):
        self.inboxes[dst][self.rank].put((tensor.clone(), stamp))
        return completed

    def _raw_irecv(self, tensor, src, stamped):
        def wait(timeout):
            try:
                payload, stamp = self.inboxes[self.rank][src].get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no message from rank {src}") from None
            check_received(self.rank, src, tensor, payload.numel() * payload.element_size(), payload.dtype)
            tensor.copy_(payload.reshape(tensor.shape))
            return stamp

        return wait

    def allgather_object(self, obj) -> list:
        return self.control.allgather_object(obj)

    def native_allreduce(self, tensor, op) -> None:
        self.control.native_allreduce(tensor, op)

    def close(self) -> None:
        self.control.close()


def build_fake(name, control, *, timeout, network, address):
    return QueueCommunicator(control, timeout, network)


@pytest.fixture
def fake(monkeypatch):
    """"fake" registered through the factory for one test (the registry restored after it)."""
    monkeypatch.setattr(factory, "TRANSPORTS", dict(factory.TRANSPORTS))
    factory.register("fake", build_fake)
    return "fake"


def label(name, params):
    return name + "".join(f"[{k}={v}]" for k, v in params.items())


SETTINGS = list(strategies.registry.settings())
# what a transport changes: no message (0), more ranks than elements (3), large and divisible by no world size
# (4099); the ops are transport-independent (strategies.ops, checked op by op on the thread transport)
NUMELS = (0, 3, 4099)


def fake_ops(config) -> tuple[str, ...]:
    """sum (order-dependent) and max (exact), or the one op a neighbour average has."""
    return tuple(op for op in ("sum", "max") if op in config.ops) or config.ops


@pytest.mark.parametrize("name,params", SETTINGS, ids=[label(*s) for s in SETTINGS])
def test_every_strategy_passes_its_matrix_on_the_fake_transport(name, params, fake):
    """test_strategy_matrix's results-and-traffic check, every world size, with the fake carrying the messages."""
    ops = fake_ops(strategies.make(name, **params))
    cases = check_strategy(name, world_sizes=WORLD_SIZES, numels=NUMELS, ops=ops, p2p=fake, **params)
    assert cases == len(WORLD_SIZES) * len(NUMELS) * len(ops)


@pytest.mark.parametrize("name,params", SETTINGS, ids=[label(*s) for s in SETTINGS])
def test_int64_on_the_fake_transport(name, params, fake):
    config = strategies.make(name, **params)
    if not config.exact:
        pytest.skip(f"{name} is a neighbour average")
    for op in ("sum", "max"):
        if op not in config.ops:
            continue
        inputs = make_inputs(5, 1000, op, np.int64)
        outputs, traffic = run_collective(name, inputs, op=op, timeout=20, p2p=fake, **params)
        for rank, got in enumerate(outputs):
            np.testing.assert_array_equal(got, reference(inputs, op), err_msg=f"{name} {op}: rank {rank}")
        check_traffic(config, 5, 1000, 8, traffic, f"{label(name, params)} int64 op={op}")


def test_the_fake_carries_the_messages_and_its_counters_are_the_base_classes(fake):
    """Not the thread queues in disguise: the communicator a strategy gets is the fake's, and it counts."""

    def body(comm):
        other = 1 - comm.rank
        got = torch.empty(3)
        handles = [comm.irecv(got, other), comm.isend(torch.full((3,), float(comm.rank)), other)]
        for h in handles:
            h.wait()
        return type(comm).__name__, comm.transport, got.tolist(), comm.counters().as_dict()

    for rank, (kind, transport, got, counters) in enumerate(run_threads(2, body, timeout=10, p2p=fake)):
        assert (kind, transport, got) == ("QueueCommunicator", "fake-queues", [float(1 - rank)] * 3)
        assert counters == {"bytes_sent": 12, "bytes_recv": 12, "msgs_sent": 1, "msgs_recv": 1}


def test_the_fake_refuses_a_message_of_the_wrong_size_with_the_common_text(fake):
    def body(comm):
        if comm.rank == 0:
            comm.send(torch.ones(4), 1)
            return None
        with pytest.raises(Exception, match="rank 1: rank 0 sent 16 bytes of float32, this rank expected 32 bytes "
                                             "of float32 .8 elements.: ranks disagree"):
            comm.recv(torch.zeros(8), 0)
        return "refused"

    assert run_threads(2, body, timeout=10, p2p=fake)[1] == "refused"


def test_registering_a_taken_name_or_building_an_unknown_one_is_refused(fake):
    with pytest.raises(ValueError, match="transport 'fake' is already registered"):
        factory.register("fake", build_fake)
    with pytest.raises(ValueError, match="p2p 'nope': expected one of threads, gloo, sockets, .*, fake"):
        run_threads(2, lambda comm: None, p2p="nope")

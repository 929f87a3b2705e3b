"""FlatModel: gradients land in the flat buffer, the optimizer updates flat params, training is unchanged."""

import copy

import pytest
import torch
import torch.nn.functional as F

from workloads.flat import FlatModel, consensus_distance
from workloads.models import build_model


def batch(seed, image_size=8, n=4):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, image_size, image_size, generator=generator)
    return x, torch.randint(0, 10, (n,), generator=generator)


def flat_of(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("name,image_size", [("tiny", 8), ("resnet18", 32)])
def test_backward_writes_into_the_flat_grad_buffer(name, image_size):
    model = build_model(name, image_size=image_size)
    before = flat_of(model)
    flat = FlatModel(model)
    assert flat.numel == before.numel() == flat.params.numel() == flat.grads.numel()
    assert torch.equal(flat.params, before)  # flattening keeps the weights
    x, y = batch(0, image_size, n=2)
    F.cross_entropy(model(x), y).backward()
    assert flat.grads.abs().sum() > 0
    assert torch.equal(flat.grads, torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    flat.check_views()


def test_backward_accumulates_and_zero_grad_clears_in_place():
    model = build_model("tiny", image_size=8)
    flat = FlatModel(model)
    x, y = batch(1)
    F.cross_entropy(model(x), y).backward()
    once = flat.grads.clone()
    F.cross_entropy(model(x), y).backward()
    torch.testing.assert_close(flat.grads, 2 * once)
    buffer = flat.grads
    flat.zero_grad()
    assert flat.grads is buffer and not flat.grads.any()
    flat.check_views()


def test_optimizer_step_updates_the_flat_params_and_flat_grads_drive_it():
    model = build_model("tiny", image_size=8)
    flat = FlatModel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch(2)
    F.cross_entropy(model(x), y).backward()
    flat.grads.mul_(0.5)  # what a strategy does: average the flat buffer in place...
    halved = [p.grad.clone() for p in model.parameters()]
    before = flat.params.clone()
    optimizer.step()  # ...and the optimizer sees it through the views
    torch.testing.assert_close(before - flat.params, 0.1 * torch.cat([g.reshape(-1) for g in halved]))
    assert torch.equal(flat.params, flat_of(model))
    flat.check_views()


@pytest.mark.parametrize("name,image_size,steps", [("tiny", 8, 5), ("resnet18", 32, 2)])
def test_training_with_and_without_flat_model_agrees(name, image_size, steps):
    plain = build_model(name, image_size=image_size, seed=3)
    flat_model = copy.deepcopy(plain)
    flat = FlatModel(flat_model)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    opt_flat = torch.optim.SGD(flat_model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    for step in range(steps):
        x, y = batch(step, image_size)
        opt_plain.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        opt_plain.step()
        flat.zero_grad()
        F.cross_entropy(flat_model(x), y).backward()
        opt_flat.step()
    torch.testing.assert_close(flat.params, flat_of(plain), rtol=0, atol=1e-6)
    assert not torch.equal(flat.params, flat_of(build_model(name, image_size=image_size, seed=3)))


def test_optimizer_zero_grad_breaks_the_views_detectably_and_zero_grad_repairs():
    model = build_model("tiny", image_size=8)
    flat = FlatModel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()  # set_to_none=True by default
    x, y = batch(3)
    F.cross_entropy(model(x), y).backward()
    assert not flat.grads.any()  # the gradients went elsewhere
    with pytest.raises(RuntimeError, match="FlatModel.zero_grad"):
        flat.check_views()
    flat.zero_grad()
    F.cross_entropy(model(x), y).backward()
    flat.check_views()
    assert flat.grads.any()


def test_moving_after_flattening_detected():
    model = build_model("tiny", image_size=8)
    flat = FlatModel(model)
    model.to(torch.float64)
    with pytest.raises(RuntimeError, match="moved with .to\\(\\) after flattening"):
        flat.check_views()


def test_mixed_dtypes_rejected():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="parameter 1.weight is torch.float64"):
        FlatModel(model)


def test_consensus_distance():
    a = torch.tensor([0.0, 0.0])
    b = torch.tensor([3.0, 4.0])
    assert consensus_distance([a, a.clone(), a.clone()]) == 0
    assert consensus_distance([a, b]) == pytest.approx(2.5)  # each is 5/2 from the midpoint
    c = torch.tensor([6.0, 8.0])
    assert consensus_distance([a, b, c]) == pytest.approx((5 + 0 + 5) / 3)
    with pytest.raises(ValueError, match="at least one"):
        consensus_distance([])

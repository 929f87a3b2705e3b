"""Synthetic and digits data: shapes, reproducibility, disjoint shards, a held-out split, and clear errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workloads.data import DATASETS, make_dataset
from workloads.models import build_model


def test_synthetic_batch_shape_and_labels():
    data = make_dataset("synthetic", batch_size=4, image_size=32, num_classes=10, rank=0, world_size=2)
    x, y = data.next_batch()
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert y.shape == (4,) and y.dtype == torch.int64 and 0 <= y.min() and y.max() < 10


def test_synthetic_reproducible_per_seed_and_rank():
    def batch(seed, rank):
        return make_dataset("synthetic", 4, 16, 10, rank=rank, world_size=2, seed=seed).next_batch()

    a, b = batch(0, 0), batch(0, 0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], batch(0, 1)[0])  # ranks differ, so their gradients do
    assert not torch.equal(a[0], batch(1, 0)[0])
    assert not torch.equal(batch(1, 0)[0], batch(0, 1)[0])  # seed 1 rank 0 is not seed 0 rank 1


def test_synthetic_batch_generated_once_and_reused():
    data = make_dataset("synthetic", 4, 16, 10)
    first, second = data.next_batch(), data.next_batch()
    assert first[0] is second[0] and first[1] is second[1]


def test_digits_batches_are_normalized_images_at_the_asked_size():
    data = make_dataset("digits", batch_size=64, image_size=32, num_classes=10, seed=0)
    x, y = data.next_batch()
    assert x.shape == (64, 3, 32, 32) and y.shape == (64,) and y.dtype == torch.int64
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])
    assert 0 <= y.min() and y.max() <= 9
    assert abs(data.train_x.mean().item()) < 0.2 and abs(data.train_x.std().item() - 1) < 0.2
    assert data.num_train + data.num_test == 1797 and data.num_test == 360


def test_digits_shards_are_disjoint_and_cover_the_training_split():
    shards = [make_dataset("digits", 8, 8, 10, rank=r, world_size=3, seed=4).indices for r in range(3)]
    assert sum(len(s) for s in shards) == 1437
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(1437))


def test_digits_epoch_walks_the_whole_shard_then_reshuffles():
    data = make_dataset("digits", batch_size=50, image_size=8, num_classes=10, rank=1, world_size=3, seed=0)
    shard_size = len(data.indices)  # 479
    seen = torch.cat([data.next_batch()[1] for _ in range(shard_size // 50 + 1)])
    assert seen.numel() == 500 and data.epoch == 1  # the last batch ran into the next epoch
    first_epoch = seen[:shard_size].sort().values
    assert torch.equal(first_epoch, data.train_y.sort().values)  # each shard sample exactly once
    assert data.order.tolist() != sorted(data.order.tolist())


def test_digits_reproducible_per_seed():
    def batches(seed):
        data = make_dataset("digits", 32, 8, 10, rank=0, world_size=2, seed=seed)
        return [data.next_batch() for _ in range(30)]  # 30 x 32 > 719: crosses an epoch

    a, b, c = batches(0), batches(0), batches(1)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert not all(torch.equal(p[1], q[1]) for p, q in zip(a, c))


def test_digits_eval_batches_cover_the_test_split():
    data = make_dataset("digits", batch_size=100, image_size=16, num_classes=10, rank=2, world_size=3)
    batches = list(data.eval_batches())
    assert [len(y) for _, y in batches] == [100, 100, 100, 60]
    assert all(x.shape[1:] == (3, 16, 16) for x, _ in batches)
    labels = torch.cat([y for _, y in batches])
    assert torch.equal(labels, data.test_y)


def test_tiny_learns_digits():
    """Real data trains: 150 SGD steps of the tiny CNN on digits reach > 85% held-out accuracy."""
    data = make_dataset("digits", batch_size=32, image_size=8, num_classes=10, seed=0)
    model = build_model("tiny", image_size=8, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(150):
        x, y = data.next_batch()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in data.eval_batches())
    assert correct / data.num_test > 0.85


def test_unknown_dataset_named_with_accepted_ones():
    with pytest.raises(ValueError, match="cifar10") as info:
        make_dataset("cifar10", 4, 32, 10)
    assert all(name in str(info.value) for name in DATASETS)


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(world_size=0), "world_size must be an integer >= 1, got 0"),
    (dict(rank=2, world_size=2), "rank must be an integer in 0..1 for world_size 2, got 2"),
    (dict(rank=-1), "rank must be an integer in 0..0 for world_size 1, got -1"),
])
def test_bad_arguments_named(kwargs, message):
    args = dict(name="synthetic", batch_size=4, image_size=8, num_classes=10) | kwargs
    with pytest.raises(ValueError, match=message):
        make_dataset(**args)


def test_digits_needs_ten_classes():
    with pytest.raises(ValueError, match="digits has 10 classes: num_classes must be >= 10, got 5"):
        make_dataset("digits", 4, 8, num_classes=5)

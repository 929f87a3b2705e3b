"""The data a run trains on: seeded synthetic batches for throughput, scikit-learn's digits for convergence.

Both live on the worker's device and hand out one (images, labels) batch per `next_batch()` call, so the data
path costs (almost) nothing inside a timed step. Nothing is downloaded: digits ships with scikit-learn.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

DATASETS = ("synthetic", "digits")


def _seed(*parts) -> int:
    """One 63-bit seed from several integers (run seed, rank, epoch) without collisions like seed + rank."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)


class SyntheticData:
    """Random N(0, 1) images and uniform labels, generated once on the device and returned at every step.

    The standard throughput benchmark (Horovod's synthetic benchmark does the same): one batch is drawn from a
    generator seeded by (seed, rank) and reused, because drawing a fresh 64x3x224x224 batch every step costs
    ~80 ms on one CPU thread, which would be counted as compute and is not what is measured.
    Ranks get different batches (so gradients differ before averaging); the same seed gives the same batches.
    Callers must not modify the returned tensors in place.
    """

    def __init__(self, batch_size, image_size, num_classes, rank, world_size, seed, device):
        generator = torch.Generator(device=device).manual_seed(_seed(seed, rank))
        self.x = torch.randn(batch_size, 3, image_size, image_size, generator=generator, device=device)
        self.y = torch.randint(0, num_classes, (batch_size,), generator=generator, device=device)

    def next_batch(self):
        return self.x, self.y


class DigitsData:
    """scikit-learn's handwritten digits (1,797 8x8 images, 10 classes), resized to image_size, 3 channels.

    A fixed stratified split (seed 0, 20% test) keeps accuracy comparable across runs and seeds. The training
    split is shuffled once by `seed` and dealt round-robin: rank r owns indices perm[r::world_size], disjoint
    from every other rank's for the whole run. Each epoch walks the rank's shard in an order seeded by
    (seed, rank, epoch); a batch that runs past the end of the shard continues into the next epoch, so every
    batch is full.
    Images are stored as 8x8 on the device and resized (bilinear) per batch: cheap, and small at 224x224.
    """

    test_fraction = 0.2

    def __init__(self, batch_size, image_size, num_classes, rank, world_size, seed, device):
        from sklearn.datasets import load_digits  # imported here: sklearn takes ~2 s, synthetic runs skip it
        from sklearn.model_selection import train_test_split

        if num_classes < 10:
            raise ValueError(f"digits has 10 classes: num_classes must be >= 10, got {num_classes}")
        digits = load_digits()
        images = digits.images.astype(np.float32) / 16.0  # pixel values are 0..16
        labels = digits.target.astype(np.int64)
        train_x, test_x, train_y, test_y = train_test_split(
            images, labels, test_size=self.test_fraction, stratify=labels, random_state=0)
        # normalize with the training split's statistics; bilinear resizing is affine, so the two commute
        mean, std = train_x.mean(), train_x.std()
        train_x, test_x = (train_x - mean) / std, (test_x - mean) / std

        shard = np.random.default_rng(_seed(seed)).permutation(len(train_x))[rank::world_size]
        if len(shard) == 0:
            raise ValueError(f"digits has {len(train_x)} train images: too few for world_size {world_size}")
        self.indices = np.sort(shard)  # positions in the training split this rank owns
        self.num_train, self.num_test = len(train_x), len(test_x)
        self.batch_size, self.image_size, self.rank, self.seed = batch_size, image_size, rank, seed
        self.device = torch.device(device)
        self.train_x = torch.from_numpy(train_x[self.indices]).to(self.device)
        self.train_y = torch.from_numpy(train_y[self.indices]).to(self.device)
        self.test_x = torch.from_numpy(test_x).to(self.device)
        self.test_y = torch.from_numpy(test_y).to(self.device)
        self.epoch = -1
        self.order = np.empty(0, dtype=np.int64)
        self.position = 0

    def _prepare(self, x):
        """8x8 single-channel images -> image_size x image_size, 3 identical channels."""
        x = x.unsqueeze(1)
        if self.image_size != 8:
            size = (self.image_size, self.image_size)
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        return x.expand(-1, 3, -1, -1).contiguous()

    def next_batch(self):
        """The next batch_size samples of this rank's shard, reshuffled for a new epoch when it runs out."""
        picks = []
        needed = self.batch_size
        while needed > 0:
            if self.position == len(self.order):
                self.epoch += 1
                self.order = np.random.default_rng(_seed(self.seed, self.rank, self.epoch)).permutation(
                    len(self.indices))
                self.position = 0
            take = self.order[self.position:self.position + needed]
            picks.append(take)
            self.position += len(take)
            needed -= len(take)
        idx = torch.from_numpy(np.concatenate(picks)).to(self.device)
        return self._prepare(self.train_x[idx]), self.train_y[idx]

    def eval_batches(self):
        """The whole held-out test split (the same on every rank), in order, in batches of batch_size."""
        for lo in range(0, self.num_test, self.batch_size):
            yield self._prepare(self.test_x[lo:lo + self.batch_size]), self.test_y[lo:lo + self.batch_size]


def make_dataset(name, batch_size, image_size, num_classes, rank=0, world_size=1, seed=0, device="cpu"):
    """The data rank `rank` of `world_size` trains on: an object whose next_batch() gives (images, labels)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: accepted are {', '.join(DATASETS)}")
    for key, value, low in (("batch_size", batch_size, 1), ("image_size", image_size, 1),
                            ("num_classes", num_classes, 1), ("world_size", world_size, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in 0..{world_size - 1} for world_size {world_size}, "
                         f"got {rank!r}")
    data_cls = SyntheticData if name == "synthetic" else DigitsData
    return data_cls(batch_size, image_size, num_classes, rank, world_size, seed, device)

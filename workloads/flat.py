"""One flat buffer for all parameters and one for all gradients: strategies sync one tensor, copy-free.

Every parameter's `.data` and `.grad` become views into the two buffers: backward accumulates into the flat
gradient buffer in place and the optimizer's in-place update writes into the flat parameter buffer.
On resnet18 this costs nothing per step; torch.cat costs ~28 ms, a copy into a preallocated buffer ~9 ms.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatModel:
    """Rewires `model` in place so its parameters and gradients live in `params` and `grads` (1-D, numel).

    Move the model to its device before flattening: `model.to(...)` afterwards reallocates the parameters.
    Zero gradients with `FlatModel.zero_grad()`, never `optimizer.zero_grad()` or `model.zero_grad()`: their
    default set_to_none=True drops the views, and backward would then write gradients outside the buffer.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        if not self.trainable:
            raise ValueError("model has no trainable parameters to flatten")
        first = self.trainable[0]
        for name, p in model.named_parameters():
            if p.requires_grad and (p.dtype != first.dtype or p.device != first.device):
                raise ValueError(f"parameter {name} is {p.dtype} on {p.device}; a flat buffer needs every "
                                 f"parameter to be {first.dtype} on {first.device}")
        self.numel = sum(p.numel() for p in self.trainable)
        self.params = torch.empty(self.numel, dtype=first.dtype, device=first.device)
        self.grads = torch.zeros(self.numel, dtype=first.dtype, device=first.device)
        self.param_views, self.grad_views = [], []
        offset = 0
        for p in self.trainable:
            n = p.numel()
            self.params[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.params[offset:offset + n].view_as(p)
            self.param_views.append(p.data)
            self.grad_views.append(self.grads[offset:offset + n].view_as(p))
            offset += n
        self.zero_grad()

    def zero_grad(self):
        """Zero the flat gradient buffer in place and (re)attach every `p.grad` as a view into it."""
        self.grads.zero_()
        for p, view in zip(self.trainable, self.grad_views):
            p.grad = view

    def check_views(self):
        """Raise if a parameter or gradient left the flat buffers (e.g. after optimizer.zero_grad())."""
        for p, param_view, view in zip(self.trainable, self.param_views, self.grad_views):
            if p.data_ptr() != param_view.data_ptr():
                raise RuntimeError("a parameter no longer lives in FlatModel.params: was the model moved "
                                   "with .to() after flattening? Move it first, then flatten")
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                raise RuntimeError("a gradient no longer lives in FlatModel.grads: zero gradients with "
                                   "FlatModel.zero_grad(), not optimizer.zero_grad() or model.zero_grad()")


def consensus_distance(vectors: list[torch.Tensor]) -> float:
    """Mean L2 distance of each worker's flat parameters to their average: how far workers drift."""
    if not vectors:
        raise ValueError("consensus_distance needs at least one parameter vector, got none")
    average = torch.zeros(vectors[0].shape, dtype=torch.float64, device=vectors[0].device)
    for v in vectors:
        if v.shape != average.shape:
            raise ValueError(f"parameter vectors differ in shape: {tuple(v.shape)} vs {tuple(average.shape)}")
        average += v
    average /= len(vectors)
    return sum(torch.linalg.vector_norm(v.double() - average).item() for v in vectors) / len(vectors)

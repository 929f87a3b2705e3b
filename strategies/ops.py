"""Reduction operators: any associative, commutative op works for an allreduce."""

from __future__ import annotations

import torch

OPS = ("sum", "mean", "min", "max", "prod")


def check_op(op: str, dtype: torch.dtype, accepted: tuple[str, ...] = OPS) -> None:
    """Reject an unknown op, one the strategy does not support, or a mean of integers, before any work."""
    if op not in accepted:
        raise ValueError(f"unknown or unsupported reduction op {op!r}: accepted are {', '.join(accepted)}")
    if op == "mean" and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"op 'mean' needs a floating-point tensor, got {dtype}: use 'sum' for integers")


def reduce_into(acc: torch.Tensor, other: torch.Tensor, op: str) -> None:
    """acc <- acc (op) other, in place. 'mean' sums here; finish_reduction divides once at the end."""
    if op in ("sum", "mean"):
        acc.add_(other)
    elif op == "prod":
        acc.mul_(other)
    elif op == "min":
        torch.minimum(acc, other, out=acc)
    elif op == "max":
        torch.maximum(acc, other, out=acc)
    else:
        raise ValueError(f"unknown reduction op {op!r}: accepted are {', '.join(OPS)}")


def finish_reduction(tensor: torch.Tensor, op: str, count: int) -> None:
    """Turn a sum of `count` contributions into their mean; every other op is already final."""
    if op == "mean" and count > 1:
        tensor.div_(count)


def reference(arrays, op: str):
    """numpy reference reduction of a list of arrays (the tests' ground truth)."""
    import numpy as np

    stack = np.stack([np.asarray(a) for a in arrays])
    return {"sum": stack.sum, "mean": stack.mean, "min": stack.min, "max": stack.max,
            "prod": stack.prod}[op](axis=0)

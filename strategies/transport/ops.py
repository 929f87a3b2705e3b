"""Reduction operators and the dtypes they accept: any associative, commutative op works for an allreduce.

Arithmetic (sum, mean, min, max, prod) as MPI/NCCL define it; logical (land, lor, lxor: the result is 1
where true, 0 where false) and bitwise (band, bor, bxor) as MPI's LAND/LOR/LXOR/BAND/BOR/BXOR. Integer
arithmetic wraps around in the tensor's own dtype, as numpy does in the same dtype. Every check here runs on
each rank before any byte moves, so a rank never fails halfway through a collective over a bad dtype.
"""

from __future__ import annotations

import contextlib
import math

import torch

ARITHMETIC = ("sum", "mean", "min", "max", "prod")
LOGICAL = ("land", "lor", "lxor")
BITWISE = ("band", "bor", "bxor")
OPS = ARITHMETIC + LOGICAL + BITWISE

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF = (torch.float16, torch.bfloat16)
COMPLEX = (torch.complex64, torch.complex128)
INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64)
# torch has only bitwise kernels for the wide unsigned types: they travel and reduce as the signed type of
# the same width (the same bits; sum and prod wrap identically; min/max compare with the sign bit flipped).
_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}

# Which ops each kind of dtype accepts (bool sums and products are refused: numpy would widen them to int).
ACCEPTED: dict[torch.dtype, tuple[str, ...]] = {
    **{d: ARITHMETIC for d in FLOATS},
    **{d: ("sum", "mean", "prod") for d in COMPLEX},
    **{d: ("sum", "min", "max", "prod") + LOGICAL + BITWISE for d in INTEGERS},
    torch.bool: ("min", "max") + LOGICAL + BITWISE,
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_op(op: str, dtype: torch.dtype, accepted: tuple[str, ...] = OPS) -> None:
    """Refuse an unknown op, one the strategy does not support, or a dtype the op cannot reduce, up front."""
    if op not in accepted:
        raise ValueError(f"unknown or unsupported reduction op {op!r}: accepted are {', '.join(accepted)}")
    if dtype not in ACCEPTED:
        raise ValueError(f"dtype {_dtype_name(dtype)} cannot be reduced: accepted dtypes are "
                         f"{', '.join(_dtype_name(d) for d in ACCEPTED)}")
    if op not in ACCEPTED[dtype]:
        hint = ": use 'sum' for integers" if op == "mean" and dtype in INTEGERS else ""
        raise ValueError(f"op {op!r} does not apply to {_dtype_name(dtype)} tensors{hint}; accepted for "
                         f"{_dtype_name(dtype)} are {', '.join(o for o in ACCEPTED[dtype] if o in accepted)}")


@contextlib.contextmanager
def wire_form(flat: torch.Tensor, op: str):
    """The tensor as it travels and reduces: wide unsigned integers as their signed twin (min/max with the
    sign bit flipped so that signed order is unsigned order), everything else as it is."""
    twin = _SIGNED_TWIN.get(flat.dtype)
    if twin is None:
        yield flat
        return
    signed = flat.view(twin)
    flip = op in ("min", "max")
    if flip:
        signed.bitwise_xor_(torch.iinfo(twin).min)
    yield signed
    if flip:
        signed.bitwise_xor_(torch.iinfo(twin).min)


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of `dtype` travels and reduces as (see wire_form)."""
    return _SIGNED_TWIN.get(dtype, dtype)


def _mean_shift(count: int) -> int:
    return math.ceil(math.log2(count)) if count > 1 else 0


def prescale(flat: torch.Tensor, op: str, count: int) -> None:
    """Before a half-precision mean: scale each contribution by 2^-ceil(log2 count), exactly (a power of two),
    so that the sum of `count` of them cannot overflow where the mean would not (NCCL scales before it sums
    too). finish_reduction scales back by 2^k / count. Other dtypes and ops sum first, then divide once."""
    if op == "mean" and flat.dtype in HALF and count > 1:
        flat.mul_(2.0 ** -_mean_shift(count))


def reduce_into(acc: torch.Tensor, other: torch.Tensor, op: str) -> None:
    """acc <- acc (op) other, in place. 'mean' sums here; finish_reduction divides once at the end."""
    if acc.is_meta:  # sizes without values (the simulated transport): nothing to compute, and meta ops are slow
        return
    if op in ("sum", "mean"):
        acc.add_(other)
    elif op == "prod":
        acc.mul_(other)
    elif op == "min":
        torch.minimum(acc, other, out=acc)
    elif op == "max":
        torch.maximum(acc, other, out=acc)
    elif op == "land":
        torch.logical_and(acc, other, out=acc)
    elif op == "lor":
        torch.logical_or(acc, other, out=acc)
    elif op == "lxor":
        torch.logical_xor(acc, other, out=acc)
    elif op == "band":
        acc.bitwise_and_(other)
    elif op == "bor":
        acc.bitwise_or_(other)
    elif op == "bxor":
        acc.bitwise_xor_(other)
    else:
        raise ValueError(f"unknown reduction op {op!r}: accepted are {', '.join(OPS)}")


def finish_reduction(tensor: torch.Tensor, op: str, count: int) -> None:
    """Finish a reduction of `count` contributions where it completes (also for count = 1, a rank alone):
    a logical op's answer becomes 0/1; a sum becomes the mean; every other op is already final.

    Half precision: the contributions were prescaled by 2^-k; the sum is scaled by 2^k / count in float64
    (exact multiply, one correctly rounded division) and rounded once to the tensor's dtype.
    """
    if op in LOGICAL and tensor.dtype != torch.bool:
        tensor.copy_(tensor != 0)
    if op != "mean" or count <= 1:
        return
    if tensor.dtype in HALF:
        tensor.copy_(tensor.double().mul_(2.0 ** _mean_shift(count)).div_(count))
    else:
        tensor.div_(count)


def reference(arrays, op: str):
    """numpy reference reduction of a list of arrays (the tests' ground truth), in the arrays' own dtype:
    integer sums and products wrap around as they do in that dtype; logical ops give 0/1 in that dtype."""
    import numpy as np

    stack = np.stack([np.asarray(a) for a in arrays])
    dtype = stack.dtype
    if op in ("sum", "prod") and dtype.kind in "iu":
        return (stack.sum if op == "sum" else stack.prod)(axis=0, dtype=dtype)
    if op in LOGICAL + BITWISE:
        ufunc = {"land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
                 "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        return ufunc.reduce(stack, axis=0).astype(dtype)
    return {"sum": stack.sum, "mean": stack.mean, "min": stack.min, "max": stack.max,
            "prod": stack.prod}[op](axis=0)

"""What every received message is checked against: the sender's byte count and dtype against the posted buffer.

Transports that carry a header send the dtype as a small code (`dtype_code`); the receiver refuses a payload
whose size or dtype differs from its buffer's, with one error text for every transport.
"""

from __future__ import annotations

import torch

from strategies.transport.communicator import CommError

# dtype codes carried in headers; a dtype not listed travels as -1 and only its byte count is checked
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128, torch.uint16,
          torch.uint32, torch.uint64)


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else -1


def dtype_of(code: int) -> torch.dtype | None:
    """The dtype a header's code names (None: a dtype not in DTYPES)."""
    return DTYPES[code] if 0 <= code < len(DTYPES) else None


def _name(dtype: torch.dtype | None) -> str:
    return "unlisted dtype" if dtype is None else str(dtype).removeprefix("torch.")


def mismatch(src: int, buffer: torch.Tensor, nbytes: int, dtype: torch.dtype | None) -> str | None:
    """Why a message of `nbytes` bytes of `dtype` from rank `src` does not fit `buffer`; None if it does.

    `dtype` None: a dtype outside DTYPES, sent as a code; it matches any other such dtype (only its bytes count)."""
    want_bytes = buffer.numel() * buffer.element_size()
    same_dtype = dtype == buffer.dtype or (dtype is None and buffer.dtype not in DTYPES)
    if nbytes == want_bytes and same_dtype:
        return None
    return (f"rank {src} sent {nbytes} bytes of {_name(dtype)}, this rank expected {want_bytes} bytes of "
            f"{_name(buffer.dtype)} ({buffer.numel()} elements): ranks disagree on the tensor's size or dtype")


def check_received(rank: int, src: int, buffer: torch.Tensor, nbytes: int, dtype: torch.dtype | None) -> None:
    """Raise a CommError naming both sizes and dtypes if the message from `src` does not fit `buffer`."""
    why = mismatch(src, buffer, nbytes, dtype)
    if why:
        raise CommError(f"rank {rank}: {why}")

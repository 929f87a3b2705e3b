"""Cross-memory attach (CMA), as MPI's shared-memory transports use it: a receiver copies a payload straight out of
the sender's memory with one process_vm_readv (Linux), where the kernel lets it (same user, ptrace allowed).
"""

from __future__ import annotations

import ctypes
import os

import torch


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _process_vm_readv():
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):  # not Linux (or an old libc): no single copy
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.c_ulong]
    return fn


_VM_READV = _process_vm_readv()


def _read_peer_memory(pid: int, address: int, into: int, nbytes: int) -> None:
    """Copy `nbytes` at `address` in process `pid` to `into` in this one; OSError if the kernel refuses."""
    done = 0
    while done < nbytes:
        local, remote = _IoVec(into + done, nbytes - done), _IoVec(address + done, nbytes - done)
        got = _VM_READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"process_vm_readv from pid {pid}: {os.strerror(errno)}")
        done += got


def _can_read(pid: int, address: int, value: int) -> bool:
    """Whether this process may read process `pid`'s memory: read its probe and compare."""
    if _VM_READV is None:
        return False
    out = torch.zeros(1, dtype=torch.int64)
    try:
        _read_peer_memory(pid, address, out.data_ptr(), 8)
    except OSError:
        return False
    return int(out) == value

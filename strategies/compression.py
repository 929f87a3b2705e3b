"""Gradient compression around any gradient-averaging strategy: fp16, bf16, PowerSGD and top-k, declared once.

`compress(config, settings)` wraps a strategy's config (strategies.make applies it from the run settings); the
wrapped strategy's own algorithm carries the compressed payload, so the wire holds the compressed bytes and
`traffic()` is the inner strategy's traffic of that payload, exactly:
- fp16 / bf16: the gradient cast to 16 bits, averaged by the strategy in that dtype, cast back (Horovod's fp16
  allreduce); half the bytes.
- powersgd: the buffer viewed as a rows x cols matrix M (cols = ceil(sqrt(numel)), zero-padded), rank r
  (Vogels et al. 2019, PyTorch's powerSGD_hook): P = M Q averaged, orthogonalized, Q = M^T P averaged,
  M ~ P Q^T. Error feedback keeps M - P Q^T for the next step; warm start reuses Q. Before `powersgd_start`
  steps, and when (rows + cols) r >= numel (no saving), the buffer is averaged uncompressed, as the hook does.
- topk: each worker sends its k = ceil(ratio x numel) largest entries (of gradient + residual with error
  feedback: Deep Gradient Compression) as (index, value) pairs. Workers pick different indices, so the pairs are
  gathered: each worker writes its 2k int32 words (indices, then the values' float32 bits) into its own slot of
  an n x 2k buffer, zeros elsewhere, and the strategy sums it (x + 0 = x in integers: bit-exact). Every worker
  then adds the n sparse contributions in worker order (identical bits everywhere). The strategy's allreduce of
  n x 2k words carries what an allgather would, at its own cost (a ring: 2(n-1) x 2k words, twice an allgather's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from strategies.base import GRADIENTS, RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.ops import check_op

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk")
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
MAX_TOPK_NUMEL = 2**31 - 1  # indices travel as int32


@dataclass(frozen=True)
class Compression:
    """A run's compression settings (run settings `compression`, `powersgd_rank`, ... beside it)."""

    compression: str = "none"
    powersgd_rank: int = 1        # PyTorch's default matrix_approximation_rank
    powersgd_start: int = 10      # PyTorch's start_powerSGD_iter: steps averaged uncompressed first
    powersgd_warm_start: bool = True
    topk_ratio: float = 0.01
    error_feedback: bool = True   # PowerSGD and top-k: keep what was not sent and add it to the next gradient

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Each bad value named with what is accepted; [] when every setting is valid."""
        out = []
        if self.compression not in COMPRESSIONS:
            out.append(f"compression = {self.compression!r}: accepted are {', '.join(map(repr, COMPRESSIONS))}")
        if not _is_int(self.powersgd_rank) or not 1 <= self.powersgd_rank <= 1024:
            out.append(f"powersgd_rank = {self.powersgd_rank!r}: accepted are whole numbers 1 to 1024")
        if not _is_int(self.powersgd_start) or not 0 <= self.powersgd_start <= 1_000_000:
            out.append(f"powersgd_start = {self.powersgd_start!r}: accepted are whole numbers 0 to 1,000,000")
        for key in ("powersgd_warm_start", "error_feedback"):
            if not isinstance(getattr(self, key), bool):
                out.append(f"{key} = {getattr(self, key)!r}: accepted are true or false")
        ratio = self.topk_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            out.append(f"topk_ratio = {ratio!r}: accepted are numbers > 0 and <= 1 (0.01 sends 1% of the entries)")
        return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def add_traffic(a: Traffic, b: Traffic) -> Traffic:
    """Two collectives one after the other: bytes, messages, rounds and critical-path bytes add up."""
    ranks = tuple(RankTraffic(x.role, x.bytes_sent + y.bytes_sent, x.bytes_recv + y.bytes_recv,
                              x.msgs_sent + y.msgs_sent, x.msgs_recv + y.msgs_recv) for x, y in zip(a.ranks, b.ranks))
    return Traffic(ranks, a.rounds + b.rounds, a.path_bytes + b.path_bytes, a.counted and b.counted)


def matrix_shape(numel: int) -> tuple[int, int]:
    """PowerSGD's view of a flat buffer: rows x cols with cols = ceil(sqrt(numel)), zero-padded."""
    cols = max(1, math.isqrt(max(numel - 1, 0)) + 1) if numel > 0 else 1
    return -(-numel // cols), cols


def topk_count(numel: int, ratio: float) -> int:
    """k = ceil(ratio x numel), at least 1 of a non-empty buffer."""
    return 0 if numel == 0 else min(numel, max(1, math.ceil(ratio * numel)))


class CompressedSync(Strategy):
    """Compress, let the inner strategy average the payload, decompress; one runtime per bucket (its step count
    and its error-feedback residual are that bucket's)."""

    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.settings = config.compression
        self.inner: dict[str, Strategy] = {}  # one inner runtime per payload shape (P, Q, full): one size check each
        self.step = 0
        self.residual: torch.Tensor | None = None
        self.q: torch.Tensor | None = None

    def _inner(self, purpose: str) -> Strategy:
        if purpose not in self.inner:
            self.inner[purpose] = self.config.inner.bind(self.comm, self.workers)
        return self.inner[purpose]

    def sync(self, tensor: torch.Tensor, op: str = "mean") -> None:
        check_op(op, tensor.dtype, self.config.ops)
        if not tensor.dtype.is_floating_point:
            raise ValueError(f"compression = {self.settings.compression!r} compresses floating-point gradients: "
                             f"got a {tensor.dtype} tensor (accepted: float16, bfloat16, float32, float64)")
        if not tensor.is_contiguous():
            raise ValueError("sync() needs a contiguous tensor (flatten gradients into one buffer first)")
        flat = tensor.view(-1)
        kind = self.settings.compression
        if kind in HALF:
            wire = flat.to(HALF[kind])
            self._inner("full").sync(wire, op)
            flat.copy_(wire)
        elif kind == "topk":
            self._topk(flat, op)
        elif kind == "powersgd":
            self._powersgd(flat, op)
        else:
            self._inner("full").sync(flat, op)
        self.step += 1

    def _topk(self, flat: torch.Tensor, op: str) -> None:
        numel, n = flat.numel(), self.workers
        if numel > MAX_TOPK_NUMEL:
            raise ValueError(f"compression = 'topk' sends int32 indices: a bucket of {numel:,} elements is too "
                             f"large (accepted: up to {MAX_TOPK_NUMEL:,}; set bucket_mb)")
        k = topk_count(numel, self.settings.topk_ratio)
        acc = flat.detach().to(torch.float32)
        if self.settings.error_feedback and self.residual is not None:
            acc = acc + self.residual
        index = acc.abs().topk(k, sorted=False).indices if k else torch.empty(0, dtype=torch.long)
        values = acc[index]
        if self.settings.error_feedback:  # what was not sent, exactly: acc with the sent entries zeroed
            self.residual = acc.clone()
            self.residual[index] = 0
        slots = torch.zeros(n * 2 * k, dtype=torch.int32)
        mine = slots[self.rank * 2 * k:(self.rank + 1) * 2 * k]
        mine[:k] = index.to(torch.int32)
        mine[k:] = values.contiguous().view(torch.int32)
        self._inner("slots").sync(slots, "sum")
        out = torch.zeros(numel, dtype=torch.float32)
        for worker in range(n):  # in worker order on every rank: identical bits
            words = slots[worker * 2 * k:(worker + 1) * 2 * k]
            out.index_add_(0, words[:k].to(torch.long), words[k:].contiguous().view(torch.float32))
        if op == "mean":
            out /= n
        flat.copy_(out)

    def _powersgd(self, flat: torch.Tensor, op: str) -> None:
        numel, s = flat.numel(), self.settings
        rows, cols = matrix_shape(numel)
        rank = min(s.powersgd_rank, rows, cols)
        if self.step < s.powersgd_start or (rows + cols) * rank >= numel:
            self._inner("full").sync(flat, op)  # warm-up, or a buffer PowerSGD would not shrink
            return
        m = torch.zeros(rows * cols, dtype=torch.float32)
        m[:numel] = flat.detach().to(torch.float32)
        if s.error_feedback and self.residual is not None:
            m[:numel] += self.residual
        m = m.view(rows, cols)
        if self.q is None or not s.powersgd_warm_start:  # the same random Q on every rank: seeded by the step
            generator = torch.Generator().manual_seed(self.step)
            self.q = torch.randn(cols, rank, generator=generator)
        p = (m @ self.q).contiguous()
        self._inner("p").sync(p.view(-1), op)
        p = torch.linalg.qr(p).Q.contiguous()  # orthonormal columns, the same bits on every rank
        q = (m.t() @ p).contiguous()
        self._inner("q").sync(q.view(-1), op)
        self.q = q
        approx = (p @ q.t()).reshape(-1)[:numel]
        if s.error_feedback:  # this worker's matrix minus what the group agreed on
            self.residual = m.reshape(-1)[:numel] - approx
        flat.copy_(approx)


@dataclass(frozen=True)
class CompressedConfig(StrategyConfig):
    """A gradient strategy with compression: its settings, its analytic traffic per step (the compressed
    payload's, and PowerSGD's uncompressed warm-up steps), its runtime."""

    inner: StrategyConfig | None = None
    compression: Compression = Compression()
    summary = "a gradient strategy with compressed payloads"
    role = GRADIENTS
    ops = ("sum", "mean")
    runtime = CompressedSync

    def validate(self):
        inner = self.inner
        if inner is None or inner.role != GRADIENTS or inner.wraps_model:
            name = getattr(inner, "name", None)
            raise ValueError(f"compression = {self.compression.compression!r} applies to strategies that average "
                             f"gradients through sync() (ring, halving_doubling, ...): strategy {name!r} does not "
                             f"(accepted: compression = 'none' for it)")

    @property
    def name(self):
        return self.inner.name

    @property
    def exact(self):
        return self.inner.exact

    @property
    def identical(self):
        return self.inner.identical

    @property
    def counted(self):
        return self.inner.counted

    def num_servers(self, workers):
        return self.inner.num_servers(workers)

    def traffic(self, workers, numel, itemsize=4):
        """The steady state: a step after PowerSGD's warm-up."""
        return self.step_traffic(workers, numel, itemsize, step=math.inf)

    def step_traffic(self, workers, numel, itemsize=4, step=0):
        s, inner = self.compression, self.inner
        if s.compression in HALF:
            return inner.traffic(workers, numel, 2)
        if s.compression == "topk":
            return inner.traffic(workers, workers * 2 * topk_count(numel, s.topk_ratio), 4)
        if s.compression == "powersgd":
            rows, cols = matrix_shape(numel)
            rank = min(s.powersgd_rank, rows, cols)
            if step < s.powersgd_start or (rows + cols) * rank >= numel:
                return inner.traffic(workers, numel, itemsize)
            return add_traffic(inner.traffic(workers, rows * rank, 4), inner.traffic(workers, cols * rank, 4))
        return inner.traffic(workers, numel, itemsize)


def compress(config: StrategyConfig, settings: Compression) -> StrategyConfig:
    """The strategy with `settings` applied: itself for compression = 'none' (today's path, untouched)."""
    if settings.compression == "none":
        return config
    return CompressedConfig(inner=config, compression=settings)

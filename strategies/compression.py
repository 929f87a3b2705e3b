"""Gradient compression around any gradient-averaging strategy: fp16, bf16, PowerSGD and top-k, declared once.

`compress(config, settings)` wraps a strategy's config (strategies.make applies it from the run settings); the
wrapped strategy's own algorithm carries the compressed payload, so the wire holds the compressed bytes and
`traffic()` is the inner strategy's traffic of that payload, exactly:
- fp16 / bf16: the gradient cast to 16 bits, averaged by the strategy in that dtype, cast back (Horovod's fp16
  allreduce); half the bytes.
- powersgd (Vogels et al. 2019), as PyTorch's powerSGD_hook: each tensor of the bucket (its layout, declared by
  `set_shapes()`; training declares its parameters' shapes) is the matrix M of its own shape[0] x the rest, rank
  r = min(powersgd_rank, rows, cols); a tensor PowerSGD would not shrink at least twofold ((rows + cols) r x 2 >=
  rows x cols: biases, every 1-d tensor) goes uncompressed, all such tensors in one collective. For the
  compressed ones, P = M Q of every tensor in one collective, each P orthogonalized, Q = M^T P in one more,
  M ~ P Q^T. Error feedback keeps acc - what the group agreed on (torch's error_dict); warm start reuses the Qs.
  Before `powersgd_start` steps the buffer is averaged uncompressed, as the hook does. A buffer without a layout
  (verify, bench, the plug-in harness) is one tensor viewed as rows x cols, cols = ceil(sqrt(numel)), zero-padded.
- topk: each worker sends its k = ceil(ratio x numel) largest entries (of gradient + residual with error
  feedback: Deep Gradient Compression) as (index, value) pairs. Workers pick different indices, so the pairs are
  gathered: each worker writes its 2k int32 words (indices, then the values' float32 bits) into its own slot of
  an n x 2k buffer, zeros elsewhere, and the strategy sums it (x + 0 = x in integers: bit-exact). Every worker
  then adds the n sparse contributions in worker order (identical bits everywhere). The strategy's allreduce of
  n x 2k words carries what an allgather would, at its own cost (a ring: 2(n-1) x 2k words, twice an allgather's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from strategies.base import GRADIENTS, RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.ops import check_op
from strategies.wrapper import WrapperConfig

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk")
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
MAX_TOPK_NUMEL = 2**31 - 1  # indices travel as int32
MIN_COMPRESSION_RATE = 2  # PowerSGDState.min_compression_rate: compress a tensor only if it shrinks at least 2x


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
    """PowerSGD's view of a buffer without a layout: rows x cols with cols = ceil(sqrt(numel)), zero-padded."""
    cols = max(1, math.isqrt(max(numel - 1, 0)) + 1) if numel > 0 else 1
    return -(-numel // cols), cols


def topk_count(numel: int, ratio: float) -> int:
    """k = ceil(ratio x numel), at least 1 of a non-empty buffer."""
    return 0 if numel == 0 else min(numel, max(1, math.ceil(ratio * numel)))


@dataclass(frozen=True)
class Piece:
    """One tensor of a bucket as PowerSGD treats it: elements [offset, offset + numel) viewed as rows x cols
    (rows x cols > numel only for a buffer without a layout: zero-padded), compressed at `rank` (0: sent as is)."""

    offset: int
    numel: int
    rows: int
    cols: int
    rank: int


def check_layout(shapes) -> tuple[tuple[int, ...], ...]:
    """A bucket's tensor shapes in buffer order, as tuples of whole numbers >= 0; anything else refused."""
    try:
        out = tuple(tuple(int(d) for d in shape) for shape in shapes)
    except (TypeError, ValueError):
        raise ValueError(f"layout {shapes!r}: accepted is a sequence of tensor shapes (tuples of whole numbers), "
                         f"in buffer order") from None
    if any(d < 0 for shape in out for d in shape):
        raise ValueError(f"layout {shapes!r}: a dimension is negative (accepted: whole numbers >= 0)")
    return out


def powersgd_plan(numel: int, rank: int, shapes: Sequence[tuple[int, ...]] | None = None) -> tuple[Piece, ...]:
    """How PowerSGD at `rank` treats a buffer of `numel` elements holding tensors of these `shapes` (None: one
    tensor, the square view): torch's rule per tensor, matrix shape[0] x the rest, rank min(rank, rows, cols),
    compressed when (rows + cols) x rank x MIN_COMPRESSION_RATE < rows x cols."""
    if shapes is None:
        rows, cols = matrix_shape(numel)
        r = min(rank, rows, cols)
        return (Piece(0, numel, rows, cols, r if (rows + cols) * r * MIN_COMPRESSION_RATE < numel else 0),)
    pieces, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        rows = shape[0] if shape else 1
        cols = size // rows if rows else 0
        r = min(rank, rows, cols)
        pieces.append(Piece(offset, size, rows, cols, r if (rows + cols) * r * MIN_COMPRESSION_RATE < size else 0))
        offset += size
    if offset != numel:
        raise ValueError(f"layout {list(shapes)} holds {offset:,} elements, the buffer {numel:,}: accepted is the "
                         f"shapes of the tensors the buffer holds, in buffer order")
    return tuple(pieces)


class CompressedSync(Strategy):
    """Compress, let the inner strategy average the payload, decompress; one runtime per bucket (its step count,
    its layout, its error-feedback residual and PowerSGD's Qs are that bucket's)."""

    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.settings = config.compression
        self.wrapped_runtimes: dict[str, Strategy] = {}  # per payload (P, Q, rest, full): one size check each
        self.step = 0
        self.shapes: tuple[tuple[int, ...], ...] | None = None
        self.residual: torch.Tensor | None = None
        self.qs: list[torch.Tensor] | None = None

    def set_shapes(self, shapes: Sequence[tuple[int, ...]]) -> None:
        """The shapes of the tensors the synced buffer holds, in buffer order (training calls it once per bucket
        with its parameters' shapes): PowerSGD compresses each as a matrix of its own."""
        self.shapes = check_layout(shapes)

    def _inner(self, purpose: str) -> Strategy:
        if purpose not in self.wrapped_runtimes:
            self.wrapped_runtimes[purpose] = self.config.wrapped.bind(self.comm, self.workers)
        return self.wrapped_runtimes[purpose]

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
        index = acc.abs().topk(k, sorted=False).indices if k else torch.empty(0, dtype=torch.long, device=acc.device)
        values = acc[index]
        if self.settings.error_feedback:  # what was not sent, exactly: acc with the sent entries zeroed
            self.residual = acc.clone()
            self.residual[index] = 0
        slots = torch.zeros(n * 2 * k, dtype=torch.int32, device=acc.device)
        mine = slots[self.rank * 2 * k:(self.rank + 1) * 2 * k]
        mine[:k] = index.to(torch.int32)
        mine[k:] = values.contiguous().view(torch.int32)
        self._inner("slots").sync(slots, "sum")
        out = torch.zeros(numel, dtype=torch.float32, device=acc.device)
        for worker in range(n):  # in worker order on every rank: identical bits
            words = slots[worker * 2 * k:(worker + 1) * 2 * k]
            out.index_add_(0, words[:k].to(torch.long), words[k:].contiguous().view(torch.float32))
        if op == "mean":
            out /= n
        flat.copy_(out)

    def _powersgd(self, flat: torch.Tensor, op: str) -> None:
        numel, s = flat.numel(), self.settings
        plan = powersgd_plan(numel, s.powersgd_rank, self.shapes)
        compressed = [p for p in plan if p.rank]
        if self.step < s.powersgd_start or not compressed:
            self._inner("full").sync(flat, op)  # warm-up, or a buffer PowerSGD would not shrink
            return
        acc = flat.detach().to(torch.float32)
        if s.error_feedback and self.residual is not None:
            acc = acc + self.residual
        out = torch.empty(numel, dtype=torch.float32, device=acc.device)
        # the tensors sent as they are (biases, 1-d, small ones): one collective, in the buffer's dtype
        rest = [p for p in plan if not p.rank]
        if sum(p.numel for p in rest):
            wire = torch.cat([acc[p.offset:p.offset + p.numel] for p in rest]).to(flat.dtype)
            self._inner("rest").sync(wire, op)
            at = 0
            for p in rest:
                out[p.offset:p.offset + p.numel] = wire[at:at + p.numel]
                at += p.numel
        # the others: M = P Q^T per tensor, every tensor's P in one collective, then every Q
        matrices = []
        for p in compressed:
            m = acc[p.offset:p.offset + p.numel]
            if p.rows * p.cols != p.numel:  # the square view of a buffer without a layout: zero-padded
                m = torch.cat([m, m.new_zeros(p.rows * p.cols - p.numel)])
            matrices.append(m.view(p.rows, p.cols))
        if self.qs is None or not s.powersgd_warm_start:  # the same random Qs on every rank: seeded by the step
            generator = torch.Generator().manual_seed(self.step)
            # drawn on the host (one generator's bits on every rank and device), then moved to the buffer's device
            self.qs = [torch.linalg.qr(torch.randn(p.cols, p.rank, generator=generator)).Q.to(acc.device)
                       for p in compressed]
        ps = torch.cat([(m @ q).reshape(-1) for m, q in zip(matrices, self.qs)])
        self._inner("p").sync(ps, op)
        ps = [torch.linalg.qr(part.view(p.rows, p.rank)).Q  # orthonormal columns, the same bits on every rank
              for part, p in zip(ps.split([p.rows * p.rank for p in compressed]), compressed)]
        # Q = M^T P, computed as (P^T M)^T: the same sums, without multiplying a transposed view (16x faster on CPU
        # for a 512 x 2048 matrix, which the codec's time on the profile twins paid every step)
        qs = torch.cat([(pm.t() @ m).t().reshape(-1) for m, pm in zip(matrices, ps)])
        self._inner("q").sync(qs, op)
        self.qs = [part.view(p.cols, p.rank) for part, p in zip(qs.split([p.cols * p.rank for p in compressed]),
                                                                    compressed)]
        for p, pm, qm in zip(compressed, ps, self.qs):
            out[p.offset:p.offset + p.numel] = (pm @ qm.t()).reshape(-1)[:p.numel]
        if s.error_feedback:  # this worker's gradient (+ residual) minus what the group agreed on
            self.residual = acc - out
        flat.copy_(out)


@dataclass(frozen=True)
class CompressedConfig(WrapperConfig):
    """A gradient strategy with compression: its settings, its analytic traffic per step (the compressed
    payload's, and PowerSGD's uncompressed warm-up steps), its runtime."""

    compression: Compression = Compression()
    summary = "a gradient strategy with compressed payloads"
    role = GRADIENTS
    ops = ("sum", "mean")
    runtime = CompressedSync

    def validate(self):
        wrapped = self.wrapped
        if wrapped is None or wrapped.role != GRADIENTS or wrapped.wraps_model:
            name = getattr(wrapped, "name", None)
            raise ValueError(f"compression = {self.compression.compression!r} applies to strategies that average "
                             f"gradients through sync() (ring, halving_doubling, ...): strategy {name!r} does not "
                             f"(accepted: compression = 'none' for it)")

    def traffic(self, workers, numel, itemsize=4, shapes=None):
        """The steady state: a step after PowerSGD's warm-up."""
        return self.step_traffic(workers, numel, itemsize, step=math.inf, shapes=shapes)

    def step_traffic(self, workers, numel, itemsize=4, step=0, shapes=None):
        """One bucket's traffic at `step`; `shapes`: the tensors it holds (PowerSGD's layout, None: one tensor)."""
        s, inner = self.compression, self.wrapped
        if s.compression in HALF:
            return inner.traffic(workers, numel, 2)
        if s.compression == "topk":
            return inner.traffic(workers, workers * 2 * topk_count(numel, s.topk_ratio), 4)
        if s.compression == "powersgd":
            plan = powersgd_plan(numel, s.powersgd_rank, None if shapes is None else check_layout(shapes))
            compressed = [p for p in plan if p.rank]
            if step < s.powersgd_start or not compressed:
                return inner.traffic(workers, numel, itemsize)
            out = add_traffic(inner.traffic(workers, sum(p.rows * p.rank for p in compressed), 4),
                              inner.traffic(workers, sum(p.cols * p.rank for p in compressed), 4))
            rest = sum(p.numel for p in plan if not p.rank)
            return add_traffic(inner.traffic(workers, rest, itemsize), out) if rest else out
        return inner.traffic(workers, numel, itemsize)


def compress(config: StrategyConfig, settings: Compression) -> StrategyConfig:
    """The strategy with `settings` applied: itself for compression = 'none' (today's path, untouched)."""
    if settings.compression == "none":
        return config
    if hasattr(config, "compressed"):  # a strategy with its own compression path (ddp: DDP's comm hooks)
        return config.compressed(settings)
    return CompressedConfig(wrapped=config, compression=settings)

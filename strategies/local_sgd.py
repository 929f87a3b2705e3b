"""Local SGD and DiLoCo around any averaging strategy: workers step alone and average parameters every H steps.

`local_sgd(config, sync_every, outer)` wraps a strategy's config (strategies.make applies it from the run settings
`sync_every` and `outer_optimizer`). The wrapped config averages parameters (role PARAMETERS: the pipeline's
ParameterAveraging takes a local optimizer step, then calls sync() on the flat parameters); its runtime lets the
inner strategy average them on every H-th call only and leaves them alone otherwise (no bytes).
- outer_optimizer = "none" (torchft's LocalSGD): the average replaces the parameters.
- outer_optimizer = "nesterov" (DiLoCo, Douillard et al. 2023; torchft's DiLoCo): the averaged pseudo-gradient
  anchor - average goes to an outer SGD with Nesterov momentum (lr 0.7, momentum 0.9, the paper's) that steps
  the anchor, the parameters of the last synchronization; every worker continues from the new anchor.
sync_every = 1 is not wrapped at all: today's strategy, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strategies.base import GRADIENTS, PARAMETERS, RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.wrapper import WrapperConfig

OUTER_OPTIMIZERS = ("none", "nesterov")


@dataclass(frozen=True)
class LocalSgd:
    """A run's local-SGD settings: the sync period H and the outer optimizer on the averaged pseudo-gradient."""

    sync_every: int = 1
    outer_optimizer: str = "none"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        out = []
        h = self.sync_every
        if not isinstance(h, int) or isinstance(h, bool) or not 1 <= h <= 1_000_000:
            out.append(f"sync_every = {h!r}: accepted are whole numbers 1 (every step: today's training) to "
                       f"1,000,000")
        if self.outer_optimizer not in OUTER_OPTIMIZERS:
            out.append(f"outer_optimizer = {self.outer_optimizer!r}: accepted are "
                       f"{', '.join(map(repr, OUTER_OPTIMIZERS))} (nesterov: DiLoCo)")
        for key, low, high in (("outer_lr", 0.0, 100.0), ("outer_momentum", 0.0, 1.0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high \
                    and not (key == "outer_momentum" and value == 0):
                out.append(f"{key} = {value!r}: accepted are numbers > {low:g} and < {high:g}"
                           + (" (or 0)" if key == "outer_momentum" else ""))
        if self.outer_optimizer == "nesterov" and self.sync_every == 1:
            out.append("outer_optimizer = 'nesterov' with sync_every = 1: DiLoCo's outer step needs inner steps "
                       "between syncs (accepted: sync_every >= 2, or outer_optimizer = 'none')")
        return out


class PeriodicAverage(Strategy):
    """Average the parameters through the wrapped strategy on every H-th call; DiLoCo's outer step after it."""

    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.wrapped = config.wrapped.bind(comm, workers)
        self.step = 0
        self.anchor: torch.nn.Parameter | None = None
        self.outer: torch.optim.Optimizer | None = None

    def start(self, params: torch.Tensor) -> None:
        """The parameters every worker starts from (seeded, identical), before any local step: DiLoCo's first
        anchor. Training calls it once; a caller that does not (sync() alone) starts from the first synced tensor."""
        settings = self.config.local
        if settings.outer_optimizer == "nesterov":
            self.anchor = torch.nn.Parameter(params.detach().clone())
            self.outer = torch.optim.SGD([self.anchor], lr=settings.outer_lr, momentum=settings.outer_momentum,
                                         nesterov=True)

    def sync(self, tensor: torch.Tensor, op: str = "mean") -> None:
        if op != "mean" or not tensor.dtype.is_floating_point:
            raise ValueError(f"sync_every = {self.config.local.sync_every} averages floating-point parameters: got "
                             f"op {op!r} on {tensor.dtype} (accepted: op 'mean' on a float tensor)")
        settings = self.config.local
        outer = settings.outer_optimizer == "nesterov"
        if outer and self.anchor is None:
            self.start(tensor)
        self.step += 1
        if self.step % settings.sync_every:
            return  # a local step: nothing moves
        self.wrapped.sync(tensor, op)
        if outer:
            self.anchor.grad = self.anchor.detach() - tensor  # the averaged pseudo-gradient (anchor - average)
            self.outer.step()
            tensor.copy_(self.anchor.detach())


@dataclass(frozen=True)
class LocalSgdConfig(WrapperConfig):
    """An averaging strategy synchronized every H steps: traffic on the H-th step of each period, none between."""

    local: LocalSgd = LocalSgd()
    summary = "local SGD / DiLoCo: average parameters every sync_every steps"
    role = PARAMETERS
    ops = ("mean",)
    runtime = PeriodicAverage

    def validate(self):
        wrapped = self.wrapped
        if wrapped is None or wrapped.role not in (GRADIENTS, PARAMETERS) or wrapped.wraps_model:
            name = getattr(wrapped, "name", None)
            raise ValueError(f"sync_every = {self.local.sync_every} applies to strategies that average through "
                             f"sync() (ring, halving_doubling, decentralized, ...): strategy {name!r} does not "
                             f"(accepted: sync_every = 1 for it)")

    def traffic(self, workers, numel, itemsize=4):
        """A synchronizing step's traffic (the wrapped strategy's); steps between syncs move nothing."""
        return self.wrapped.traffic(workers, numel, itemsize)

    def step_traffic(self, workers, numel, itemsize=4, step=0, shapes=None):
        """Step `step`'s traffic: the wrapped strategy's on every H-th step, nothing between (shapes: unused)."""
        if (step + 1) % self.local.sync_every == 0:
            return self.wrapped.traffic(workers, numel, itemsize)
        idle = self.wrapped.traffic(workers, 0, itemsize)
        return Traffic(tuple(RankTraffic(r.role, 0, 0, 0, 0) for r in idle.ranks), 0, 0, idle.counted)


def local_sgd(config: StrategyConfig, settings: LocalSgd) -> StrategyConfig:
    """The strategy synchronized every settings.sync_every steps: itself for sync_every = 1 (today's path)."""
    if settings.sync_every == 1:
        return config
    return LocalSgdConfig(wrapped=config, local=settings)

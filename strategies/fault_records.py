"""What a run with injected failures records (the failures, the mixing matrices, the run's end), the event a failed
rank raises, and the gradient call every recovery path shares: below fault_runs.py and fault_replicas.py, which both
use them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from strategies.faults import RunEnded


class RankFailed(RuntimeError):  # noqa: N818 - an injected event, raised on purpose
    """The injected death of a rank during a step."""

    def __init__(self, slot: int, step: int):
        super().__init__(f"rank {slot} failed during step {step} (injected)")
        self.slot, self.step = slot, step


@dataclass(frozen=True)
class FailureRecord:
    """One failure and what it cost: steps lost (completed steps redone), seconds from the death to its detection,
    and seconds from the detection to the recovered group's first step (re-forming or restarting, fetching
    parameters)."""

    step: int
    rank: int
    steps_lost: int
    recovery_s: float  # from the detection to the recovered group's first step (NaN: not recovered)
    survivors: int  # workers that ran the step after it
    detection_s: float = math.nan  # from the death to its detection (every survivor stopped, the failure known)


@dataclass(frozen=True)
class Mixing:
    """Decentralized, after a re-weighting: the survivors (original ranks), their W and its spectral gap."""

    step: int
    survivors: tuple[int, ...]
    matrix: np.ndarray
    spectral_gap: float


@dataclass
class FaultRun:
    params: dict[int, np.ndarray]  # live slot -> its parameters at the end (server: "server" key, barrier-free)
    completed_steps: int  # steps the run completed (the step counter it reached)
    steps_run: int  # steps executed, those redone after a restart included
    failures: list[FailureRecord] = field(default_factory=list)
    mixings: list[Mixing] = field(default_factory=list)
    pushes: dict[int, int] = field(default_factory=dict)  # barrier-free PS: pushes per worker slot
    ended: RunEnded | None = None
    wall_s: float = math.nan  # seconds from the first segment's start to the end (NaN: not measured here)
    starts_s: list[float] = field(default_factory=list)  # seconds each replacement rank took to start (Ray actors)


def _grad(gradient, slot: int, step: int, x: torch.Tensor) -> torch.Tensor:
    g = torch.as_tensor(np.asarray(gradient(slot, step, x.numpy()), dtype=x.numpy().dtype))
    if g.shape != x.shape:
        raise ValueError(f"gradient(slot={slot}, step={step}) returned shape {tuple(g.shape)}, the parameters "
                         f"have {tuple(x.shape)}")
    return g.clone()

"""Replaying a compute profile (workloads/profile_format.py) through autograd: ReplayModel sleeps through the
profile's forward, releases each gradient at its measured ready time and ends backward on time, while the real
gradient buffers are synchronized.
"""

from __future__ import annotations

import time

import torch

from workloads.profile_format import Profile, ProfileError

# -- replay ---------------------------------------------------------------------------------------------

_EARLY_S = 1e-3  # a deadline closer than this is taken as reached: a wake-up can cost more than that on busy cores


def _sleep_until(deadline: float) -> None:
    """Sleep until a time.perf_counter() deadline (absolute deadlines: a late wake-up does not accumulate).

    Gradients whose ready times lie within 1 ms of each other are released together, without a sleep each:
    on loaded cores every sleep wakes late, and 62 late wake-ups in a row added 20-50 ms to a 180 ms backward."""
    left = deadline - time.perf_counter()
    if left > _EARLY_S:
        time.sleep(left)


class _BackwardClock:
    """Shared by one ReplayModel's autograd functions: when the current backward pass started."""

    backward_start = 0.0


class _StartBackward(torch.autograd.Function):
    """The last operation of the replayed forward, so the first of backward: it notes when backward starts."""

    @staticmethod
    def forward(ctx, x, clock):
        ctx.clock = clock
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.backward_start = time.perf_counter()
        return grad, None


class _ReleaseGradient(torch.autograd.Function):
    """One parameter's step of the replayed backward: wait until the profile says its gradient is ready, then
    hand autograd the stored real gradient. Autograd accumulates it into `param.grad` and runs the parameter's
    post-accumulate-grad hooks (syncbench's bucket readiness, DDP's reducer) exactly as in a real backward."""

    @staticmethod
    def forward(ctx, x, param, gradient, clock, ready_s):
        ctx.gradient, ctx.clock, ctx.ready_s = gradient, clock, ready_s
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _sleep_until(ctx.clock.backward_start + ctx.ready_s)
        return grad, ctx.gradient, None, None, None


class ReplayModel(torch.nn.Module):
    """Replays a profile's timeline instead of computing: forward sleeps, backward releases each parameter's
    gradient at its measured time (in the measured order), `optimizer_step()` sleeps for the optimizer.

    `params` are the real model's parameters (registration order; they stay its parameters, so flat buffers,
    optimizers and DDP see the same tensors), `gradients` a real gradient for each (from a real backward pass),
    which every replayed backward accumulates again. `slowdown` stretches every time (a straggler).
    Call `begin_step()` at the start of each step: the forward's deadline counts from there.
    """

    def __init__(self, profile: Profile, params: list[torch.nn.Parameter], gradients: list[torch.Tensor],
                 slowdown: float = 1.0):
        super().__init__()
        if [p.numel() for p in params] != list(profile.numels):
            raise ProfileError(f"profile {profile.id}: its parameter sizes do not match the model's "
                               f"({len(profile.params)} vs {len(params)} parameters)")
        self.profile = profile
        self.weights = torch.nn.ParameterList(params)
        self.gradients = [g.detach() for g in gradients]
        self.scale = float(slowdown)
        self.clock = _BackwardClock()
        # backward visits the functions in reverse order of application: apply the last-ready parameter first
        self.order = sorted(range(len(params)), key=lambda i: profile.params[i].ready_s, reverse=True)
        self.step_start = time.perf_counter()

    def begin_step(self) -> None:
        self.step_start = time.perf_counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """A scalar 'loss' whose backward replays the profile's backward; returns at the forward's deadline."""
        out = torch.zeros(1, device=self.gradients[0].device)
        for i in self.order:
            out = _ReleaseGradient.apply(out, self.weights[i], self.gradients[i], self.clock,
                                         self.profile.params[i].ready_s * self.scale)
        out = _StartBackward.apply(out, self.clock).sum()
        _sleep_until(self.step_start + self.profile.forward_s * self.scale)
        return out

    def finish_backward(self) -> None:
        """After loss.backward(): wait out the rest of the measured backward pass."""
        _sleep_until(self.clock.backward_start + self.profile.backward_s * self.scale)

    def optimizer_step(self) -> None:
        """The optimizer's measured time (the parameters are not updated: profile mode measures time)."""
        _sleep_until(time.perf_counter() + self.profile.optimizer_s * self.scale)

"""What a worker computes per step, declared: the members the step loop (experiments/pipeline/train.py) calls.

Two substrates implement it: the measured one (measured.py's MeasuredCompute: the model, or a replayed profile, on
the wall clock) and the simulated one (experiments/simulate/substrate.py's SimulatedCompute: a timeline on the
simulated clock). The step loop calls only what this class declares; the optional members have defaults here
that say "not on this substrate", so the loop never probes a compute object for a member.
"""

from __future__ import annotations

import math


class Compute:
    """The step loop's view of what a worker computes.

    Required (each substrate defines them): clock, threaded, trains, wraps, flat, numel, on_ready, begin_step(),
    forward_backward(), synchronize(), straggle(), optimizer_step(), take_parameters(), loss_value(),
    consensus_distance(), final().

    Optional, with defaults below:
      hook_state       ddp through a strategy: DDP's buckets on a communication thread (None elsewhere)
      evaluates        whether evaluate(metric) can score a trained model (a run with a target needs it)
      server_update()  the optimizer of parameter-server shards run beside this worker (colocated servers)
      close()          the run is over: release what the compute holds
      forward_end      when this step's forward ended, on the compute's clock (a traced step's phases; NaN: unknown)
      straggles        whether straggle() spends the straggler's extra time as a phase of its own (a traced step)
    """

    hook_state = None
    evaluates = False
    forward_end = math.nan
    straggles = False

    def evaluate(self, metric: str) -> float:
        raise ValueError(f"{type(self).__name__} does not train a model to evaluate {metric!r} on "
                         f"(accepted: a measured run with compute = \"real\")")

    def server_update(self):
        raise ValueError(f"{type(self).__name__} cannot run servers beside its workers (colocated "
                         f"update mode): use placement = \"dedicated\" or mode = \"summation\" here")

    def close(self) -> None:
        """Nothing held by default."""

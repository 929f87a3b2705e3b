"""A strategy config around another: what compression (compression.py) and local SGD (local_sgd.py) share.

The wrapped config (`wrapped`; not `inner`, which is hierarchical's setting naming its within-node strategy) is
the registered strategy: the wrapper keeps its name, its exactness, whether its ranks end
identical, whether its bytes are counted, its servers and (an inexact one's) mixing matrix, and changes only what
a step sends (traffic, step_traffic) and does (runtime). Subclasses check what they accept to wrap in validate().
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import StrategyConfig


@dataclass(frozen=True)
class WrapperConfig(StrategyConfig):
    """`wrapped`'s facts, forwarded: name, exact, identical, counted, num_servers, mixing_matrix, spectral_gap."""

    wrapped: StrategyConfig | None = None
    step_dependent = True  # compression's warm-up, local SGD's steps between syncs

    @property
    def name(self):
        return self.wrapped.name

    @property
    def exact(self):
        return self.wrapped.exact

    @property
    def identical(self):
        return self.wrapped.identical

    @property
    def counted(self):
        return self.wrapped.counted

    def num_servers(self, workers):
        return self.wrapped.num_servers(workers)

    def mixing_matrix(self, workers, round=0):
        return self.wrapped.mixing_matrix(workers, round)

    def spectral_gap(self, workers, round=0):
        return self.wrapped.spectral_gap(workers, round)

    def unwrapped(self):
        return self.wrapped.unwrapped()

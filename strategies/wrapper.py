"""A strategy config around another: what compression (compression.py) and local SGD (local_sgd.py) share.

The wrapped config is the registered strategy: the wrapper keeps its name, its exactness, whether its ranks end
identical, whether its bytes are counted, its servers and (an inexact one's) mixing matrix, and changes only what
a step sends (traffic, step_traffic) and does (runtime). Subclasses check what they accept to wrap in validate().
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import StrategyConfig


@dataclass(frozen=True)
class WrapperConfig(StrategyConfig):
    """`inner`'s facts, forwarded: name, exact, identical, counted, num_servers, mixing_matrix, spectral_gap."""

    inner: StrategyConfig | None = None

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

    def mixing_matrix(self, workers, round=0):
        return self.inner.mixing_matrix(workers, round)

    def spectral_gap(self, workers, round=0):
        return self.inner.spectral_gap(workers, round)

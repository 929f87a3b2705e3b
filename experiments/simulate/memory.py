"""How much memory a simulation will take, before it starts: refused when it would not fit, never killed.

A simulation runs in a process forked from this one (child.run_child): it starts with this process's anonymous
resident memory (a fork copies those page tables; file-backed pages such as torch's libraries count only once the
child touches them: about 100 MB of them do) and grows by what every simulated rank holds (a SimGrid actor and its
OS thread, the rank's communicator, strategy and step rows) plus what every message of a step keeps alive (ring
posts all its n - 1 receives of a phase up front and waits its sends at the end: views and handles per message).
Measured on the 2-core development machine (peak resident set of the forked process, SimGrid 3.32, Python 3.11;
docs/simulation.md):

    halving_doubling, alpha_beta, one ResNet-50 step, peak MiB from a process of 318 MiB anonymous memory:
        256 ranks (4,096 messages) 467, 1,024 (20,480) 544, 4,096 (98,304) 867-944, 16,384 (458,752) 3,640
    ring, the same: 128 ranks (32,512 messages) 511, 256 (130,560) 698, 512 (523,264) 1,319

The constants below are fitted to those peaks; the estimate is meant to refuse what cannot fit (a 16,384-rank
run asked of a machine with 2 GB free), not to predict to the megabyte.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
# Fitted (least squares on relative error) to the seven peaks above: each predicted within 0.84-1.15x
TOUCHED = 98 << 20  # bytes of file-backed pages (libraries) a simulation touches
PER_RANK = 115 * 1024  # bytes each simulated rank adds to the peak
PER_MESSAGE = 1750  # bytes each message of one step adds (ring keeps every round's views and handles alive)
HEADROOM = 0.9  # of the memory available, what a simulation may plan to use (the rest: this process, the OS)


@dataclass(frozen=True)
class MemoryEstimate:
    """A simulation's expected peak resident memory: what the forked process starts with plus its growth."""

    start_bytes: int  # what the fork starts with and touches regardless of size: this process's anonymous memory now
    # plus TOUCHED
    ranks: int
    messages: int

    @property
    def growth_bytes(self) -> int:
        return self.ranks * PER_RANK + self.messages * PER_MESSAGE

    @property
    def peak_bytes(self) -> int:
        return self.start_bytes + self.growth_bytes

    def describe(self) -> str:
        return (f"about {self.peak_bytes / MiB:,.0f} MiB ({self.start_bytes / MiB:,.0f} MiB to start + "
                f"{self.ranks:,} ranks x {PER_RANK // 1024} KiB + {self.messages:,} messages x {PER_MESSAGE:,} B)")


def estimate(ranks: int, messages: int) -> MemoryEstimate:
    """The peak of a simulation of `ranks` SimGrid actors moving `messages` messages, forked from this process."""
    return MemoryEstimate(anonymous_bytes() + TOUCHED, int(ranks), int(messages))


def anonymous_bytes() -> int:
    """This process's anonymous resident memory (RssAnon, Linux; its peak resident set elsewhere, 0 if unknown)."""
    found = proc_bytes("/proc/self/status", "RssAnon")
    if found is not None:
        return found
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        return 0


def available_bytes() -> int | None:
    """Memory the kernel can give without swapping (MemAvailable), or None where it does not say."""
    return proc_bytes("/proc/meminfo", "MemAvailable")


def proc_bytes(path: str, field: str) -> int | None:
    """A `field: N kB` line of a /proc file in bytes (/proc/meminfo, /proc/PID/status), or None where it is not."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_memory(text: str) -> int:
    """'8GB', '512MiB', '2G', '1.5GiB' -> bytes (GB = 10^9, GiB = 2^30; a bare G or M is binary, as `free -g`)."""
    units = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
             "gib": 1 << 30, "tib": 1 << 40, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    raw = str(text).strip().lower().replace(" ", "")
    number = raw.rstrip("kmgtib")
    unit = raw[len(number):] or "b"
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or not 0 < value < float("inf"):
        raise ValueError(f"memory {text!r}: expected a positive size such as 8GB, 512MiB or 2G")
    return int(value * units[unit])


def refusal(needed: MemoryEstimate, limit: int | None = None, what: str = "this simulation") -> str | None:
    """Why `needed` cannot run (naming both numbers), or None. `limit`: the user's --max-memory in bytes; without
    one, 90% of what the machine has available now."""
    if limit is not None:
        if needed.peak_bytes > limit:
            return (f"{what} would need {needed.describe()}, over --max-memory {limit / MiB:,.0f} MiB: "
                    f"accepted is fewer ranks or a larger --max-memory")
        return None
    available = available_bytes()
    if available is None:
        return None
    budget = int(HEADROOM * available)  # the fork's starting pages are this process's, already resident
    if needed.growth_bytes > budget:
        return (f"{what} would need {needed.describe()}: its {needed.growth_bytes / MiB:,.0f} MiB of growth is over "
                f"the {budget / MiB:,.0f} MiB this machine can give it (90% of {available / MiB:,.0f} MiB "
                f"available): accepted is fewer ranks, or --max-memory to state the limit yourself")
    return None

"""The commands a namespace cluster runs (ip, tc) and the error every part of it raises."""

from __future__ import annotations

import subprocess


class ClusterError(RuntimeError):
    """The cluster cannot be created, reached or removed; says what failed and what to do."""


def _sh(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join((text or "").strip().splitlines()[-lines:])

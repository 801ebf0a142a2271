"""Figures the benchmarks share: nearest-rank percentiles and a process's memory."""

from __future__ import annotations

from collections.abc import Sequence


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of the sorted, non-empty ``ordered``: the value at the position
    ``q * (n - 1)`` rounded half up."""
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def status_mib(pid: int, field: str, default: float) -> float:
    """A figure of ``/proc/<pid>/status`` in kB (``VmRSS``, ``VmHWM``) as MiB; ``default``
    when the process is gone or has no such line."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return default

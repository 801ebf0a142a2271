"""Figures the benchmarks share: nearest-rank percentiles and a process's memory."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler import native


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


def provenance() -> dict[str, Any]:
    """Where a measurement was made: the commit (``+dirty`` with uncommitted changes), the
    machine (cores, CPU model, memory), Python and how it ran the policy core (compiled
    or not: ``scheduler.native``), the time and the load average at the end."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    model = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    memory_gib = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 2**30
    return {
        "commit": commit,
        "machine": f"{os.cpu_count()} cores, {model}, {memory_gib:.0f} GiB",
        "python": platform.python_version(),
        "core": native.mode(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": round(os.getloadavg()[0], 1),
    }

"""Stale gang eviction: a running gang below its minimum for longer than the grace period
(``stale_gang_grace_ms``) is evicted whole (rule ``stale-gang``), so it can be placed
again instead of holding GPUs it cannot use."""

from __future__ import annotations

from scheduler.core.session import Emit
from scheduler.core.state import RUNNING, State, wake
from scheduler.core.victims import preemption


def evict_stale_gangs(state: State, emit: Emit) -> None:
    """Evict each stale gang past its grace period; wake when the next one falls due."""
    grace = state.config.stale_gang_grace_ms
    for job_id in list(state.stale):
        job = state.jobs[job_id]
        since = job.stale_since
        if since is None or job.status != RUNNING:
            continue
        if state.now - since < grace:
            wake(state, since + grace)
            continue
        emit(preemption(job, state.now, None, "stale-gang"))

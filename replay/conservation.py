"""Work conservation, measured: time during which GPUs sat idle while a job that fits waited.

A ``ConservationMonitor`` observes a simulation after every cycle. After a cycle it asks
whether some pending job could start right now on the capacity that is free and not
spoken for by a live reservation (``State.reserved``: nodes held for a blocked job whose
start is still ahead, or unknown). If one could, the time until the next cycle counts as
*idle while a fitting job waits*, and so do the idle GPUs over that time. A
work-conserving policy keeps both at zero; a policy that holds capacity back by its own
rules (a queue's limit, non-preemptible work only within deserved quota) shows it here,
and ``held_by_rule`` says how much of it was such a job.

The check is a dry run of every pending job's placement (free capacity only, nothing
evicted), skipping jobs that ask at least as much as one that already failed, and stops at
the first job that fits. It runs at most once per ``every_ms`` of simulated time; between
checks the last answer holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.admission import admission_reason
from scheduler.core.fairshare import Shares, fair_shares
from scheduler.core.placement import FailedShapes, Statement
from scheduler.core.running import NEVER
from scheduler.core.state import GANG_POLICIES, Job, State

MINUTE_MS = 60_000


@dataclass(slots=True)
class ConservationMonitor:
    """Call ``observe(state, now)`` after each cycle; read the totals at the end."""

    every_ms: int = MINUTE_MS
    waiting_ms: int = 0
    """Time with a fitting job waiting and free GPUs (or, for a CPU-only job, free room)."""
    idle_gpu_ms: int = 0
    """Milli-GPU x ms idle outside reservations while a fitting job waited."""
    held_by_rule_ms: int = 0
    """Part of ``waiting_ms`` where every fitting job was held by its queue's limit or
    quota rule (so the policy's own rules, not its search, left the capacity idle)."""
    _at: int = 0
    _checked: int = -1
    _last: tuple[bool, int, bool] = (False, 0, False)

    def observe(self, state: State, now: int) -> None:
        """Charge the interval since the last cycle, then look at the state as it is now."""
        elapsed = now - self._at
        if elapsed > 0:
            waiting, idle, by_rule = self._last
            if waiting:
                self.waiting_ms += elapsed
                self.idle_gpu_ms += idle * elapsed // 1000
                if by_rule:
                    self.held_by_rule_ms += elapsed
        self._at = now
        if self._checked >= 0 and now - self._checked < self.every_ms:
            return
        self._checked = now
        self._last = _fitting_job_waits(state)

    @property
    def waiting_minutes(self) -> float:
        """``waiting_ms`` in minutes."""
        return self.waiting_ms / MINUTE_MS

    @property
    def idle_gpu_hours(self) -> float:
        """``idle_gpu_ms`` in GPU-hours."""
        return self.idle_gpu_ms / 1000 / 3_600_000


def _fitting_job_waits(state: State) -> tuple[bool, int, bool]:
    """(a pending job fits outside live reservations, idle milli-GPUs there, and every
    such job is held back by a limit or the non-preemptible quota rule)."""
    now = state.now
    skip = {n: None for n, start in state.reserved.items() if start > now or start == NEVER}
    idle = sum(
        n.free_gpu_milli for n in state.nodes.values() if not n.cordoned and n.name not in skip
    )
    failed = FailedShapes()
    shares = fair_shares(state) if state.policy in GANG_POLICIES else None
    held_only = True
    found = False
    jobs = state.jobs
    for _, _, job_id in state.pending:
        job = jobs[job_id]
        if job.placements or job.backoff_until > now or not failed.may_fit(job):
            continue
        if job.request[0] and not idle:
            continue
        with Statement(state.nodes, index=state.free_index()) as stmt:
            fits = stmt.place_gang(job, skip=skip or None) is not None
        if not fits:
            failed.add(job)
            continue
        found = True
        if not _held_by_rule(state, job, shares):
            held_only = False
            break
    return (found, idle, found and held_only)


def _held_by_rule(state: State, job: Job, shares: Shares | None) -> bool:
    """Whether the gang policy's own admission rules keep the job out now (a queue's
    limit up its tree, or non-preemptible work beyond deserved quota)."""
    queue = state.queues.get(job.queue)
    if shares is None or queue is None:
        return False
    return admission_reason(state, queue, job, shares) is not None

"""Work conservation, measured: time during which GPUs sat idle while a job that fits waited.

A ``ConservationMonitor`` observes a simulation after every cycle. After a cycle it asks
whether some pending job could start right now on the capacity that is free and not
spoken for by a live reservation (``State.reserved``: nodes held for a blocked job whose
start is still ahead, or unknown). If one could, the time until the next cycle counts as
*idle while a fitting job waits*, and so do the idle GPUs over that time. A
work-conserving policy keeps both at zero; a policy that holds capacity back by its own
rules (a queue's limit, non-preemptible work only within deserved quota) shows it here,
and ``held_by_rule`` says how much of it was such a job.

The check is the core's dry run of every pending job's placement
(``scheduler.core.fitting``, ``fitting_jobs``: free capacity
only, nothing evicted, nodes scored as the gang policy scores them), skipping jobs that ask
at least as much as one that already failed, and stops at the first job that fits and that
no rule holds back. It runs at most once per ``every_ms`` of simulated time; between
checks the last answer holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core import State, fitting_job_waits

MINUTE_MS = 60_000


@dataclass(slots=True)
class ConservationMonitor:
    """Call ``observe(state, now)`` after each cycle; read the totals at the end."""

    every_ms: int = MINUTE_MS
    waiting_ms: int = 0
    """Time with a fitting job waiting and free GPUs (or, for a CPU-only job, free room)."""
    idle_gpu_ms: int = 0
    """GPU-ms idle outside reservations while a fitting job waited."""
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
        self._last = fitting_job_waits(state)

    @property
    def waiting_minutes(self) -> float:
        """``waiting_ms`` in minutes."""
        return self.waiting_ms / MINUTE_MS

    @property
    def idle_gpu_hours(self) -> float:
        """``idle_gpu_ms`` in GPU-hours."""
        return self.idle_gpu_ms / 3_600_000

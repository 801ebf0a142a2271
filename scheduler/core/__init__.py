"""The pure policy core: ``State``, ``apply(state, event, at)``, ``cycle(state, now)``.

Nothing in this package performs I/O, reads a clock, draws an unseeded random number or
depends on hash order; ``tests/test_core_purity.py`` enforces the import side of that.
"""

from scheduler.core.apply import apply, lost_work, retire_ended
from scheduler.core.fairshare import Shares, fair_shares
from scheduler.core.fitting import fitting_job_waits, fitting_jobs, live_reservations
from scheduler.core.policy import POLICIES, REVISION, cycle
from scheduler.core.reasons import gpus
from scheduler.core.state import (
    PRIORITY_CLASSES,
    Job,
    Node,
    Queue,
    State,
    ended_attempt,
    ended_status,
)

__all__ = [
    "POLICIES",
    "PRIORITY_CLASSES",
    "REVISION",
    "Job",
    "Node",
    "Queue",
    "Shares",
    "State",
    "apply",
    "cycle",
    "ended_attempt",
    "ended_status",
    "fair_shares",
    "fitting_job_waits",
    "fitting_jobs",
    "gpus",
    "live_reservations",
    "lost_work",
    "retire_ended",
]

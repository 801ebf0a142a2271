"""The scheduling cycle: ``cycle(state, now) -> decisions``.

``gpuledger`` — the hierarchical gang policy (docs/policy.md explains every rule) — runs
its actions in this order, each in a module of its own:

1. ``stale.evict_stale_gangs``: stale gangs past their grace period are evicted
   (``stale-gang``);
2. ``allocate.allocate``: fair shares are divided once per cycle (with time-based usage
   when configured); queue by queue in KAI-Scheduler's order (``admission.queue_order``),
   each queue's next eligible job is admitted against every ancestor's limit
   (non-preemptible work only within deserved quota, ``admission``), placed
   all-or-nothing through a statement, and if it does not fit room is made by the rules
   of ``victims.RULES`` (backfill, reclaim, preempt), then by ``consolidation``;
3. ``backfill``: a job that still cannot start reserves the nodes it will get at the
   earliest time it can (EASY backfill); later jobs may use the gap only if they end
   before that time or are preemptible — without backfill, its queue waits behind it;
4. ``neverfits``: a job that can never fit the cluster as it stands is rejected at once
   with a reason (``reasons`` words every wait).

``fifo``, ``drf`` and ``easy`` are the baselines in ``scheduler.core.baselines``.

Every decision is applied to the state as it is made, so later steps of the same cycle
see it; the caller appends the returned decisions to the ledger after the inputs.
"""

from __future__ import annotations

from typing import Final

import msgspec

from events.model import (
    POLICY_KNOBS,
    CycleCompleted,
    Event,
    JobTerminated,
    PolicyConfigured,
)
from scheduler.core import baselines
from scheduler.core.allocate import allocate
from scheduler.core.apply import apply
from scheduler.core.fairshare import accrue_usage
from scheduler.core.neverfits import reject_impossible
from scheduler.core.session import Emit
from scheduler.core.stale import evict_stale_gangs
from scheduler.core.state import ACTIVE, State

REVISION: Final = 17
"""Semantics revision of this core; recorded in ``policy_configured`` by writers."""

KAI_KNOBS: Final[dict[str, object]] = {k.field: k.kai_event for k in POLICY_KNOBS if k.set_by_kai}
"""The knobs of ``policy_configured`` that policy ``kai`` sets, in the ledger's units: each
knob's ``kai`` value (``events.knobs.Knob``), KAI-Scheduler's choice where gpuledger
deliberately differs (docs/policy.md, "Where gpuledger differs from KAI-Scheduler").
Consolidation stays off where pods cannot be moved (live ledgers)."""


def kai_knobs(config: PolicyConfigured) -> PolicyConfigured:
    """``config`` as policy ``kai``: the gang policy with ``KAI_KNOBS`` in force."""
    knobs = dict(KAI_KNOBS)
    if not config.requeue_lost:
        knobs["consolidation"] = False
    return msgspec.structs.replace(config, policy="kai", **knobs)


POLICIES: Final = ("gpuledger", "kai", "drf", "fifo", "easy")
"""Policy names; ``kai`` is the gang policy with ``KAI_KNOBS``."""


def cycle(state: State, now: int) -> list[Event]:
    """Run one scheduling cycle at ``now``; return (and apply) its decisions.

    The last decision is always ``CycleCompleted``, which marks the cycle's boundary in
    the ledger so replay can run the very same cycles.
    """
    state.now = max(state.now, now)
    decisions: list[Event] = []

    def emit(event: Event) -> None:
        decisions.append(event)
        apply(state, event, state.now)

    due = state.wakeup is not None and state.wakeup <= state.now
    if due:
        state.wakeup = None
    if state.broken:
        _end_broken(state, emit)
    if state.policy == "fifo":
        # kube-scheduler never rejects: a pod that cannot fit waits, fresh or not.
        if state.dirty:
            baselines.fifo(state, emit)
    else:
        _queued(state, emit, run=state.dirty or due)
    if state.config.half_life_ms > 0:
        state.usage_alloc = {q.name: q.allocated[0] for q in state.leaf_queues()}
    # A cycle runs until nothing more can start; the next one would change nothing until
    # an input makes the state dirty again or a time-based rule falls due. Applying
    # CycleCompleted records that (clean, no fresh jobs), here as in any fold of the ledger.
    emit(CycleCompleted(decisions=len(decisions)))
    return decisions


def _queued(state: State, emit: Emit, *, run: bool) -> None:
    """The policies that reject what never fits (``gpuledger``, ``drf``, ``easy``): usage
    accrues, fresh jobs that never fit are rejected, and when ``run`` (an input or a
    time-based rule is due) the policy's actions run."""
    if state.config.half_life_ms > 0:
        accrue_usage(state)
    if state.fresh:
        reject_impossible(state, emit)
    if not run:
        return
    state.reserved = {}
    if state.policy == "drf":
        baselines.drf(state, emit)
        return
    if state.policy == "easy":
        baselines.easy(state, emit)
        return
    if state.config.stale_gang_eviction and state.stale:
        evict_stale_gangs(state, emit)
    allocate(state, emit)


def _end_broken(state: State, emit: Emit) -> None:
    """End every job that can no longer run as placed (``State.broken``), in the order they
    broke: the binder evicts its pods still in the cluster (those on a live node that have
    not finished, and those left on a removed node)."""
    for job_id, reason in list(state.broken.items()):
        job = state.jobs.get(job_id)
        if job is None or job.status not in ACTIVE:
            del state.broken[job_id]
            continue
        pods = tuple(
            p.pod
            for p in job.placements.values()
            if p.pod not in job.finished or p.node not in state.nodes
        )
        emit(JobTerminated(job=job_id, queue=job.queue, pods=pods, reason=reason))

"""Allocate: the gang policy's main action, queue by queue in KAI-Scheduler's order.

Each queue's next eligible job is admitted (``admission``), placed all-or-nothing in a
statement, and if it is the queue's head and does not fit, room is made (``victims``:
backfill, reclaim, preempt; then ``consolidation``). A head that still cannot start
blocks its queue: with backfill it reserves nodes (``backfill``) and the jobs behind it
may use the gap; without, the queue waits behind it for the cycle.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final, Literal

from events.model import PodPlacement, PodsAllocated
from scheduler.core.admission import (
    admission_headroom,
    admission_reason,
    kai_ranked,
    limited,
    queue_order,
    quota_reason,
)
from scheduler.core.backfill import (
    backfill_for,
    blocked_nodes,
    carried_plans,
    keep_plans,
    missed,
    reserve,
)
from scheduler.core.blocked import blocked_reason
from scheduler.core.consolidation import consolidate
from scheduler.core.headroom import Headroom, held_back
from scheduler.core.pendingblocks import Key
from scheduler.core.placement import (
    FailedShapes,
    Statement,
    binpack_score,
    job_shape,
    spread_score,
)
from scheduler.core.reasons import Reason, backoff_reason
from scheduler.core.running import NEVER, held_resources
from scheduler.core.session import Emit, Session
from scheduler.core.state import PENDING, FailedMemo, Job, Node, Queue, State
from scheduler.core.victims import make_room, preemption

Tried = Literal["placed", "failed", "skipped"]
"""What trying a job came to (``_try_job``)."""

_NUMBERED: Final = 4096
"""Skip keys (``skip_id``) or kept-off node sets (``_kept_off``) numbered before the
numbering starts afresh (``renumber``): a live scheduler meets new ones for as long as it
runs."""


def allocate(state: State, emit: Emit) -> None:
    """Start what can start, queue by queue, until every queue is done for the cycle."""
    tuning = state.tuning
    if len(state.kept_off_ids_cache) > _NUMBERED or len(state.skip_ids_cache) > _NUMBERED:
        renumber(state)
    leaves = [q for q in state.leaf_queues() if q.pending]
    s = Session(
        state,
        emit,
        leaves,
        planned=carried_plans(state) if tuning.carry_plans else {},
        known_failed=carried_failures(state) if tuning.carry_failures else None,
    )
    while (queue := _next_queue(s)) is not None:
        index = s.cursor.get(queue.name, 0)
        job = state.jobs[queue.pending[index][2]]
        if job.backoff_until > state.now:
            s.note(job, partial(backoff_reason, job))
            s.cursor[queue.name] = index + 1
            continue
        head = queue.name not in s.blocked and job.job not in s.requeued
        if queue.name in s.blocked and _no_room_left(s, queue):
            s.done[queue.name] = None  # nothing behind the blocked head could be placed
            continue
        _step(s, queue, job, index, head=head)
    for r in s.reservations:
        for node in r.nodes:
            state.reserved[node] = min(r.start, state.reserved.get(node, r.start))
    keep_plans(s)
    keep_failures(s)


def renumber(state: State) -> None:
    """Forget the numbers given to skip keys and kept-off node sets, and every memo that
    holds one: the numbers each job's shape caches, the pending blocks' summaries (keyed
    by skip key; their held runs hold none) and the failures carried over (keyed by node
    set). A cycle after it numbers them afresh as it meets them; numbers are only ever
    compared with each other, so it decides the same (``tests/test_skip_held.py``)."""
    state.skip_ids_cache.clear()
    state.kept_off_ids_cache.clear()
    state.failed_cache = None
    for shape in state.shape_cache.values():
        shape.skip_id = -2
    for blocks in state.blocks_cache.values():
        blocks.summaries = [None] * len(blocks.summaries)
        blocks.grew = [None] * len(blocks.grew)


def carried_failures(state: State) -> FailedShapes | None:
    """What found no room by the end of the last cycle (``keep_failures``), while no event
    since has given capacity back or changed a node (``State.freed_cache``): a job of
    those shapes, kept off the same nodes, finds no room again.

    Unlike ``Session.failed`` it only spares the placement tries: a job it rules out
    counts as tried and failed, as it would have (so a queue's ``Tuning.backfill_tries``
    run out as they would)."""
    memo = state.failed_cache
    if memo is None or memo.freed != state.freed_cache or not memo.failures:
        return None
    known = FailedShapes(state.shape_cache, exact_gangs=state.tuning.exact_gangs)
    known.failed = memo.failures
    return known


def keep_failures(s: Session) -> None:
    """Keep what found no room by the end of the cycle for the next one
    (``carried_failures``): this cycle's failures since its last eviction, and those it
    was given (dropped at an eviction too)."""
    failures = s.failed.failed
    if s.known_failed is not None:
        if failures:
            s.failed.absorb(s.known_failed.failed)
        else:
            failures = s.known_failed.failed
    s.state.failed_cache = FailedMemo(s.state.freed_cache, failures)


def _step(s: Session, queue: Queue, job: Job, index: int, *, head: bool) -> None:
    """Try the job at ``index`` of the queue's pending list, and move the queue's walk on
    by what came of it."""
    passing = head and queue.name in s.passed
    tried, reason = _admit(s, queue, job, head=head, passing=passing)
    if tried == "placed":
        _placed(s, job)
        return  # the job left pending; the same index is now the next job
    s.cursor[queue.name] = index + 1
    if passing and reason is not None:
        return  # held back as the head passed over before it (``_skip_known``)
    if head:
        _blocked(s, queue, job, reason)
    elif tried == "failed" and reason is None:
        missed(s, queue, job)  # behind a blocked head: a placement into the gap failed
        # Its shape is in ``Session.failed`` now, kept off the same nodes: a later job of
        # the same skip key would be ruled out there (``skipped``) until a placement,
        # reservation or eviction, each of which empties ``skipping``.
        _skipped(s, queue, job)
    elif queue.name in s.blocked:
        # Held back by its queue's limit or quota, or ruled out by the memo of failed
        # shapes: nothing was tried, so it is no backfill try (a queue's rules must not
        # use up the tries that a job its rules admit would have had).
        _skipped(s, queue, job)


def skip_id(state: State, job: Job) -> int:
    """The job's skip key as a number, the same for equal keys (-1: it has none).

    The skip key (``JobShape.skip``, worked out once per pending job by
    ``placement.job_shape``) is what decides whether a job behind a blocked head is
    skipped (``_try_job``), when that is all: its shape (``FailedShapes``: whether the
    memo rules it out), the nodes it must keep off (``blocked_nodes``: by preemptibility
    and expected runtime) and its admission (``admission_reason``: by its request and
    preemptibility, against queue state that only placements change). The walk compares
    the numbers (``State.skip_ids_cache``), not the nested tuples."""
    shape = state.shape_cache.get(job.job)
    if shape is None or shape.job is not job:
        shape = job_shape(state.shape_cache, job, exact_gangs=state.tuning.exact_gangs)
    found = shape.skip_id
    if found == -2:
        ids = state.skip_ids_cache
        found = shape.skip_id = -1 if shape.skip is None else ids.setdefault(shape.skip, len(ids))
    return found


def _skipped(s: Session, queue: Queue, job: Job) -> None:
    """A job behind the queue's blocked head was skipped: remember its skip key."""
    key = skip_id(s.state, job)
    if key < 0:
        return
    if s.skipping_queue != queue.name:
        s.skipping.clear()
        s.skipping_queue = queue.name
    s.skipping[key] = None


def _skip_known(s: Session, queue: Queue, index: int) -> int:
    """The index of the blocked queue's next job to look at: past every job from
    ``index`` on that the walk would only skip, as admission holds it back
    (``admission_held``) or its skip key was skipped already in this walk
    (``Session.skipping``).

    Behind a blocked head a job is tried only if it is out of back-off, the walk goes on
    (``_no_room_left``), admission lets it and the memo of failed shapes does not rule
    it out. A job admission holds back there is skipped and decides nothing; a job whose
    skip key was skipped since the last placement, reservation or eviction (which empty
    ``skipping``) would be skipped for the same reasons. Neither changes between
    placements and evictions (which empty ``Session.headroom`` too). A congested queue's
    backlog is passed over here instead of being tried job by job."""
    if queue.name not in s.blocked and queue.name not in s.passed:
        return index
    pending = queue.pending
    end = len(pending)
    # The first few jobs one by one: a walk that stops among them needs no blocks.
    tuning = s.state.tuning
    probe = min(index + tuning.probe, end) if tuning.skip_held and tuning.held_blocks else end
    at = _skip_jobs(s, queue, index, probe)
    if at == probe < end:
        at = _pass_blocks(s, queue, at)
    if at != index:
        s.cursor[queue.name] = at
    return at


def _pass_blocks(s: Session, queue: Queue, at: int) -> int:
    """``_skip_known`` from ``at`` on by blocks of the pending order (``pendingblocks``): a
    block whose every job admission holds back, or that holds only skip keys skipped
    already, is passed over whole; the first other block job by job. The index where the
    walk stops (or the end).

    A run of blocks admission holds back whole is kept (``PendingBlocks.held``): a later
    walk, in this cycle or another, passes over it in one step while the queue's headroom
    is no larger (a congested queue's held backlog is then not summed up block by block at
    every cycle)."""
    state = s.state
    pending = queue.pending
    end = len(pending)
    blocks = state.pending_blocks(queue)
    limited = s.limited[queue.name]
    room = _headroom(s, queue)
    now = state.now
    first: Key | None = None  # where the run of blocks held back whole being passed began
    held = blocks.held
    if held is not None and held.holds(pending[at], limited, room, now):
        first = held.first
        at = end if held.stop is None else bisect_left(pending, held.stop)
    skipping = s.skipping if queue.name == s.skipping_queue else None
    if at < end:
        block = blocks.block(pending[at])
        start = bisect_left(pending, blocks.starts[block])
    while at < end:
        stop = start + blocks.counts[block]
        summary = blocks.summaries[block] or blocks.summary(
            block, pending, start, state.jobs, lambda job: skip_id(state, job)
        )
        if summary.all_held(limited, room, now):
            first = pending[start] if first is None else first
        else:
            blocks.keep(first, pending[start], limited, room, now)
            first = None
            if skipping is None or not summary.passes(limited, room, now, skipping):
                at = _skip_jobs(s, queue, at, stop)
                if at < stop:
                    return at
        at = stop
        block += 1
        start = stop
    blocks.keep(first, None, limited, room, now)
    return at


def _skip_jobs(s: Session, queue: Queue, at: int, stop: int) -> int:
    """``_skip_known`` job by job from ``at``: the index of the first job it would not
    skip, or ``stop``. Behind a blocked head it also passes over (remembering its skip
    key, as ``_step`` would) a job that its step would only skip (``_ruled_out``)."""
    pending = queue.pending
    jobs = s.state.jobs
    now = s.state.now
    skipping = s.skipping if queue.name == s.skipping_queue else None
    state = s.state
    cache = state.shape_cache
    held = s.state.tuning.skip_held
    limited = s.limited[queue.name]
    room = _headroom(s, queue) if held else (NEVER, NEVER, NEVER, NEVER)
    behind = held and queue.name in s.blocked
    while at < stop:
        job = jobs[pending[at][2]]
        if job.backoff_until > now:
            break
        if held and held_back(limited, room, job.request, job.preemptible):
            at += 1
            continue
        if skipping is not None:
            shape = cache.get(job.job)
            key = shape.skip_id if shape is not None and shape.job is job else -2
            if key == -2:
                key = skip_id(state, job)
            if key in skipping:
                at += 1
                continue
        if not (behind and _ruled_out(s, queue, job)):
            break
        _skipped(s, queue, job)
        skipping = s.skipping if queue.name == s.skipping_queue else None
        at += 1
    return at


def _ruled_out(s: Session, queue: Queue, job: Job) -> bool:
    """A job behind the queue's blocked head that its step (``_step``) would only skip,
    trying nothing and deciding nothing: admission holds it back (``_admit``), or a job
    asking no less found no room on the same nodes in this cycle (``_try_job``'s
    ``skipped``)."""
    if _admission(s, queue, job) is not None:
        return True
    _, kept_off = _kept_off(s, job)
    return not s.failed.may_fit(job, kept_off)


def _headroom(s: Session, queue: Queue) -> Headroom:
    """``admission_headroom`` of the queue, worked out once between placements and
    evictions (``_placed``, ``_reopen``)."""
    room = s.headroom.get(queue.name)
    if room is None:
        room = s.headroom[queue.name] = admission_headroom(s.state, queue, s.shares)
    return room


def _admit(
    s: Session, queue: Queue, job: Job, *, head: bool, passing: bool = False
) -> tuple[Tried, Reason | None]:
    """Admit and try the job: what came of it, and why admission held it back (None: it
    did not). A head held back only by a limit may still start by preempting
    lower-priority jobs of its own queue that bring every limit back within bounds; the
    jobs tried after a head admission held back (``passing``) do not, as that head
    tried already."""
    state = s.state
    reason = _admission(s, queue, job)
    if reason is None:
        return _try_job(s, queue, job, head=head), None
    if passing or not (head and state.config.preempt) or quota_reason(state, queue, job, s.shares):
        return "failed", reason
    tried = _try_preempting(s, queue, job)
    return tried, (None if tried == "placed" else reason)


def _admission(s: Session, queue: Queue, job: Job) -> Reason | None:
    """``admission_reason`` for the job, worked out once per request and preemptibility in
    the queue until a placement or eviction changes what the queues hold (``_placed``,
    ``_reopen``): it depends on nothing else of the job, and a congested queue asks it of
    up to ``Tuning.backfill_tries`` jobs behind its blocked head in every cycle. None
    without asking for a preemptible job where no limit applies: admission never holds
    one back."""
    if job.preemptible and not s.limited[queue.name]:
        return None
    key = (queue.name, job.request, job.preemptible)
    if key in s.admissions:
        return s.admissions[key]
    reason = s.admissions[key] = admission_reason(s.state, queue, job, s.shares)
    return reason


def _next_queue(s: Session) -> Queue | None:
    """The first queue in order that still has a job to try (None: the cycle is done),
    its cursor moved past the jobs it would only skip (``_skip_known``).

    Order keys change only when allocations change: after a placement the queue placed
    in moves to its new place, or every queue is ranked again (``_rerank``); in between
    queues only drop out.
    """
    if s.moved and s.ranked:
        _rerank(s)
    s.moved = ""
    if not s.ranked:
        heads = _heads(s)
        leaves = [q for q in s.leaves if q.name in heads]
        if s.state.config.queue_order == "kai":
            s.ranked = kai_ranked(s.state, leaves, s.shares, heads)
            s.ranked_keys = []
        else:
            keyed = sorted((queue_order(q, s.shares, heads[q.name]), q) for q in leaves)
            s.ranked = [q for _, q in keyed]
            s.ranked_keys = [key for key, _ in keyed]
        s.ranked_heads = {name: job.job for name, job in heads.items()}
        s.at = 0
    ranked = s.ranked
    while s.at < len(ranked):
        queue = ranked[s.at]
        if queue.name not in s.done:
            index = s.cursor.get(queue.name, 0)
            if s.skipping or (s.state.tuning.skip_held and (s.blocked or s.passed)):
                index = _skip_known(s, queue, index)
            if index < len(queue.pending):
                return queue
        s.at += 1
    return None


def _rerank(s: Session) -> None:
    """After a placement in ``Session.moved``: the flat order with only that queue moved to
    its new place, when every other queue is ranked by the same head job as before (its
    order key depends on nothing else a placement elsewhere changes: its own allocation,
    its first pending job and the cycle's shares). Otherwise ``ranked`` is emptied, to be
    ranked anew."""
    if not s.ranked_keys or not s.state.tuning.rerank_moved:
        s.ranked = []  # ``kai``'s order ranks ancestors too: every key may have moved
        return
    moved = s.moved
    heads = _heads(s)
    before = s.ranked_heads
    if len(heads) - (moved in heads) != len(before) - (moved in before) or any(
        name != moved and before.get(name) != job.job for name, job in heads.items()
    ):
        s.ranked = []
        return
    at = next((i for i, q in enumerate(s.ranked) if q.name == moved), None)
    if at is not None:
        del s.ranked[at]
        del s.ranked_keys[at]
    head = heads.get(moved)
    if head is not None:
        queue = s.state.queues[moved]
        key = queue_order(queue, s.shares, head)
        where = bisect_left(s.ranked_keys, key)
        s.ranked.insert(where, queue)
        s.ranked_keys.insert(where, key)
    s.ranked_heads = {name: job.job for name, job in heads.items()}
    s.at = 0


def _heads(s: Session) -> dict[str, Job]:
    """Per leaf with pending jobs, the job its queue is ranked by: the first job it will
    try. With backfill a head its own limit or quota holds back is passed over before
    the queues are ranked (``_pass_held_head``), so a queue is judged by the job it
    would start, not by one its rules keep waiting (KAI-Scheduler ranks a queue by the
    job it tries next as well)."""
    jobs = s.state.jobs
    backfill = s.state.config.backfill
    heads: dict[str, Job] = {}
    for queue in s.leaves:
        pending = queue.pending
        if not pending:
            continue
        at = 0
        if backfill and queue.name not in s.blocked and queue.name not in s.done:
            at = _pass_held_head(s, queue)
        heads[queue.name] = jobs[pending[min(at, len(pending) - 1)][2]]
    return heads


def _pass_held_head(s: Session, queue: Queue) -> int:
    """Pass over the queue's head if its own limit or quota holds it back (saying so), and
    the held jobs after it (``_past_held``): the index of the job the queue tries next.
    A head held by a limit alone is left to its turn, where it may preempt lower-priority
    jobs of its own queue (``_admit``)."""
    state = s.state
    at = s.cursor.get(queue.name, 0)
    if queue.name not in s.passed:
        if at:
            return 0  # the head was tried already in this cycle
        job = state.jobs[queue.pending[0][2]]
        if job.backoff_until > state.now or job.job in s.requeued:
            return 0
        reason = _admission(s, queue, job)
        if reason is None:
            return 0
        if state.config.preempt and not quota_reason(state, queue, job, s.shares):
            return 0
        s.note(job, lambda: reason)
        s.passed[queue.name] = None
        at = 1
    # the same jobs either way; ``_skip_known`` passes over whole held blocks
    at = _skip_known(s, queue, at) if s.state.tuning.skip_held else _past_held(s, queue, at)
    s.cursor[queue.name] = at
    return at


def _past_held(s: Session, queue: Queue, at: int) -> int:
    """The index of the queue's first job from ``at`` on that admission does not hold
    back (``admission_held``), or that is backing off (it is told so in its turn). The
    job-by-job form of what ``_skip_known`` passes over, for ``Tuning.skip_held`` off."""
    pending = queue.pending
    jobs = s.state.jobs
    now = s.state.now
    limited = s.limited[queue.name]
    room = _headroom(s, queue)
    while at < len(pending):
        job = jobs[pending[at][2]]
        if job.backoff_until > now or not held_back(limited, room, job.request, job.preemptible):
            break
        at += 1
    return at


def _no_room_left(s: Session, queue: Queue) -> bool:
    """No GPU is free anywhere and every job the queue has waiting asks for one: a walk on
    behind its blocked head would try each of them in vain (it decides nothing), so a
    congested cycle costs the queues' heads, not their whole backlogs."""
    if s.free_gpu is None:
        s.free_gpu = s.state.free_schedulable()
    if s.free_gpu > 0:
        return False
    gpuless = s.gpuless.get(queue.name)
    if gpuless is None:  # (``State.wanted`` counts its pending jobs asking for no GPU)
        gpuless = s.gpuless[queue.name] = s.state.wanted(queue)[3] > 0
    return not gpuless


def _placed(s: Session, job: Job) -> None:
    """Count the job's resources as placed this cycle up its queue's chain, and drop what the
    placement made stale: the queue order and the reservations planned."""
    held = held_resources(job)
    for q in s.state.ancestors(job.queue):
        row = s.shares.placed.setdefault(q.name, [0, 0, 0])
        for resource, amount in enumerate(held):
            row[resource] += amount
    s.moved = job.queue  # its order key changed (``_rerank``)
    s.planned.clear()
    s.free_gpu = None
    s.skipping.clear()
    s.admissions.clear()
    s.headroom.clear()
    s.kept_by = None


def _blocked(s: Session, queue: Queue, job: Job, reason: Reason | None) -> None:
    """The queue's head could not start: it blocks the queue, and says why it waits."""
    s.skipping.clear()  # skips were judged in another queue, or before this reservation
    if not s.state.config.backfill:
        s.done[queue.name] = None  # first in, first out: the queue waits behind it
        s.note(job, lambda: reason or blocked_reason(s, queue, job, None))
        return
    if reason is not None:
        # Held back by its queue's limit or quota, not by capacity: it reserves nothing
        # and blocks nothing. The next job the queue's rules admit is its head instead,
        # and makes room or reserves as a head does.
        s.note(job, lambda: reason)
        s.passed[queue.name] = None
        return
    s.blocked[queue.name] = None
    s.heads[queue.name] = job.job
    if not s.state.config.reservations:
        # KAI-Scheduler's backfill: nothing is held for a blocked head
        s.note(job, lambda: blocked_reason(s, queue, job, None))
        return
    reserve(s, queue, job)


def _requeued(s: Session, victim: Job) -> None:
    """A victim that went back to pending (where lost work is re-run) is tried again in
    this cycle on free capacity: its queue's walk resumes from it, and a queue that had
    nothing pending at the start of the cycle joins the walk. It makes no room for itself
    in this cycle (no chain of reclaims within one cycle)."""
    if victim.status != PENDING:
        return
    queue = s.state.queues.get(victim.queue)
    if queue is None:
        return
    if all(q.name != queue.name for q in s.leaves):
        s.leaves.append(queue)
        s.limited[queue.name] = limited(s.state, queue.name)
    s.requeued[victim.job] = None
    s.gpuless.pop(queue.name, None)
    index = bisect_left(queue.pending, victim.pending_key)
    s.cursor[queue.name] = min(s.cursor.get(queue.name, 0), index)
    s.done.pop(queue.name, None)
    s.ranked = []


def score_for(state: State, queue: Queue, job: Job) -> Callable[[Node, int], tuple[int, str]]:
    """How the job's pods pick nodes: its own placement strategy, else its queue's, else
    the policy's (binpack unless spread)."""
    strategy = job.placement or queue.placement or state.config.placement
    return spread_score if strategy == "spread" else binpack_score


@dataclass(slots=True)
class _Plan:
    """What starting a job takes: its placements, the victims evicted for it (with the
    rule), and the jobs moved to defragment (with where they go)."""

    placements: list[PodPlacement]
    evicted: list[tuple[Job, str]]
    moves: list[tuple[Job, list[PodPlacement]]]

    def __init__(
        self,
        placements: list[PodPlacement],
        evicted: list[tuple[Job, str]] | None = None,
        moves: list[tuple[Job, list[PodPlacement]]] | None = None,
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.placements = placements
        self.evicted = [] if evicted is None else evicted
        self.moves = [] if moves is None else moves


def _try_job(s: Session, queue: Queue, job: Job, *, head: bool) -> Tried:
    """Place one admitted job; a queue's head may also make room. The caller records why
    a job waits (one reason per cycle: a capacity wait, or the reservation made for it).
    ``skipped``: a job asking no less already found no room on the same nodes this cycle,
    so nothing was tried (``Session.failed``).
    """
    state = s.state
    allowed, kept_off = _kept_off(s, job)
    if not head and not s.failed.may_fit(job, kept_off):
        return "skipped"
    # Found no room by the end of the last cycle and none given back since: it fails.
    known = s.known_failed is not None and not s.known_failed.may_fit(job, kept_off)
    if known and not head:
        s.failed.add(job, kept_off)
        return "failed"
    plan: _Plan | None = None
    with Statement(
        state.nodes, score=score_for(state, queue, job), index=state.free_index()
    ) as stmt:
        placements = None
        if s.reserved_nodes and (allowed is None or job.preemptible) and not known:
            # A job that may use reserved nodes (it gives way when the reservation starts)
            # goes elsewhere if it can: every job backfilled there is work lost later.
            placements = stmt.place_gang(job, skip=s.reserved_nodes)
        if placements is None and not known:
            placements = stmt.place_gang(job, skip=allowed)
        if placements is not None:
            plan = _Plan(placements)
        else:
            s.failed.add(job, kept_off)
            if head:
                plan = _make_room(s, queue, job, stmt, allowed)
    if plan is None:
        return "failed"
    _commit(s, job, plan)
    return "placed"


def _try_preempting(s: Session, queue: Queue, job: Job) -> Tried:
    """A head held back by a limit: it starts only by preempting lower-priority jobs of
    its own queue that bring every limit back within bounds and make room
    (``victims.make_room``; never on free capacity alone, which would take the queue
    over its limit)."""
    state = s.state
    allowed, _ = _kept_off(s, job)
    with Statement(
        state.nodes, score=score_for(state, queue, job), index=state.free_index()
    ) as stmt:
        placements, evicted = make_room(s, queue, job, stmt, allowed)
    if placements is None:
        return "failed"
    _commit(s, job, _Plan(placements, evicted))
    return "placed"


def _kept_off(s: Session, job: Job) -> tuple[dict[str, None] | None, int]:
    """``blocked_nodes`` for the job, and a number for that set of nodes (0: none) that
    the memos of failed shapes key on (``State.kept_off_ids_cache``): worked out once per
    preemptibility and expected runtime, all it depends on besides the reservations made
    so far (``Session.kept_off`` is emptied when they change)."""
    key = (job.preemptible, job.expected_runtime_ms)
    found = s.kept_off.get(key)
    if found is None:
        allowed = blocked_nodes(s.state, job, s.reservations)
        number = 0
        if allowed:
            ids = s.state.kept_off_ids_cache
            number = ids.setdefault(tuple(allowed), len(ids) + 1)
        found = s.kept_off[key] = (allowed, number)
    return found


def _make_room(
    s: Session, queue: Queue, job: Job, stmt: Statement, allowed: dict[str, None] | None
) -> _Plan | None:
    """Room for a queue's head: by the victim rules, else (where pods can be re-run, not
    live) by consolidation."""
    placements, evicted = make_room(s, queue, job, stmt, allowed)
    if placements is not None:
        return _Plan(placements, evicted)
    config = s.state.config
    if not (config.consolidation and config.requeue_lost):
        return None
    placements, moves = consolidate(s.state, job, stmt, allowed, s.victims)
    if placements is None:
        return None
    return _Plan(placements, [(moved, "consolidation") for moved, _ in moves], moves)


def _commit(s: Session, job: Job, plan: _Plan) -> None:
    """Emit the plan's decisions: evictions, moves, then the job's placement."""
    if plan.evicted:
        s.failed.clear()  # evictions free capacity: what failed before may fit now
        s.known_failed = None
    for victim, rule in plan.evicted:
        s.emit(preemption(victim, s.state.now, job, rule))
        _requeued(s, victim)
    for moved, where in plan.moves:
        s.emit(PodsAllocated(job=moved.job, queue=moved.queue, placements=tuple(where)))
    s.emit(
        PodsAllocated(
            job=job.job,
            queue=job.queue,
            placements=tuple(plan.placements),
            backfill_for=backfill_for(s.reservations, plan.placements),
        )
    )
    if plan.evicted:
        _reopen(s)


def _reopen(s: Session) -> None:
    """Evictions can free more than the job they were for takes (a victim's pods on nodes
    the gang does not use, victims a limit needed): every queue is walked again from its
    head, with the reservations worked out anew, so nothing that now fits is left waiting.
    Each reopening follows a placement, and victims make no room in the cycle, so the
    cycle still ends."""
    s.done.clear()
    s.blocked.clear()
    s.passed.clear()
    s.cursor.clear()
    s.misses.clear()
    s.reservations.clear()
    s.reserved_nodes.clear()
    s.kept_off.clear()
    s.ranked = []
    s.skipping.clear()
    s.admissions.clear()
    s.headroom.clear()
    s.kept_by = None

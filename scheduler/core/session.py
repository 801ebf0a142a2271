"""The gang policy's working data for one cycle, handed to each of its actions.

A cycle of the gang policy runs its actions (``scheduler.core.policy``) over one
``Session``: what they decided so far (reservations made, queues done with), where each
queue's walk stands, and what they learnt that later attempts reuse (gang shapes that
found no room, reservations by shape). It lives for one cycle and is never stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from events.model import Event
from scheduler.core.admission import limited
from scheduler.core.backfill import RunningEnds
from scheduler.core.fairshare import Shares, cycle_shares
from scheduler.core.headroom import Headroom
from scheduler.core.placement import FailedShapes
from scheduler.core.reasons import Reason, note_reason
from scheduler.core.state import Job, Queue, Reservation, State
from scheduler.core.victims import Victims

Emit = Callable[[Event], None]
"""Record a decision: appended to the cycle's decisions and applied to the state at once."""


@dataclass(slots=True)
class Session:
    """One cycle of the gang policy: its inputs, its decisions so far, its memos."""

    state: State
    emit: Emit
    shares: Shares
    victims: Victims
    running: RunningEnds
    leaves: list[Queue]
    """The leaf queues with pending jobs when the cycle began."""
    limited: dict[str, bool]
    """Per leaf in ``leaves``: whether it or an ancestor has a limit (``admission.limited``)."""
    reservations: list[Reservation]
    """Nodes held for blocked queue heads, in the order they were made (backfill)."""
    reserved_nodes: dict[str, None]
    """Every node some reservation of this cycle holds (``backfill.reserve`` adds them)."""
    planned: dict[tuple[object, ...], Reservation | None]
    """Reservations by plain gang shape (the same shape on the same nodes reserves the same
    nodes at the same time) and by job with the jobs backfilled under it, until a
    placement changes the nodes (then cleared; ``backfill._planned``)."""
    kept_off: dict[tuple[bool, int | None], tuple[dict[str, None] | None, int]]
    """Per (preemptible, expected runtime): the nodes such a job keeps off
    (``backfill.blocked_nodes``) and their number, while the reservations stay as they are
    (``allocate._kept_off``; emptied when one is made or all are dropped)."""
    failed: FailedShapes
    """Jobs that found no room, by shape: free capacity only shrinks between evictions, so
    a job asking no less fails too (cleared when victims are evicted)."""
    known_failed: FailedShapes | None
    """What found no room by the end of the last cycle, while nothing gave capacity back
    (``allocate.carried_failures``; dropped when victims are evicted)."""
    ranked: list[Queue]
    """The queues in order (``admission.queue_order``); emptied when the order keys may all
    have changed, and ranked again."""
    ranked_keys: list[tuple[int, int, int, int, int, str]]
    """Under the flat order, each ranked queue's order key (empty under ``kai``'s)."""
    ranked_heads: dict[str, str]
    """The job each ranked queue was ranked by."""
    moved: str
    """The leaf a placement moved since the ranking: only its order key changed, unless
    another queue's head did (``allocate._rerank``)."""
    at: int
    """Position in ``ranked`` of the next queue to try."""
    cursor: dict[str, int]
    """Per queue, the index in its pending list of the next job to try."""
    blocked: dict[str, None]
    """Queues whose head could not start: behind it only backfill into the gap is tried."""
    passed: dict[str, None]
    """Queues whose head their own limit or quota holds back (with backfill): capacity is
    not what it waits for, so the next job the queue's rules admit is tried as its head
    (``allocate._blocked``), and the held jobs on the way are passed over as that head."""
    heads: dict[str, str]
    """Per blocked queue, its head (named in the reasons of the jobs behind it)."""
    misses: dict[str, int]
    """Per blocked queue, failed backfill attempts (``Tuning.backfill_tries``)."""
    requeued: dict[str, None]
    """Victims of this cycle sent back to pending: tried again, but make no room."""
    free_gpu: int | None
    """Milli-GPUs free on schedulable nodes (None: to be summed; reset by each placement)."""
    gpuless: dict[str, bool]
    """Per queue: whether any of its pending jobs asked for no GPU when first asked in the
    cycle (``allocate._no_room_left``; dropped when a victim goes back to it)."""
    done: dict[str, None]
    """Queues with nothing more to try this cycle."""
    skipping: dict[int, None]
    """Skip keys (``allocate.skip_id``) of jobs behind the blocked head of the queue being
    walked that were skipped (``failed``) since the last placement, reservation or
    eviction: a later job of the same key in that queue is skipped as well."""
    skipping_queue: str
    """The queue whose walk ``skipping`` belongs to."""
    admissions: dict[tuple[str, tuple[int, int, int], bool], Reason | None]
    """``admission_reason`` by (queue, request, preemptible) since the last placement or
    eviction (``allocate._admission``)."""
    headroom: dict[str, Headroom]
    """Per queue, ``admission_headroom`` since the last placement or eviction: whether
    admission holds a job back, without wording why (``allocate._skip_known``)."""
    kept_by: frozenset[str] | None
    """The rules keeping the GPUs of the queues above their deserved quota from reclaim
    (``blocked._kept_by``), since the last placement or eviction (None: to be worked out)."""

    def __init__(
        self,
        state: State,
        emit: Emit,
        leaves: list[Queue],
        *,
        planned: dict[tuple[object, ...], Reservation | None],
        known_failed: FailedShapes | None,
    ) -> None:
        """A cycle over ``leaves`` begins: the cycle's shares, victims and running ends are
        worked out, ``planned`` and ``known_failed`` carried over from the last cycle
        (``backfill.carried_plans``, ``allocate.carried_failures``), every memo empty.
        (Written out: compiled, a dataclass's generated ``__init__`` runs as Python.)"""
        self.state = state
        self.emit = emit
        self.shares = cycle_shares(state)
        self.victims = Victims(state)
        self.running = RunningEnds(state)
        self.leaves = leaves
        self.limited = {q.name: limited(state, q.name) for q in leaves}
        self.reservations = []
        self.reserved_nodes = {}
        self.planned = planned
        self.kept_off = {}
        self.failed = FailedShapes(state.shape_cache, exact_gangs=state.tuning.exact_gangs)
        self.known_failed = known_failed
        self.ranked = []
        self.ranked_keys = []
        self.ranked_heads = {}
        self.moved = ""
        self.at = 0
        self.cursor = {}
        self.blocked = {}
        self.passed = {}
        self.heads = {}
        self.misses = {}
        self.requeued = {}
        self.free_gpu = None
        self.gpuless = {}
        self.done = {}
        self.skipping = {}
        self.skipping_queue = ""
        self.admissions = {}
        self.headroom = {}
        self.kept_by = None

    def note(self, job: Job, why: Callable[[], Reason]) -> None:
        """Record why the job waits (``reasons.note_reason``), worded only when the tuning
        asks for reasons (``Tuning.reasons``)."""
        if self.state.tuning.reasons:
            note_reason(job, why(), self.emit)

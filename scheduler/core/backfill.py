"""Backfill with reservations (EASY backfill).

A queue's head that cannot start even by making room reserves the nodes it will get at
the earliest time it can, as running jobs end (``reserve``); behind it only placements
into the gap are tried (``Tuning.backfill_tries``), and a later job may use reserved nodes only
if it ends before the reservation starts or is preemptible (``blocked_nodes``): it then
gives way when the reservation starts, while the work it would lose is young
(``victims.gives_way``). A reservation due but for older ones drains: it waits for them to
end and takes no more (``Reservation.draining``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from events.model import PodPlacement
from scheduler.core.blocked import behind_reason, blocked_reason
from scheduler.core.placement import Statement, gang_shape, job_shape, uniform_size
from scheduler.core.running import NEVER
from scheduler.core.state import (
    ACTIVE,
    Job,
    PlannedMemo,
    Queue,
    Reservation,
    State,
    UniformGangs,
    wake,
)
from scheduler.core.victims import Victims, backfilled_under

if TYPE_CHECKING:
    from scheduler.core.session import Session


@dataclass(slots=True)
class RunningEnds:
    """Expected ends of the running jobs, for reservations: read from the state's running
    index, which ``apply`` keeps current (jobs placed earlier in the cycle are in it, jobs
    evicted are not). Two orders: every job, and only the jobs holding GPUs — releasing a
    CPU-only pod changes nothing for a gang that asks only for GPUs, and need not be
    walked past."""

    state: State

    def __init__(self, state: State) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.state = state

    def ordered(self, gpus_only: bool) -> Iterator[tuple[int, int, str]]:
        """(expected end, seq, job) of the active jobs (asking for GPUs, if ``gpus_only``),
        soonest first; lazy."""
        return self.state.running_index().ends(self.state, gpus_only)


def missed(s: Session, queue: Queue, job: Job) -> None:
    """A job behind the queue's blocked head was tried in the gap and found no room, and
    says so: after ``Tuning.backfill_tries`` of them the queue is done for the cycle."""
    if queue.name in s.blocked:
        head = s.heads[queue.name]
        s.note(job, lambda: behind_reason(queue, head, any(r.job == head for r in s.reservations)))
    s.misses[queue.name] = s.misses.get(queue.name, 0) + 1
    if s.misses[queue.name] >= s.state.tuning.backfill_tries:
        s.done[queue.name] = None


def blocked_nodes(
    state: State, job: Job, reservations: list[Reservation]
) -> dict[str, None] | None:
    """Nodes the job must keep off so as not to delay a reservation (None: none).

    A job that ends before a reservation starts, or is preemptible (it will give way when
    the reservation starts), may use its nodes; any other job keeps off them. A draining
    reservation's nodes (``Reservation.draining``) take no job that would have to give way.
    """
    if not reservations:
        return None
    blocked: dict[str, None] = {}
    runtime = job.expected_runtime_ms
    for r in reservations:
        if job.preemptible and not r.draining:
            continue  # it gives way
        ends_in_time = runtime is not None and r.start != NEVER and state.now + runtime <= r.start
        if not ends_in_time:
            blocked.update(r.nodes)
    return blocked or None


def backfill_for(reservations: list[Reservation], placements: list[PodPlacement]) -> str:
    """The job whose reservation the placements run in (its gap), if any: they give way
    to it when it starts."""
    for r in reservations:
        if any(p.node in r.nodes for p in placements):
            return r.job
    return ""


def reserve(s: Session, queue: Queue, job: Job) -> None:
    """Reserve nodes for a blocked head and record why it waits (``blocked``)."""
    reservation = _planned(s, job)
    s.note(job, lambda: blocked_reason(s, queue, job, reservation))  # before it is counted
    if reservation is not None:
        s.reservations.append(reservation)
        s.reserved_nodes.update(reservation.nodes)
        s.kept_off.clear()


def _planned(s: Session, job: Job) -> Reservation | None:
    """The job's reservation, reused from ``s.planned`` for a gang of a shape planned
    already (plain gangs of one pod size are all planned in one walk), or for the job
    itself with the same jobs backfilled under it."""
    state = s.state
    shape = _reservation_shape(job, s.victims)
    size = _uniform_size(job) if shape is not None else None
    if size is not None and ("size", size, len(job.pods)) not in s.planned:
        # One walk through the running jobs serves every gang of this pod size.
        s.planned.update(reserve_sizes(state, size, uniform_gangs(state, size), s.running))
    key = ("size", size, len(job.pods)) if size is not None else shape
    if key is None:  # its own reservation, kept for the next cycle
        key = ("job", job.job, tuple(v.job for v in s.victims.under_of(job.job)))
    if key not in s.planned:
        reservation = s.planned[key] = reservation_for(state, job, s.running, s.victims)
        return reservation
    planned = s.planned[key]
    if planned is None:
        return None
    if state.now < planned.start < NEVER:
        wake(state, planned.start)
    return Reservation(job.job, planned.start, planned.nodes, planned.draining)


def carried_plans(state: State) -> dict[tuple[object, ...], Reservation | None]:
    """The reservations the last cycle worked out (``keep_plans``) that this one would
    work out the same way: all of them, or none.

    A reservation rests on the nodes, the running jobs and their expected ends: no event
    but a new job's submission, a pod's start, a reason or a cycle's end may have been
    applied since (``State.changes_cache``). A gang's start moves its job's end from its
    allocation to its start, later: a job that ended after every reservation's start was
    released after each was found and still is, so every job that started since must end
    after the latest start kept, before and after its start
    (``State.started_end_cache``). The ends depend on ``now`` too, and only in this: an
    end that has passed counts as ``now``. So no further running job may have overrun its
    end since, none may be without a start (its end counts from ``now``), and no
    reservation kept may rest on an overrun end (one that starts at the time it was worked
    out; those are not kept). Then the running jobs are released in the same order up to
    every reservation's start and every reservation comes out the same."""
    memo = state.planned_cache
    if memo is None or memo.changes != state.changes_cache or not memo.planned:
        return {}
    if state.started_end_cache != NEVER and state.started_end_cache <= memo.latest:
        return {}
    index = state.running_index()
    index.advance(state.now)
    if index.unstarted or index.overrun_count() != memo.overrun:
        return {}
    return dict(memo.planned)


def keep_plans(s: Session) -> None:
    """Keep the cycle's reservations for the next one (``carried_plans``)."""
    state = s.state
    index = state.running_index()
    index.advance(state.now)
    kept = {key: r for key, r in s.planned.items() if r is None or r.start > state.now}
    latest = max((NEVER if r is None else r.start for r in kept.values()), default=0)
    state.planned_cache = PlannedMemo(state.changes_cache, index.overrun_count(), latest, kept)
    state.started_end_cache = NEVER


def _reservation_shape(job: Job, victims: Victims) -> tuple[object, ...] | None:
    """What ``reservation_for`` depends on of a plain, unplaced gang that nothing was
    backfilled under (None for any other job: its reservation is worked out on its own)."""
    if job.placements or gang_shape(job, False) is None or victims.under_of(job.job):
        return None
    return (
        tuple((p.gpu_milli, p.group) for p in job.pods),
        job.min_members,
        tuple(sorted(job.min_per_group.items())),
    )


def _uniform_size(job: Job) -> int | None:
    """The pod size of a plain gang (see ``_reservation_shape``) whose pods are all alike
    and all required, or None."""
    return uniform_size(job)


def uniform_gangs(state: State, size: int) -> dict[int, Job]:
    """A pending plain gang of ``size``-milli-GPU pods (``JobShape.uniform``: all pods
    alike and required, GPUs only), unplaced and in a leaf queue's pending order, for each
    gang size waiting. Any one of a size serves: ``reserve_sizes`` places only its shape.

    Read from ``State.uniform_cache``, which indexes the jobs added to a pending order
    since it was last read and drops those that have left one, instead of walking every
    pending job each time."""
    jobs = state.jobs
    index = _uniform_index(state)
    found: dict[int, Job] = {}
    by_count = index.by_size.get(size, {})
    for count, ids in list(by_count.items()):
        gone = []
        for job_id in ids:
            job = jobs.get(job_id)
            if job is not None and not job.placements and state.in_leaf_pending(job):
                found[count] = job
                break
            gone.append(job_id)
        for job_id in gone:
            del ids[job_id]
        if not ids:
            del by_count[count]
    return found


def _uniform_index(state: State) -> UniformGangs:
    """``State.uniform_cache`` with the jobs added since it was last read indexed."""
    jobs = state.jobs
    index = state.uniform_cache
    if index is None:
        index = state.uniform_cache = UniformGangs()
        added = [job_id for leaf in state.leaf_queues() for _, _, job_id in leaf.pending]
    else:
        added, index.added = index.added, []
    cache = state.shape_cache
    for job_id in added:
        job = jobs.get(job_id)
        if job is None or not state.in_leaf_pending(job):
            continue
        shape = cache.get(job_id)
        if shape is None or shape.job is not job:
            shape = job_shape(cache, job, exact_gangs=state.tuning.exact_gangs)
        if shape.uniform:
            by_count = index.by_size.setdefault(shape.uniform, {})
            by_count.setdefault(len(job.pods), {})[job_id] = None
    return index


def reserve_sizes(
    state: State, size: int, gangs: dict[int, Job], running: RunningEnds
) -> dict[tuple[object, ...], Reservation | None]:
    """``reservation_for`` gangs of ``size``-milli-GPU pods, every gang size in one walk.

    Placement is greedy pod by pod, so where a gang of n such pods fits, its first m < n
    pods land exactly where a gang of m would: a smaller gang fits at least as early and
    on those very nodes. The running jobs are released once, in the order
    ``reservation_for`` uses; at each release the smallest gangs not yet placed are tried
    while they fit, from the point where the same cheap bounds (``_Release``) let them be
    tried. The results are what ``reservation_for`` gives each gang (with no job
    backfilled under it).
    """
    counts = sorted(gangs)
    found: dict[tuple[object, ...], Reservation | None] = {
        ("size", size, count): None for count in counts
    }
    jobs = state.jobs
    waiting = 0  # counts[waiting] is the smallest gang not placed yet
    with Statement(state.nodes, index=state.free_index()) as stmt:
        release = _Release(stmt, size, state.free_schedulable(), *_held(state))
        for end, _, job_id in running.ordered(True):
            other = jobs[job_id]
            if other.status not in ACTIVE:
                continue
            release.book(other)
            while waiting < len(counts):
                count = counts[waiting]
                if not release.may_fit(count * size, count):
                    break
                release.evict_booked()
                point = stmt.checkpoint()
                placed = stmt.place_gang(gangs[count])
                if placed is None:
                    break
                stmt.rollback(point)
                found[("size", size, count)] = Reservation("", end, {p.node: None for p in placed})
                waiting += 1
            if waiting == len(counts):
                break
    return found


def _held(state: State) -> tuple[dict[str, tuple[tuple[str, int], ...]], dict[str, int]]:
    """The running index's GPUs held per job, by node and in all."""
    index = state.running_index()
    return index.spots, index.held


@dataclass(slots=True)
class _Release:
    """Running jobs released, soonest end first, in a statement until a gang fits.

    Cheap necessary conditions come first: GPUs free in total and, for a gang of one pod
    size, how many such pods the nodes could hold (each node's free GPUs with what is
    booked there, ignoring how they split across devices). Released jobs are only booked
    per node (``book``) until both say the gang could fit; then the booked jobs with a
    pod on a node whose GPUs, with what is booked there, could hold a pod of that size
    are evicted in the statement (``evict_booked``) and a placement tried. On any other
    node no pod of the gang fits either way, so its jobs stay booked; by the time a gang
    fits, every released job on a node it could use has been evicted, however often a
    placement was tried before. Without one pod size every booked job is evicted.
    """

    stmt: Statement
    pod_size: int
    free: int
    spots: dict[str, tuple[tuple[str, int], ...]]
    held: dict[str, int]
    """The running index's GPUs held per job, by node and in all (``RunningIndex``)."""
    slots: int
    extra: dict[str, int]
    """Per node: milli-GPUs its booked jobs hold there (that ``give_slots`` gives back)."""
    booked: dict[str, tuple[Job, Sequence[tuple[str, int]]]]
    """Booked job -> (the job, its nodes with the milli-GPUs it holds on each)."""
    on_node: dict[str, list[str]]
    """Per node: the jobs booked with a pod there (some may be evicted since)."""

    def __init__(
        self,
        stmt: Statement,
        pod_size: int,
        free: int,
        spots: dict[str, tuple[tuple[str, int], ...]],
        held: dict[str, int],
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.stmt = stmt
        self.pod_size = pod_size
        self.free = free
        self.spots = spots
        self.held = held
        self.slots = 0
        self.extra = {}
        self.booked = {}
        self.on_node = {}
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.pod_size > 0 and self.stmt.index is not None:
            self.slots = self.stmt.index.slots_at_most(self.pod_size)

    def book(self, job: Job) -> None:
        job_id = job.job
        spots = self.spots.get(job_id)
        given_on: Sequence[tuple[str, int]]
        if spots is not None and not job.finished and len(spots) == len(job.placements):
            # Every pod holds GPUs: the running index has what each holds, where.
            self.free += self.held[job_id]
            given_on = spots
        else:
            given_on = self._given_on(job)
        size = self.pod_size
        if size <= 0:
            self.booked[job_id] = (job, ())
            return
        nodes = self.stmt.nodes
        extra = self.extra
        on_node = self.on_node
        slots = self.slots
        for name, given in given_on:
            node = nodes.get(name)
            if node is None:  # (gone from the cluster: nothing is given back there)
                given_on = [(n, g) for n, g in given_on if n in nodes]
                continue
            booked_there = on_node.get(name)
            if booked_there is None:
                on_node[name] = [job_id]
            else:
                booked_there.append(job_id)
            before = extra.get(name, 0)
            was = node.free_gpu_milli + before
            extra[name] = before + given
            slots += (was + given) // size - was // size
        self.slots = slots
        self.booked[job_id] = (job, given_on)

    def _given_on(self, job: Job) -> list[tuple[str, int]]:
        """(node, milli-GPUs held there) of each live pod, GPUs or not, counting into
        ``free`` what the job holds."""
        nodes = self.stmt.nodes
        given_on: list[tuple[str, int]] = []
        for placement in job.live():
            held = given = 0
            node = nodes.get(placement.node)
            devices = len(node.free_devices) if node is not None else 0
            for slot in placement.gpus:
                held += slot.milli
                if slot.device < devices:  # (``give_slots`` skips the others)
                    given += slot.milli
            self.free += held
            given_on.append((placement.node, given))
        return given_on

    def evict_booked(self) -> None:
        size = self.pod_size
        if size <= 0:
            for job, _ in self.booked.values():
                self.stmt.evict(job)
            self.booked.clear()
            self.on_node.clear()
            return
        nodes = self.stmt.nodes
        extra = self.extra
        booked = self.booked
        fits = [name for name, more in extra.items() if nodes[name].free_gpu_milli + more >= size]
        for name in fits:
            for job_id in self.on_node.pop(name, ()):
                entry = booked.pop(job_id, None)
                if entry is None:
                    continue  # evicted already, for a pod on another node
                job, given_on = entry
                self.stmt.evict(job)
                for where, given in given_on:
                    left = extra.get(where, 0) - given
                    if left:
                        extra[where] = left
                    else:
                        extra.pop(where, None)

    def may_fit(self, need: int, pods: int) -> bool:
        return self.free >= need and (self.pod_size <= 0 or self.slots >= pods)


def reservation_for(
    state: State, job: Job, running: RunningEnds, victims: Victims
) -> Reservation | None:
    """EASY backfill: where and when the job could start as running jobs end.

    Running jobs are released in order of expected end (those without an expected runtime
    last, as if never); the first time the gang fits on what is then free is the
    reservation's start, and the nodes it would get are held. Jobs backfilled under this
    very reservation give way when it starts, so their nodes count as free from the
    outset, or every backfill would push the reservation later.
    """
    free = state.free_schedulable()
    with Statement(state.nodes, index=state.free_index()) as stmt:
        given_way: dict[str, None] = {}
        for other in backfilled_under(job, victims):
            stmt.evict(other)
            free += victims.held_gpu(other)
            given_way[other.job] = None
        if given_way and state.config.backfill_give_way_ms >= 0:
            point = stmt.checkpoint()
            placed = stmt.place_gang(job)
            if placed is not None:
                # Due now but for jobs backfilled under it that did not give way (older
                # than ``backfill_give_way_ms``, or beyond the lost-work budget): it starts
                # when they end, a time not known, and none is backfilled there meanwhile.
                return Reservation(job.job, NEVER, {p.node: None for p in placed}, draining=True)
            stmt.rollback(point)
        sizes = {p.gpu_milli for p in job.pods}
        pod_size = next(iter(sizes)) if len(sizes) == 1 and not job.topology_key else 0
        reservation = _first_fit(
            state, job, running, _Release(stmt, pod_size, free, *_held(state)), given_way
        )
    if reservation is not None and state.now < reservation.start < NEVER:
        # Due later: a cycle then. Due now (held by overrunning jobs): their ends are
        # events, so waking every cycle until then would only repeat this one.
        wake(state, reservation.start)
    return reservation


def _first_fit(
    state: State, job: Job, running: RunningEnds, release: _Release, given_way: dict[str, None]
) -> Reservation | None:
    """Release the running jobs soonest end first until the gang places: the
    reservation, or None if it never does. Jobs in ``given_way`` count as free already."""
    need = job.request[0]
    pods = len(job.pods) if not job.min_members else job.min_members
    gpus_only = not any(p.cpu_milli or p.memory_mib for p in job.pods)
    jobs = state.jobs
    for end, _, job_id in running.ordered(gpus_only):
        other = jobs[job_id]
        if other.status not in ACTIVE or job_id in given_way:
            continue  # evicted earlier in this cycle, or already counted as free
        release.book(other)
        if not release.may_fit(need, pods):
            continue  # no placement can succeed yet: too few GPUs, or no arrangement
        release.evict_booked()
        placed = release.stmt.place_gang(job)
        if placed is not None:
            return Reservation(job=job.job, start=end, nodes={p.node: None for p in placed})
    return None

"""What blocks a queue's head that could not start, and what a reservation promises.

``blocked_reason`` names the one cause that holds the head back, checked in this order:
the free capacity would hold it but only on nodes another job's reservation holds
(``reserved``); enough GPUs are free but not where its pods may go (``mismatch``); its
queue goes beyond its deserved quota or fair share and what it needs is held by work it
may not reclaim (``share``: a reservation made then is no promise, as in-quota work of
other queues is placed before it); its own reservation (``reservation``); else plain
capacity (``capacity``), naming what reclaim could not take and why.

A reservation's start is a promise (``Job.promise``): a later cycle that finds it later
says why it moved (``moved_because``); one already due (held by jobs past their runtime
estimate) names the job it waits for instead of a time in the past.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from events.model import MILLI, PodSpec
from scheduler.core.apply import lost_work
from scheduler.core.fairshare import capacity
from scheduler.core.placement import (
    Statement,
    effective_gpu_milli,
    pod_fits_now,
    selector_matches,
    split_gang,
    tolerates,
)
from scheduler.core.reasons import (
    BEHIND,
    CAPACITY,
    MISMATCH,
    RESERVATION,
    RESERVED,
    SHARE,
    Reason,
    capacity_text,
    gpus,
    moment,
)
from scheduler.core.running import NEVER
from scheduler.core.state import ACTIVE, Job, Node, Queue, State
from scheduler.core.victims import (
    backfilled_under,
    budgeted,
    lost_work_budget,
    min_runtime,
    protected,
    recently_reclaimed,
)

if TYPE_CHECKING:
    from scheduler.core.session import Session
    from scheduler.core.state import Reservation

_NAMED: Final = 3
"""At most this many queues are named in a reason (the rest are counted)."""


def blocked_reason(s: Session, queue: Queue, job: Job, reservation: Reservation | None) -> Reason:
    """Why the queue's head waits, given the reservation made for it (None: none)."""
    state = s.state
    own_start = _promised(state, reservation)
    held = _held_for_other(s, job)
    if held is not None:
        tail = ""
        if reservation is not None and own_start >= 0:
            tail = f"; its own reservation: {len(reservation.nodes)} nodes at {moment(own_start)}"
            if 0 <= job.promise < own_start:
                tail += (
                    f", moved from {moment(job.promise)} because "
                    f"{moved_because(s, job, reservation)}"
                )
        return Reason(
            f"fits the free GPUs only on nodes reserved for job '{held.job}' "
            f"({_when(state, held.start)}); it may use them only if it ends before then "
            f"or is preemptible" + tail,
            RESERVED,
            own_start,
        )
    required_pods, fitted, mismatch = _misfit(state, job)
    if mismatch is not None:
        return Reason(mismatch, MISMATCH)
    share = _share_reason(s, queue, job)
    if share is not None:
        return share
    if reservation is not None:
        return _with_guarantee(s, queue, job, reservation_reason(s, job, reservation))
    text = capacity_text(required_pods, fitted)
    protections = _protections(s, queue, job)
    return Reason(text + (f"; cannot reclaim {protections}" if protections else ""), CAPACITY)


def behind_reason(queue: Queue, head: str, reserved: bool) -> Reason:
    """A job behind its queue's blocked head that does not fit the gap. The head is named
    when it holds a reservation (what the gap is kept for); without reservations
    (``reservations: false``) the gap is all free capacity, and no head is named."""
    if reserved:
        return Reason(
            f"waits behind job '{head}', the head of queue '{queue.name}' holding a "
            f"reservation; it does not fit the free capacity that no reservation holds",
            BEHIND,
        )
    return Reason(
        f"waits behind the blocked head of queue '{queue.name}'; it does not fit the free "
        f"capacity that no reservation holds",
        BEHIND,
    )


# --------------------------------------------------------------------------- reservations


def reservation_reason(s: Session, job: Job, r: Reservation) -> Reason:
    """The head's own reservation: when it starts, and why it moved if it did."""
    state = s.state
    nodes = f"waiting for a reservation of {len(r.nodes)} nodes"
    promise = job.promise
    if r.draining:
        return Reason(f"{nodes}, {_drained_by(s, job, r)}", RESERVATION)
    if r.start == NEVER:
        moved = ""
        if promise >= 0:
            moved = f" (promised for {moment(promise)}: {moved_because(s, job, r)})"
        return Reason(
            f"{nodes} when running jobs end{moved}; smaller jobs backfill the gap", RESERVATION
        )
    if r.start <= state.now:
        # Held by jobs past their expected runtime: a time here would be `now` (in the
        # past by the next cycle); the job they wait for is named instead.
        late = _overrunning(state, r)
        when = "as soon as overrunning jobs end"
        if late is not None:
            when = f"as soon as job '{late.job}' of queue '{late.queue}' ends ({_past(late)})"
        return Reason(f"{nodes} {when}; smaller jobs backfill the gap", RESERVATION)
    text = f"{nodes} at {moment(r.start)}; smaller jobs backfill the gap"
    if r.start == promise and job.reason.startswith(text):
        text = job.reason  # the promise holds: its reason (and why it last moved) stands
    elif 0 <= promise < r.start:
        text += f"; moved from {moment(promise)} because {moved_because(s, job, r)}"
    return Reason(text, RESERVATION, r.start)


def _drained_by(s: Session, job: Job, r: Reservation) -> str:
    """What a draining reservation waits for: the jobs backfilled onto its nodes, in victim
    order, and the work evicting them would lose (``Reservation.draining``)."""
    state = s.state
    under = [
        v for v in backfilled_under(job, s.victims) if any(p.node in r.nodes for p in v.live())
    ]
    names = ", ".join(f"'{v.job}' of queue '{v.queue}'" for v in under[:_NAMED])
    if len(under) > _NAMED:
        names += f" and {len(under) - _NAMED} more"
    lost = sum(lost_work(v, state.now)[0] for v in under)
    one = len(under) == 1
    return (
        f"due now but for {'the job' if one else f'the {len(under)} jobs'} backfilled onto "
        f"them ({names}), which would lose {lost / 3_600_000:.1f} GPU-h of work if evicted "
        f"now; it starts when {'that job ends' if one else 'they end'}, and no more jobs are "
        f"backfilled there"
    )


def moved_because(s: Session, job: Job, r: Reservation) -> str:
    """Why the job's reservation starts later than promised: a node it counted on went,
    a job placed in a later cycle took GPUs on its nodes, or the jobs it waits for end
    later (``_ends_later``)."""
    state = s.state
    since = job.promised_at
    lost_at, lost = state.node_lost
    if lost_at >= since:
        return f"node '{lost}' was removed or cordoned"
    given_way = {v.job for v in s.victims.under_of(job.job)}
    on_nodes = _jobs_on(state, r.nodes)
    took = [
        other
        for other in on_nodes
        if other.allocated_at is not None
        and other.allocated_at > since
        and other.job not in given_way
        and other.job != job.job
    ]
    if not took:
        # Placed elsewhere, on nodes the earlier reservation counted on.
        took = sorted(
            (
                other
                for leaf in state.leaf_queues()
                for other in (state.jobs[j] for j in leaf.active)
                if other.allocated_at is not None
                and other.allocated_at > since
                and other.job not in given_way
                and other.request[0] > 0
            ),
            key=lambda other: (other.allocated_at or 0, other.seq, other.job),
        )
    if took:
        first = took[0]
        return (
            f"job '{first.job}' of queue '{first.queue}' was placed before it "
            f"({moment(first.allocated_at or 0)}) on GPUs it counted on"
        )
    return _ends_later(state, r, on_nodes, since)


def _ends_later(state: State, r: Reservation, on_nodes: list[Job], since: int) -> str:
    """Why the jobs a reservation waits for end later than when it was promised, nothing
    having been placed since: one started after the promise (its end counts from its
    start, no longer from its placement), or one ran past its runtime estimate (or was
    not started within it)."""
    for other in on_nodes:
        if other.started_at is None:
            if other.allocated_at is None:
                return f"job '{other.job}' has not started yet, so its expected end moves with time"
            continue  # its end counts from its placement, which does not move
        if other.started_at > since:
            return (
                f"job '{other.job}' started only at {moment(other.started_at)}, and its "
                f"expected end counts from its start"
            )
    late = _overrunning(state, r)
    if late is None:
        return "the jobs it waits for are now expected to end later"
    if late.started_at is None:
        return (
            f"job '{late.job}' was placed at {moment(late.allocated_at or 0)} and has "
            f"not started within its runtime estimate ({moment(_raw_end(late))})"
        )
    return f"job '{late.job}' ran past its runtime estimate ({moment(_raw_end(late))})"


def _promised(state: State, reservation: Reservation | None) -> int:
    """The start a reservation promises (-1: none, unknown, or already due)."""
    if reservation is None or reservation.start == NEVER or reservation.start <= state.now:
        return -1
    return reservation.start


def _when(state: State, start: int) -> str:
    if start == NEVER:
        return "until running jobs end"
    if start <= state.now:
        return "due as soon as overrunning jobs end"
    return f"from {moment(start)}"


def _jobs_on(state: State, nodes: dict[str, None]) -> list[Job]:
    """The active jobs holding pods on these nodes, in node order, each once."""
    found: dict[str, Job] = {}
    for name in nodes:
        node = state.nodes.get(name)
        if node is None:
            continue
        for job_id in node.pods.values():
            other = state.jobs.get(job_id)
            if other is not None and other.status in ACTIVE and job_id not in found:
                found[job_id] = other
    return list(found.values())


def _raw_end(job: Job) -> int:
    """The job's expected end, counted from its start or, placed but not started yet, from
    its placement (``running.RunningIndex``)."""
    runtime = job.expected_runtime_ms
    began = job.started_at if job.started_at is not None else job.allocated_at
    if began is None or runtime is None:
        return NEVER
    return began + runtime - job.checkpointed_ms


def _past(job: Job) -> str:
    """How a job is past its expected end (``_raw_end``)."""
    if job.started_at is None:
        return (
            f"placed at {moment(job.allocated_at or 0)} and not started yet, so past its "
            f"runtime estimate, {moment(_raw_end(job))}"
        )
    return f"past its runtime estimate, {moment(_raw_end(job))}"


def _overrunning(state: State, r: Reservation) -> Job | None:
    """A job on the reservation's nodes past its expected end (soonest first)."""
    late = [j for j in _jobs_on(state, r.nodes) if _raw_end(j) <= state.now]
    return min(late, key=lambda j: (_raw_end(j), j.seq, j.job)) if late else None


# --------------------------------------------------------------------------- where it fits


def _held_for_other(s: Session, job: Job) -> Reservation | None:
    """The reservation of another job whose nodes alone keep this one from the free
    capacity (None: it would not fit even on them, or no reservation it must keep off
    stands; ``backfill.blocked_nodes`` says which it must)."""
    if job.preemptible:
        return None  # a preemptible job may use any reservation's nodes
    now, runtime = s.state.now, job.expected_runtime_ms
    others = [
        r
        for r in s.reservations
        if r.job != job.job
        and not (runtime is not None and r.start != NEVER and now + runtime <= r.start)
    ]
    if not others:
        return None
    with Statement(s.state.nodes, index=s.state.free_index()) as stmt:
        placed = stmt.place_gang(job)
    if placed is None:
        return None
    used = {p.node for p in placed}
    return next((r for r in others if any(n in used for n in r.nodes)), None)


def _gang_mismatch(job: Job) -> str:
    """Every required pod fits the free capacity one by one, yet the gang does not."""
    if job.topology_key:
        return f"the free GPUs hold every pod, but not within one '{job.topology_key}' domain"
    return "the free GPUs hold every pod one by one, but not the gang as a whole"


def _misfit(state: State, job: Job) -> tuple[list[PodSpec], int, str | None]:
    """The gang's required pods, how many of them the free capacity holds placed one by
    one, and what rules out the rest when enough GPUs are free (None: a plain shortage)."""
    required_pods, _ = split_gang(job)
    fitted = 0
    with Statement(state.nodes, index=state.free_index()) as stmt:
        for pod in required_pods:
            if stmt.place(job.job, pod, None) is None:
                break
            fitted += 1
        if fitted == len(required_pods):
            return required_pods, fitted, _gang_mismatch(job)
        rest = sum(effective_gpu_milli(p, True) for p in required_pods[fitted:])
        return required_pods, fitted, _pod_mismatch(state, required_pods[fitted], fitted, rest)


def _pod_mismatch(state: State, pod: PodSpec, fitted: int, rest: int) -> str | None:
    """``pod``, the first of the gang without a node after ``fitted`` others took theirs:
    if the free GPUs could hold the ``rest`` of the gang, what rules them out (None: too
    few GPUs are free, a plain shortage)."""
    # The free total and the nodes with room from the free index (the order of ``roomy``
    # decides nothing: only whether some node passes each test below).
    if state.free_schedulable() < rest:
        return None
    need = effective_gpu_milli(pod, True)
    roomy = [
        node
        for node in (state.nodes[name] for name in state.free_index().ascending(need))
        if not node.cordoned and _gpu_room(node, need)
    ]
    lead = f"pod '{pod.name}' ({gpus(need)} GPUs, {fitted} pods of the gang placed before it)"
    if not roomy:
        # (no amounts free: they change with every job, and the reason with them)
        return (
            f"enough GPUs are free but scattered: {lead} needs {gpus(need)} on one node, "
            f"and no node has that many free"
        )
    if pod.node_selector:
        roomy = [n for n in roomy if selector_matches(n, pod.node_selector)]
        if not roomy:
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(pod.node_selector.items()))
            return f"{lead}: node selector {{{wanted}}} matches none of the nodes with room"
    tolerated = [n for n in roomy if not n.taints or tolerates(n, pod)]
    if not tolerated:
        return f"{lead} does not tolerate the taints of any node with room"
    if not any(pod_fits_now(n, pod) for n in tolerated):
        return (
            f"{lead}: the nodes with room lack the CPU or memory it asks for "
            f"({pod.cpu_milli} millicores, {pod.memory_mib} MiB)"
        )
    return None


def _gpu_room(node: Node, need: int) -> bool:
    whole = need // MILLI if need >= MILLI else 0
    return node.free_whole >= whole and node.free_gpu_milli >= need


# --------------------------------------------------------------------------- quota and share


def _share_reason(s: Session, queue: Queue, job: Job) -> Reason | None:
    """The head asks for more than its queue's fair share (it may reclaim nothing), or
    more than its deserved quota while other queues hold GPUs within theirs: what it
    needs is held by work it may not reclaim, and in-quota work of other queues is placed
    before it, so no reservation time is a promise."""
    state = s.state
    need = job.request[0]
    if need <= 0 or not state.config.reclaim:
        return None
    deserved = s.shares.deserved[queue.name][0]
    fair = s.shares.fair[queue.name][0]
    # Judged by the job's own request: what its queue holds now may be what its
    # reservation waits for (its own jobs ending), which the queue then no longer holds.
    holders = _holders(s, queue, job)
    in_quota = [q for q, kind, _ in holders if kind == "in-quota"]
    if need <= fair and (need <= deserved or not in_quota):
        return None
    if not holders:
        return None
    named = holders[:_NAMED]
    parts: list[str] = []
    for kind, words in (
        ("in-quota", "in-quota work of {}"),
        ("within", "work of {} within its fair share"),
        ("above", "work of {} above its fair share"),
    ):
        of_kind = [f"'{q.name}'" for q, k, _ in named if k == kind]
        if of_kind:
            parts.append(words.format(_joined(of_kind)))
    more = len(holders) - len(named)
    if more:
        parts.append(f"{more} more queues")
    total = capacity(state)[0]
    unnamed = sum(held for _, _, held in holders[_NAMED:])
    room = max(0, total - need - queue.allocated[0] - unnamed)
    names = _joined([f"'{q.name}'" for q, _, _ in named])
    when = f"the usage of {names} falls to {gpus(room)}"
    if sum(held for _, _, held in named) <= room:
        when = "GPUs free up where its pods fit"  # the GPUs are there, not in its shape
    # The fair share moves with every queue's demand: named only when it is what binds
    # (not when the job asks for more than the deserved quota beside in-quota work).
    share = (
        f"deserves {gpus(deserved)}"
        if (need > deserved and in_quota) or fair == deserved
        else f"deserves {gpus(deserved)} (fair share {gpus(fair)})"
    )
    return Reason(
        f"needs {gpus(need)} GPUs; queue '{queue.name}' {share} and cannot reclaim "
        f"{', '.join(parts)}; starts when {when} "
        f"or the share of '{queue.name}' grows",
        SHARE,
    )


def _holders(s: Session, queue: Queue, job: Job) -> list[tuple[Queue, str, int]]:
    """The other leaf queues holding GPUs that do not give way to ``job`` (jobs backfilled
    under its reservation do), most first (then by name), each with how it stands
    (``in-quota``: within its deserved quota, ``within``: within its fair share,
    ``above``: above its fair share) and the milli-GPUs it holds that do not give way."""
    giving: dict[str, int] = {}
    for under in s.victims.under_of(job.job):
        giving[under.queue] = giving.get(under.queue, 0) + s.victims.held_gpu(under)
    found: list[tuple[Queue, str, int]] = []
    for other in s.state.leaf_queues():
        held = other.allocated[0] - giving.get(other.name, 0)
        if other.name == queue.name or held <= 0:
            continue
        if held <= s.shares.deserved[other.name][0]:
            kind = "in-quota"
        elif held <= s.shares.fair[other.name][0]:
            kind = "within"
        else:
            kind = "above"
        found.append((other, kind, held))
    found.sort(key=lambda item: (-item[2], item[0].name))
    return found


def _protections(s: Session, queue: Queue, job: Job) -> str:
    """What the other queues hold that reclaim may not take for this job, and why:
    in-quota, within fair share (unless the job's queue stays within its deserved quota,
    which may reclaim above any deserved quota), or per job non-preemptible, within its
    queue's reclaim min-runtime, placed by reclaim within the hysteresis window, or beyond
    the lost-work budget ("" when no other queue holds GPUs)."""
    state = s.state
    if job.request[0] <= 0:
        return ""
    holders = _holders(s, queue, job)
    # as reclaim judges it: a queue within its deserved quota is not held to the budget,
    # and may reclaim from every queue above its deserved quota, whatever its fair share
    in_quota = not budgeted(s, queue, job, "reclaim")
    budget = NEVER if in_quota else lost_work_budget(state, job)
    parts: list[str] = []
    for other, kind, _ in holders[:_NAMED]:
        if kind == "in-quota":
            parts.append(f"'{other.name}' (in quota)")
            continue
        if kind == "within" and not in_quota:
            parts.append(f"'{other.name}' (within its fair share)")
            continue
        why: dict[str, int] = {}
        for key, held in _kept_held(state, other, budget):
            why[key] = why.get(key, 0) + held
        detail = ", ".join(f"{gpus(v)} GPUs {k}" for k, v in why.items())
        parts.append(f"'{other.name}' ({detail})")
    more = len(holders) - _NAMED
    if more > 0:
        parts.append(f"{more} more queues")
    return ", ".join(parts)


GUARANTEE: Final = "; within its deserved quota it may reclaim only from queues above theirs"
"""How the reason of a head within its deserved quota that still waits begins to say what
keeps it from reclaiming (``_with_guarantee``)."""

_KEPT_WORDS: Final = {
    "non-preemptible": "non-preemptible",
    "within reclaim min-runtime": "within reclaim min-runtime",
    "placed by reclaim within the hysteresis window": "placed by reclaim within the hysteresis "
    "window",
    "reclaimable, but not enough where the gang fits": "too few, or not where its pods fit "
    "(all or nothing across its pods)",
}
"""``_kept``'s words, as a head within its deserved quota is told them, in this order."""


def _with_guarantee(s: Session, queue: Queue, job: Job, reason: Reason) -> Reason:
    """``reason`` for a head that waits although reclaim within its deserved quota is its
    guarantee (docs/policy.md §5), with the rules that keep the GPUs of the queues above
    their deserved quota from it; any other reason as it is. The rules are named without
    figures, so the words change only when the rules do (a reason is recorded when its
    words change)."""
    state = s.state
    if not state.config.reclaim or job.request[0] <= 0 or budgeted(s, queue, job, "reclaim"):
        return reason
    if s.kept_by is None:
        s.kept_by = _kept_by(s)
    text = reason.text
    cut = text.find(GUARANTEE)  # the words of a kept promise carry the last cycle's
    if cut >= 0:
        text = text[:cut]
    if s.kept_by:
        rules = _joined([_KEPT_WORDS[k] for k in _KEPT_WORDS if k in s.kept_by])
        text += f"{GUARANTEE}, whose GPUs are {rules}"
    else:
        text += f"{GUARANTEE}, and none holds GPUs above it"
    return reason._replace(text=text)


def _kept_by(s: Session) -> frozenset[str]:
    """Why reclaim leaves each GPU-holding job of a queue above its deserved quota alone
    (``_kept`` with no lost-work budget): the rules that apply to at least one."""
    state = s.state
    found: set[str] = set()
    for other in state.leaf_queues():
        if other.allocated[0] <= s.shares.deserved[other.name][0]:
            continue
        for key, _ in _kept_held(state, other, NEVER):
            found.add(key)
            if len(found) == len(_KEPT_WORDS):
                return frozenset(found)
    return frozenset(found)


def _kept_held(state: State, queue: Queue, budget: int) -> Iterator[tuple[str, int]]:
    """For each GPU-holding active job of ``queue``: why reclaim leaves it alone
    (``_kept``, against its queue's reclaim min-runtime) and the milli-GPUs it holds."""
    floor = min_runtime(state, queue.name, "reclaim")
    for job_id in queue.active:
        victim = state.jobs[job_id]
        held = sum(slot.milli for p in victim.live() for slot in p.gpus)
        if held:
            yield _kept(state, victim, floor, budget), held


def _kept(state: State, victim: Job, floor: int, budget: int) -> str:
    """Why reclaim leaves this running job of a queue above its fair share alone."""
    if not victim.preemptible:
        return "non-preemptible"
    if protected(victim, state.now, floor):
        return "within reclaim min-runtime"
    if recently_reclaimed(state, victim):
        return "placed by reclaim within the hysteresis window"
    if budget < NEVER and lost_work(victim, state.now)[0] > budget:
        return "beyond the lost-work budget"
    return "reclaimable, but not enough where the gang fits"


def _joined(names: list[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]

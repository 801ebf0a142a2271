"""Victims: making room for a queue's head by evicting running jobs.

``make_room`` tries the rules of ``RULES`` in order, each a named strategy with the
victims it may take, cheapest first (least lost work): **backfill** (jobs backfilled
under the head's own reservation give way while the work they would lose is young,
``gives_way``), **reclaim** (from other queues above their
fair share or quota, ``reclaim_candidates``) and **preempt** (lower-priority jobs of the
same queue). A rule evicts the fewest victims that let the gang start, and only if it
then starts: never in vain. Where reclaim's shared bounds, counted in victim order, are
spent on devices scattered over many nodes, its victims are chosen again node by node,
cheapest whole nodes first (``_node_by_node``). ``protected`` is the one min-runtime
check, applied by reclaim, preempt and consolidation (a job backfilled under a
reservation gives way to it however young).
"""

from __future__ import annotations

import heapq
import itertools
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from events.model import JobPreempted, PodPlacement, PodSpec, PolicyConfigured
from scheduler.core.admission import limit_excess
from scheduler.core.apply import lost_work
from scheduler.core.fairshare import RESOURCES, Shares, capacity
from scheduler.core.placement import (
    Statement,
    gang_demand,
    least_to_free,
    may_fit,
    selector_matches,
    tolerates,
)
from scheduler.core.running import NEVER, VictimItem, gpu_spots, held_gpu, held_resources
from scheduler.core.state import ACTIVE, Job, Node, Queue, State, wake

if TYPE_CHECKING:
    from scheduler.core.session import Session


@dataclass(slots=True)
class Victims:
    """Running preemptible jobs in victim order (least lost work first), per leaf queue,
    read from the state's running index (``scheduler.core.running``).

    Within a cycle ``now`` is fixed, so a job's order key is too; jobs placed in the cycle
    are in the index but never victims in it (they are protected), and jobs evicted in it
    have left it.
    """

    state: State
    held: dict[str, int]
    lost_memo: dict[tuple[str, int, int], int]

    def __init__(self, state: State) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.state = state
        self.held = {}
        self.lost_memo = {}

    def streams(self, leaf: str) -> list[tuple[int | None, Iterator[VictimItem]]]:
        """The leaf's victims as sorted streams, each with the GPUs every job in it holds
        (None: they differ)."""
        return self.state.running_index().victims(self.state, leaf)

    def of(self, leaves: Iterable[str]) -> Iterator[VictimItem]:
        """The victims of these leaf queues, cheapest first across them: (key..., job,
        GPUs held)."""
        return self.state.running_index().victim_order(self.state, leaves)

    def under_of(self, job_id: str) -> list[Job]:
        """Jobs backfilled under ``job_id``'s reservation, in victim order."""
        return self.state.running_index().backfilled_under(self.state, job_id)

    def spots(self, job: Job) -> tuple[tuple[str, int], ...]:
        """(node, milli-GPUs) of each of the job's pods holding GPUs now."""
        found = self.state.running_index().spots.get(job.job)
        return gpu_spots(job) if found is None else found

    def lost(self, job: Job) -> int:
        """``lost_work(job, now)[0]``, worked out once per job and attempt in the cycle
        (``now`` is fixed in it, and a victim's live pods change only by its eviction, which
        ends the attempt or leaves it protected)."""
        key = (job.job, job.attempt, len(job.finished))
        found = self.lost_memo.get(key)
        if found is None:
            found = self.lost_memo[key] = lost_work(job, self.state.now)[0]
        return found

    def held_gpu(self, job: Job) -> int:
        """Milli-GPUs the job holds now."""
        held = self.held.get(job.job)
        if held is None:
            held = self.held[job.job] = held_gpu(job)
        return held


# --------------------------------------------------------------------------- protection


def min_runtime(state: State, queue: str, rule: str) -> int:
    """The queue's minimum runtime before ``rule`` may take its jobs (0: none)."""
    q = state.queues.get(queue)
    if q is None:
        return 0
    return q.reclaim_min_runtime_ms if rule == "reclaim" else q.preempt_min_runtime_ms


def protected(victim: Job, now: int, floor: int) -> bool:
    """Whether ``victim`` keeps running: it started less than ``floor`` ms ago (the
    min-runtime protection; a job allocated but not started yet counts as starting now),
    or it was placed in this very cycle (taking it back would only be churn)."""
    began = victim.started_at
    if began is None:
        return victim.allocated_at == now or floor > 0
    return floor > 0 and now - began < floor


def recently_reclaimed(state: State, victim: Job) -> bool:
    """Hysteresis: the victim started by reclaiming less than ``reclaim_hysteresis_ms``
    ago, so reclaim may not take it back yet."""
    window = state.config.reclaim_hysteresis_ms
    return (
        window > 0 and victim.reclaimed_at is not None and state.now - victim.reclaimed_at < window
    )


def wake_when_free(state: State, victim: Job, floor: int, *, hysteresis: bool) -> None:
    """A victim a rule skipped because of a time window — its queue's min-runtime
    ``floor`` since it started, and for reclaim (``hysteresis``) the hysteresis since it
    reclaimed — may be taken once the windows end: ask for a cycle then (``State.wakeup``),
    or the job that wanted it would wait for the next input to be tried again. A victim
    kept by what is no time (placed in this cycle, or not started yet under a
    min-runtime: its start is an input) asks for nothing."""
    now = state.now
    at = now
    began = victim.started_at
    if began is None:
        if victim.allocated_at == now or floor > 0:
            return
    elif floor > 0:
        at = max(at, began + floor)
    if hysteresis and recently_reclaimed(state, victim) and victim.reclaimed_at is not None:
        at = max(at, victim.reclaimed_at + state.config.reclaim_hysteresis_ms)
    if at > now:
        wake(state, at)


def lost_work_budget(state: State, job: Job) -> int:
    """The most GPU-ms of work the victims of ``job``'s reclaim or backfill eviction may
    lose together: ``lost_work_ratio_milli`` of the GPU time it has waited (NEVER: no
    bound). A job that just arrived may take only what costs nothing (jobs not yet running,
    or checkpointed); one that has waited long may take more."""
    ratio = state.config.lost_work_ratio_milli
    if ratio <= 0:
        return NEVER
    waited = max(0, state.now - job.submitted_at)
    return waited * job.request[0] // 1000 * ratio // 1000


def backing_off(state: State, job: Job) -> bool:
    """Whether ``job``'s search for victims to reclaim beyond its deserved quota (bounded
    by its lost-work budget) waits for the next period of ``victim_search_backoff_ms``
    (0: never waits).

    The job searches in the first cycle with fresh inputs after it was submitted, then in
    the first such cycle of each period of ledger time (``State.policy_ran_at`` is the
    last one before this cycle). Each job's periods are shifted by a hash of its id, so
    heads waiting side by side search in different cycles. Between searches the answer
    changes only as slowly as its budget grows with its wait, and a starved head would
    otherwise read every candidate victim again in every cycle. Reclaim within deserved
    quota, preemption by priority and a reservation's start (the jobs backfilled under it
    give way) never wait."""
    period = state.config.victim_search_backoff_ms
    last = state.policy_ran_at
    if period <= 0 or last < job.submitted_at:
        return False
    phase = zlib.crc32(job.job.encode()) % period
    return (state.now - phase) // period == (last - phase) // period


def budgeted(s: Session, queue: Queue, job: Job, rule: str) -> bool:
    """Whether ``lost_work_budget`` bounds this eviction: backfill always; reclaim unless
    the job's queue stays within its deserved quota (quota is a guarantee, taken back at
    once, as KAI-Scheduler's); preempt never (strictly higher priority is a promise)."""
    if rule == "backfill":
        return True
    if rule != "reclaim":
        return False
    return queue.allocated[0] + job.request[0] > s.shares.deserved[queue.name][0]


def may_take(state: State, victim: Job, rule: str) -> bool:
    """An active victim that ``rule`` may evict now."""
    if victim.status not in ACTIVE:
        return False
    return not protected(victim, state.now, min_runtime(state, victim.queue, rule))


def preemption(victim: Job, now: int, preemptor: Job | None, rule: str) -> JobPreempted:
    """The decision evicting ``victim`` under ``rule``, with the work it loses."""
    lost, kept = lost_work(victim, now)
    return JobPreempted(
        job=victim.job,
        queue=victim.queue,
        pods=tuple(p.pod for p in victim.live()),
        preemptor=preemptor.job if preemptor is not None else "",
        preemptor_queue=preemptor.queue if preemptor is not None else "",
        rule=rule,
        lost_gpu_ms=lost,
        checkpointed_ms=kept,
    )


# --------------------------------------------------------------------------- the rules


@dataclass(slots=True)
class Candidates:
    """The victims a rule may take for a job, in the order they are taken: as many as it
    may take together (``victims``). Where what they take together stopped the list short
    (a bound shared by the victims of a queue, reclaim's), ``wider`` gives every victim
    the rule may take alone and ``allows`` says whether a set of them may go together, so
    a victim counted first does not block another that alone would make room."""

    victims: list[Job]
    wider: Callable[[], list[Job]] | None
    allows: Callable[[list[Job]], bool] | None
    take: _Take | None
    """Reclaim's bounds, counted victim by victim (``_node_by_node``), with ``wider``."""

    def __init__(
        self,
        victims: list[Job],
        wider: Callable[[], list[Job]] | None = None,
        allows: Callable[[list[Job]], bool] | None = None,
        take: _Take | None = None,
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.victims = victims
        self.wider = wider
        self.allows = allows
        self.take = take


def backfilled_under(job: Job, victims: Victims) -> list[Job]:
    """Jobs backfilled into this job's reservation gap, in victim order."""
    return [v for v in victims.under_of(job.job) if v.status in ACTIVE]


def gives_way(state: State, victim: Job, victims: Victims) -> bool:
    """Whether a job backfilled under a reservation gives way to it now: the work it would
    lose is younger than ``backfill_give_way_ms`` per GPU it holds (a job that has not
    started, or just checkpointed, loses none)."""
    limit = state.config.backfill_give_way_ms
    if limit < 0:
        return True
    held = victims.held_gpu(victim)
    lost = lost_work(victim, state.now, held)[0]
    return lost == 0 or lost * 1000 < limit * held


def preempt_candidates(s: Session, queue: Queue, job: Job) -> Candidates:
    """Preemptible jobs of the same queue with strictly lower priority: least lost work
    first, or under ``victim_order: kai`` lower priority first, then newest."""
    state = s.state
    found: list[Job] = []
    lowest = state.running_index().lowest_priority(queue.name)
    if lowest is None or lowest >= job.priority:
        return Candidates(found)  # no victim of lower priority: none read, none woken
    for item in s.victims.of((queue.name,)):
        victim = item[4]
        if victim.priority >= job.priority:
            continue
        if may_take(state, victim, "preempt"):
            found.append(victim)
        elif victim.status in ACTIVE:
            floor = min_runtime(state, victim.queue, "preempt")
            wake_when_free(state, victim, floor, hysteresis=False)
    if state.config.victim_order == "kai":
        found.sort(key=lambda v: (v.priority, -v.seq, v.job))
    return Candidates(found)


@dataclass(slots=True)
class Reclaimer:
    """The queue reclaiming ``need`` of one resource (0 GPU, 1 CPU, 2 memory) for a job,
    and by which strategies: fair-share reclaim (it stays within its fair share of that
    resource) and quota reclaim (within its deserved quota of it)."""

    queue: Queue
    need: int
    by_fair_share: bool
    by_quota: bool
    resource: int

    def __init__(
        self, queue: Queue, need: int, by_fair_share: bool, by_quota: bool, resource: int = 0
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.queue = queue
        self.need = need
        self.by_fair_share = by_fair_share
        self.by_quota = by_quota
        self.resource = resource


def reclaim_resources(state: State, job: Job) -> tuple[int, ...]:
    """The resources reclaim judges for ``job``: those it asks for that the cluster's
    nodes model (a resource no node has a capacity for is never short)."""
    total = capacity(state)
    return tuple(r for r in range(RESOURCES) if job.request[r] > 0 and total[r] > 0)


def reclaim_candidates(s: Session, queue: Queue, job: Job) -> Candidates:
    """Victims in other queues that reclaim may take from, in victim order.

    Two strategies, as KAI-Scheduler's: **fair-share reclaim** — the reclaiming queue stays
    within its fair share, and each victim queue is above its fair share and keeps a
    saturation (allocated / fair share) at least the reclaimer's after the move, so the
    queues' order is preserved; **quota reclaim** — the reclaiming queue stays within its
    deserved quota and takes only from queues above their deserved quota. Both checks hold
    at the leaves and again where the two queues' branches meet (the siblings below their
    lowest common ancestor; a top-level leaf is its own side there), so a subtree is not
    drained below its own share.

    Each resource the job asks for is judged on its own (``reclaim_resources``), and a
    victim by what it frees of them (``_judged``): its GPUs when it holds GPUs the job
    asks for, else the CPU and memory it holds that the job asks for. A victim freeing
    nothing the job asks for is never taken. A job asking for GPUs reclaims only while
    its queue stays within its GPU fair share or quota (so GPUs are never taken back on
    the strength of a CPU or memory share); CPU and memory it asks for are reclaimed,
    from jobs holding no GPU, only where its queue stays within its share of them.
    """
    shares = s.shares
    takers: list[Reclaimer] = []
    for r in reclaim_resources(s.state, job):
        need = job.request[r]
        takers.append(
            Reclaimer(
                queue,
                need,
                by_fair_share=queue.allocated[r] + need <= shares.fair[queue.name][r],
                by_quota=queue.allocated[r] + need <= shares.deserved[queue.name][r],
                resource=r,
            )
        )
    if any(t.resource == 0 and not (t.by_fair_share or t.by_quota) for t in takers):
        return Candidates([])  # GPUs are taken back only within the job's queue's GPU share
    takers = [t for t in takers if t.by_fair_share or t.by_quota]
    if not takers:
        return Candidates([])
    # Per giver leaf, the levels checked ((queue taken from, resource, most it may give)
    # at the leaf and where the branches meet), solved for the amount taken once per queue.
    levels_of: dict[str, list[Level]] = {}
    for leaf in _givers(s.state, shares, takers):
        pairs = [(queue, s.state.queues[leaf])]
        branches = _lowest_common_children(s.state, queue.name, leaf)
        # Where the branches meet is judged even when one side is a top-level leaf itself
        # (KAI-Scheduler's leveled queues); only two top-level leaves meet at the leaves.
        if branches is not None and (branches[0] is not queue or branches[1].name != leaf):
            pairs.append(branches)
        levels_of[leaf] = [
            (theirs.name, t.resource, *most_taken(shares, _leveled(shares, t, mine), mine, theirs))
            for mine, theirs in pairs
            for t in takers
        ]
    if not levels_of:
        return Candidates([])
    resources = tuple(t.resource for t in takers)
    return _taken(s, queue, job, _Take(s.state, s.victims, s.shares, levels_of, resources))


def _taken(s: Session, queue: Queue, job: Job, take: _Take) -> Candidates:
    """Reclaim's candidates read from ``take``'s givers, unless none could make room
    within the job's lost-work budget (``_beyond_budget``)."""
    state = s.state
    budget = lost_work_budget(state, job) if budgeted(s, queue, job, "reclaim") else NEVER
    if _beyond_budget(state, job, take, budget):
        return Candidates([])
    stops = state.tuning.budget_stops and state.config.victim_order != "kai"
    victims = take.run(together=True, budget=budget if stops else NEVER)
    if take.partial:
        # Read up to the budget: whether it clipped is settled only if that matters
        # (``make_room``, ``_Take.settle``).
        return Candidates(victims, None, take.allows, take)
    if not take.clipped:
        return Candidates(victims)
    return Candidates(victims, lambda: take.run(together=False), take.allows, take)


def _beyond_budget(state: State, job: Job, take: _Take, budget: int) -> bool:
    """Whether no victims of reclaim's givers could make room for ``job`` within its
    lost-work ``budget`` (NEVER: none bounds it), known without reading the victim order
    (``Tuning.lost_floor``): whatever victims make room free at least what its pods lack
    on the nodes (``placement.least_to_free``; fractions count as fractions), and
    ``RunningIndex.lost_floor`` bounds from below what any such set loses. Every victim
    set ``make_room`` could keep is then refused by the budget (``_try_rule``), and no
    victim of the givers can be protected by a time window (``_Take._no_wakes``), so
    reading them would ask for no wake-up either: the rule fails as it would."""
    if not state.tuning.lost_floor or job.request[0] <= 0 or budget >= NEVER:
        return False
    if not take._no_wakes():
        return False
    need = least_to_free(state.free_index(), gang_demand(job, True))
    if need <= 0:
        return False
    return state.running_index().lost_floor(state, take.levels_of, need, budget) > budget


def _leveled(shares: Shares, taker: Reclaimer, mine: Queue) -> Reclaimer:
    """The taker's strategies judged for ``mine``, the reclaiming side where the branches
    meet (the leaf's ancestor there), as KAI-Scheduler judges its leveled queues: quota
    reclaim also needs that ancestor to stay within its own deserved quota with the job,
    so a leaf within its quota does not take from another department on behalf of a
    department above its own. Fair-share reclaim there is bounded by the two sides'
    saturations (``most_taken``), so the ancestor goes above its fair share only while
    it stays less saturated than the queue it takes from."""
    if mine is taker.queue or not taker.by_quota:
        return taker
    r = taker.resource
    if mine.allocated[r] + taker.need <= shares.deserved[mine.name][r]:
        return taker
    return Reclaimer(taker.queue, taker.need, taker.by_fair_share, False, r)


def _givers(state: State, shares: Shares, takers: list[Reclaimer]) -> list[str]:
    """The other active leaves above their fair share or quota of a resource reclaimed (as
    the taker's strategies for it ask): a leaf above neither can give nothing, the
    leaf-level check refusing each of its jobs anyway."""
    givers: list[str] = []
    name = takers[0].queue.name
    for other in state.leaf_queues():
        if other.name == name or not other.active:
            continue
        for t in takers:
            held = shares.held_before(other, t.resource)
            over_fair = t.by_fair_share and held > shares.fair[other.name][t.resource]
            over_quota = t.by_quota and held > shares.deserved[other.name][t.resource]
            if over_fair or over_quota:
                givers.append(other.name)
                break
    return givers


Level = tuple[str, int, int, int]
"""A queue reclaim takes from, at a leaf or where the branches meet, the resource judged,
and its two bounds from ``most_taken``."""


_Stream = tuple[VictimItem, int, Iterator[VictimItem], list[Level], int]
"""A giver's victim stream in the merge: (its next victim, GPUs each of its jobs holds or
-1, the rest of it, the giver's levels, the giver's reclaim min-runtime)."""


def _judged(item: VictimItem, reclaimed: tuple[int, ...]) -> tuple[int, int, int] | None:
    """What a victim frees that reclaim judges, per resource (0 where not judged), or
    None when it frees nothing of the ``reclaimed`` resources. A victim holding GPUs a GPU
    job asks for is judged by its GPUs alone, as the queue order is; one holding none by
    the CPU and memory it holds that the job asks for."""
    gpu = item[5]
    if gpu > 0 and 0 in reclaimed:
        return gpu, 0, 0
    held = held_resources(item[4])
    judged = (0, held[1] if 1 in reclaimed else 0, held[2] if 2 in reclaimed else 0)
    return judged if any(judged) else None


@dataclass(slots=True)
class _Take:
    """Reclaim's victims in victim order, each checked against the levels of its queue
    (``most_taken``): merged from the givers' sorted streams (least lost work first) or,
    under ``victim_order: kai``, in KAI-Scheduler's order."""

    state: State
    victims: Victims
    shares: Shares
    levels_of: dict[str, list[Level]]
    reclaimed: tuple[int, ...]
    clipped: bool
    """Whether a victim was left out only because of what those before it took."""
    judged: dict[str, tuple[list[Level], tuple[int, int, int]]]
    """Per victim taken alone (``together=False``): its levels and what they judge of it."""
    dearest: int
    """The most work (GPU-ms) a victim taken together (``together=True``) loses; -1: none."""
    partial: bool
    """The together pass stopped past the lost-work budget before ``clipped`` was known;
    ``settle`` reads on when it is needed."""
    rest: (
        tuple[
            Iterator[tuple[VictimItem, list[Level], int]],
            dict[tuple[str, int], int],
            dict[tuple[str, int], int],
            tuple[VictimItem, list[Level], int],
        ]
        | None
    )
    """The suspended together pass (for ``settle``): its rows, counts and next row."""

    def __init__(
        self,
        state: State,
        victims: Victims,
        shares: Shares,
        levels_of: dict[str, list[Level]],
        reclaimed: tuple[int, ...],
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.state = state
        self.victims = victims
        self.shares = shares
        self.levels_of = levels_of
        self.reclaimed = reclaimed
        self.clipped = False
        self.judged = {}
        self.dearest = -1
        self.partial = False
        self.rest = None

    def run(self, *, together: bool, ceiling: int | None = None, budget: int = NEVER) -> list[Job]:
        """The victims in order that may be taken: with ``together``, each while every
        level it counts against still has room after those before it; without, each as
        if it were the only one (``allows`` then judges a set). With a ``ceiling`` (the
        node-by-node choice's), only victims holding GPUs and losing at most ``ceiling``
        GPU-ms are read: under gpuledger's victim order (least lost work first) the
        reading stops at the first dearer one, and streams of jobs holding no GPU are
        passed over whole (``Tuning.ceiling_stops``)."""
        taken = {(level[0], level[1]): 0 for ls in self.levels_of.values() for level in ls}
        zero = dict(taken)
        allowed: list[Job] = []
        bounded = ceiling is not None
        limit = NEVER if ceiling is None else ceiling
        state = self.state
        stops = bounded and state.tuning.ceiling_stops and state.config.victim_order != "kai"
        rows = self._ordered(taken if together else zero, zero, gpus_only=stops)
        cut = together and budget < NEVER and self._no_wakes()
        for item, levels, floor in rows:
            if cut and item[0] > budget and self.dearest > budget:
                self._suspend(rows, taken, zero, (item, levels, floor))
                return allowed
            if bounded and (item[0] > limit or item[5] <= 0):
                if stops and item[0] > limit:
                    break
                continue
            victim = item[4]
            judged = _judged(item, self.reclaimed) if victim.status in ACTIVE else None
            if judged is None or self._protected(victim, floor):
                continue
            if together:
                if not self._count_together(item[0], levels, judged, taken, zero):
                    continue
            elif _within(levels, zero, judged):
                self.judged[victim.job] = (levels, judged)
            else:
                continue
            if item[0] <= budget:
                allowed.append(victim)
        return allowed

    def _count_together(
        self,
        lost: int,
        levels: list[Level],
        judged: tuple[int, int, int],
        taken: dict[tuple[str, int], int],
        zero: dict[tuple[str, int], int],
    ) -> bool:
        """A victim of a together pass, losing ``lost``: counted (True) while every level
        still has room after those before it; else ``clipped`` notes whether it was left
        out only because of them."""
        if not _within(levels, taken, judged):
            if _within(levels, zero, judged):
                self.clipped = True
            return False
        _count(levels, taken, judged)
        self.dearest = max(self.dearest, lost)
        return True

    def _protected(self, victim: Job, floor: int) -> bool:
        """Whether min-runtime or hysteresis keeps ``victim`` now; if so, a cycle is asked
        for when that ends."""
        state = self.state
        if protected(victim, state.now, floor) or recently_reclaimed(state, victim):
            wake_when_free(state, victim, floor, hysteresis=True)
            return True
        return False

    def _suspend(
        self,
        rows: Iterator[tuple[VictimItem, list[Level], int]],
        taken: dict[tuple[str, int], int],
        zero: dict[tuple[str, int], int],
        row: tuple[VictimItem, list[Level], int],
    ) -> None:
        """Stop a together pass at ``row``: every victim from there on loses more than the
        budget (victim order), a victim past it was taken together (so the node-by-node
        ceiling is the budget), and none from there on can ask for a wake-up, so all that
        is left to learn is ``clipped``, read on by ``settle`` if it is needed."""
        if not self.clipped:
            self.partial = True
            self.rest = (rows, taken, zero, row)

    def _no_wakes(self) -> bool:
        """No victim of the givers can be protected but by being placed in this cycle
        (those lose no work, so come before any budget): no reclaim min-runtime, and no
        job that started by reclaiming within the hysteresis window."""
        state = self.state
        window = state.config.reclaim_hysteresis_ms
        index = state.running_index()
        now = state.now
        for leaf in self.levels_of:
            if min_runtime(state, leaf, "reclaim") > 0:
                return False
            if window > 0:
                found = index.reclaimed.get(leaf)
                if found and any(now - at < window for at in found.values()):
                    return False
        return True

    def settle(self) -> bool:
        """``clipped``, reading the rest of a partial together pass (it only learns)."""
        if not self.partial or self.rest is None:
            return self.clipped
        rows, taken, zero, first = self.rest
        self.partial = False
        self.rest = None
        state = self.state
        for item, levels, floor in itertools.chain([first], rows):
            if self.clipped:
                break
            victim = item[4]
            judged = _judged(item, self.reclaimed) if victim.status in ACTIVE else None
            # (``_no_wakes``: none is protected here, so none would ask for a wake-up)
            if judged is None or protected(victim, state.now, floor):
                continue
            if not recently_reclaimed(state, victim):
                self._count_together(item[0], levels, judged, taken, zero)
        return self.clipped

    def allows(self, victims: list[Job]) -> bool:
        """Whether these victims (from ``run(together=False)``) may be taken together: the
        smallest first, so a quota level is still above its deserved quota when the
        largest is picked."""
        taken = {(level[0], level[1]): 0 for ls in self.levels_of.values() for level in ls}
        rows = sorted((self.judged[v.job][1], v.job) for v in victims)
        for judged, job_id in rows:
            levels = self.judged[job_id][0]
            if not _within(levels, taken, judged):
                return False
            _count(levels, taken, judged)
        return True

    def admit(self, taken: dict[tuple[str, int], int], victims: list[Job]) -> bool:
        """Whether ``victims`` (from ``run(together=False)``) may be taken after those
        counted in ``taken``, counted in this order; if so they are counted in it. A set
        allowed so in some order is allowed smallest first (``allows``: each bound is
        loosest when the largest victim comes last), so this is a quick check before
        ``allows``; the victims a rule keeps are validated by ``allows`` in any case."""
        trial = dict(taken)
        for victim in victims:
            levels, judged = self.judged[victim.job]
            if not _within(levels, trial, judged):
                return False
            _count(levels, trial, judged)
        taken.update(trial)
        return True

    def count(self, taken: dict[tuple[str, int], int], victims: list[Job]) -> None:
        """Count ``victims`` (from ``run(together=False)``) in ``taken``."""
        for victim in victims:
            levels, judged = self.judged[victim.job]
            _count(levels, taken, judged)

    def tally(self) -> dict[tuple[str, int], int]:
        """Nothing taken yet, per queue and resource the levels judge."""
        return {(level[0], level[1]): 0 for ls in self.levels_of.values() for level in ls}

    def _ordered(
        self,
        taken: dict[tuple[str, int], int],
        zero: dict[tuple[str, int], int],
        *,
        gpus_only: bool = False,
    ) -> Iterator[tuple[VictimItem, list[Level], int]]:
        """(victim, its levels, its queue's reclaim min-runtime) in victim order. A stream
        whose jobs all hold the same GPUs, judged by GPU, is dropped once they hold more
        than their queue may still give (``taken`` only grows, so none of its jobs could
        be taken any more); with ``gpus_only`` one whose jobs hold no GPU is not read."""
        state = self.state
        if state.config.victim_order == "kai":
            yield from self._kai_ordered()
            return
        heap: list[_Stream] = []
        for leaf, levels in self.levels_of.items():
            floor = min_runtime(state, leaf, "reclaim")
            for same, stream in self.victims.streams(leaf):
                if (gpus_only or self.reclaimed == (0,)) and same is not None and same <= 0:
                    continue  # its jobs hold no GPU: none frees what a GPU-only job asks
                first = next(stream, None)
                if first is not None:
                    shortcut = -1 if same is None or same <= 0 or 0 not in self.reclaimed else same
                    heap.append((first, shortcut, stream, levels, floor))
        heapq.heapify(heap)
        while heap:
            item, same, stream, levels, floor = heap[0]
            yield item, levels, floor
            following = next(stream, None)
            if following is not None and same > 0 and not _within(levels, taken, (same, 0, 0)):
                if taken is not zero and _within(levels, zero, (same, 0, 0)):
                    self.clipped = True
                following = None  # budgets only shrink: the stream has nothing more
            _advance(heap, following)

    def _kai_ordered(self) -> Iterator[tuple[VictimItem, list[Level], int]]:
        """KAI-Scheduler's victim order: lower-priority queues first, then the queue most
        saturated (held ÷ fair share) before this cycle, then lower-priority jobs, then
        newer ones."""
        state = self.state
        shares = self.shares
        rows = []
        for leaf, levels in self.levels_of.items():
            q = state.queues[leaf]
            fair = shares.fair[leaf][0]
            held = shares.held_before(q, 0)
            saturation = held * 1_000_000 // fair if fair > 0 else NEVER
            floor = min_runtime(state, leaf, "reclaim")
            for _, stream in self.victims.streams(leaf):
                for item in stream:
                    job = item[4]
                    key = (q.priority, -saturation, leaf, job.priority, -job.seq, job.job)
                    rows.append((key, item, levels, floor))
        rows.sort(key=lambda row: row[0])
        for _, item, levels, floor in rows:
            yield item, levels, floor


def _within(
    levels: list[Level], taken: dict[tuple[str, int], int], held: tuple[int, int, int]
) -> bool:
    """Whether every level may still give a victim freeing ``held`` of the resources
    judged: by fair share while what is taken stays within its bound, or by quota while
    the queue is still above its deserved quota when the victim is picked
    (``most_taken``). A level of a resource the victim frees none of is not asked."""
    for name, resource, fair, above in levels:
        amount = held[resource]
        if amount <= 0:
            continue
        already = taken[(name, resource)]
        if not (already + amount <= fair or already < above):
            return False
    return True


def _count(
    levels: list[Level], taken: dict[tuple[str, int], int], judged: tuple[int, int, int]
) -> None:
    """Count a victim taken against each queue and resource its levels judge, once each:
    a top-level victim queue is both its own leaf and where the branches meet, judged
    twice (for the taker's leaf and for its side there) but giving the victim once."""
    for key in dict.fromkeys((name, resource) for name, resource, _, _ in levels):
        taken[key] += judged[key[1]]


def _advance(heap: list[_Stream], following: VictimItem | None) -> None:
    """Move the top stream on to its ``following`` victim (None: drop it)."""
    if following is None:
        heapq.heappop(heap)
        return
    _, same, stream, levels, floor = heap[0]
    if (len(heap) < 2 or following < heap[1][0]) and (len(heap) < 3 or following < heap[2][0]):
        heap[0] = (following, same, stream, levels, floor)  # still the smallest
    else:
        heapq.heapreplace(heap, (following, same, stream, levels, floor))


def _lowest_common_children(state: State, a: str, b: str) -> tuple[Queue, Queue] | None:
    """The two queues just below the lowest common ancestor of ``a`` and ``b``."""
    chain_a = list(reversed(state.ancestors(a)))
    chain_b = list(reversed(state.ancestors(b)))
    for qa, qb in zip(chain_a, chain_b, strict=False):
        if qa.name != qb.name:
            return qa, qb
    return None


def most_taken(shares: Shares, taker: Reclaimer, mine: Queue, theirs: Queue) -> tuple[int, int]:
    """How much ``mine`` (gaining the taker's need) may take from ``theirs`` in one cycle,
    of the taker's resource:
    (``fair``, ``above``). A victim holding h may be taken when what is already taken plus h
    is at most ``fair`` (fair-share reclaim), or when what is already taken is below
    ``above`` (quota reclaim: the queue is still above its deserved quota when the victim
    is picked, as KAI-Scheduler's rule; so quota reclaim never takes a queue further below
    its deserved quota than its last victim). -1: no victim by that strategy.

    Fair-share reclaim takes from a queue above its fair share, as long as its saturation
    after the move stays at least the taker's: (theirs - taken) / their fair share >=
    (mine + need) / my fair share; a queue whose fair share is 0 is saturated however
    little it holds, so all of it may go (``tests/test_scale_paths.py`` holds the plain
    form). ``mine`` is the taker's leaf, or its side of where the branches meet."""
    r = taker.resource
    their_alloc = shares.held_before(theirs, r)
    deserved = shares.deserved[theirs.name][r]
    above = their_alloc - deserved if taker.by_quota and their_alloc > deserved else -1
    fair = -1
    their_fair = shares.fair[theirs.name][r]
    if taker.by_fair_share and their_alloc > their_fair:
        if their_fair <= 0:
            fair = their_alloc
        else:
            # (their_alloc - taken) * mine_fair >= (mine + need) * their_fair, for integers
            after_mine = mine.allocated[r] + taker.need
            mine_fair = max(shares.fair[mine.name][r], 1)
            fair = their_alloc - -(-(after_mine * their_fair) // mine_fair)
    return fair, above


@dataclass(frozen=True, slots=True)
class Rule:
    """A way to make room: its name (``job_preempted.rule``), whether the policy's knobs
    allow it, and the victims it may take for a queue's job, cheapest first."""

    name: str
    enabled: Callable[[PolicyConfigured], bool]
    candidates: Callable[[Session, Queue, Job], Candidates]


RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "backfill",
        lambda _config: True,
        lambda s, _queue, job: Candidates(
            [v for v in backfilled_under(job, s.victims) if gives_way(s.state, v, s.victims)]
        ),
    ),
    Rule("reclaim", lambda config: config.reclaim, reclaim_candidates),
    Rule("preempt", lambda config: config.preempt, preempt_candidates),
)
"""The rules in the order they are tried: the first that lets the gang start wins."""


# --------------------------------------------------------------------------- making room

_NONE: Final = (0, 0, 0)


@dataclass(slots=True)
class _Room:
    """Making room for one gang in a statement: what it needs and what is free now."""

    state: State
    victims: Victims
    stmt: Statement
    job: Job
    allowed: dict[str, None] | None
    demand: list[tuple[int, int]]
    free: int
    """Milli-GPUs free now on the schedulable nodes."""
    must_free: tuple[int, int, int] = (0, 0, 0)
    """What the victims must hold together, per resource, for the job's queue and its
    ancestors to stay within their limits (``admission.limit_excess``; 0: no bound)."""

    def covers(self, victims: Iterable[Job]) -> bool:
        """Whether evicting ``victims`` frees at least ``must_free`` of every resource."""
        if not any(self.must_free):
            return True
        freed = [0, 0, 0]
        for victim in victims:
            for resource, amount in enumerate(held_resources(victim)):
                freed[resource] += amount
        return all(f >= m for f, m in zip(freed, self.must_free, strict=True))

    def could_fit(self, candidates: list[Job]) -> bool:
        """Could the gang fit at all were every candidate evicted? The victims' GPUs are
        only booked per node (no statement steps), then the bounds of ``may_fit`` applied:
        a rule whose every candidate together cannot make room is not tried victim by
        victim."""
        extra: dict[str, int] = {}
        free = self.free
        indexed = self.state.running_index().spots
        for victim in candidates:
            spots = indexed.get(victim.job)
            for name, milli in self.victims.spots(victim) if spots is None else spots:
                extra[name] = extra.get(name, 0) + milli
                free += milli
        if free < self.job.request[0] or not self.covers(candidates):
            return False
        if self.stmt.index is None:
            return True
        nodes = self.state.nodes
        for size, count in self.demand:
            slots = self.stmt.index.slots_at_most(size)
            for name, milli in extra.items():
                node = nodes.get(name)
                if node is not None:
                    base = node.free_gpu_milli
                    slots += (base + milli) // size - base // size
            if slots < count:
                return False
        return True

    def evict_until_fits(
        self, candidates: list[Job]
    ) -> tuple[list[PodPlacement], list[Job]] | None:
        """Evict candidates in order until the gang places: its placements and the victims
        evicted (left so in the statement), or None with the statement as it was."""
        stmt = self.stmt
        point = stmt.checkpoint()
        need = self.job.request[0]
        free = self.free
        wait = 0  # victims to evict before the next placement attempt (doubles on failure)
        step = 1
        tried = 0  # victims evicted at the last placement attempt
        for count, victim in enumerate(candidates, 1):
            stmt.evict(victim)
            free += self.victims.held_gpu(victim)
            if free < need or (stmt.index is not None and not may_fit(stmt.index, self.demand)):
                continue  # cheap necessary conditions before a full gang placement
            if not self.covers(candidates[:count]):
                continue  # the queue would still be over a limit
            if wait > 0:
                wait -= 1
                continue
            placements = stmt.place_gang(self.job, skip=self.allowed)
            tried = count
            if placements is not None:
                return placements, candidates[:count]
            # A gang that fits the counts but not yet the nodes is tried again after
            # 1, 2, 4, ... more victims: extra victims are dropped below, attempts are not.
            wait, step = step, step * 2
        if tried < len(candidates) and self.covers(candidates):
            placements = stmt.place_gang(self.job, skip=self.allowed)  # every one evicted
            if placements is not None:
                return placements, candidates
        stmt.rollback(point)  # never evict for a gang that still would not fit
        return None


def make_room(
    s: Session,
    queue: Queue,
    job: Job,
    stmt: Statement,
    allowed: dict[str, None] | None,
) -> tuple[list[PodPlacement] | None, list[tuple[Job, str]]]:
    """Evict the fewest, cheapest victims that let the gang start; never in vain. Returns
    the gang's placements (made in ``stmt``) and the victims with the rule taking each.

    A job whose queue (or an ancestor) is at a limit (``admission.limit_excess``) makes
    room only by ``preempt``, and its victims must hold together at least the excess of
    each resource, so the queue and its ancestors end within their limits."""
    state = s.state
    must_free = limit_excess(state, queue.name, job.request) if s.limited[queue.name] else _NONE
    room = _Room(
        state,
        s.victims,
        stmt,
        job,
        allowed,
        gang_demand(job, stmt.fractional),
        state.free_schedulable(),
        must_free,
    )
    # Where reclaim's shared bounds stopped the victim order short and it could not make
    # room: without a lost-work budget (KAI's) every victim allowed alone is tried in
    # victim order (with one, reclaim's bounds are spent cheapest first, so what it evicts
    # stays cheap); then, for a job asking for GPUs, the victims node by node, cheapest
    # nodes first (``_node_by_node``), so the bounds are spent on whole nodes, each victim
    # losing no more work than the dearest the victim order counted.
    budgetless = state.config.lost_work_ratio_milli <= 0
    for rule in RULES:
        if not rule.enabled(state.config) or (any(must_free) and rule.name != "preempt"):
            continue
        budget = lost_work_budget(state, job) if budgeted(s, queue, job, rule.name) else NEVER
        if rule.name == "reclaim" and budget < NEVER and backing_off(state, job):
            continue
        found = rule.candidates(s, queue, job)
        kept = _try_rule(room, found.victims, budget)
        if kept is None and found.take is not None and found.take.partial:
            # Budgeted (so no ``wider``): the node-by-node choice is all that ``clipped``
            # gates, and its ceiling is the budget; settle ``clipped`` only if it would run.
            pre = _by_node_precheck(room, found.take, budget) if job.request[0] > 0 else None
            if pre and found.take.settle():
                kept = _by_node(room, found, found.take, pre, budget)  # read already
        elif kept is None and found.wider is not None and found.allows is not None:
            wider = found.wider() if budgetless else None
            if wider is not None:
                kept = _try_rule(room, wider, budget, found.allows)
            if kept is None and found.take is not None and job.request[0] > 0:
                kept = _by_node(room, found, found.take, wider, budget)
        if kept is not None:
            placements, victims = kept
            return placements, [(v, rule.name) for v in victims]
    return None, []


def _try_rule(
    room: _Room,
    candidates: list[Job],
    budget: int,
    allows: Callable[[list[Job]], bool] | None = None,
) -> tuple[list[PodPlacement], list[Job]] | None:
    """The gang's placements and the victims kept, evicting ``candidates`` in order until
    it fits, then only those the placement (and a limit) needs — or, under gpuledger's
    victim order, one victim that alone makes room losing no more work (``_one_instead``).
    None, with the statement as it was, when they cannot make room, cost more than
    ``budget`` together, or are not ``allows``-ed together."""
    state = room.state
    stmt = room.stmt
    if budget < NEVER:
        candidates = [v for v in candidates if room.victims.lost(v) <= budget]
    if not candidates or not room.could_fit(candidates):
        return None  # even with every candidate evicted the gang could not fit
    point = stmt.checkpoint()
    found = room.evict_until_fits(candidates)
    if found is None:
        return None
    placements, chosen = found
    kept = _needed_victims(state, chosen, placements, _spare(chosen, room.must_free))
    if state.config.victim_order != "kai":
        one = _one_instead(room, candidates, kept, point)
        if one is not None:
            return one
    if (budget < NEVER and sum(room.victims.lost(v) for v in kept) > budget) or (
        allows is not None and not allows(kept)
    ):
        stmt.rollback(point)  # the start would cost more than the job has waited, or the
        return None  # rule's bounds do not allow these victims together
    return placements, kept


def _by_node(
    room: _Room, found: Candidates, take: _Take, wider: list[Job] | None, budget: int
) -> tuple[list[PodPlacement], list[Job]] | None:
    """Reclaim's victims node by node (``_node_by_node``), tried when together they could
    make room at all (``_Room.could_fit`` only grows with the victims, and the nodes'
    victims are among them): the victims allowed alone (from ``wider`` when it was read
    whole) that ``_node_ceiling_allows``."""
    ceiling = min(budget, take.dearest)
    guaranteed = budget >= NEVER
    if wider is None:
        candidates = take.run(together=False, ceiling=NEVER if guaranteed else ceiling)
    else:
        candidates = wider
    victims = room.victims
    candidates = [v for v in candidates if _node_ceiling_allows(victims, v, ceiling, guaranteed)]
    if room.state.tuning.ceiling_stops and (not candidates or not room.could_fit(candidates)):
        return None
    by_node = _node_by_node(room, candidates, NEVER if guaranteed else ceiling, take)
    return _try_rule(room, by_node, budget, found.allows)


def _node_ceiling_allows(victims: Victims, v: Job, ceiling: int, guaranteed: bool) -> bool:
    """Whether the node-by-node choice may take ``v``: when it loses no more work than
    ``ceiling`` (the dearest victim the victim order counted, or the lost-work budget if
    less); and, for reclaim within the job's deserved quota (``guaranteed``: no lost-work
    budget bounds it, §5), whatever it loses when all its GPUs sit on one node — a node's
    room then costs only what is on that node, and the cheapest nodes are taken first. A
    gang spanning nodes stays within the ceiling there: it is evicted whole (all or
    nothing across its pods), throwing away its pods on nodes the job does not need."""
    if victims.lost(v) <= ceiling:
        return True
    return guaranteed and len({n for n, m in victims.spots(v) if m > 0}) <= 1


def _by_node_precheck(room: _Room, take: _Take, budget: int) -> list[Job] | None:
    """``_by_node``'s first test, which does not depend on ``clipped``: its candidates
    (within the ceiling) when together they could make room, else None."""
    ceiling = min(budget, take.dearest)
    candidates = take.run(together=False, ceiling=ceiling)
    if not room.state.tuning.ceiling_stops or (candidates and room.could_fit(candidates)):
        return candidates
    return None


def _node_by_node(room: _Room, candidates: list[Job], budget: int, take: _Take) -> list[Job]:
    """The candidates node by node, for a gang the victim order cannot make room for
    because reclaim's shared bounds are spent on devices scattered over many nodes
    before any node is freed (a gang of whole-node pods on a cluster packed pod by pod).

    A node is ranked when the gang may use it (not cordoned nor kept off, a pod's
    selector matches and its taints are tolerated), it holds GPUs, and every job holding
    GPUs on it is a candidate losing no more than ``budget`` (``_by_node`` passes the
    lost-work budget, or the dearest victim the victim order counted if less; every other
    rule — min-runtime, hysteresis, a queue's bounds alone — was applied to the
    candidates). Nodes are taken cheapest first: least work lost by the victims not taken
    yet, then fewest such victims, then by name (a victim spanning nodes makes its other
    nodes cheaper once taken); a node's victims join only if the bounds allow them
    together with those before (``_Take.admit``, else ``_Take.allows``). ``_try_rule``
    then evicts them in this order until the gang fits and keeps only those its
    placement needs.
    """
    by_id = {v.job: v for v in candidates if budget >= NEVER or room.victims.lost(v) <= budget}
    cost = {job_id: room.victims.lost(v) for job_id, v in by_id.items()}
    blockers = _freeable_nodes(room, by_id)
    where: dict[str, list[str]] = {}  # job -> the ranked nodes it holds GPUs on
    for name, job_id in ((n, j) for n, holders in blockers.items() for j in holders):
        where.setdefault(job_id, []).append(name)
    taken: dict[str, None] = {}
    amounts = take.tally()
    order: list[Job] = []

    def rank(name: str) -> tuple[int, int, str]:
        left = [j for j in blockers[name] if j not in taken]
        return sum(cost[j] for j in left), len(left), name

    heap = [rank(name) for name in blockers]
    heapq.heapify(heap)
    current = {row[2]: row for row in heap}
    while heap:
        row = heapq.heappop(heap)
        name = row[2]
        if current.get(name) != row:
            continue  # a cheaper row of this node came first, or it is done
        del current[name]
        new = [by_id[j] for j in blockers[name] if j not in taken]
        if not new:
            continue
        if not take.admit(amounts, new):
            if not take.allows([*order, *new]):
                continue
            take.count(amounts, new)
        order.extend(new)
        taken.update(dict.fromkeys(v.job for v in new))
        for other in dict.fromkeys(n for v in new for n in where[v.job]):
            if other in current:
                current[other] = rank(other)
                heapq.heappush(heap, current[other])
    return order


def _freeable_nodes(room: _Room, takable: dict[str, Job]) -> dict[str, list[str]]:
    """Node -> the jobs holding GPUs on it (sorted), for each node in name order that the
    gang may use, holding GPUs, whose every such job is ``takable``."""
    state = room.state
    pods = [p for p in room.job.pods if p.gpu_milli > 0] or list(room.job.pods)
    found: dict[str, list[str]] = {}
    for name in sorted(state.nodes):
        node = state.nodes[name]
        if node.cordoned or node.gpus <= 0 or (room.allowed is not None and name in room.allowed):
            continue
        if node.free_gpu_milli >= node.gpus * 1000:
            continue  # nothing to free on it
        if not any(selector_matches(node, p.node_selector) and tolerates(node, p) for p in pods):
            continue
        holders = []
        for job_id in dict.fromkeys(node.pods.values()):
            job = state.jobs.get(job_id)
            if job is None or not any(n == name and m > 0 for n, m in room.victims.spots(job)):
                continue  # holds no GPU here
            if job_id not in takable:
                break  # a job the rule may not take holds GPUs here
            holders.append(job_id)
        else:
            found[name] = sorted(holders)
    return found


def _one_instead(
    room: _Room, candidates: list[Job], kept: list[Job], point: tuple[int, int]
) -> tuple[list[PodPlacement], list[Job]] | None:
    """One victim that alone lets the gang start, losing no more work than ``kept``
    together (strictly less when ``kept`` is one victim): the first such in victim order,
    so the fewest victims and the least lost work together. The candidates are read
    while they lose no more than ``kept`` (they come cheapest first); None: keep ``kept``
    (the statement is then rolled back to ``point``; the caller's placements stand)."""
    cost = sum(room.victims.lost(v) for v in kept)
    single = kept[0].job if len(kept) == 1 else None
    stmt = room.stmt
    tries = 0
    for victim in candidates:
        lost = room.victims.lost(victim)
        if lost > cost or tries >= room.state.tuning.one_instead_tries:
            break
        if single is not None and lost >= cost:
            break  # one victim already: only a cheaper one would do better
        if not room.could_fit([victim]):
            continue
        tries += 1
        stmt.rollback(point)
        stmt.evict(victim)
        placements = stmt.place_gang(room.job, skip=room.allowed)
        if placements is not None:
            return placements, [victim]
    stmt.rollback(point)
    return None


def _spare(chosen: list[Job], must_free: tuple[int, int, int]) -> list[int]:
    """Per resource, how much of what ``chosen`` hold may be given back with the limits
    still kept (``make_room``'s ``must_free``; NEVER: no limit to keep)."""
    spare = [NEVER, NEVER, NEVER]
    for resource, needed in enumerate(must_free):
        if needed > 0:
            spare[resource] = sum(held_resources(v)[resource] for v in chosen) - needed
    return spare


def _needed_victims(
    state: State, chosen: list[Job], placements: list[PodPlacement], spare: list[int]
) -> list[Job]:
    """Never more victims than the placement, and the limits, need.

    Called with every chosen victim evicted and the gang placed. Victims are given back
    their resources, dearest first, whenever the placement still fits beside them (on
    the very devices and nodes it uses) and ``spare`` (``_spare``) still covers what they
    hold, so those kept are each needed by it or by a limit: victims with nothing under
    the gang's nodes go back unless a limit needs them gone.
    """
    nodes = state.nodes
    free: dict[str, list[int]] = {}  # the gang's nodes, in placement order
    for p in placements:
        node = nodes[p.node]
        free.setdefault(p.node, [*node.free_devices, node.free_cpu, node.free_memory])
    kept: list[Job] = []
    for victim in reversed(chosen):
        specs = {p.name: p for p in victim.pods}
        under = [(p, specs[p.pod]) for p in victim.live() if p.node in free]
        holds = held_resources(victim)
        if any(h > room for h, room in zip(holds, spare, strict=True)):
            kept.append(victim)  # the queue would go back over a limit without it
            continue
        _shift(free, under, -1)  # tentatively back on its nodes
        if any(_overcommitted(nodes[p.node], free[p.node]) for p, _ in under):
            _shift(free, under, 1)
            kept.append(victim)
        else:
            for resource, h in enumerate(holds):
                spare[resource] -= h
    kept.reverse()
    return kept


def _shift(free: dict[str, list[int]], pods: list[tuple[PodPlacement, PodSpec]], sign: int) -> None:
    """Add (``sign`` 1) or take (-1) the pods' devices, CPU and memory to ``free``: per node,
    its devices' free milli-GPUs followed by free millicores and free MiB."""
    for placement, spec in pods:
        row = free[placement.node]
        for slot in placement.gpus:
            row[slot.device] += sign * slot.milli
        row[-2] += sign * spec.cpu_milli
        row[-1] += sign * spec.memory_mib


def _overcommitted(node: Node, row: list[int]) -> bool:
    """A device, or the node's CPU or memory where it has a capacity, below zero."""
    return (
        min(row[:-2], default=0) < 0
        or (node.cpu_milli > 0 and row[-2] < 0)
        or (node.memory_mib > 0 and row[-1] < 0)
    )

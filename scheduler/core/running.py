"""What runs, kept across cycles in the two orders the policy reads it in.

Two orders of the running jobs barely change between cycles, and re-deriving them from
every running job in every cycle would take about half a cycle at 1,000 nodes: the
**expected ends** (EASY backfill releases running jobs in that order to find when and
where a waiting gang could start) and the **victim order** (least lost work first; reclaim
and preempt take victims in it).
``RunningIndex`` keeps both, and ``apply`` keeps it current job by job (``update``), so a
cycle reads them without sorting. It is a derived cache (``State.running_cache``): built
from the leaf queues' active jobs on first use, dropped when the queue tree changes or a
snapshot is restored, and checked against a fresh build by the property tests.

Both orders depend on ``now``, but in a way that can be kept:

- A started job's expected end is ``started + runtime - checkpointed``, fixed, except that
  an end already past counts as ``now``. A job placed whole but not started yet counts
  from its placement (``allocated + runtime - checkpointed``), the earliest it could have
  started: an end that moved with ``now`` would move a reservation resting on it every
  cycle; once it starts, its end counts from its start. Ends still ahead are kept sorted
  (``future``); those that have passed move, once, to ``overrun``, kept by sequence number
  (at ``now`` they all tie on the end). A job holding pods but not yet allocated whole
  (``fifo``'s partly placed gangs) ends ``runtime`` from now: the few such jobs are
  ordered when read.
- A victim's key is (lost work, -start, -seq, job) with lost work ``(now - start) ×
  held GPUs``. Among jobs of one leaf queue holding the same GPUs and not checkpointing,
  that order is the order of (-start, -seq, job) at every ``now``: ``groups`` keep it.
  Jobs not yet started (lost work 0 at any time) are kept by sequence; checkpointing
  jobs, whose lost work saws up and down, are keyed and sorted when read (``dynamic``).
  Readers merge the groups lazily, so reclaim reads only as far as its budgets allow.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, Final

from events.model import MILLI

if TYPE_CHECKING:
    from scheduler.core.state import Job, State

NEVER: Final = 1 << 62
"""The expected end of a job without an expected runtime (released last)."""

VictimItem = tuple[int, int, int, str, "Job", int]
"""(lost GPU-ms, -start, -seq, job id, the job, milli-GPUs it holds): a victim in order."""


def held_gpu(job: Job) -> int:
    """Milli-GPUs of the job's pods that have not finished."""
    total = 0
    finished = job.finished
    for placement in job.placements.values():
        if finished and placement.pod in finished:
            continue
        for slot in placement.gpus:
            total += slot.milli
    return total


def held_resources(job: Job) -> tuple[int, int, int]:
    """[gpu_milli, cpu_milli, memory_mib] of the job's pods that have not finished: what
    its queue's allocation would lose were it evicted."""
    gpu = cpu = memory = 0
    specs = {p.name: p for p in job.pods}
    for placement in job.live():
        spec = specs[placement.pod]
        gpu += sum(slot.milli for slot in placement.gpus)
        cpu += spec.cpu_milli
        memory += spec.memory_mib
    return gpu, cpu, memory


def gpu_spots(job: Job) -> tuple[tuple[str, int], ...]:
    """(node, milli-GPUs) of each of the job's pods that holds GPUs and has not finished."""
    finished = job.finished
    spots = []
    for placement in job.placements.values():
        if finished and placement.pod in finished:
            continue
        milli = 0
        for slot in placement.gpus:
            milli += slot.milli
        if milli:
            spots.append((placement.node, milli))
    return tuple(spots)


@dataclass(slots=True)
class _Entry:
    """What ``add`` indexed of a job, so it can be taken out again."""

    end: tuple[int, int, str] | None
    """(raw expected end, seq, job) of a started or allocated job; None: neither."""
    leaf: str
    victim: str
    """Which victim list holds it: "group", "waiting", "dynamic" or "" (not preemptible)."""
    key: tuple[Any, ...] | None
    """Its item in that list (group: (-start, -seq, job); waiting: (-seq, job))."""
    held: int
    under: str
    """The reservation holder it was backfilled under ("" for none)."""
    preemptible: bool = False
    priority: int = 0
    gpus: bool = False
    """Whether it asks for GPUs: which of the end orders holds it."""


@dataclass(slots=True)
class RunningIndex:
    """The active jobs of the leaf queues, by expected end and in victim order."""

    mark: int = 0
    """Started (or allocated) jobs whose raw end is at or before ``mark`` are in
    ``overrun``."""
    future: list[tuple[int, int, str]] = field(default_factory=list)
    """(raw expected end, seq, job) of started (or allocated) jobs asking for GPUs ending
    after ``mark``, sorted."""
    overrun: list[tuple[int, str]] = field(default_factory=list)
    """(seq, job) of started (or allocated) jobs asking for GPUs whose expected end has
    passed, sorted."""
    future_cpu: list[tuple[int, int, str]] = field(default_factory=list)
    """``future`` of the jobs asking for no GPU: kept apart, so that a walk for a gang
    asking only for GPUs does not pass over them one by one."""
    overrun_cpu: list[tuple[int, str]] = field(default_factory=list)
    """``overrun`` of the jobs asking for no GPU."""
    unstarted: dict[str, None] = field(default_factory=dict)
    """Active jobs neither started nor allocated whole: their expected end counts from
    ``now``."""
    groups: dict[str, dict[int, list[tuple[int, int, str]]]] = field(default_factory=dict)
    """leaf -> GPUs held -> sorted (-start, -seq, job) of its preemptible started jobs
    that do not checkpoint."""
    waiting: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    """leaf -> sorted (-seq, job) of its preemptible jobs not yet started."""
    dynamic: dict[str, dict[str, None]] = field(default_factory=dict)
    """leaf -> its preemptible checkpointing jobs (and any started at time 0)."""
    under: dict[str, dict[str, None]] = field(default_factory=dict)
    """reservation holder -> preemptible jobs backfilled under it."""
    held: dict[str, int] = field(default_factory=dict)
    """job -> milli-GPUs it holds (every indexed job)."""
    spots: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    """job -> (node, milli-GPUs) of each of its pods holding GPUs (every indexed job)."""
    entries: dict[str, _Entry] = field(default_factory=dict)
    priorities: dict[str, dict[int, int]] = field(default_factory=dict)
    """leaf -> priority -> how many of its preemptible indexed jobs have it (preempt reads
    a queue's jobs only when one of lower priority runs: ``lowest_priority``)."""
    reclaimed: dict[str, dict[str, int]] = field(default_factory=dict)
    """leaf -> job -> reclaimed_at, of its preemptible indexed jobs that started by
    reclaiming (the only victims reclaim's hysteresis can protect: ``_Take._no_wakes``)."""

    @classmethod
    def of(cls, state: State) -> RunningIndex:
        """Index every active job of the leaf queues."""
        index = cls(mark=state.now)
        jobs = state.jobs
        for leaf in state.leaf_queues():
            for job_id in leaf.active:
                index.add(jobs[job_id], leaf.name)
        return index

    # ----------------------------------------------------------------- upkeep

    def update(self, state: State, job: Job) -> None:
        """The job's placements, start or backfill mark changed: index it afresh."""
        if job.job in self.entries:
            self.remove(job.job)
        queue = state.queues.get(job.queue)
        if queue is not None and not queue.children and job.job in queue.active:
            self.add(job, queue.name)

    def add(self, job: Job, leaf: str) -> None:
        job_id = job.job
        spots = gpu_spots(job)
        gpus = job.request[0] > 0
        held = 0
        for _, milli in spots:
            held += milli
        self.held[job_id] = held
        self.spots[job_id] = spots
        end: tuple[int, int, str] | None = None
        began = job.started_at if job.started_at is not None else job.allocated_at
        if began is None:
            self.unstarted[job_id] = None
        else:
            runtime = job.expected_runtime_ms
            raw = NEVER if runtime is None else began + runtime - job.checkpointed_ms
            end = (raw, job.seq, job_id)
            if raw <= self.mark:
                insort(self.overrun if gpus else self.overrun_cpu, (job.seq, job_id))
            else:
                insort(self.future if gpus else self.future_cpu, end)
        victim = ""
        key: tuple[Any, ...] | None = None
        if job.preemptible:
            if job.started_at is None:
                victim = "waiting"
                key = (-job.seq, job_id)
                insort(self.waiting.setdefault(leaf, []), key)
            elif job.checkpoint_interval_ms or not job.started_at:
                # ``victim_key`` reads a start at 0 as "now": keyed when read, as these.
                victim = "dynamic"
                self.dynamic.setdefault(leaf, {})[job_id] = None
            else:
                victim = "group"
                key = (-job.started_at, -job.seq, job_id)
                insort(self.groups.setdefault(leaf, {}).setdefault(held, []), key)
        if job.preemptible:
            counts = self.priorities.setdefault(leaf, {})
            counts[job.priority] = counts.get(job.priority, 0) + 1
            if job.reclaimed_at is not None:
                self.reclaimed.setdefault(leaf, {})[job_id] = job.reclaimed_at
        under = job.backfill_for if job.preemptible else ""
        if under:
            self.under.setdefault(under, {})[job_id] = None
        self.entries[job_id] = _Entry(
            end, leaf, victim, key, held, under, job.preemptible, job.priority, gpus
        )

    def remove(self, job_id: str) -> None:
        entry = self.entries.pop(job_id)
        if entry.preemptible:
            self._forget_preemptible(job_id, entry)
        del self.held[job_id]
        del self.spots[job_id]
        if entry.end is None:
            del self.unstarted[job_id]
        elif entry.end[0] <= self.mark:
            _remove(self.overrun if entry.gpus else self.overrun_cpu, (entry.end[1], job_id))
        else:
            _remove(self.future if entry.gpus else self.future_cpu, entry.end)
        leaf = entry.leaf
        if entry.victim == "group":
            by_held = self.groups[leaf]
            _remove(by_held[entry.held], entry.key)
            if not by_held[entry.held]:
                del by_held[entry.held]
        elif entry.victim == "waiting":
            _remove(self.waiting[leaf], entry.key)
        elif entry.victim == "dynamic":
            del self.dynamic[leaf][job_id]
        if entry.under:
            holders = self.under[entry.under]
            del holders[job_id]
            if not holders:
                del self.under[entry.under]

    def advance(self, now: int) -> None:
        """Move the started jobs whose expected end has passed by ``now`` to ``overrun``."""
        if now <= self.mark:
            return
        for future, overrun in ((self.future, self.overrun), (self.future_cpu, self.overrun_cpu)):
            cut = bisect_left(future, (now + 1,))
            if cut:
                passed = [(seq, job_id) for _, seq, job_id in future[:cut]]
                del future[:cut]
                if len(passed) > 16:
                    overrun.extend(passed)
                    overrun.sort()
                else:
                    for item in passed:
                        insort(overrun, item)
        self.mark = now

    def overrun_count(self) -> int:
        """How many indexed jobs have passed their expected end (as of ``advance``)."""
        return len(self.overrun) + len(self.overrun_cpu)

    # ----------------------------------------------------------------- reading

    def ends(self, state: State, gpus_only: bool) -> Iterator[tuple[int, int, str]]:
        """(expected end, seq, job) of every indexed job, soonest first (ends already
        past count as ``now``; jobs without an expected runtime last); only the jobs
        asking for GPUs if ``gpus_only``. Lazy: the caller stops when it has seen enough."""
        now = state.now
        self.advance(now)
        jobs = state.jobs
        starting = []
        for job_id in self.unstarted:
            job = jobs[job_id]
            if gpus_only and not job.request[0]:
                continue
            runtime = job.expected_runtime_ms
            end = NEVER if runtime is None else max(now, now + runtime - job.checkpointed_ms)
            starting.append((end, job.seq, job_id))
        starting.sort()
        # (lazy: a walk usually stops long before its end)
        passed = _merged([self.overrun] if gpus_only else [self.overrun, self.overrun_cpu])
        at_now = _at(now, passed)
        futures = [self.future] if gpus_only else [self.future, self.future_cpu]
        if starting:  # (an end counted from now may tie with the overrun ones)
            return heapq.merge(at_now, *futures, starting)
        # Every overrun end is ``now`` and every future one later (``advance``).
        return chain(at_now, _merged(futures))

    def victims(self, state: State, leaf: str) -> list[tuple[int | None, Iterator[VictimItem]]]:
        """The leaf's preemptible jobs as sorted streams of ``VictimItem``: one per group
        of equal GPUs held (with that amount), and the others (with None)."""
        now = state.now
        jobs = state.jobs
        streams: list[tuple[int | None, Iterator[VictimItem]]] = []
        for held, items in self.groups.get(leaf, {}).items():
            streams.append((held, _grouped(items, held, now, jobs)))
        waiting = self.waiting.get(leaf)
        held_of = self.held
        if waiting:
            streams.append((None, _waiting(waiting, now, jobs, held_of)))
        dynamic = self.dynamic.get(leaf)
        if dynamic:
            keyed = []
            for job_id in dynamic:
                job = jobs[job_id]
                held = held_of[job_id]
                keyed.append((*victim_key(job, now, held), job, held))
            keyed.sort()
            streams.append((None, iter(keyed)))
        return streams

    def lost_floor(self, state: State, leaves: Iterable[str], need: int, budget: int) -> int:
        """At most the work (GPU-ms) that evicting preemptible jobs of these leaves, each
        losing at most ``budget``, loses when together they hold ``need`` milli-GPUs;
        NEVER when together they hold less. Counting stops once it passes ``budget``.

        A fractional knapsack on costs never above the true ones, so never above what any
        set of those jobs loses. Each job costs per milli-GPU it holds what an "age" says:
        ``(age - 1000) / 1000``. A group's job that started ``age`` ms ago and holds ``h``
        loses ``age × h / 1000`` (less under a second of rounding); a checkpointing job
        losing ``l`` has the age ``l × 1000 // h + 1000``; a job not started loses
        nothing. Groups are read lazily in age order (the order of their starts), so the
        reading stops within ``need`` milli-GPUs; checkpointing jobs are keyed first."""
        free, ordered = self._costed(state, leaves, budget)
        need -= free
        if need <= 0:
            return 0
        smallest = min((held for held, _ in ordered), default=NEVER)
        floor = 0
        for age, held, lost in heapq.merge(*(stream for _, stream in ordered)):
            if (age - MILLI) * smallest // MILLI > budget:
                break  # every job from here on loses more than the budget
            if lost > budget:
                continue
            part = min(held, need)
            floor += max(0, age - MILLI) * part // MILLI
            need -= part
            if need <= 0 or floor > budget:
                return floor
        return NEVER

    def _costed(
        self, state: State, leaves: Iterable[str], budget: int
    ) -> tuple[int, list[tuple[int, Iterable[tuple[int, int, int]]]]]:
        """For ``lost_floor``: the milli-GPUs the leaves' jobs not started hold, and the
        other preemptible jobs holding GPUs as streams of (age, milli-GPUs held, lost
        work) in age order, each with the least any of its jobs holds: the groups read
        lazily, the checkpointing jobs losing at most ``budget`` keyed."""
        now = state.now
        jobs = state.jobs
        free = 0
        ordered: list[tuple[int, Iterable[tuple[int, int, int]]]] = []
        for leaf in leaves:
            for _, job_id in self.waiting.get(leaf, ()):
                free += self.held[job_id]
            dear = []
            for job_id in self.dynamic.get(leaf, ()):
                held = self.held[job_id]
                if held > 0:
                    lost = victim_key(jobs[job_id], now, held)[0]
                    if lost <= budget:
                        dear.append((lost * MILLI // held + MILLI, held, lost))
            if dear:
                dear.sort()
                ordered.append((min(held for _, held, _ in dear), dear))
            for held, items in self.groups.get(leaf, {}).items():
                if held > 0 and items:
                    ordered.append((held, _ages(items, held, now)))
        return free, ordered

    def victim_order(self, state: State, leaves: Iterable[str]) -> Iterator[VictimItem]:
        """The preemptible jobs of these leaves, cheapest victim first."""
        streams = [it for leaf in leaves for _, it in self.victims(state, leaf)]
        return iter(streams[0]) if len(streams) == 1 else heapq.merge(*streams)

    def _forget_preemptible(self, job_id: str, entry: _Entry) -> None:
        """Take a preemptible job out of ``priorities`` and ``reclaimed``."""
        counts = self.priorities[entry.leaf]
        counts[entry.priority] -= 1
        if not counts[entry.priority]:
            del counts[entry.priority]
        found = self.reclaimed.get(entry.leaf)
        if found is not None and found.pop(job_id, None) is not None and not found:
            del self.reclaimed[entry.leaf]

    def lowest_priority(self, leaf: str) -> int | None:
        """The lowest priority of the leaf's preemptible jobs (None: it has none)."""
        counts = self.priorities.get(leaf)
        return min(counts) if counts else None

    def backfilled_under(self, state: State, holder: str) -> list[Job]:
        """Preemptible jobs backfilled under ``holder``'s reservation, in victim order."""
        found = self.under.get(holder)
        if not found:
            return []
        now = state.now
        jobs = state.jobs
        return sorted(
            (jobs[j] for j in found),
            key=lambda job: victim_key(job, now, self.held[job.job]),
        )

    def content(self, now: int) -> dict[str, object]:
        """Everything indexed, in a form independent of how it was built (for tests)."""
        self.advance(now)
        return {
            "ends": [(now, seq, job) for seq, job in self.overrun] + sorted(self.future),
            "unstarted": sorted(self.unstarted),
            "groups": {
                leaf: {held: items for held, items in sorted(by_held.items()) if items}
                for leaf, by_held in sorted(self.groups.items())
                if any(by_held.values())
            },
            "waiting": {leaf: items for leaf, items in sorted(self.waiting.items()) if items},
            "dynamic": {leaf: sorted(d) for leaf, d in sorted(self.dynamic.items()) if d},
            "under": {h: sorted(d) for h, d in sorted(self.under.items())},
            "held": dict(sorted(self.held.items())),
            "spots": dict(sorted(self.spots.items())),
        }


def victim_key(victim: Job, now: int, held: int) -> tuple[int, int, int, str]:
    """Victim order: least lost work first, then newest, then the job id (``held``: the
    milli-GPUs the victim holds, which weigh its lost work)."""
    started = victim.started_at
    if started is None or now <= started:
        lost = 0
    else:
        ran = now - started
        interval = victim.checkpoint_interval_ms
        kept = (ran // interval) * interval if interval else 0
        lost = (ran - kept) * held // MILLI
    return (lost, -(started or now), -victim.seq, victim.job)


def _grouped(
    items: list[tuple[int, int, str]], held: int, now: int, jobs: dict[str, Job]
) -> Iterator[VictimItem]:
    for neg_start, neg_seq, job_id in items:
        yield ((now + neg_start) * held // MILLI, neg_start, neg_seq, job_id, jobs[job_id], held)


def _ages(items: list[tuple[int, int, str]], held: int, now: int) -> Iterator[tuple[int, int, int]]:
    """(age, milli-GPUs held, lost work) of each of a group's jobs, newest first, lazily
    (``RunningIndex.lost_floor``)."""
    for neg_start, _, _ in items:
        age = now + neg_start
        yield (age, held, age * held // MILLI)


def _waiting(
    items: list[tuple[int, str]], now: int, jobs: dict[str, Job], held_of: dict[str, int]
) -> Iterator[VictimItem]:
    """The jobs not started yet (they lose nothing), lazily as ``_at``."""
    for neg_seq, job_id in items:
        yield (0, -now, neg_seq, job_id, jobs[job_id], held_of[job_id])


def _at(now: int, passed: Iterable[tuple[int, str]]) -> Iterator[tuple[int, int, str]]:
    """(now, seq, job) of each overrun job, lazily. A generator function, not a generator
    expression: mypyc builds a stored generator expression whole (here every overrun job,
    where a walk reads a few)."""
    for seq, job_id in passed:
        yield (now, seq, job_id)


def _merged(orders: list[list[Any]]) -> Iterable[Any]:
    """The sorted lists merged in order, lazily (one of them as it is, when it alone
    holds anything)."""
    held = [items for items in orders if items]
    return heapq.merge(*held) if len(held) > 1 else held[0] if held else ()


def _remove(items: list[Any], key: Any) -> None:
    """Take ``key`` out of the sorted list ``items`` (it is there)."""
    del items[bisect_left(items, key)]

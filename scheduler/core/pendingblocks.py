"""A leaf queue's pending order in blocks, each summed up by what admission needs to hold
back every job in it at once.

Behind a queue's blocked head the walk passes over the jobs admission holds back
(``allocate._skip_known``). A congested queue holds back most of a backlog of thousands,
cycle after cycle, and a job-by-job pass costs the whole backlog each time. The blocks
split the queue's pending order (``Queue.pending``) into runs of consecutive keys; each
block keeps, for its preemptible and its non-preemptible jobs apart, the requests that no
other request of the block is at most in every resource (the minimal ones) and the latest
back-off. Admission holds back a job exactly when its request exceeds the queue's headroom
in some resource (``admission.admission_held``), so it holds back every job of a block when
it holds back each minimal request, and a block whose jobs are all held and none backing
off is passed over in one step.

The blocks follow the pending order as ``State.add_pending`` and ``State.remove_pending``
change it (a block's count and its summary, dropped and worked out again on the next
walk that reaches it). A job's request and preemptibility never change; its back-off is
set only as it goes back to pending, before any cycle can look at its block.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from scheduler.core.headroom import Headroom, admission_held, held_back

if TYPE_CHECKING:
    from scheduler.core.state import Job

Key = tuple[int, int, str]
"""A pending key: (-priority, seq, job id)."""

Request = tuple[int, int, int]


@dataclass(slots=True)
class Summary:
    """What decides whether admission holds back every job of a block."""

    preemptible: list[Request]
    """The minimal requests of the block's preemptible jobs."""
    fixed: list[Request]
    """The minimal requests of its non-preemptible jobs."""
    backoff: int
    """The latest ``backoff_until`` of its jobs."""
    keys: dict[int, tuple[Request, bool]]
    """The skip keys of its jobs (``allocate.skip_id``), each with the request and
    preemptibility it stands for."""
    unkeyed: list[tuple[Request, bool]]
    """The requests and preemptibility of its jobs that have no skip key."""

    def __init__(
        self,
        preemptible: list[Request],
        fixed: list[Request],
        backoff: int,
        keys: dict[int, tuple[Request, bool]] | None = None,
        unkeyed: list[tuple[Request, bool]] | None = None,
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.preemptible = preemptible
        self.fixed = fixed
        self.backoff = backoff
        self.keys = {} if keys is None else keys
        self.unkeyed = [] if unkeyed is None else unkeyed

    def all_held(self, limited: bool, headroom: Headroom, now: int) -> bool:
        """Whether the walk passes over every job of the block (``_skip_known``): none
        backs off at ``now`` and admission holds back each (``admission_held``; where no
        limit applies, it holds back no preemptible job)."""
        if self.backoff > now or (self.preemptible and not limited):
            return False
        return all(admission_held(headroom, v, True) for v in self.preemptible) and all(
            admission_held(headroom, v, False) for v in self.fixed
        )

    def passes(
        self,
        limited: bool,
        headroom: Headroom,
        now: int,
        skipping: dict[int, None],
    ) -> bool:
        """Whether the walk passes over every job of the block, each held back by
        admission or of a skip key the walk skipped already (``skipping``): the
        job-by-job rule of ``allocate._skip_jobs``, per distinct key."""
        if self.backoff > now:
            return False
        for key, (request, preemptible) in self.keys.items():
            if key not in skipping and not held_back(limited, headroom, request, preemptible):
                return False
        for request, preemptible in self.unkeyed:
            if not held_back(limited, headroom, request, preemptible):
                return False
        return True


def minimal(requests: list[Request]) -> list[Request]:
    """The requests no other one of ``requests`` is at most in every resource (one of
    equal requests), in sorted order."""
    kept: list[Request] = []
    for v in sorted(set(requests)):
        # Sorted: every kept request is at most ``v`` in its first resource already.
        if not any(u[1] <= v[1] and u[2] <= v[2] for u in kept):
            kept.append(v)
    return kept


@dataclass(slots=True)
class HeldRun:
    """Consecutive pending keys, from ``first`` up to (not including) ``stop`` (None: to the
    end of the order), whose every job admission held back at ``now`` under ``headroom``
    (with ``limited`` as given), none backing off. Under a headroom no larger in any bound,
    later, it holds each back still (``admission_held`` asks whether a request exceeds a
    bound; back-offs end, and a job's back-off is set only as it goes back to pending). A
    job put into the run cuts it there (``PendingBlocks.added``); one taken out leaves the
    others held."""

    first: Key
    stop: Key | None
    limited: bool
    headroom: Headroom
    now: int

    def __init__(
        self, first: Key, stop: Key | None, limited: bool, headroom: Headroom, now: int
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.first = first
        self.stop = stop
        self.limited = limited
        self.headroom = headroom
        self.now = now

    def covers(self, key: Key) -> bool:
        """Whether ``key`` lies within the run."""
        return self.first <= key and (self.stop is None or key < self.stop)

    def holds(self, key: Key, limited: bool, headroom: Headroom, now: int) -> bool:
        """Whether the run holds ``key`` back under ``headroom`` at ``now``."""
        return (
            self.covers(key)
            and limited == self.limited
            and now >= self.now
            and headroom[0] <= self.headroom[0]
            and headroom[1] <= self.headroom[1]
            and headroom[2] <= self.headroom[2]
            and headroom[3] <= self.headroom[3]
        )


SkipOf = Callable[["Job"], int]
"""A job's skip key id (``allocate.skip_id``; -1: it has none)."""


def _no_key(_job: Job) -> int:
    return -1


def summarise(
    pending: list[Key], lo: int, hi: int, jobs: dict[str, Job], skip_of: SkipOf = _no_key
) -> Summary:
    """The summary of the jobs ``pending[lo:hi]``."""
    return grown(Summary([], [], 0), pending[lo:hi], jobs, skip_of)


def grown(summary: Summary, added: list[Key], jobs: dict[str, Job], skip_of: SkipOf) -> Summary:
    """The summary of a block's jobs and the jobs ``added`` to it since, from the block's
    summary: the minimal requests of the whole are the minimal ones of its minimal requests
    and the added ones (a request another dominates is dominated by a minimal one), and
    what ``Summary.all_held`` and ``Summary.passes`` ask of the rest depends on no order.
    It costs the jobs added, not the block."""
    preemptible = list(summary.preemptible)
    fixed = list(summary.fixed)
    backoff = summary.backoff
    keys = dict(summary.keys)
    unkeyed = dict.fromkeys(summary.unkeyed)
    for _, _, job_id in added:
        job = jobs[job_id]
        (preemptible if job.preemptible else fixed).append(job.request)
        backoff = max(backoff, job.backoff_until)
        key = skip_of(job)
        if key < 0:
            unkeyed[(job.request, job.preemptible)] = None
        else:
            keys[key] = (job.request, job.preemptible)
    return Summary(minimal(preemptible), minimal(fixed), backoff, keys, list(unkeyed))


@dataclass(slots=True)
class PendingBlocks:
    """One leaf queue's pending order cut into blocks of consecutive keys: block ``b``
    holds the keys from ``starts[b]`` up to (not including) ``starts[b + 1]``."""

    starts: list[Key] = field(default_factory=list)
    """The lowest key each block may hold (the first block's is its lowest key)."""
    counts: list[int] = field(default_factory=list)
    """How many pending keys each block holds (none is empty)."""
    summaries: list[Summary | None] = field(default_factory=list)
    """Each block's summary (None: to be worked out)."""
    grew: list[tuple[Summary, list[Key]] | None] = field(default_factory=list)
    """Per block whose summary is None only because jobs were added to it: the summary it
    had, and the keys added since (``grown``). None once a job left the block."""
    size: int = 32
    """Jobs per block as the blocks are first cut (``Tuning.block``); a block that grows
    past twice this is cut in two."""
    held: HeldRun | None = None
    """The last run of whole blocks a walk found held back by admission
    (``allocate._pass_blocks``), valid across cycles as ``HeldRun`` says."""

    @classmethod
    def of(cls, pending: list[Key], size: int) -> PendingBlocks:
        """The blocks of a queue's pending order, ``size`` jobs each, summaries to be
        worked out."""
        starts = pending[::size]
        counts = [min(size, len(pending) - i) for i in range(0, len(pending), size)]
        return cls(starts, counts, [None] * len(starts), [None] * len(starts), size)

    def added(self, pending: list[Key], key: Key) -> None:
        """``key`` was put into ``pending`` (which holds it now)."""
        held = self.held
        if held is not None and held.covers(key):
            self.held = replace(held, stop=key) if held.first < key else None
        starts = self.starts
        if not starts:
            starts.append(key)
            self.counts.append(1)
            self.summaries.append(None)
            self.grew.append(None)
            return
        b = bisect_right(starts, key) - 1
        if b < 0:
            b = 0
            starts[0] = key
        self.counts[b] += 1
        count = self.counts[b]
        if count > 2 * self.size:
            lo = bisect_left(pending, starts[b])
            half = count // 2
            starts.insert(b + 1, pending[lo + half])
            self.counts[b] = half
            self.counts.insert(b + 1, count - half)
            self.summaries[b] = None
            self.summaries.insert(b + 1, None)
            self.grew[b] = None
            self.grew.insert(b + 1, None)
            return
        summary = self.summaries[b]
        if summary is not None:
            self.summaries[b] = None
            self.grew[b] = (summary, [key])
        else:
            grew = self.grew[b]
            if grew is not None:
                grew[1].append(key)

    def removed(self, key: Key) -> None:
        """``key`` was taken out of the pending order."""
        b = bisect_right(self.starts, key) - 1
        self.counts[b] -= 1
        self.summaries[b] = None
        self.grew[b] = None
        if not self.counts[b]:
            del self.starts[b]
            del self.counts[b]
            del self.summaries[b]
            del self.grew[b]

    def keep(
        self, first: Key | None, stop: Key | None, limited: bool, headroom: Headroom, now: int
    ) -> None:
        """Keep the run of blocks held back whole from ``first`` to ``stop`` (``held``);
        nothing when ``first`` is None (no run)."""
        if first is not None:
            self.held = HeldRun(first, stop, limited, headroom, now)

    def block(self, key: Key) -> int:
        """The block that holds ``key``."""
        return bisect_right(self.starts, key) - 1

    def summary(
        self, b: int, pending: list[Key], lo: int, jobs: dict[str, Job], skip_of: SkipOf = _no_key
    ) -> Summary:
        """Block ``b``'s summary; ``lo`` is where it begins in ``pending``."""
        found = self.summaries[b]
        if found is None:
            grew = self.grew[b]
            if grew is not None:
                found = grown(grew[0], grew[1], jobs, skip_of)
                self.grew[b] = None
            else:
                found = summarise(pending, lo, lo + self.counts[b], jobs, skip_of)
            self.summaries[b] = found
        return found

"""When will a pending job start? Forecasts from the state at a moment of a ledger.

The forecast runs the real policy forward from the core's state at that moment
(``replay.sim.Simulation.resume``): running jobs end when their runtimes say, pods bind and
start as the ledger's own timing did, and no new work arrives. A pending job's forecast
start is when that run starts its gang. A job not started within the horizon is forecast
"later than" its end.

Runtime estimates, in this order: the job's own ``expected_runtime_ms``; what the ledger's
history says of jobs like it — by queue, gang size, GPUs and priority class, falling back
to coarser groups, down to every job — as the runtimes of those that ran at least as long
as it has (the completed jobs, and those still running as censored observations:
``kaplan_meier``); else none. A job without an estimate that runs is taken to run
past the horizon, so whatever waits behind it is "later than" too.

The run is made ``samples`` times (``SAMPLES``). In each, every job whose runtime is learned
draws one from its estimate's distribution, at a quantile its name and the run's number
fix (``draw_at``: the runs spread each job's draws evenly, and reruns are identical). The
forecast start is the middle of the runs' starts, and its range is the earliest to the
latest. One run with every job's median would forecast wrong both ways: the first of many
ends comes sooner than any one job's median, and a long queue drains by the runtimes'
mean, which for skewed runtimes is well above their median (``python -m bench.forecast``
measured that as a 64-hour early bias on the congested trace). Where every runtime is
given, the runs are one.

A forecast is a read-side computation: it never enters a ledger, and the state it starts
from is a copy.
"""

from __future__ import annotations

import bisect
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import msgspec

from events.codec import DecodeError, Envelope, decode_event
from events.ledgertime import format_at, format_duration, is_wall_clock
from events.model import JobSubmitted, PodBound, PodsAllocated, PodSpec, PodStarted
from replay.config import ConfigError, WorkloadFile, parse
from replay.sim import SimJob, Simulation, expand
from scheduler.core.apply import apply
from scheduler.core.state import ACTIVE, PENDING, RUNNING, SUCCEEDED, State
from scheduler.fold.heap import gc_paused
from scheduler.fold.outcomes import JobOutcome, OutcomeFold
from scheduler.fold.snapshot import state_bytes, state_from_bytes
from scheduler.fold.validate import validate

DAY_MS = 86_400_000
HORIZON_MS = 7 * DAY_MS
COARSE = 32
"""By default a forecast's runs round each pod's end up to a step of about 1/32 of the run
it has left when it starts (``Simulation.resume``): no job runs more than about 3 % longer
than its estimate, so the forward run keeps the cluster's throughput however far ahead,
and a start an hour ahead is forecast to within about two minutes (never earlier than
exact); long runs' ends share cycles instead of taking one each. ``coarse=0`` runs
exactly (every end at its own time)."""
MIN_SAMPLES = 3
"""Completed jobs a group of the history needs before its percentiles are used."""
MIN_PERIOD_MS = 3_600_000
"""The ``recent`` assumption repeats what it has seen at least an hour apart: a ledger
minutes old does not multiply its few submissions by the thousand."""

__all__ = [
    "ARRIVALS",
    "HORIZON_MS",
    "Estimate",
    "Forecast",
    "Moment",
    "Recent",
    "RuntimeModel",
    "forecast",
    "job_from_yaml",
    "learn",
    "moment_of",
    "sooner",
    "submit",
]


@dataclass(frozen=True, slots=True)
class Runtimes:
    """A group's runtime distribution, learned from its completed jobs and, as censored
    observations, from those still running (Kaplan–Meier): a job that has run 9 hours
    and goes on counts as "longer than 9 hours", so the long jobs a history of completed
    ones leaves out still weigh. ``cdf[k]`` is P(runtime ≤ ``values[k]``); the mass above
    ``cdf[-1]`` (when jobs still run past the longest completed) lies beyond that
    longest, with the tail ``Estimate.draw`` gives a job that outran its group."""

    values: tuple[int, ...]
    cdf: tuple[float, ...]
    running: int = 0
    """How many of the observations were jobs still running."""

    def below(self, ran_ms: int) -> float:
        """P(runtime ≤ ``ran_ms``)."""
        k = bisect.bisect_right(self.values, ran_ms)
        return self.cdf[k - 1] if k else 0.0

    def value_at(self, p: float) -> int | None:
        """The shortest runtime whose cdf exceeds ``p`` (None: ``p`` is in the mass
        beyond the longest completed; a runtime's cdf is a product of fractions, so
        callers give ``p`` off by ``_EPSILON`` to say which side of a step they mean)."""
        k = bisect.bisect_right(self.cdf, p)
        if k < len(self.values):
            return self.values[k]
        return None if self.cdf[-1] < 1.0 - _EPSILON else self.values[-1]


def kaplan_meier(completed: Sequence[int], running: Sequence[int]) -> Runtimes:
    """The distribution of ``completed`` runtimes (sorted, not empty) with ``running``
    ones (sorted) as censored observations: each is at risk up to what it has run."""
    values: list[int] = []
    cdf: list[float] = []
    at_risk = len(completed) + len(running)
    survive = 1.0
    i = j = 0
    while i < len(completed):
        t = completed[i]
        while j < len(running) and running[j] < t:  # a job still running at t is at risk
            at_risk -= 1
            j += 1
        ended = bisect.bisect_right(completed, t, i) - i
        survive *= 1.0 - ended / at_risk
        at_risk -= ended
        values.append(t)
        cdf.append(1.0 - survive)
        i += ended
    return Runtimes(tuple(values), tuple(cdf), len(running))


@dataclass(frozen=True, slots=True)
class Estimate:
    """A runtime estimate: median and 90th percentile in ms (None: no estimate), where it
    comes from (``given``, a group of the history, or ``unknown``) and the distribution
    ``draw`` samples: ``runtimes`` above its quantile ``base`` (those of the group that
    ran as long as the job has), or, for a job that outran them all after ``ran_ms``, a
    tail with P(T > t) = ran/t (``p50_ms`` and ``p90_ms`` at twice and ten times that);
    neither: every draw is ``p50_ms``."""

    p50_ms: int | None
    p90_ms: int | None
    source: str
    runtimes: Runtimes | None = None
    base: float = 0.0
    ran_ms: int = 0

    def draw(self, u: float) -> int | None:
        """The runtime at quantile ``u`` (0 ≤ u < 1) of the distribution."""
        return self._at(u, _EPSILON)

    def quantile(self, q: float) -> int | None:
        """The nearest-rank percentile: the shortest runtime at least ``q`` of the
        distribution is within."""
        return self._at(q, -_EPSILON)

    def _at(self, u: float, past: float) -> int | None:
        if self.runtimes is not None:
            return _runtime_at(self.runtimes, self.base, self.ran_ms, u, past)
        if self.ran_ms:  # P(T > t | T > ran) = ran / t: the quantile u is ran / (1 - u)
            return round(self.ran_ms / (1.0 - min(u, TAIL_U)))
        return self.p50_ms


def _runtime_at(dist: Runtimes, base: float, ran_ms: int, u: float, past: float) -> int:
    """The runtime at quantile ``u`` of ``dist`` above its quantile ``base`` (what a job
    that has run ``ran_ms`` may still run to), ``past`` saying which side of a step."""
    p = base + u * (1.0 - base)
    found = dist.value_at(p + past)
    if found is not None:
        return found
    # beyond the longest completed: the tail from where the runs left off
    u = max(0.0, p - dist.cdf[-1]) / (1.0 - dist.cdf[-1])
    return round(max(ran_ms, dist.values[-1]) / (1.0 - min(u, TAIL_U)))


UNKNOWN = Estimate(None, None, "unknown: no estimate given and no history like it")
SAMPLES = 7
"""Runs per forecast where runtimes are learned: with the truth drawn like the runs, the
earliest-to-latest range of 7 holds it 6 times in 8."""
TAIL_U = 0.95
"""The highest quantile drawn from the tail of a job that has outrun its whole group."""
_EPSILON = 1e-9


def draw_at(name: str, run: int, runs: int) -> float:
    """The quantile job ``name`` draws its runtime at in run ``run`` of ``runs``: a fixed
    point of [0, 1) per name (its CRC-32: the same in every process), moved on by
    ``1/runs`` per run, so each job's draws are spread evenly and jobs' draws differ."""
    return (zlib.crc32(name.encode()) / 2**32 + run / runs) % 1.0


@dataclass(slots=True)
class RuntimeModel:
    """Runtimes (ms) by group: (queue, pods, GPUs in milli, priority class), (queue, pods,
    priority class), (queue, pods), (queue,) and () for every job; those of completed
    jobs, and what the jobs still running have run so far."""

    groups: dict[tuple[object, ...], list[int]] = field(default_factory=dict)
    running: dict[tuple[object, ...], list[int]] = field(default_factory=dict)
    _learned: dict[tuple[object, ...], Runtimes] = field(default_factory=dict)

    def add(
        self,
        queue: str,
        pods: int,
        gpu_milli: int,
        priority_class: str,
        runtime_ms: int,
        *,
        still_running: bool = False,
    ) -> None:
        """Note one completed job's runtime, or (``still_running``) what a running job has
        run so far."""
        into = self.running if still_running else self.groups
        for key, _ in _groups(queue, pods, gpu_milli, priority_class):
            bisect.insort(into.setdefault(key, []), runtime_ms)
            self._learned.pop(key, None)

    def estimate(
        self, queue: str, pods: int, gpu_milli: int, priority_class: str, elapsed_ms: int = 0
    ) -> Estimate:
        """The finest group with at least ``MIN_SAMPLES`` completed jobs, or ``UNKNOWN``.

        For a job that has run ``elapsed_ms`` already, the group's distribution above that
        counts (how long jobs like it that got this far ran); when none of the group got
        this far, the job is taken to run as long again as it has (median) or nine times
        as long (90th percentile): the longer a job has run, the longer it is likely to."""
        for key, what in _groups(queue, pods, gpu_milli, priority_class):
            completed = self.groups.get(key)
            if completed is None or len(completed) < MIN_SAMPLES:
                continue
            dist = self._learned.get(key)
            if dist is None:
                dist = self._learned[key] = kaplan_meier(completed, self.running.get(key, ()))
            base = dist.below(elapsed_ms) if elapsed_ms else 0.0
            if base >= 1.0 - _EPSILON:
                return Estimate(
                    2 * elapsed_ms,
                    10 * elapsed_ms,
                    f"history: {what}: ran longer than any of its {len(completed)} completed",
                    ran_ms=elapsed_ms,
                )
            running = f", {dist.running} running" if dist.running else ""
            return Estimate(
                _runtime_at(dist, base, elapsed_ms, 0.5, -_EPSILON),
                _runtime_at(dist, base, elapsed_ms, 0.9, -_EPSILON),
                f"history: {what} (median and p90 of {len(completed)} completed{running}"
                + (" that ran as long)" if elapsed_ms else ")"),
                dist,
                base,
                elapsed_ms,
            )
        return UNKNOWN


def _groups(
    queue: str, pods: int, gpu_milli: int, priority_class: str
) -> tuple[tuple[tuple[object, ...], str], ...]:
    """A job's groups of the history, finest first, each with how a reason names it."""
    return (
        (
            (queue, pods, gpu_milli, priority_class),
            f"queue {queue}, {pods} pods, {gpu_milli / 1000:g} GPUs, {priority_class}",
        ),
        ((queue, pods, priority_class), f"queue {queue}, {pods} pods, {priority_class}"),
        ((queue, pods), f"queue {queue}, {pods} pods"),
        ((queue,), f"queue {queue}"),
        ((), "every queue"),
    )


def learn(outcomes: Iterable[JobOutcome], now_ms: int | None = None) -> RuntimeModel:
    """The runtime model of the jobs that completed without preemption (from the moment the
    gang first ran to the moment it finished) and, given the moment ``now_ms``, of those
    running since they first ran (what they have run so far)."""
    model = RuntimeModel()
    for job in outcomes:
        if job.preemptions or job.ready_at_ms is None:
            continue
        if job.status == SUCCEEDED and job.finished_at_ms is not None:
            ran, running = job.finished_at_ms - job.ready_at_ms, False
        elif job.status == RUNNING and now_ms is not None:
            ran, running = now_ms - job.ready_at_ms, True
        else:
            continue
        model.add(
            job.queue, job.pods, job.gpu_milli, job.priority_class, ran, still_running=running
        )
    return model


@dataclass(slots=True)
class Recent:
    """The submissions of the last ``window_ms`` before the latest one noted, oldest first:
    what the ``recent`` arrivals assumption repeats."""

    window_ms: int = DAY_MS
    submissions: deque[tuple[int, JobSubmitted]] = field(default_factory=deque)
    first_ms: int | None = None
    """When the first submission was noted: a ledger younger than the window repeats
    what it has seen over its own age, not over the whole window."""

    def note(self, at: int, event: JobSubmitted) -> None:
        """One submission (in ledger order); older ones fall out of the window."""
        if self.first_ms is None:
            self.first_ms = at
        self.submissions.append((at, event))
        while self.submissions and self.submissions[0][0] < at - self.window_ms:
            self.submissions.popleft()


@dataclass(slots=True)
class Moment:
    """What a forecast needs from a ledger up to a moment: the core's state, the jobs'
    outcomes (for the runtime model), the world's timing (median bind and start-up) and
    the recent submissions (for the ``recent`` arrivals assumption)."""

    fold: OutcomeFold
    bind_ms: int
    startup_ms: int
    last_offset: int
    recent: Recent = field(default_factory=Recent)


def moment_of(
    records: Iterable[tuple[int, Envelope]],
    until_ms: int | None = None,
    *,
    before_offset: int | None = None,
) -> Moment:
    """Fold ``records`` up to ``until_ms`` (inclusive), or those before ``before_offset``
    (as ``gpuledger state --at`` folds them), or all of them."""
    fold = OutcomeFold()
    recent = Recent()
    allocated: dict[str, int] = {}
    binds: list[int] = []
    starts: list[int] = []
    bound: dict[tuple[str, str], int] = {}
    last = -1
    for offset, env in records:
        if (until_ms is not None and env.at > until_ms) or (
            before_offset is not None and offset >= before_offset
        ):
            break
        try:
            event = decode_event(env, offset)
        except DecodeError:
            continue
        fold.apply(event, offset, env.at)
        last = offset
        if isinstance(event, JobSubmitted):
            recent.note(env.at, event)
        _timing(event, env.at, allocated, bound, binds, starts)
    if until_ms is not None:
        fold.state.now = max(fold.state.now, until_ms)
    return Moment(fold, _median(binds), _median(starts), last, recent)


def _timing(
    event: object,
    at: int,
    allocated: dict[str, int],
    bound: dict[tuple[str, str], int],
    binds: list[int],
    starts: list[int],
) -> None:
    """Note the world's bind and start-up delays (as ``replay.whatif`` learns them)."""
    match event:
        case PodsAllocated(job=job):
            allocated[job] = at
        case PodBound(job=job, pod=pod) if job in allocated:
            binds.append(at - allocated[job])
            bound[(job, pod)] = at
        case PodStarted(job=job, pod=pod) if (job, pod) in bound:
            starts.append(at - bound.pop((job, pod)))


def _median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2] if values else 0


@dataclass(frozen=True, slots=True)
class Forecast:
    """One job's forecast: its start in the middle run (``median_ms``), the range of its
    starts over the runs (``earliest_ms`` to ``latest_ms``; None: not within the
    horizon), the horizon's end, its position in its queue (1 first), the core's reason it
    waits at the moment and the estimate it used."""

    job: str
    queue: str
    position: int
    earliest_ms: int | None
    latest_ms: int | None
    median_ms: int | None
    horizon_end_ms: int
    reason: str
    estimate: Estimate

    def row(self, now: int) -> dict[str, object]:
        """As the CLI and the console show it: the start and its range as ledger times
        (``now`` within a second of the moment, ``later than …`` beyond the horizon) and
        as waits."""
        wall = is_wall_clock(now)

        def when(ms: int | None) -> str:
            if ms is None:
                return f"later than {format_at(self.horizon_end_ms, wall)}"
            return "now" if ms - now < 1000 else format_at(ms, wall)

        def wait(ms: int | None) -> str:
            return "-" if ms is None else format_duration(max(0, ms - now) / 1000)

        def spread(show: Callable[[int | None], str]) -> str:
            if self.earliest_ms == self.latest_ms:
                return show(self.median_ms)
            return f"{show(self.median_ms)} ({show(self.earliest_ms)} – {show(self.latest_ms)})"

        return {
            "job": self.job,
            "queue": self.queue,
            "position": self.position,
            "start": spread(when),
            "wait": spread(wait),
            "earliest_ms": self.earliest_ms,
            "latest_ms": self.latest_ms,
            "median_ms": self.median_ms,
            "horizon_end_ms": self.horizon_end_ms,
            "estimate": self.estimate.source,
            "reason": self.reason,
        }


def _copy(state: State) -> State:
    copy = state_from_bytes(state_bytes(state))
    copy.tuning = state.tuning
    return copy


def estimates(
    state: State, model: RuntimeModel, given: Mapping[str, int] | None = None
) -> dict[str, Estimate]:
    """Every active or pending job's estimate: ``given`` (job → runtime ms, in place of
    the jobs' own ``expected_runtime_ms``), else its own, else the model's."""
    out: dict[str, Estimate] = {}
    for job in state.jobs.values():
        if job.status not in ACTIVE and job.status != PENDING:
            continue
        stated = given.get(job.job) if given is not None else job.expected_runtime_ms
        elapsed = 0
        if job.started_at is not None:  # what it has run, in all its attempts
            elapsed = state.now - job.started_at + job.checkpointed_ms
        out[job.job] = _estimate(model, stated, job.queue, job.pods, job.priority_class, elapsed)
    return out


def _estimate(
    model: RuntimeModel,
    stated: int | None,
    queue: str,
    pods: Sequence[PodSpec],
    priority_class: str,
    elapsed_ms: int = 0,
) -> Estimate:
    """``stated`` (ms) as given, else what the history says of a job like it that has run
    ``elapsed_ms``."""
    if stated is not None:
        return Estimate(stated, stated, "given")
    gpu_milli = sum(p.gpu_milli for p in pods)
    return model.estimate(queue, len(pods), gpu_milli, priority_class, elapsed_ms)


ARRIVALS = ("none", "recent")
"""What new work a forecast assumes: ``none``, or ``recent``: the submissions of the last
``Recent.window_ms`` (or of the ledger's age when it is younger, at least an hour) come
again, period after period, for as long as the horizon lasts."""


def _repeated(moment: Moment, until: int) -> list[tuple[int, str, JobSubmitted]]:
    """The ``recent`` assumption's arrivals: (moment, original job, submission renamed
    ``job@k``) for the k-th repetition of each recent submission, up to ``until``."""
    now = moment.fold.state.now
    out: list[tuple[int, str, JobSubmitted]] = []
    submissions = list(moment.recent.submissions)
    first = moment.recent.first_ms
    if not submissions or first is None or first >= now:
        return out
    # The submissions seen over the last window (or the ledger's age, when shorter, but at
    # least an hour) come again after each such period: the rate they came at goes on.
    window = max(min(moment.recent.window_ms, now - first), MIN_PERIOD_MS)
    k = 1
    while submissions[0][0] + k * window <= until:
        for at, event in submissions:
            when = at + k * window
            if now < when <= until:
                out.append(
                    (when, event.job, msgspec.structs.replace(event, job=f"{event.job}@{k}"))
                )
        k += 1
    return out


@gc_paused()  # (over the state's copy and the run: ``scheduler.fold.heap``)
def _run(
    state: State,
    runtimes: dict[str, int],
    moment: Moment,
    until: int,
    targets: set[str],
    arrivals: Sequence[SimJob] = (),
    coarse: int = COARSE,
) -> tuple[dict[str, int], dict[str, str]]:
    """One forward run: when each job is placed, and after the first cycle, each pending
    job's reason."""
    sim = Simulation.resume(
        _copy(state),
        runtimes,
        bind_ms=moment.bind_ms,
        startup_ms=moment.startup_ms,
        arrivals=arrivals,
        coarse=coarse,
    )
    jobs = sim.engine.state.jobs
    reasons: dict[str, str] = {}
    noted = False
    waiting = sorted(targets)
    passed = 0  # waiting[:passed] are placed: each is looked up once it is the first left

    def stop() -> bool:
        nonlocal noted, passed
        if not noted:  # called first right after the first cycle: the reasons then
            noted = True
            reasons.update({j.job: j.reason for j in jobs.values() if j.status == PENDING})
            # The rest of the run is read for its starts only: the same decisions, unworded.
            sim.engine.state.tuning = replace(sim.engine.state.tuning, reasons=False)
        while passed < len(waiting) and waiting[passed] in sim.placed:
            passed += 1
        return passed == len(waiting)

    sim.carry_on(until, stop)
    return {j: t for j, t in sim.placed.items() if t <= until}, reasons


def forecast(
    moment: Moment,
    *,
    horizon_ms: int = HORIZON_MS,
    given: Mapping[str, int] | None = None,
    jobs: Iterable[str] | None = None,
    arrivals: str = "none",
    coarse: int = COARSE,
    samples: int = SAMPLES,
) -> list[Forecast]:
    """The forecast of every pending job at the moment (or of ``jobs`` only, which lets
    the runs stop once those have started), assuming ``arrivals`` (``ARRIVALS``), to the
    precision ``coarse`` gives (``COARSE``; 0: exact), from ``samples`` runs."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals {arrivals!r}: expected one of {', '.join(ARRIVALS)}")
    if samples < 1:
        raise ValueError(f"samples {samples}: expected at least 1")
    state = moment.fold.state
    model = learn(moment.fold.jobs.values(), state.now)
    known = estimates(state, model, given)
    never = horizon_ms * 4 + DAY_MS  # a job without an estimate runs past the horizon
    until = state.now + horizon_ms
    pending = [  # (queue, position in it, job), queues by name
        (queue, position, name)
        for queue in sorted(state.queues)
        for position, name in enumerate(_pending(state, queue), start=1)
    ]
    # The run can stop once every job asked about (every pending one) has started.
    targets = {name for _, _, name in pending} if jobs is None else set(jobs)
    again = [  # a repeated submission runs as given for the job it repeats, else as learned
        (
            when,
            event,
            _estimate(
                model,
                given.get(original) if given is not None else event.expected_runtime_ms,
                event.queue,
                event.pods,
                event.priority_class,
            ),
        )
        for when, original, event in (_repeated(moment, until) if arrivals == "recent" else [])
    ]

    def inputs(run: int) -> tuple[dict[str, int], list[SimJob]]:
        runtimes = {j: e.draw(draw_at(j, run, samples)) or never for j, e in known.items()}
        new = [
            SimJob(when, event, e.draw(draw_at(event.job, run, samples)) or never)
            for when, event, e in again
        ]
        return runtimes, new

    reasons: dict[str, str] = {}
    runs: list[tuple[tuple[dict[str, int], list[SimJob]], dict[str, int]]] = []
    for run in range(samples):
        drawn = inputs(run)
        # The policy is deterministic: a run whose draws are an earlier run's (every
        # runtime given) would place every job as that one did.
        placed = next((out for seen, out in runs if seen == drawn), None)
        if placed is None:
            runtimes, new = drawn
            placed, first = _run(state, runtimes, moment, until, targets, new, coarse)
            reasons = reasons or first
        runs.append((drawn, placed))
    return [
        _forecast_of(
            name,
            queue,
            position,
            [placed.get(name) for _, placed in runs],
            until,
            reasons.get(name, state.jobs[name].reason),
            known.get(name, UNKNOWN),
        )
        for queue, position, name in pending
        if name in targets
    ]


def _forecast_of(
    name: str,
    queue: str,
    position: int,
    starts: list[int | None],
    until: int,
    reason: str,
    estimate: Estimate,
) -> Forecast:
    """A job's forecast from its start in each run (None: not within the horizon): the
    middle one, and the earliest to the latest."""
    ordered = sorted(starts, key=lambda at: (at is None, at or 0))
    return Forecast(
        job=name,
        queue=queue,
        position=position,
        earliest_ms=ordered[0],
        latest_ms=ordered[-1],
        median_ms=ordered[len(ordered) // 2],
        horizon_end_ms=until,
        reason=reason,
        estimate=estimate,
    )


def _pending(state: State, queue: str) -> Iterator[str]:
    """The queue's pending jobs in the order its walk takes them."""
    for _, _, name in state.queues[queue].pending:
        job = state.jobs.get(name)
        if job is not None and job.status == PENDING:
            yield name


def job_from_yaml(raw: bytes | str, source: str) -> JobSubmitted:
    """The one job of a workload YAML text (``jobs:`` with one entry, no generators), as
    submitted at the moment it is forecast from; ``ConfigError`` naming ``source``."""
    workload = parse(raw, WorkloadFile, source)
    if len(workload.jobs) != 1 or workload.generators:
        raise ConfigError(f"{source}: expected exactly one job under jobs: and no generators")
    only = msgspec.structs.replace(workload.jobs[0], at_s=0)
    (sim_job,) = expand(msgspec.structs.replace(workload, jobs=[only]))
    submitted: JobSubmitted = sim_job.submitted
    return submitted


def sooner(
    moment: Moment,
    job: JobSubmitted,
    *,
    horizon_ms: int = HORIZON_MS,
    arrivals: str = "none",
    samples: int = SAMPLES,
) -> list[dict[str, str]]:
    """What would make ``job`` (not yet submitted) start sooner: half its gang, each other
    leaf queue (at most six), and the free GPUs it lacks now; each with its forecast start."""
    state = moment.fold.state
    now = state.now

    def start_of(changed: JobSubmitted) -> str:
        with_it = submit(moment, changed)
        if isinstance(with_it, str):
            return f"refused: {with_it}"
        (f,) = forecast(
            with_it, horizon_ms=horizon_ms, jobs=[changed.job], arrivals=arrivals, samples=samples
        )
        return str(f.row(now)["start"])

    out: list[dict[str, str]] = []
    if len(job.pods) > 1:
        half = job.pods[: len(job.pods) // 2]
        smaller = msgspec.structs.replace(
            job, pods=half, min_members=min(job.min_members, len(half))
        )
        out.append({"change": f"a gang of {len(half)} pods", "start": start_of(smaller)})
    leaves = [q for q in sorted(state.queues) if not state.queues[q].children and q != job.queue]
    for queue in leaves[:6]:
        out.append(
            {
                "change": f"queue {queue}",
                "start": start_of(msgspec.structs.replace(job, queue=queue)),
            }
        )
    wanted = sum(p.gpu_milli for p in job.pods)
    free = sum(n.free_gpu_milli for n in state.nodes.values() if not n.cordoned)
    if wanted > free:
        out.append(
            {
                "change": f"{(wanted - free) / 1000:g} more free GPUs (it asks for "
                f"{wanted / 1000:g}, {free / 1000:g} are free)",
                "start": "now, if its gang fits on them",
            }
        )
    return out


def submit(moment: Moment, job: JobSubmitted) -> Moment | str:
    """The moment with ``job`` submitted at it (a copy: ``moment`` is left as it was), or
    the validator's reason when the scheduler would refuse the job."""
    state = moment.fold.state
    why = validate(state, job)
    if why is not None:
        return why
    copy = _copy(state)
    apply(copy, job, state.now)
    fold = OutcomeFold(state=copy, jobs=moment.fold.jobs)  # the history, shared read-only
    return Moment(fold, moment.bind_ms, moment.startup_ms, moment.last_offset, moment.recent)

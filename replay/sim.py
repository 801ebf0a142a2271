"""The discrete-event simulator: a simulated clock driving the same engine a live run uses.

It plays the world around the scheduler — users submitting jobs, the binder binding pods,
the kubelet starting them, jobs running to completion — as timed input events, and feeds
them to ``scheduler.runtime.engine.Engine``, which writes the very ledger a live run would write.
All inputs stamped with the same millisecond are applied together and followed by one
scheduling cycle.

World rules: a job's pods start (after ``startup_s``) only once every pod the scheduler
placed is bound, as a distributed job's rendezvous needs; it runs for its true runtime
less the progress its checkpoints kept from earlier attempts; a preempted job resumes
from its last checkpoint and the lost work is recorded by the core in ``JobPreempted``.
"""

from __future__ import annotations

import heapq
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from events.filelog import new_ledger
from events.ledgertime import format_at, format_duration, is_wall_clock
from events.model import (
    MILLI,
    Event,
    JobPreempted,
    JobSubmitted,
    NodeRegistered,
    PodBound,
    PodEvicted,
    PodFinished,
    PodsAllocated,
    PodSpec,
    PodStarted,
    PolicyConfigured,
    QueueConfigured,
    Tick,
)
from events.port import LedgerWriter
from replay.config import (
    MAX_QUANTITY,
    Choice,
    ClusterFile,
    ConfigError,
    Exponential,
    Fixed,
    Generator,
    LogNormal,
    Number,
    Periodic,
    Poisson,
    QueuesFile,
    Uniform,
    WorkloadFile,
    gpu_milli,
    mib,
    milli,
    node_events,
    policy_event,
    queue_events,
)
from scheduler.core.policy import POLICIES
from scheduler.core.state import ACTIVE, ALLOCATED, RUNNING, State, ended_attempt
from scheduler.core.tuning import DEFAULT, Tuning
from scheduler.fold.step import Runtime
from scheduler.runtime.engine import Engine

SECOND = 1000


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job of the workload: its submission and its true runtime (known only here)."""

    at: int
    submitted: JobSubmitted
    runtime_ms: int


def sample(value: Number, rng: random.Random) -> float:
    """Draw from a distribution (a plain number is itself), at most ``MAX_QUANTITY``."""
    match value:
        case float() | int():
            return float(value)
        case Fixed(value=v):
            return v
        case Choice(values=values, weights=weights):
            return rng.choices(values, weights=weights)[0]
        case Uniform(min=lo, max=hi):
            return rng.uniform(lo, hi)
        case Exponential(mean=mean):
            return min(rng.expovariate(1 / mean), MAX_QUANTITY)
        case LogNormal(median=median, sigma=sigma, max=cap):
            try:
                drawn = median * math.exp(sigma * rng.gauss(0, 1))
            except OverflowError:  # a huge sigma
                drawn = math.inf
            return min(drawn, cap if cap is not None else MAX_QUANTITY)
    raise ConfigError(f"unknown distribution {value!r}")  # pragma: no cover


def _arrivals(gen: Generator, horizon_s: float, rng: random.Random) -> list[float]:
    end = min(gen.end_s if gen.end_s is not None else horizon_s, horizon_s)
    limit = gen.count if gen.count is not None else 10**9
    times: list[float] = []
    match gen.arrival:
        case Poisson(rate_per_h=rate):
            t = gen.start_s
            while len(times) < limit:
                t += rng.expovariate(rate / 3600)
                if t >= end:
                    break
                times.append(t)
        case Periodic(every_s=every, burst=burst, jitter_s=jitter):
            k = 0
            while len(times) < limit:
                base = gen.start_s + k * every
                if base >= end:
                    break
                for _ in range(burst):
                    if len(times) < limit:
                        times.append(base + (rng.uniform(0, jitter) if jitter else 0.0))
                k += 1
    return times


def expand(workload: WorkloadFile) -> list[SimJob]:
    """Every job of the workload, sorted by submission time then name (seeded, exact)."""
    jobs: list[SimJob] = []
    for index, spec in enumerate(workload.jobs):
        where = f"workload.jobs[{index}] ({spec.name})"
        if spec.min_members > spec.pods:
            # Intake (scheduler/fold/validate.py) refuses such a job; so does the loader.
            raise ConfigError(
                f"{where}.min_members: {spec.min_members} is more than its {spec.pods} pods"
            )
        pods = _gang(
            spec.name,
            spec.pods,
            gpu_milli(spec.gpus_per_pod, f"{where}.gpus_per_pod"),
            milli(spec.cpu_per_pod, f"{where}.cpu_per_pod"),
            mib(spec.memory_gib_per_pod),
            spec.node_selector,
        )
        runtime = round(spec.runtime_s * SECOND)
        jobs.append(
            SimJob(
                at=round(spec.at_s * SECOND),
                submitted=JobSubmitted(
                    job=spec.name,
                    queue=spec.queue,
                    pods=pods,
                    min_members=spec.min_members,
                    priority_class=spec.priority_class,
                    preemptible=spec.preemptible,
                    expected_runtime_ms=(
                        round(spec.expected_runtime_s * SECOND)
                        if spec.expected_runtime_s is not None
                        else None
                    ),
                    checkpoint_interval_ms=_ms(spec.checkpoint_interval_s),
                ),
                runtime_ms=max(1, runtime),
            )
        )
    for gen in workload.generators:
        # One stream per generator, seeded by (seed, name): adding a generator does not
        # change the jobs the others produce. A str seed is hashed with SHA-512, not hash().
        rng = random.Random(f"{workload.seed}:{gen.name}")
        for number, at_s in enumerate(_arrivals(gen, workload.horizon_s, rng)):
            name = f"{gen.name}-{number:05d}"
            where = f"generator {gen.name}"
            size = max(1, round(sample(gen.gang_size, rng)))
            pod_gpu = gpu_milli(_gpu_value(sample(gen.gpus_per_pod, rng)), f"{where}.gpus")
            runtime = max(1, round(sample(gen.runtime_s, rng) * SECOND))
            pods = _gang(
                name,
                size,
                pod_gpu,
                milli(gen.cpu_per_pod, f"{where}.cpu_per_pod"),
                mib(gen.memory_gib_per_pod),
                gen.node_selector,
            )
            jobs.append(
                SimJob(
                    at=round(at_s * SECOND),
                    submitted=JobSubmitted(
                        job=name,
                        queue=gen.queue,
                        pods=pods,
                        priority_class=gen.priority_class,
                        preemptible=gen.preemptible,
                        expected_runtime_ms=runtime if gen.expected_runtime else None,
                        checkpoint_interval_ms=_ms(gen.checkpoint_interval_s),
                    ),
                    runtime_ms=runtime,
                )
            )
    names: dict[str, None] = {}
    for job in jobs:
        if job.submitted.job in names:
            raise ConfigError(f"workload: duplicate job name {job.submitted.job!r}")
        names[job.submitted.job] = None
    jobs.sort(key=lambda j: (j.at, j.submitted.job))
    return jobs


def _gang(
    job: str, size: int, gpu: int, cpu: int, memory: int, selector: dict[str, str]
) -> tuple[PodSpec, ...]:
    """``size`` identical pods named ``{job}-{index}``."""
    return tuple(
        PodSpec(
            name=f"{job}-{k}",
            gpu_milli=gpu,
            cpu_milli=cpu,
            memory_mib=memory,
            node_selector=dict(selector),
        )
        for k in range(size)
    )


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * SECOND)


def _gpu_value(drawn: float) -> float:
    """A drawn GPU amount: fractions stay (to 1/1000), above one round to whole GPUs."""
    if drawn > 1:
        return float(round(drawn))
    return round(drawn * MILLI) / MILLI


class InputRefusedError(ConfigError):
    """An input of the run that the scheduler's intake refuses (``scheduler.fold.validate``): a
    job, queue or node of the input files, or a recorded fact a what-if re-runs. ``kind``
    says which input file it came from: ``job``, ``queue``, ``node`` or ``event``."""

    def __init__(self, kind: str, name: str, at_ms: int, reason: str) -> None:
        """``name``: the job, queue or node; ``at_ms``: when the run submitted it."""
        self.kind, self.name, self.at_ms, self.reason = kind, name, at_ms, reason
        super().__init__(
            f"{kind} {name!r} (at {format_at(at_ms, is_wall_clock(at_ms))}): the scheduler "
            f"refuses it: {reason}"
        )

    def __reduce__(self) -> tuple[type[InputRefusedError], tuple[str, str, int, str]]:
        """Pickled whole (``compare`` runs simulations in worker processes)."""
        return (InputRefusedError, (self.kind, self.name, self.at_ms, self.reason))


def _refused_input(event: Event, at_ms: int, reason: str) -> InputRefusedError:
    match event:
        case JobSubmitted(job=name):
            return InputRefusedError("job", name, at_ms, reason)
        case QueueConfigured(queue=name):
            return InputRefusedError("queue", name, at_ms, reason)
        case NodeRegistered(node=name):
            return InputRefusedError("node", name, at_ms, reason)
    name = getattr(event, "job", "") or getattr(event, "node", "") or type(event).__name__
    return InputRefusedError("event", name, at_ms, reason)


@dataclass(slots=True)
class SimResult:
    """What a simulation did, in counts; the projections hold the details."""

    policy: str
    jobs: int
    records: int
    cycles: int
    end_ms: int
    statuses: dict[str, int] = field(default_factory=dict)
    time_to_ready_ms: dict[str, int] = field(default_factory=dict)
    """Per job that ever ran: submission until its gang first ran."""
    gpus: dict[str, int] = field(default_factory=dict)
    """Per job: GPU milli requested."""
    refused: list[InputRefusedError] = field(default_factory=list)
    """Inputs the scheduler refused, each with its reason (only with ``skip_invalid``)."""

    def gang_summary(self) -> str:
        """The largest gang's time-to-ready and the small jobs' p90, on one line."""
        if not self.gpus:
            return "no jobs"
        largest = max(self.gpus, key=lambda j: (self.gpus[j], j))
        small = sorted(
            t for j, t in self.time_to_ready_ms.items() if self.gpus[j] <= 1000 and j != largest
        )
        big = self.time_to_ready_ms.get(largest)
        big_text = format_duration(big / 1000) if big is not None else "never ran"
        p90 = small[min(len(small) - 1, (len(small) * 9) // 10)] / 1000 if small else 0.0
        return (
            f"largest gang {largest} ({self.gpus[largest] // 1000} GPUs): time to ready "
            f"{big_text}; jobs of at most 1 GPU: p90 time to ready {format_duration(p90)} "
            f"({len(small)} jobs)"
        )


Progress = Callable[[int, int, int], None]
"""progress(sim_time_ms, jobs_submitted_so_far, jobs_total)"""


class Simulation:
    """One run of a workload on a cluster under a policy, writing a ledger."""

    def __init__(
        self,
        cluster: ClusterFile,
        queues: QueuesFile,
        workload: WorkloadFile,
        policy: str | PolicyConfigured,
        writer: LedgerWriter | None = None,
        *,
        flush_every: int = 1024,
        tuning: Tuning = DEFAULT,
        skip_invalid: bool = False,
    ) -> None:
        """``tuning``: the core's shortcuts and bounds (``scheduler.core.tuning``); tests
        give others, every recorded run uses ``DEFAULT``. An input the scheduler refuses
        raises ``InputRefusedError``; with ``skip_invalid`` it is left out of the run and listed
        in the result's ``refused`` instead."""
        self._setup(
            [(0, e) for e in (*queue_events(queues), *node_events(cluster))],
            expand(workload),
            bind_ms=round(cluster.timing.bind_latency_s * SECOND),
            startup_ms=round(cluster.timing.startup_s * SECOND),
            policy=policy,
            writer=writer,
            flush_every=flush_every,
            tuning=tuning,
            skip_invalid=skip_invalid,
        )

    @classmethod
    def from_inputs(
        cls,
        world: list[tuple[int, Event]],
        jobs: list[SimJob],
        *,
        bind_ms: int,
        startup_ms: int,
        policy: str | PolicyConfigured,
        writer: LedgerWriter | None = None,
        flush_every: int = 1024,
        tuning: Tuning = DEFAULT,
        skip_invalid: bool = False,
    ) -> Simulation:
        """A simulation of recorded facts: ``world`` holds timed node, queue and cancel
        events (a what-if replays an incident's), ``jobs`` the submissions and runtimes."""
        sim = cls.__new__(cls)
        sim._setup(
            world,
            jobs,
            bind_ms=bind_ms,
            startup_ms=startup_ms,
            policy=policy,
            writer=writer,
            flush_every=flush_every,
            tuning=tuning,
            skip_invalid=skip_invalid,
        )
        return sim

    def _setup(
        self,
        world: list[tuple[int, Event]],
        jobs: list[SimJob],
        *,
        bind_ms: int,
        startup_ms: int,
        policy: str | PolicyConfigured,
        writer: LedgerWriter | None,
        flush_every: int,
        tuning: Tuning,
        skip_invalid: bool,
    ) -> None:
        config = policy if isinstance(policy, PolicyConfigured) else policy_event(policy)
        if config.policy not in POLICIES:
            raise ConfigError(
                f"unknown policy {config.policy!r}; choose one of {', '.join(POLICIES)}"
            )
        self.config = config
        self.policy = config.policy
        self.world = world
        self.jobs = jobs
        self.runtime = {j.submitted.job: j.runtime_ms for j in self.jobs}
        self.engine = Engine(writer, flush_every=flush_every, runtime=Runtime(State(tuning=tuning)))
        self.skip_invalid = skip_invalid
        self.refused: list[InputRefusedError] = []
        self.bind_ms = bind_ms
        self.startup_ms = startup_ms
        self._heap: list[tuple[int, int, Event, int]] = []
        self._seq = 0
        self._bound: dict[str, dict[str, None]] = {}
        self._started: dict[str, int] = {}
        self._finishing: dict[str, int] = {}
        self._nodes_of: dict[str, dict[str, str]] = {}
        self._ticks: dict[int, int] = {}
        """Wake-ups asked for: the latest moment a cycle may serve each (``_wake``)."""
        self.ready: dict[str, int] = {}
        self.placed: dict[str, int] = {}
        """Per job: when the scheduler first placed its gang (its first ``PodsAllocated``)."""
        self.origin = 0
        self.coarse = 0
        self.cycles = 0

    def _push(self, at: int, event: Event, attempt: int = -1) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, event, attempt))

    def run(
        self,
        progress: Progress | None = None,
        progress_every: int = 20_000,
        observe: Callable[[State, int], None] | None = None,
    ) -> SimResult:
        """Simulate until nothing more can happen; flush the ledger."""
        engine = self.engine
        setup: list[tuple[Event, int]] = [(self.config, 0)]
        for at, event in self.world:
            if at <= 0:
                setup.append((event, 0))
            else:
                self._push(at, event)
        for sim_job in self.jobs:
            self._push(sim_job.at, sim_job.submitted)
        self._react(self._step(setup, 0), 0)
        self.cycles += 1
        now, submitted = self._loop(
            progress=progress, progress_every=progress_every, observe=observe
        )
        total = len(self.jobs)
        engine.flush()
        if progress is not None:
            progress(now, submitted, total)
        statuses = engine.state.status_counts()  # ended jobs included
        return SimResult(
            policy=self.policy,
            jobs=total,
            records=engine.records,
            cycles=self.cycles,
            end_ms=now,
            statuses=statuses,
            time_to_ready_ms=self.ready,
            gpus={j.submitted.job: sum(p.gpu_milli for p in j.submitted.pods) for j in self.jobs},
            refused=self.refused,
        )

    def _loop(
        self,
        *,
        until: int | None = None,
        stop: Callable[[], bool] | None = None,
        progress: Progress | None = None,
        progress_every: int = 20_000,
        observe: Callable[[State, int], None] | None = None,
    ) -> tuple[int, int]:
        """Take the queued events in time order, a cycle per moment, until none is left,
        the next is later than ``until`` or ``stop()`` says so; return the last moment and
        the submissions taken."""
        engine = self.engine
        submitted = 0
        total = len(self.jobs)
        heap = self._heap
        jobs = engine.state.jobs
        ended = engine.state.ended
        now = engine.state.now
        while heap and (until is None or heap[0][0] <= until):
            now = heap[0][0]
            batch: list[tuple[Event, int]] = []
            while heap and heap[0][0] == now:
                _, _, event, attempt = heapq.heappop(heap)
                if attempt >= 0:
                    job_id = getattr(event, "job", "")
                    job = jobs.get(job_id)
                    if job is not None:
                        current = job.attempt
                    else:  # an ended job's last attempt (a late event about it still counts)
                        code = ended.get(job_id)
                        current = -1 if code is None else ended_attempt(code)
                    if current != attempt:
                        continue  # about an attempt that preemption already ended
                if isinstance(event, JobSubmitted):
                    submitted += 1
                batch.append((event, now))
            if not batch:
                continue
            if (
                self.coarse
                and heap
                and heap[0][0] <= self._ticks.get(now, now)
                and all(isinstance(event, Tick) for event, _ in batch)
            ):
                # A due wake-up alone: the next moment's cycle, on the grid, serves it (the
                # tick goes along, so that cycle runs even if every event then is stale).
                self._push(heap[0][0], Tick())
                continue
            decisions = self._step(batch, now)
            self.cycles += 1
            if observe is not None:
                observe(engine.state, now)
            self._wake(now)
            self._after_inputs(batch, now)
            self._react(decisions, now)
            if progress is not None and self.cycles % progress_every == 0:
                progress(now, submitted, total)
            if stop is not None and stop():
                break
        return now, submitted

    def _ending(self, at: int, now: int) -> int:
        """When a pod due at ``now`` to end at ``at`` ends: then, or on the coarse grid
        (``resume``). The grid's step follows the pod's remaining run, not the distance
        from the forecast's moment: a job started days ahead that runs five minutes still
        runs about five minutes, so the forward run keeps the cluster's throughput."""
        step = self._step_for(at - now)
        return at if not step else self.origin + -(-(at - self.origin) // step) * step

    def _step_for(self, ahead: int) -> int:
        """The coarse grid's step for a moment ``ahead`` ms away (0: exact)."""
        if not self.coarse or ahead <= 1000:
            return 0
        return 1 << max(10, (ahead // self.coarse).bit_length() - 1)

    def _wake(self, now: int) -> None:
        """A time-based rule falls due at the state's wakeup: make sure a cycle runs then.
        On the coarse grid that cycle may come later by the grid step of the wake-up's
        distance from the state's moment (``resume``): when another event comes by then,
        its cycle serves the due wake-up (``_loop``). A reservation's start is the expected
        end of the jobs it waits for, which the forward run may put elsewhere (its own
        runtimes, rounded up to the grid): a cycle at the start alone finds them running."""
        wakeup = self.engine.state.wakeup
        if wakeup is not None and wakeup > now and wakeup not in self._ticks:
            self._ticks[wakeup] = wakeup + self._step_for(wakeup - self.origin)
            self._push(wakeup, Tick())

    @classmethod
    def resume(
        cls,
        state: State,
        runtimes: dict[str, int],
        *,
        bind_ms: int,
        startup_ms: int,
        arrivals: Sequence[SimJob] = (),
        coarse: int = 0,
    ) -> Simulation:
        """A simulation that carries on from ``state`` — the core's state at a moment of a
        ledger, which it takes over — with only ``arrivals`` as new work: each active or
        pending job runs ``runtimes[job]`` ms in all once it has started (less what it has
        checkpointed), the world binds in ``bind_ms`` and starts pods in ``startup_ms``, and
        pods that preemption is evicting are gone after ``bind_ms``. ``carry_on`` runs it;
        ``placed`` then holds when each job was placed. Nothing is recorded.

        ``coarse`` (a forecast's speed for its precision): when non-zero, a pod's end is
        rounded up to a grid whose step is about 1/``coarse`` of the run it has left when
        it is due (a power of two of milliseconds, at least a second), so long runs' ends
        share a cycle instead of taking one each; and a time-based rule falling due (the
        core's wake-up, such as a reservation's start) takes no cycle of its own when
        another event comes within 1/``coarse`` of its distance from the state's moment:
        that event's cycle serves it (``_wake``)."""
        sim = cls.__new__(cls)
        sim._setup(
            [],
            [],
            bind_ms=bind_ms,
            startup_ms=startup_ms,
            policy=state.config,
            writer=None,
            flush_every=1024,
            tuning=state.tuning,
            skip_invalid=False,
        )
        sim.engine.state = state
        sim.origin, sim.coarse = state.now, coarse
        sim.runtime = dict(runtimes)
        now = state.now
        for job in state.jobs.values():
            if job.status == RUNNING and job.started_at is not None:
                end = job.started_at + max(1, runtimes[job.job] - job.checkpointed_ms)
                sim._started[job.job] = sim._finishing[job.job] = job.attempt
                for pod in job.placements:
                    if pod not in job.finished:
                        at = sim._ending(max(end, now + 1), now)
                        sim._push(at, PodFinished(job=job.job, pod=pod), job.attempt)
            elif job.status == ALLOCATED:
                for pod, placed in job.placements.items():
                    sim._push(
                        now + bind_ms, PodBound(job=job.job, pod=pod, node=placed.node), job.attempt
                    )
        for job_id, pods in state.held.items():
            for pod, held in pods.items():
                sim._push(now + bind_ms, PodEvicted(job=job_id, pod=pod, node=held.node))
        for arrival in arrivals:
            sim.runtime[arrival.submitted.job] = arrival.runtime_ms
            sim._push(arrival.at, arrival.submitted)
        return sim

    def carry_on(self, until: int, stop: Callable[[], bool] | None = None) -> int:
        """Run a cycle at the state's moment, then everything that follows up to ``until``
        (or until ``stop()`` says so); return the last moment simulated."""
        state = self.engine.state
        now = state.now
        state.dirty = True  # the state came from elsewhere: judge every job afresh
        self._react(self._step([], now), now)
        self.cycles += 1
        self._wake(now)
        if stop is not None and stop():
            return now
        last, _ = self._loop(until=until, stop=stop)
        return last

    def _step(self, batch: list[tuple[Event, int]], now: int) -> list[Event]:
        """One engine step; an input it refused raises ``InputRefusedError`` (or, with
        ``skip_invalid``, is noted in ``refused``) instead of vanishing from the run."""
        engine = self.engine
        seen = len(engine.refused)
        decisions = engine.step(batch, now)
        for refusal in engine.refused[seen:]:
            refused = _refused_input(batch[refusal.index][0], now, refusal.reason)
            if not self.skip_invalid:
                raise refused
            self.refused.append(refused)
        return decisions

    def _react(self, decisions: list[Event], now: int) -> None:
        """The binder's side of each decision."""
        jobs = self.engine.state.jobs
        for decision in decisions:
            match decision:
                case PodsAllocated(job=job_id, placements=placements):
                    self.placed.setdefault(job_id, now)
                    attempt = jobs[job_id].attempt
                    nodes = self._nodes_of.setdefault(job_id, {})
                    for placement in placements:
                        nodes[placement.pod] = placement.node
                        self._push(
                            now + self.bind_ms,
                            PodBound(job=job_id, pod=placement.pod, node=placement.node),
                            attempt,
                        )
                case JobPreempted(job=job_id, pods=pods):
                    nodes = self._nodes_of.pop(job_id, {})
                    self._bound.pop(job_id, None)
                    for pod in pods:
                        self._push(
                            now + self.bind_ms,
                            PodEvicted(job=job_id, pod=pod, node=nodes.get(pod, "")),
                        )
                case _:
                    pass

    def _after_inputs(self, batch: list[tuple[Event, int]], now: int) -> None:
        """The kubelet's side: start bound gangs, finish running ones."""
        jobs = self.engine.state.jobs
        for event, _ in batch:
            match event:
                case PodBound(job=job_id, pod=pod):
                    job = jobs.get(job_id)  # None: the job has ended since (cancelled)
                    bound = self._bound.setdefault(job_id, {})
                    bound[pod] = None
                    if (
                        job is not None
                        and job.status in ACTIVE
                        and self._started.get(job_id) != job.attempt
                        and all(p in bound for p in job.placements)
                    ):
                        self._started[job_id] = job.attempt
                        for placed in job.placements:
                            self._push(
                                now + self.startup_ms,
                                PodStarted(job=job_id, pod=placed),
                                job.attempt,
                            )
                case PodStarted(job=job_id):
                    job = jobs.get(job_id)
                    if (
                        job is not None
                        and job.status == RUNNING
                        and job.started_at == now
                        and self._finishing.get(job_id) != job.attempt
                    ):
                        self._finishing[job_id] = job.attempt
                        if job_id not in self.ready:
                            self.ready[job_id] = now - job.submitted_at
                        remaining = max(1, self.runtime[job_id] - job.checkpointed_ms)
                        for placed in job.placements:
                            self._push(
                                self._ending(now + remaining, now),
                                PodFinished(job=job_id, pod=placed),
                                job.attempt,
                            )
                case _:
                    pass


def check_inputs(queues: QueuesFile, workload: WorkloadFile) -> None:
    """``ConfigError`` naming the job and field when the workload does not fit the queues:
    a job (or generator) whose queue is not in the queue tree, or is not a leaf of it (the
    scheduler would refuse its submission), or two explicit jobs (or generators) of one
    name. Nothing is simulated or written, and nothing is generated: the arrivals are
    drawn once, by the run (``expand`` checks the generated names there)."""
    parents = {q.parent for q in queues.queues if q.parent}
    names = {q.name for q in queues.queues}
    leaves = ", ".join(sorted(names - parents)) or "none"
    named = [(f"workload.jobs[{i}] ({j.name})", j.queue) for i, j in enumerate(workload.jobs)]
    named += [(f"workload.generators[{i}]", g.queue) for i, g in enumerate(workload.generators)]
    for where, queue in named:
        if queue not in names:
            raise ConfigError(f"{where}.queue: unknown queue {queue!r}; the leaf queues: {leaves}")
        if queue in parents:
            raise ConfigError(
                f"{where}.queue: {queue!r} has child queues; jobs go to a leaf: {leaves}"
            )
    for kind, specs in (("job", workload.jobs), ("generator", workload.generators)):
        seen: dict[str, None] = {}
        for spec in specs:
            if spec.name in seen:
                raise ConfigError(f"workload: duplicate {kind} name {spec.name!r}")
            seen[spec.name] = None


def simulate_into(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policy: str | PolicyConfigured,
    ledger: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    observe: Callable[[State, int], None] | None = None,
    skip_invalid: bool = False,
) -> SimResult:
    """Simulate ``workload`` on ``cluster`` under ``policy`` into the new ledger directory
    ``ledger`` (written whole or not at all: ``events.filelog.new_ledger``); ``ConfigError``
    if the inputs do not fit together, ``InputRefusedError`` for an input the scheduler refuses
    (listed in the result instead with ``skip_invalid``)."""
    with new_ledger(ledger) as writer:
        sim = Simulation(cluster, queues, workload, policy, writer, skip_invalid=skip_invalid)
        return sim.run(progress=progress, observe=observe)

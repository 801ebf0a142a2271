"""The live scheduler: intake → core → ledger on Kafka, exactly once (aiokafka).

This is the one module that knows the stream processor. It is a consume-transform-produce
loop with aiokafka's transactional producer; faust-streaming was tried first and not used
(docs/operations.md, "Why not faust"). Per micro-batch of intake records it:

1. begins a transaction and adds the ledger partition to it at once, so that round trip
   overlaps the next two steps (``add_partition_now``),
2. decodes and validates each record; a refused one becomes a dead letter,
3. applies the accepted ones and runs one ``cycle`` (the engine's order),
4. appends ``[accepted inputs…, decisions…, cycle_completed]`` to the domain's ledger
   partition and the dead letters, and commits: all of it in ONE transaction; after it,
   at most every ``offsets_every_ms``, the intake offset is committed to the group (for
   lag tools only, see below);
5. every ``snapshot_every`` ledger records, once that transaction has committed, encodes
   the state in a forked child (``EncodedElsewhere``) and writes it as a snapshot, in parts
   (``scheduler.fold.snapshot.split_snapshot``) and in a transaction of its own, from a second
   producer and off the loop's path (``_write_snapshot``).

Nothing of a micro-batch is visible before its commit, and the next one is applied only
after it: if a transaction fails, the state (which holds the failed batch) is rebuilt from
the ledger, as a new owner would (``_step_down``, then ``_take_over``).

A snapshot is consistent with the ledger offset it records because it is encoded between
two micro-batches, right after the commit of the records it covers: it is committed
provably after them, never ahead of the ledger. The snapshot writer's transactional id is
fixed per domain too, so a new owner fences a previous owner's snapshot writer (and aborts
its open snapshot transaction) before it reads the snapshots. A snapshot that fails to
land costs only a longer ledger tail at the next restore.

Exactly once across crashes does not rest on the group's committed offset: aiokafka cannot
ask for a *stable* committed offset (KIP-447's ``require_stable``), so right after a crash
it may read one that predates the last commit. The last ledger record of every
transaction carries the next intake offset in the header ``intake-next``; a new owner
takes its intake position from the ledger (or the snapshot), which commits atomically
with the records it describes.

Ownership: one consumer group per domain; the member that is assigned the domain's intake
partition is active, the others stand by. The active one's transactional id is fixed per
domain, so initialising it fences a previous owner (a zombie's next commit fails and it
exits with status 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import uvicorn
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from events.codec import (
    DecodeError,
    Envelope,
    decode_envelope,
    encode_envelope,
)
from events.kafka_admin import (
    SNAPSHOT_MAX_BYTES,
    KafkaSettings,
    add_partition_now,
    ensure_topics,
    new_consumer,
    new_producer,
    send_records,
    start_client,
)
from events.kafkalog import end_offset_of, read_records
from events.localfiles import wall_ms
from events.model import JobPreempted, PodsAllocated, tag_of
from scheduler.core import State, fair_shares
from scheduler.fold.snapshot import (
    PART_BYTES,
    CatchUp,
    SnapshotAssembler,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    split_snapshot,
)
from scheduler.fold.step import (
    REFUSAL_KINDS,
    Input,
    Refusal,
    Runtime,
    StepResult,
    live_policy,
)

log = logging.getLogger(__name__)

INTAKE_NEXT = "intake-next"
"""Header on the last ledger record of each transaction: the next intake offset."""
WRITER = "writer"
"""Header on the last ledger record of each transaction: ``host/pid`` of the instance that
committed it (for operators and the fencing test; replay ignores headers)."""
FENCED_EXIT = 3
ENCODER_NICE = 10
"""How much lower than the service the snapshot encoder's child runs (``os.nice``)."""


class Fenced(RuntimeError):  # noqa: N818  # names the condition, like aiokafka's
    """Another instance owns the domain now; this one must stop writing."""


class DeadLetter(msgspec.Struct, frozen=True):
    """An intake record the scheduler refused, as stored on the dead-letter topic."""

    kind: str
    """``decode`` | ``unknown_type`` | ``schema`` | ``invalid``."""
    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    value: bytes
    at: int = 0


_dl_enc = msgspec.msgpack.Encoder()
_dl_dec = msgspec.msgpack.Decoder(DeadLetter)


_T = TypeVar("_T")

FOLD_SLICE_S = 0.05
"""The longest the catch-up fold holds the event loop before it lets other tasks run."""


async def fold_yielding(
    items: Sequence[_T], feed: Callable[[_T], object], slice_s: float = FOLD_SLICE_S
) -> Sequence[_T]:
    """Feed every item, letting the event loop run other tasks at least every
    ``slice_s`` (checked every 64 items); returns ``items``.

    The catch-up fold re-runs every cycle of the ledger since the snapshot: a fetched
    batch of a congested ledger takes seconds on a loaded machine. Held that long, the
    loop could not send the group's heartbeats, the session would expire during the
    restore, and the domain would pass to the standby, which would restore and lose it
    the same way."""
    last = time.monotonic()
    for i, item in enumerate(items):
        feed(item)
        if i & 63 == 63 and time.monotonic() - last >= slice_s:
            await asyncio.sleep(0)
            last = time.monotonic()
    return items


def encode_dead_letter(dl: DeadLetter) -> bytes:
    """Stored bytes of a dead letter."""
    return _dl_enc.encode(dl)


def decode_dead_letter(data: bytes) -> DeadLetter:
    """A stored dead letter."""
    return _dl_dec.decode(data)


# --------------------------------------------------------------------------- metrics


_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_READY_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    """Cumulative: ``counts[i]`` observations were ``<= buckets[i]``."""
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def add_to(self, family: HistogramMetricFamily, labels: Sequence[str]) -> None:
        """Add this histogram to ``family`` as the series of ``labels``."""
        counts = self.counts or [0] * len(self.buckets)
        buckets = [(f"{b:g}", float(c)) for b, c in zip(self.buckets, counts, strict=True)]
        family.add_metric(labels, [*buckets, ("+Inf", float(self.n))], self.total)


@dataclass
class Metrics:
    """What the scheduler exposes to Prometheus (through ``prometheus_client``)."""

    cycle_seconds: _Histogram = field(default_factory=lambda: _Histogram(_BUCKETS_S))
    time_to_ready: dict[str, _Histogram] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    intake_lag: int = 0
    accepted: int = 0
    transactions: int = 0
    fair_share_gpu_milli: dict[str, int] = field(default_factory=dict)
    """Per queue, the GPU fair share of the last cycle (``scheduler.core.fair_shares``)."""
    deserved_gpu_milli: dict[str, int] = field(default_factory=dict)
    """Per queue, the deserved GPUs of the last cycle (percentages resolved)."""
    preempted: dict[str, int] = field(default_factory=dict)
    """Victim's queue → jobs preempted."""
    lost_gpu_ms: dict[str, int] = field(default_factory=dict)
    """Victim's queue → GPU-milliseconds of work preemption threw away."""

    def observe_cycle(self, seconds: float, decisions: Sequence[Any], state: State) -> None:
        """Record one cycle's latency, its decisions and the jobs it made ready."""
        self.cycle_seconds.observe(seconds)
        for d in decisions:
            tag = tag_of(type(d))
            self.decisions[tag] = self.decisions.get(tag, 0) + 1
            if isinstance(d, JobPreempted):
                self.preempted[d.queue] = self.preempted.get(d.queue, 0) + 1
                self.lost_gpu_ms[d.queue] = self.lost_gpu_ms.get(d.queue, 0) + d.lost_gpu_ms
            if isinstance(d, PodsAllocated):
                job = state.jobs.get(d.job)
                if job is not None:
                    hist = self.time_to_ready.setdefault(d.queue, _Histogram(_READY_BUCKETS_S))
                    hist.observe(max(state.now - job.submitted_at, 0) / 1000)
        # One division per micro-batch: the same computation the cycle's rules use.
        shares = fair_shares(state)
        self.fair_share_gpu_milli = {q: row[0] for q, row in shares.fair.items()}
        self.deserved_gpu_milli = {q: row[0] for q, row in shares.deserved.items()}

    def families(self, state: State, domain: str) -> list[Metric]:
        """The metric families of one scrape: these counters and the state's gauges."""
        d = [domain]
        cycle = HistogramMetricFamily(
            "gpuledger_cycle_seconds",
            "Micro-batch time: decode, validate, apply, cycle and commit.",
            labels=["domain"],
        )
        self.cycle_seconds.add_to(cycle, d)
        decisions = CounterMetricFamily(
            "gpuledger_decisions_total",
            "Decisions recorded, by event type.",
            labels=["domain", "type"],
        )
        for t, n in sorted(self.decisions.items()):
            decisions.add_metric([domain, t], n)
        dead = CounterMetricFamily(
            "gpuledger_dead_letters_total",
            "Intake records refused into the dead-letter topic, by kind.",
            labels=["domain", "kind"],
        )
        for k in sorted({*REFUSAL_KINDS, *self.dead_letters}):  # every kind from 0
            dead.add_metric([domain, k], self.dead_letters.get(k, 0))
        lag = GaugeMetricFamily(
            "gpuledger_intake_lag", "Intake records not yet in the ledger.", labels=["domain"]
        )
        lag.add_metric(d, self.intake_lag)
        accepted = CounterMetricFamily(
            "gpuledger_intake_accepted_total", "Intake records accepted.", labels=["domain"]
        )
        accepted.add_metric(d, self.accepted)
        jobs = GaugeMetricFamily(
            "gpuledger_core_jobs",
            "Jobs the core holds whole, and ended jobs it holds only the id of.",
            labels=["domain", "held"],
        )
        jobs.add_metric([domain, "whole"], len(state.jobs))
        jobs.add_metric([domain, "ended_id"], len(state.ended))
        pending = GaugeMetricFamily(
            "gpuledger_pending_workloads",
            "Jobs waiting, per leaf queue.",
            labels=["domain", "queue"],
        )
        allocated = GaugeMetricFamily(
            "gpuledger_queue_allocated_gpus",
            "GPUs allocated, per queue.",
            labels=["domain", "queue"],
        )
        for name in sorted(state.queues):
            q = state.queues[name]
            if not q.children:
                pending.add_metric([domain, name], len(q.pending))
            allocated.add_metric([domain, name], q.allocated[0] / 1000)
        share = GaugeMetricFamily(
            "gpuledger_queue_fair_share_gpu",
            "GPU fair share of the last cycle, per queue.",
            labels=["domain", "queue"],
        )
        for name in sorted(self.fair_share_gpu_milli):
            share.add_metric([domain, name], self.fair_share_gpu_milli[name] / 1000)
        deserved = GaugeMetricFamily(
            "gpuledger_queue_deserved_gpus",
            "Deserved GPUs of the last cycle, per queue (percentages resolved).",
            labels=["domain", "queue"],
        )
        for name in sorted(self.deserved_gpu_milli):
            deserved.add_metric([domain, name], self.deserved_gpu_milli[name] / 1000)
        preempted = CounterMetricFamily(
            "gpuledger_preempted_workloads",
            "Jobs preempted, per victim's queue (the rule of each: gpuledger_decisions_total "
            "and the ledger's job_preempted).",
            labels=["domain", "queue"],
        )
        lost = CounterMetricFamily(
            "gpuledger_gpu_seconds_lost_to_preemption",
            "GPU-seconds of work preemption threw away, per victim's queue.",
            labels=["domain", "queue"],
        )
        # Every leaf queue has a series from the start: a dashboard's rate() needs the 0.
        for name in sorted(
            {*self.preempted, *(q for q in state.queues if not state.queues[q].children)}
        ):
            preempted.add_metric([domain, name], self.preempted.get(name, 0))
            lost.add_metric([domain, name], self.lost_gpu_ms.get(name, 0) / 1000)
        total = GaugeMetricFamily(
            "gpuledger_allocated_gpus_total", "GPUs allocated in all.", labels=["domain"]
        )
        total.add_metric(
            d, sum(n.gpus * 1000 - n.free_gpu_milli for n in state.nodes.values()) / 1000
        )
        ready = HistogramMetricFamily(
            "gpuledger_admission_wait_time_seconds",
            "Submission to allocation of the jobs allocated, per queue.",
            labels=["domain", "queue"],
        )
        for queue in sorted(self.time_to_ready):
            self.time_to_ready[queue].add_to(ready, [domain, queue])
        return [
            cycle,
            decisions,
            dead,
            lag,
            accepted,
            jobs,
            pending,
            share,
            deserved,
            allocated,
            preempted,
            lost,
            total,
            ready,
        ]

    def render(self, state: State, domain: str) -> str:
        """The exposition text (Prometheus text format 0.0.4, label values escaped)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(lambda: self.families(state, domain)))
        return generate_latest(registry).decode()


class _Families(Collector):
    """A collector that yields what ``produce`` returns at each scrape."""

    def __init__(self, produce: Callable[[], list[Metric]]) -> None:
        self.produce = produce

    def collect(self) -> Iterable[Metric]:
        return self.produce()


def metrics_app(render: Callable[[], str]) -> Starlette:
    """The ASGI app of the Prometheus endpoint: ``GET /metrics`` (and ``HEAD``) answer
    ``render()``; another method there is 405 with ``Allow``, another path 404."""

    async def metrics(_request: Request) -> Response:
        # Rendered here, on the loop that changes the state, so a scrape sees one
        # consistent state (prometheus_client's own server would read it from a thread).
        # The endpoint is a coroutine for that: Starlette runs a plain function in a thread.
        return Response(render(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


class _LoopServer(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM and SIGINT to the event loop's owner."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn would install handlers of its own for the time it serves, and the
        # service's (run_service) would never hear of the signal that should stop it.
        yield


class MetricsServer:
    """The Prometheus endpoint over HTTP (``metrics_app`` on uvicorn), served by a task on
    the running event loop from ``start`` to ``stop``."""

    def __init__(self, render: Callable[[], str], host: str, port: int) -> None:
        self.render = render
        self.host = host
        self.port = port
        """The port asked for; after ``start``, the one bound (``0`` picks a free one)."""
        self._server: _LoopServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen, or raise ``OSError`` if the address cannot be bound, and serve."""
        # Bound here rather than by uvicorn, which logs a failure to bind and exits the
        # process from inside its task; the socket also tells which port 0 became.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            metrics_app(self.render),
            log_config=None,  # the service's logging, not uvicorn's own handlers
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = _LoopServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and let scrapes in progress finish (1 s at most).

        A failure of the server is logged, not raised: ``stop`` runs as the service stops,
        and must not hide why it stopped (``Fenced`` is exit status 3)."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except Exception:
            log.exception("the metrics server failed")
        self._server = self._task = None


# --------------------------------------------------------------------------- the service


@dataclass
class ServiceConfig:
    """Knobs of one scheduler instance."""

    settings: KafkaSettings
    domain: str
    max_batch: int = 1000
    """Intake records per micro-batch (one cycle, one transaction)."""
    poll_ms: int = 50
    snapshot_every: int = 50_000
    """Ledger records between snapshots."""
    snapshot_part_bytes: int = PART_BYTES
    """A larger snapshot is written as parts of at most this many bytes, one at a time, in
    its one transaction (``scheduler.fold.snapshot.split_snapshot``)."""
    session_timeout_ms: int = 3000
    """How long the group waits before a silent active instance loses the domain."""
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    """Address the Prometheus endpoint listens on (``0.0.0.0`` inside a container)."""
    policy: str = "gpuledger"
    """The policy to schedule with (``scheduler.core.POLICIES``): recorded first on a new
    ledger, and recorded again at take-over when the ledger's differs (a switch)."""
    max_skew_ms: int = 60_000
    """An intake record stamped further ahead of the scheduler's clock is dead-lettered."""
    heap_every: int = 2000
    """Intake records between two tidyings of the heap (``SchedulerService._tidy_heap``):
    a collection of what was allocated since the last one, after which the survivors are
    frozen out of the garbage collector's sight."""
    heap_full_every_s: float = 600.0
    """Seconds between full collections of the whole heap, frozen part included."""
    offsets_every_ms: int = 1000
    """Commit the intake position to the consumer group at most once per this many ms,
    after a micro-batch's transaction. Nothing of the service reads it back (a new owner
    takes its position from the ledger's ``intake-next`` header): it is there for lag
    tools, to which it may lag by this much."""


@dataclass(slots=True)
class _Batch:
    """One micro-batch decided: what its transaction writes."""

    result: StepResult
    ledger: list[Envelope]
    dead: list[DeadLetter]
    intake_next: int


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, service: SchedulerService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if self.service.tp in revoked:
            self.service.owned = False
            if self.service.active:
                await self.service.check_fenced()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.service.owned = self.service.tp in assigned


class SchedulerService:
    """One instance: stands by until the group gives it the domain, then schedules."""

    def __init__(self, config: ServiceConfig) -> None:
        """Prepare (nothing connects until ``run``)."""
        self.config = config
        s = config.settings
        self.partition = s.partition(config.domain)
        self.tp = TopicPartition(s.intake, self.partition)
        self.ledger_tp = TopicPartition(s.ledger, self.partition)
        self.owned = False
        self.active = False
        self.runtime = Runtime(live=True, max_skew_ms=config.max_skew_ms)
        self.metrics = Metrics()
        self.intake_next = 0
        self.ledger_next = 0
        self.records_since_snapshot = 0
        self.records = 0
        self._consumer: Any = None
        self._producer: Any = None
        self._snap_producer: Any = None
        """Writes snapshots, in transactions of their own (see the module docstring)."""
        self._snapshot_task: asyncio.Task[None] | None = None
        self._encoding: EncodedElsewhere | None = None
        self._offsets_at = 0.0
        """``time.monotonic()`` of the last commit of the intake position to the group."""
        self._offsets_task: asyncio.Task[None] | None = None
        self._record_policy = False
        """Whether the next micro-batch records ``config.policy`` first (``_take_over``)."""
        self._since_tidy = 0
        """Intake records since the heap was last tidied."""
        self._full_gc_at = 0.0
        """``time.monotonic()`` of the last full collection."""
        self._txn_lock = asyncio.Lock()
        """One transaction at a time: the loop's commits and the revocation check."""
        self.fenced: Fenced | None = None
        """Set when the broker refused this instance's transactional id; ``run`` raises it."""
        self.writer_id = f"{socket.gethostname()}/{os.getpid()}"

    @property
    def state(self) -> State:
        """The scheduler's state (the runtime's)."""
        return self.runtime.state

    @state.setter
    def state(self, state: State) -> None:
        self.runtime.state = state

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; raises ``Fenced`` if another owner took over."""
        cfg = self.config
        s = cfg.settings
        await ensure_topics(s)
        if cfg.metrics_port is None:
            await self._schedule(stop)
            return
        server = MetricsServer(
            lambda: self.metrics.render(self.state, cfg.domain), cfg.metrics_host, cfg.metrics_port
        )
        await server.start()
        try:
            await self._schedule(stop)
        finally:
            await server.stop()

    async def _schedule(self, stop: asyncio.Event) -> None:
        """Join the group and schedule while the domain is this instance's, until ``stop``."""
        cfg = self.config
        s = cfg.settings
        self._consumer = new_consumer(
            s.bootstrap,
            security=s.security,
            group_id=s.transactional_id(cfg.domain),
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=max(cfg.session_timeout_ms // 6, 100),
            max_poll_interval_ms=60_000,
            rebalance_timeout_ms=cfg.session_timeout_ms * 2,
        )
        await start_client(self._consumer, s.bootstrap, s.security)
        self._consumer.subscribe([s.intake], listener=_Listener(self))
        try:
            while not stop.is_set():
                if self.fenced is not None:
                    raise self.fenced
                if not self.owned:
                    if self.active:
                        await self._step_down()
                    # getmany drives the group protocol; a standby gets nothing from it.
                    await self._consumer.getmany(timeout_ms=cfg.poll_ms)
                    continue
                if not self.active:
                    await self._take_over()
                await self._step()
        finally:
            await self._stop_snapshots()
            if self._offsets_task is not None:
                self._offsets_task.cancel()
                with contextlib.suppress(BaseException):
                    await self._offsets_task
            with contextlib.suppress(Exception):
                await self._consumer.stop()
            if self._producer is not None:
                with contextlib.suppress(Exception):
                    await self._producer.stop()

    async def _take_over(self) -> None:
        """Fence the previous owner, restore the state, position intake from the ledger."""
        cfg = self.config
        s = cfg.settings
        started = time.perf_counter()
        self._producer = new_producer(
            s.bootstrap,
            s.transactional_id(cfg.domain),
            security=s.security,
            max_request_size=SNAPSHOT_MAX_BYTES,  # a large micro-batch
        )
        # Uncompressed: gzip of a 10 MB snapshot would hold the loop for a few 100 ms.
        self._snap_producer = new_producer(
            s.bootstrap,
            s.snapshot_transactional_id(cfg.domain),
            security=s.security,
            compression=None,
            max_request_size=SNAPSHOT_MAX_BYTES,
        )
        # init_transactions: fences and aborts a zombie's ledger and snapshot transactions,
        # before the restore reads what they wrote.
        await start_client(self._producer, s.bootstrap, s.security)
        await start_client(self._snap_producer, s.bootstrap, s.security)
        self.state, self.ledger_next, self.intake_next, self.records = await self.restore()
        self.records_since_snapshot = 0
        self._offsets_at = 0.0
        # Decided here, once per take-over: a policy record sent through intake later on
        # stands until the next owner.
        self._record_policy = self.ledger_next == 0 or self.state.policy != self.config.policy
        self._consumer.seek(self.tp, self.intake_next)
        # The restored state is frozen as it is (a collection here would walk all of it
        # on every start); what the restore left as cyclic garbage waits for the next
        # full collection (``_tidy_heap``).
        gc.freeze()
        self._full_gc_at = time.monotonic()
        self._since_tidy = 0
        self.active = True
        log.warning(
            "domain %s: active after %.2fs; ledger at %d, intake at %d",
            cfg.domain,
            time.perf_counter() - started,
            self.ledger_next,
            self.intake_next,
        )

    async def restore(self) -> tuple[State, int, int, int]:
        """Latest snapshot + ledger tail → (state, ledger_next, intake_next, records)."""
        s = self.config.settings
        reader = new_consumer(s.bootstrap, security=s.security)
        await start_client(reader, s.bootstrap, s.security)
        try:
            state, ledger_next, intake_next, records = State(), 0, 0, 0
            snap_tp = TopicPartition(s.snapshots, self.partition)
            reader.assign([snap_tp, self.ledger_tp])
            parts = SnapshotAssembler()
            end = await end_offset_of(reader, snap_tp)
            async for batch in read_records(reader, snap_tp, 0, end):
                for m in batch:
                    parts.feed(m.value, m.headers)
            latest = parts.latest
            if latest is not None:
                try:
                    # In a thread: decoding a large snapshot takes a second or more on a
                    # loaded machine, and the loop must keep the group's heartbeats going
                    # (a session lost during restore hands the domain on, over and over).
                    snap, state = await asyncio.to_thread(decode_snapshot, latest)
                    ledger_next, intake_next, records = (
                        snap.ledger_next,
                        snap.intake_next,
                        snap.records,
                    )
                except SnapshotError:
                    log.exception("unreadable snapshot; replaying the whole ledger")
                    state, ledger_next, intake_next, records = State(), 0, 0, 0
            catch = CatchUp(state)
            end = await end_offset_of(reader, self.ledger_tp)
            async for batch in read_records(reader, self.ledger_tp, ledger_next, end):
                for m in await fold_yielding(
                    batch, lambda m: catch.feed(m.offset, decode_envelope(m.value, m.offset))
                ):
                    for key, value in m.headers or ():
                        if key == INTAKE_NEXT:
                            intake_next = int(value)
            return catch.state, max(end, ledger_next), intake_next, records + catch.records
        finally:
            await reader.stop()

    async def check_fenced(self) -> None:
        """Ask the broker whether this instance still holds the domain's transactional id.

        Called when the group takes the domain's intake partition away from the active
        instance. A revocation alone does not say why: a healthy instance loses the
        partition in an ordinary rebalance, a paused or partitioned one because its session
        expired and a successor was given the domain. The broker knows: a transaction that
        only re-commits the intake position succeeds if no successor has initialised the
        transactional id, and fails with ``ProducerFenced`` otherwise. So a zombie always
        learns that it was fenced, even when the rebalance reaches it before its next batch
        does, and stops (``run`` raises ``Fenced``, exit status 3) instead of standing by.
        """
        group = self.config.settings.transactional_id(self.config.domain)
        async with self._txn_lock:  # before the loop's step-down can stop the producer
            producer = self._producer
            if producer is None or self.fenced is not None:
                return  # stood down already, or the loop's own commit found the fence
            try:
                async with producer.transaction():
                    await producer.send_offsets_to_transaction({self.tp: self.intake_next}, group)
            except ProducerFenced:
                self.fenced = Fenced(f"domain {self.config.domain}: fenced by a newer owner")
            except KafkaError as exc:
                if "fenc" in str(exc).lower() or "epoch" in str(exc).lower():
                    self.fenced = Fenced(str(exc))
                else:
                    log.warning("could not check ownership (%s); standing down", exc)
        if self.fenced is not None:
            log.error("%s (found when the group revoked the domain)", self.fenced)

    async def _step_down(self) -> None:
        self.active = False
        await self._stop_snapshots()
        async with self._txn_lock:
            if self._producer is not None:
                with contextlib.suppress(Exception):
                    await self._producer.stop()
                self._producer = None

    async def _stop_snapshots(self) -> None:
        """Abandon a snapshot in flight (its transaction aborts) and stop its producer."""
        task, self._snapshot_task = self._snapshot_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        encoding, self._encoding = self._encoding, None
        if encoding is not None:
            encoding.abandon()
        producer, self._snap_producer = self._snap_producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()

    async def _take(self) -> list[Any]:
        """Up to ``max_batch`` intake records, waiting at most ``poll_ms`` for the first."""
        cfg = self.config
        got = await self._consumer.getmany(
            self.tp, timeout_ms=cfg.poll_ms, max_records=cfg.max_batch
        )
        return list(got.get(self.tp, []))

    async def _step(self) -> None:
        msgs = await self._take()
        if not msgs or not self.owned:
            return
        s = self.config.settings
        domain = self.config.domain.encode()
        try:
            async with self._txn_lock:
                if self.fenced is not None:
                    # The revocation check found the fence while this batch waited.
                    raise self.fenced
                producer = self._producer
                async with producer.transaction():
                    # The ledger partition is added to the transaction while the batch is
                    # decided (``add_partition_now``): one round trip off its latency.
                    await add_partition_now(producer, s.ledger, self.partition)
                    started = time.perf_counter()
                    batch = self._decide(msgs)
                    tail = [
                        (INTAKE_NEXT, str(batch.intake_next).encode()),
                        (WRITER, self.writer_id.encode()),
                    ]
                    sent = await send_records(
                        producer,
                        s.ledger,
                        self.partition,
                        domain,
                        [encode_envelope(env) for env in batch.ledger],
                        tail,
                    )
                    for dl in batch.dead:
                        await producer.send(
                            s.deadletters,
                            encode_dead_letter(dl),
                            key=domain,
                            partition=self.partition,
                        )
                    if sent is not None:
                        self.ledger_next = sent[1] + 1
                        self.records += len(batch.ledger)
                        self.records_since_snapshot += len(batch.ledger)
        except ProducerFenced as exc:
            self.fenced = Fenced(f"domain {self.config.domain}: fenced by a newer owner")
            raise self.fenced from exc
        except KafkaError as exc:
            # The transaction was aborted; the state already holds this batch, so it can
            # not simply be retried: rebuild from the ledger like a new owner would.
            log.warning("transaction failed (%s); restoring from the ledger", exc)
            if "fenc" in str(exc).lower() or "epoch" in str(exc).lower():
                self.fenced = Fenced(str(exc))
                raise self.fenced from exc
            self.active = False
            await self._step_down()
            return
        self.intake_next = batch.intake_next
        self._maybe_commit_offsets()
        self._maybe_snapshot()
        self._since_tidy += len(msgs)
        if self._since_tidy >= self.config.heap_every:
            self._tidy_heap()
        result, dead, decisions = batch.result, batch.dead, batch.result.decisions
        self.metrics.accepted += result.accepted
        self.metrics.transactions += 1
        for dl in dead:
            self.metrics.dead_letters[dl.kind] = self.metrics.dead_letters.get(dl.kind, 0) + 1
        if decisions:
            log.info(
                "cycle at %d: %d inputs, %d decisions, %d dead letters, %.1f ms",
                self.state.now,
                result.accepted,
                len(decisions) - 1,
                len(dead),
                (time.perf_counter() - started) * 1000,
            )
            self.metrics.observe_cycle(time.perf_counter() - started, decisions, self.state)
        hw = self._consumer.highwater(self.tp)
        if hw is not None:
            self.metrics.intake_lag = max(int(hw) - batch.intake_next, 0)

    def _decide(self, msgs: list[Any]) -> _Batch:
        """Decode and validate ``msgs``, apply the accepted ones and run one cycle."""
        inputs: list[Input | Refusal] = []
        now = wall_ms()
        if self._record_policy:
            # A new ledger starts with the live policy, so that a replay knows it; a
            # ledger kept under another policy records the switch first. (A failed
            # transaction stands the service down; the next take-over decides again.)
            inputs.append((live_policy(self.config.policy), now))
            self._record_policy = False
        first = len(inputs)
        for m in msgs:
            try:
                env = decode_envelope(m.value or b"", m.offset)
            except DecodeError as exc:
                inputs.append(Refusal(-1, "decode", str(exc)))
                continue
            admitted = Runtime.admit(env, m.offset)
            inputs.append(admitted if isinstance(admitted, Refusal) else (admitted, env.at))
        result = self.runtime.step(inputs, now)
        dead = [
            DeadLetter(
                kind=r.kind,
                reason=r.reason,
                source_topic=msgs[r.index - first].topic,
                source_partition=msgs[r.index - first].partition,
                source_offset=msgs[r.index - first].offset,
                value=msgs[r.index - first].value or b"",
                at=int(msgs[r.index - first].timestamp),
            )
            for r in result.refused
        ]
        return _Batch(result, result.records, dead, msgs[-1].offset + 1)

    def _maybe_commit_offsets(self) -> None:
        """Commit the intake position to the consumer group, at most every
        ``offsets_every_ms`` and outside the ledger's transactions, for lag tools.

        Nothing of the service reads it back (a new owner takes its position from the
        ledger's ``intake-next`` header), so it need not be atomic with the records; inside
        a micro-batch's transaction it cost that transaction two more broker round trips.
        It is made after the commit, so it never runs ahead of the committed ledger."""
        now = time.monotonic()
        if now - self._offsets_at < self.config.offsets_every_ms / 1000:
            return
        if self._offsets_task is not None and not self._offsets_task.done():
            return
        self._offsets_at = now
        self._offsets_task = asyncio.create_task(self._commit_offsets(self.intake_next))

    async def _commit_offsets(self, intake_next: int) -> None:
        try:
            await self._consumer.commit({self.tp: intake_next})
        except KafkaError as exc:  # a rebalance in between: the next owner commits its own
            log.debug("intake position %d not committed to the group (%s)", intake_next, exc)

    def _tidy_heap(self) -> None:
        """Collect what is new on the heap and freeze the survivors (``gc.freeze``).

        The state grows with the cluster (every job and pod is a few objects) and Python's
        full collections walk all of it, every time the heap has grown by a quarter: a
        stall of every decision behind it that grows with the cluster. Between two
        micro-batches, after their commit, this collects only the objects allocated since
        the last call (frozen ones are not walked) and freezes what survives, so automatic
        collections stay small. Cyclic garbage among frozen objects waits for the full
        collection made every ``heap_full_every_s``."""
        now = time.monotonic()
        if now - self._full_gc_at >= self.config.heap_full_every_s:
            gc.unfreeze()
            self._full_gc_at = now
        gc.collect()
        gc.freeze()
        self._since_tidy = 0

    def _maybe_snapshot(self) -> None:
        """Start writing a snapshot if ``snapshot_every`` records have been committed since
        the last one and none is in flight.

        Called right after a commit and before the next micro-batch is applied, so the
        state encoded here is exactly the committed ledger's up to ``ledger_next``; the
        bytes are taken now and sent by a task, while the loop goes on scheduling."""
        if self.records_since_snapshot < self.config.snapshot_every:
            return
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return  # the previous one is still being written: try after the next batch
        # Forked here, between two micro-batches: the child sees exactly the committed
        # ledger's state up to ledger_next.
        domain, state, ledger_next = self.config.domain, self.state, self.ledger_next
        intake_next, records = self.intake_next, self.records
        self._encoding = EncodedElsewhere(
            lambda: encode_snapshot(domain, state, ledger_next, intake_next, records)
        )
        self.records_since_snapshot = 0
        self._snapshot_task = asyncio.create_task(self._write_snapshot(self._encoding, ledger_next))

    async def _write_snapshot(self, encoding: EncodedElsewhere, ledger_next: int) -> None:
        """Wait for the snapshot's bytes (``EncodedElsewhere``) and write them in one
        transaction; a failure is logged and retried after the next micro-batch (fenced:
        this instance stops, as for the ledger)."""
        started = time.perf_counter()
        try:
            data = await encoding.result()
        except OSError as exc:
            log.warning("snapshot at ledger %d not encoded (%s); trying again", ledger_next, exc)
            self.records_since_snapshot = self.config.snapshot_every
            return
        log.info(
            "snapshot at ledger %d: %d bytes encoded in %.1f ms, off the loop",
            ledger_next,
            len(data),
            (time.perf_counter() - started) * 1000,
        )
        producer = self._snap_producer
        if producer is None:
            return
        s = self.config.settings
        started = time.perf_counter()
        records = split_snapshot(
            self.config.domain, data, self.config.snapshot_part_bytes, os.urandom(8).hex().encode()
        )
        parts = 0
        try:
            async with producer.transaction():
                # A part at a time, each acknowledged before the next is built: the loop
                # and the ledger's transactions go on in between (scheduler.fold.snapshot).
                for key, value, headers in records:
                    await (
                        await producer.send(
                            s.snapshots, value, key=key, partition=self.partition, headers=headers
                        )
                    )
                    parts += 1
        except ProducerFenced:
            self.fenced = Fenced(f"domain {self.config.domain}: fenced by a newer owner")
            return
        except KafkaError as exc:
            if "fenc" in str(exc).lower() or "epoch" in str(exc).lower():
                self.fenced = Fenced(str(exc))
                return
            log.warning("snapshot at ledger %d not written (%s); trying again", ledger_next, exc)
            self.records_since_snapshot = self.config.snapshot_every
            return
        log.info(
            "snapshot at ledger %d committed in %.0f ms (%d records)",
            ledger_next,
            (time.perf_counter() - started) * 1000,
            parts,
        )


class EncodedElsewhere:
    """``encode()``, computed in a child forked at construction while this process's loop
    goes on: ``await result()`` for the bytes, ``abandon()`` to give them up.

    A snapshot of a large state takes hundreds of milliseconds to encode (about 0.3 s at
    35,000 jobs), and on the loop every decision in flight would wait that long: the tail
    of intake-to-decision latency. The child sees the state as it is at the fork
    (copy-on-write), writes the bytes to a pipe and exits; the parent reads them on a
    worker thread. Where ``fork`` does not exist the bytes are encoded at once, here."""

    def __init__(self, encode: Callable[[], bytes]) -> None:
        self.data: bytes | None = None
        self.pid = 0
        self.fd = -1
        if not hasattr(os, "fork"):
            self.data = encode()
            return
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: encode, write, exit without running the parent's code
            status = 1
            try:
                gc.disable()  # collections would touch (and copy) every shared page
                # Below the loop's priority: on a busy machine the encoder takes what CPU
                # the decisions leave, rather than half of it from them.
                with contextlib.suppress(OSError):
                    os.nice(ENCODER_NICE)
                os.close(read_end)
                view = memoryview(encode())
                while view:
                    view = view[os.write(write_end, view) :]
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        self.pid, self.fd = pid, read_end

    async def result(self) -> bytes:
        """The bytes; ``OSError`` if the child failed."""
        if self.data is not None:
            return self.data
        pid, fd, self.pid, self.fd = self.pid, self.fd, 0, -1
        loop = asyncio.get_running_loop()
        try:
            data, status = await loop.run_in_executor(None, _collect, fd, pid)
        except asyncio.CancelledError:
            # The worker thread sees the pipe's end once the child is gone, and reaps it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise
        if status != 0:
            raise OSError(f"the snapshot encoder (pid {pid}) ended with wait status {status}")
        self.data = data
        return data

    def abandon(self) -> None:
        """Stop a child whose bytes were never asked for, and reap it."""
        pid, fd, self.pid, self.fd = self.pid, self.fd, 0, -1
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.close(fd)
            os.waitpid(pid, 0)


def _collect(fd: int, pid: int) -> tuple[bytes, int]:
    """Read a pipe to its end, close it, and reap the child that wrote it."""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status


def run_service(config: ServiceConfig) -> int:
    """Run until SIGTERM/SIGINT; exit status 0, or 3 when fenced by a newer owner.

    Raises ``KafkaLogError`` (``KafkaAuthError`` for refused credentials) when it cannot
    connect at start."""

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await SchedulerService(config).run(stop)
        except Fenced as exc:
            log.error("%s; exiting", exc)  # the traceback adds nothing
            return FENCED_EXIT
        return 0

    return asyncio.run(main())


__all__ = [
    "FENCED_EXIT",
    "INTAKE_NEXT",
    "WRITER",
    "DeadLetter",
    "Fenced",
    "Metrics",
    "MetricsServer",
    "SchedulerService",
    "ServiceConfig",
    "decode_dead_letter",
    "encode_dead_letter",
    "metrics_app",
    "run_service",
]

"""The live path against the real broker: end to end, dead letters, SIGKILL, failover, fencing.

Each test runs the scheduler service as real ``gpuledger scheduler run`` processes on its
own topic prefix, sends intake with the producer helpers the CLI uses, and judges the
ledger with the library calls: ``scheduler.fold.verify.run`` on a ``KafkaReader`` and a byte
comparison of the ledger's inputs with what intake received.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pytest

from events.codec import Envelope, decode_envelope, decode_event, encode_envelope, wrap
from events.kafka_admin import KafkaSettings, new_consumer, run_sync, start_client
from events.kafka_security import resolve_security
from events.kafkalog import KafkaReader, end_offset_of, read_records
from events.model import (
    DECISION_TAGS,
    JobCancelled,
    JobSubmitted,
    NodeRegistered,
    PodSpec,
    PolicyConfigured,
    QueueConfigured,
    Resources,
    Tick,
)
from events.sources import open_reader
from projections.projector import project
from scheduler.fold.verify import run as replay
from scheduler.runtime.intake import read_dead_letters, send_events, send_intake
from scheduler.runtime.service import FENCED_EXIT, WRITER
from tests.kafkakit import kafka, settings
from tests.waiting import wait_until

__all__ = ["kafka", "settings"]

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


class Service:
    """One ``gpuledger scheduler run`` process."""

    def __init__(self, s: KafkaSettings, log: Path, *extra: str) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scheduler.cli",
                "scheduler",
                "run",
                "--bootstrap",
                s.bootstrap,
                "--prefix",
                s.prefix,
                "--session-timeout-ms",
                "1500",
                "--max-batch",
                "200",
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(log, "ab"),  # noqa: SIM115  # the child owns it
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for s in started:
        s.stop()


def start(started: list[Service], s: KafkaSettings, tmp: Path, *extra: str) -> Service:
    svc = Service(s, tmp / f"service-{len(started)}.log", *extra)
    started.append(svc)
    return svc


def read_all(s: KafkaSettings, topic: str) -> list[tuple[int, bytes, dict[str, bytes]]]:
    from aiokafka import TopicPartition

    tp = TopicPartition(topic, 0)

    async def go() -> list[tuple[int, bytes, dict[str, bytes]]]:
        c = new_consumer(s.bootstrap, security=s.security)
        await c.start()
        try:
            c.assign([tp])
            out = []
            async for batch in read_records(c, tp, 0, await end_offset_of(c, tp)):
                out += [(m.offset, m.value, dict(m.headers or ())) for m in batch]
            return out
        finally:
            await c.stop()

    return run_sync(go())


def ledger_envelopes(s: KafkaSettings) -> list[Envelope]:
    return [decode_envelope(v) for _, v, _ in read_all(s, s.ledger)]


def ledger_inputs(s: KafkaSettings) -> list[tuple[str, bytes]]:
    """The ledger's inputs as (type, payload), without the policies the service records
    itself (first on a new ledger, and a switch; these tests send none). The service stamps
    inputs with its own clock, so ``at`` differs from the producer's; everything else is
    the intake record as sent."""
    envs = ledger_envelopes(s)
    assert envs[0].type == "policy_configured", "a new ledger starts with the live policy"
    return [
        (e.type, bytes(e.payload))
        for e in envs
        if e.type not in DECISION_TAGS and e.type != "policy_configured"
    ]


def intake_inputs(s: KafkaSettings) -> list[tuple[str, bytes]]:
    envs = [decode_envelope(v) for _, v, _ in read_all(s, s.intake)]
    return [(e.type, bytes(e.payload)) for e in envs]


def wait_for(pred: Callable[[], object], timeout: float, what: str) -> None:
    """tests.waiting.wait_until, polling every 0.2 s (each poll reads topics)."""
    wait_until(pred, timeout, what, poll=0.2)


def scheduler_group(s: KafkaSettings, domain: str = "default") -> tuple[str, int]:
    """The state and the member count of the consumer group of ``domain``'s schedulers."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def go() -> tuple[str, int]:
        security = resolve_security(s.security)
        admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap, **security.client_kwargs())
        await start_client(admin, s.bootstrap, security)
        try:
            (response,) = await admin.describe_consumer_groups([s.transactional_id(domain)])
        finally:
            await admin.close()
        (group,) = response.to_object()["groups"]
        return group["state"], len(group["members"])

    return run_sync(go())


def caught_up(s: KafkaSettings) -> bool:
    """The ledger's last transaction has taken in all of intake."""
    intake = read_all(s, s.intake)
    ledger = read_all(s, s.ledger)
    if not intake:
        return True
    heads = [int(h["intake-next"]) for _, _, h in ledger if "intake-next" in h]
    return bool(heads) and heads[-1] == intake[-1][0] + 1


def cluster(s: KafkaSettings, nodes: int = 4) -> None:
    send_events(
        s,
        "default",
        [
            QueueConfigured(queue="train", deserved=Resources(gpu_milli=16_000)),
            QueueConfigured(queue="dev", deserved=Resources(gpu_milli=16_000)),
            *(
                NodeRegistered(node=f"n{i}", gpus=8, cpu_milli=64_000, memory_mib=512_000)
                for i in range(nodes)
            ),
        ],
    )


def job(name: str, queue: str = "train", gpus: int = 1000, pods: int = 1) -> JobSubmitted:
    return JobSubmitted(
        job=name,
        queue=queue,
        pods=tuple(PodSpec(name=f"p{i}", gpu_milli=gpus) for i in range(pods)),
    )


def assert_exactly_once_and_replays(s: KafkaSettings) -> None:
    intake = intake_inputs(s)
    assert ledger_inputs(s) == intake, "every intake record in the ledger exactly once, in order"
    with KafkaReader(s.bootstrap, s.ledger, security=s.security) as reader:
        result = replay(reader)
    assert result.ok, result.mismatch and result.mismatch.diff()
    recorded = sum(e.type == "policy_configured" for e in ledger_envelopes(s))
    assert result.inputs == len(intake) + recorded  # and the policies the service recorded


def test_end_to_end_submit_allocate_replay_project(
    settings: KafkaSettings, services: list[Service], tmp_path: Path
) -> None:
    s = settings
    start(services, s, tmp_path)
    cluster(s)
    db = tmp_path / "live.duckdb"
    reader = KafkaReader(s.bootstrap, s.ledger)
    try:
        for wave in range(3):
            send_events(s, "default", [job(f"w{wave}-{i}", pods=2) for i in range(4)])
            wait_for(lambda: caught_up(s), 30, "the scheduler to take in intake")
            project(reader, db)  # followed live: one incremental run per wave
        allocated = {e.key for e in ledger_envelopes(s) if e.type == "pods_allocated"}
        assert allocated == {f"w{w}-{i}" for w in range(3) for i in range(4)}
        con = duckdb.connect(str(db), read_only=True)
        rows = con.execute("SELECT count(*), count(ready_at_ms) FROM jobs").fetchone()
        con.close()
        assert rows == (12, 0) or rows[0] == 12
        statuses = {
            r[0]
            for r in duckdb.connect(str(db), read_only=True)
            .execute("SELECT DISTINCT status FROM jobs")
            .fetchall()
        }
        assert statuses <= {"allocated", "running"}
    finally:
        reader.close()
    assert_exactly_once_and_replays(s)


BAD_KINDS = {
    "decode": 1,
    "unknown_type": 1,
    "schema": 3,
    "invalid": 7,
    "clock": 1,
}


def test_dead_letters_each_kind_and_service_keeps_running(
    settings: KafkaSettings, services: list[Service], tmp_path: Path
) -> None:
    s = settings
    svc = start(services, s, tmp_path)
    cluster(s, nodes=1)
    enc = msgspec.msgpack.Encoder()

    def raw_env(type_: str, payload: object) -> bytes:
        return enc.encode({"type": type_, "key": "x", "at": 1, "payload": payload, "version": 1})

    good = wrap(job("ok"), 5)
    bad = [
        b"\xc1 not msgpack",
        raw_env("job_teleported", {"type": "job_teleported"}),
        raw_env("job_submitted", {"type": "job_submitted", "job": "s1"}),  # no queue, no pods
        raw_env(
            "job_submitted",
            {
                "type": "job_submitted",
                "job": "s2",
                "queue": "train",
                "pods": [{"name": "p", "gpu_milli": float("nan")}],
            },
        ),
        encode_envelope(wrap(job("neg", gpus=-1000), 2)),
        encode_envelope(wrap(job("lost", queue="nope"), 2)),
        encode_envelope(
            wrap(
                JobSubmitted(job="gang", queue="train", pods=(PodSpec(name="a"),), min_members=3), 2
            )
        ),
        encode_envelope(wrap(job("odd", gpus=1500), 2)),
        encode_envelope(good),  # accepted...
        encode_envelope(wrap(job("ok"), 6)),  # ...so this one is a duplicate
        encode_envelope(wrap(JobCancelled(job="ghost"), 7)),
        encode_envelope(wrap(QueueConfigured(queue="orphan", parent="missing"), 8)),
        # A producer's clock a year ahead must not move the scheduler's time.
        encode_envelope(wrap(Tick(), int(time.time() * 1000) + 365 * 86_400_000)),
        enc.encode(
            {"type": "tick", "key": "", "at": 1, "payload": {"type": "tick"}, "version": 99}
        ),
    ]
    offsets = send_intake(s, "default", bad)
    wait_for(lambda: caught_up(s), 30, "the scheduler to take in the bad batch")
    assert svc.proc.poll() is None, "the service keeps running"
    letters = read_dead_letters(s, "default")
    kinds: dict[str, int] = {}
    for _, dl in letters:
        kinds[dl.kind] = kinds.get(dl.kind, 0) + 1
    assert kinds == BAD_KINDS
    by_source = {dl.source_offset: dl for _, dl in letters}
    good_offset = offsets[8]
    assert set(by_source) == set(offsets) - {good_offset}
    reasons = " | ".join(dl.reason for _, dl in letters)
    for phrase in (
        "negative gpu_milli",
        "unknown queue 'nope'",
        "min_members 3",
        "neither a fraction",
        "duplicate job id 'ok'",
        "unknown job 'ghost'",
        "unknown parent queue 'missing'",
        "unknown event type 'job_teleported'",
        "ahead of the scheduler's clock",
        "schema version 99",
    ):
        assert phrase in reasons
    year_ahead = int(time.time() * 1000) + 86_400_000
    assert max(e.at for e in ledger_envelopes(s)) < year_ahead, "the producer's clock moved time"
    assert by_source[offsets[0]].value == bad[0]
    # The service is still scheduling: the good job was allocated.
    assert "ok" in {e.key for e in ledger_envelopes(s) if e.type == "pods_allocated"}
    # Fix the cause and re-submit: the job for the missing queue is accepted now.
    send_events(s, "default", [QueueConfigured(queue="nope")])
    lost = [off for off, dl in letters if "unknown queue 'nope'" in dl.reason]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "dlq",
            "replay",
            "--prefix",
            s.prefix,
            "--offset",
            str(lost[0]),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wait_for(
        lambda: "lost" in {e.key for e in ledger_envelopes(s) if e.type == "pods_allocated"},
        30,
        "the re-submitted job to be allocated",
    )
    with KafkaReader(s.bootstrap, s.ledger) as reader:
        assert replay(reader).ok


def _load(s: KafkaSettings, stop: threading.Event, sent: list[int]) -> None:
    """Steady load: new one-GPU jobs and cancellations of older ones, ~150 events/s."""
    i = 0
    while not stop.is_set():
        events: list[object] = [job(f"k{i + j}", queue=("train", "dev")[j % 2]) for j in range(6)]
        if i >= 24:
            events += [JobCancelled(job=f"k{i - 24 + j}") for j in range(6)]
        send_events(s, "default", events)  # type: ignore[arg-type]
        sent.append(len(events))
        i += 6
        time.sleep(0.08)  # intentional: the load generator's pace


def test_sigkill_at_random_moments_exactly_once(
    settings: KafkaSettings, services: list[Service], tmp_path: Path
) -> None:
    s = settings
    rng = random.Random(6)
    cluster(s)
    svc = start(services, s, tmp_path, "--snapshot-every", "100")
    stop = threading.Event()
    sent: list[int] = []
    loader = threading.Thread(target=_load, args=(s, stop, sent), daemon=True)
    loader.start()
    kills = 0
    try:
        # Ten kills at least, and on until the loader has sent 1,000 events: on a loaded
        # machine its ~150 events/s can fall to 20-30, and ten kills end before that.
        while (kills < 10 or sum(sent) <= 1000) and kills < 40:
            time.sleep(rng.uniform(0.5, 3.0))  # intentional: a random moment to kill at
            svc.kill(signal.SIGKILL)
            svc.proc.wait(10)
            kills += 1
            svc = start(services, s, tmp_path, "--snapshot-every", "100")
    finally:
        stop.set()
        loader.join(10)
    wait_for(lambda: caught_up(s), 60, "the last instance to catch up")
    assert kills >= 10 and sum(sent) > 1000
    snapshots = read_all(s, s.snapshots)
    assert snapshots, "snapshots were taken (and restarts used them)"
    assert_exactly_once_and_replays(s)


def writers(s: KafkaSettings) -> list[tuple[int, int]]:
    """``(offset, pid)`` of the last record of every committed ledger transaction."""
    return [
        (off, int(h[WRITER].decode().rsplit("/", 1)[1]))
        for off, _, h in read_all(s, s.ledger)
        if WRITER in h
    ]


def verify_ledger_url(s: KafkaSettings) -> None:
    """Replay the ledger topic through the reader port, as ``gpuledger replay`` does."""
    reader = open_reader(f"kafka://{s.bootstrap}/{s.prefix}")
    try:
        result = replay(reader)
    finally:
        reader.close()  # type: ignore[attr-defined]  # KafkaReader; the port has no close
    assert result.ok, result.mismatch and result.mismatch.diff()
    assert result.mismatch is None
    assert result.inputs == len(read_all(s, s.intake)) + 1  # and the live policy


def owner_of_two(
    s: KafkaSettings, services: list[Service], tmp_path: Path
) -> tuple[Service, Service]:
    """Start two instances in one group; return (active, standby) as the ledger shows."""
    first = start(services, s, tmp_path)
    second = start(services, s, tmp_path)
    # Both join, and the group gives the domain to one of them.
    wait_for(lambda: scheduler_group(s) == ("Stable", 2), 30, "a stable group of both instances")
    send_events(s, "default", [job("probe")])
    wait_for(lambda: caught_up(s) and bool(writers(s)), 30, "an owner")
    pid = writers(s)[-1][1]
    active = first if first.proc.pid == pid else second
    assert active.proc.pid == pid
    return active, (second if active is first else first)


def test_failover_to_standby_when_the_active_dies(
    settings: KafkaSettings, services: list[Service], tmp_path: Path
) -> None:
    s = settings
    cluster(s)
    active, standby = owner_of_two(s, services, tmp_path)
    active.kill(signal.SIGKILL)
    active.proc.wait(10)
    send_events(s, "default", [job(f"after-{i}") for i in range(5)])
    wait_for(lambda: caught_up(s), 30, "the standby to take over")
    assert writers(s)[-1][1] == standby.proc.pid
    allocated = {e.key for e in ledger_envelopes(s) if e.type == "pods_allocated"}
    assert {f"after-{i}" for i in range(5)} <= allocated
    assert_exactly_once_and_replays(s)


@pytest.mark.parametrize("paused", ["under_load", "idle"])
def test_paused_zombie_is_fenced(
    settings: KafkaSettings, services: list[Service], tmp_path: Path, paused: str
) -> None:
    """SIGSTOP the active instance; the standby takes over and commits; on SIGCONT the
    zombie must find itself fenced and exit 3 without appending anything.

    ``under_load``: paused with intake flowing, so it usually wakes up holding a batch and
    its commit is refused. ``idle``: paused with nothing to do, so it usually learns of the
    fence from the ownership check when the group revokes the domain. Both must end the
    same way; the log says which path it took."""
    s = settings
    cluster(s)
    zombie, successor = owner_of_two(s, services, tmp_path)
    stop = threading.Event()
    sent: list[int] = []
    loader = threading.Thread(target=_load, args=(s, stop, sent), daemon=True)
    if paused == "under_load":
        loader.start()
    try:
        if paused == "under_load":
            wait_for(lambda: sum(sent) > 100, 10, "load")
        zombie.kill(signal.SIGSTOP)
        if paused == "idle":
            # intentional: paused longer than a fetch's wait, so no records reach its socket
            time.sleep(2)
            loader.start()
        paused_at = time.monotonic()
        # The successor takes over (session timeout 1.5 s) and commits new transactions.
        wait_for(
            lambda: sum(pid == successor.proc.pid for _, pid in writers(s)) >= 3,
            30,
            "the successor to commit ledger records",
        )
        takeover_s = time.monotonic() - paused_at
        zombie.kill(signal.SIGCONT)
        # Deterministic: whether its next batch or the group's revocation reaches it first,
        # the broker refuses its transactional id and it exits with the fenced status.
        assert zombie.proc.wait(30) == FENCED_EXIT
        # intentional: load continues across the zombie's exit and the group's rebalance
        time.sleep(1)
    finally:
        stop.set()
        if loader.is_alive():
            loader.join(10)
    assert "fenced by a newer owner" in zombie.log.read_text()
    wait_for(lambda: caught_up(s), 30, "the successor to take in all of intake")
    assert successor.proc.poll() is None
    # Nothing the zombie wrote became visible after the successor's first transaction.
    history = writers(s)
    first = next(i for i, (_, pid) in enumerate(history) if pid == successor.proc.pid)
    assert {pid for _, pid in history[first:]} == {successor.proc.pid}
    assert {pid for _, pid in history[:first]} == {zombie.proc.pid}
    assert takeover_s < 20
    assert_exactly_once_and_replays(s)
    verify_ledger_url(s)


def test_metrics_endpoint(settings: KafkaSettings, services: list[Service], tmp_path: Path) -> None:
    s = settings
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    svc = start(services, s, tmp_path, "--metrics-port", str(port))
    cluster(s, nodes=2)  # 16 GPUs; train and dev deserve 16 each
    send_events(s, "default", [job(f"m{i}", gpus=1000, pods=4) for i in range(6)])
    send_events(s, "default", [job(f"d{i}", queue="dev", pods=2) for i in range(2)])
    wait_for(lambda: caught_up(s), 30, "the scheduler")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            body: str = r.read().decode()
            return body

    wait_for(lambda: "gpuledger_queue_fair_share_gpu" in scrape(), 10, "metrics")
    samples: dict[str, float] = {}
    for line in scrape().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    d = 'domain="default"'

    def has(prefix: str) -> list[float]:
        return [v for k, v in samples.items() if k.startswith(prefix)]

    assert samples[f"gpuledger_cycle_seconds_count{{{d}}}"] >= 1
    assert has(f'gpuledger_cycle_seconds_bucket{{{d},le="+Inf"}}')
    assert samples[f'gpuledger_decisions_total{{{d},type="pods_allocated"}}'] >= 1
    assert samples[f'gpuledger_decisions_total{{{d},type="cycle_completed"}}'] >= 1
    assert samples[f"gpuledger_intake_lag{{{d}}}"] == 0
    assert f'gpuledger_pending_workloads{{{d},queue="train"}}' in samples
    assert samples[f'gpuledger_core_jobs{{{d},held="whole"}}'] >= 1
    assert f'gpuledger_core_jobs{{{d},held="ended_id"}}' in samples
    assert samples[f'gpuledger_pending_workloads{{{d},queue="dev"}}'] == 0
    # 16 GPUs, both queues deserve 16 (over-subscribed): each queue's fair share is
    # min(deserved, wanted), as KAI-Scheduler's (docs/policy.md §1): train 16 of its 24
    # wanted, dev its 4.
    train = samples[f'gpuledger_queue_fair_share_gpu{{{d},queue="train"}}']
    dev = samples[f'gpuledger_queue_fair_share_gpu{{{d},queue="dev"}}']
    assert dev == 4 and train == 16
    assert samples[f'gpuledger_queue_allocated_gpus{{{d},queue="dev"}}'] == 4
    assert samples[f"gpuledger_allocated_gpus_total{{{d}}}"] == 16
    assert samples[f'gpuledger_admission_wait_time_seconds_count{{{d},queue="train"}}'] >= 1
    # prometheus_client writes a sample's labels sorted by name: le before queue.
    assert (
        samples[f'gpuledger_admission_wait_time_seconds_bucket{{{d},le="+Inf",queue="dev"}}'] >= 1
    )
    # Every metric docs/operations.md lists is served; those with a queue column carry
    # the queue label, for every leaf queue.
    table = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    rows = table.split("<!-- metrics:", 1)[1].split("<!-- /metrics -->", 1)[0].splitlines()
    documented = [r.split("|")[1:4] for r in rows if r.startswith("| `gpuledger_")]
    assert len(documented) >= 10
    for cell, kind, labels in documented:
        name = cell.strip().strip("`")
        series = name + ("_count" if kind.strip() == "histogram" else "")
        found = [k for k in samples if k.split("{", 1)[0] == series]
        assert found, f"{name} is documented but not served"
        if "queue" in labels:
            for queue in ("train", "dev"):
                assert any(f'queue="{queue}"' in k for k in found), (name, queue)
    # SIGTERM stops the service, metrics server included: the server leaves it to the loop.
    svc.proc.terminate()
    assert svc.proc.wait(10) == 0


def test_snapshot_plus_tail_equals_full_replay(
    settings: KafkaSettings, services: list[Service], tmp_path: Path
) -> None:
    from scheduler.fold.snapshot import state_bytes
    from scheduler.runtime.service import SchedulerService, ServiceConfig

    s = settings
    cluster(s)
    start(services, s, tmp_path, "--snapshot-every", "40")
    for wave in range(6):
        send_events(s, "default", [job(f"s{wave}-{i}", pods=2) for i in range(10)])
        wait_for(lambda: caught_up(s), 30, "the scheduler")
    # a snapshot is written after the commit of the records it covers, so the last one
    # may land just after the ledger is caught up
    wait_for(lambda: len(read_all(s, s.snapshots)) >= 2, 30, "two snapshots")
    restored = run_sync(SchedulerService(ServiceConfig(settings=s, domain="default")).restore())
    with KafkaReader(s.bootstrap, s.ledger) as reader:
        full = replay(reader)
    assert full.ok
    state, _, intake_next, _ = restored
    assert state_bytes(state) == state_bytes(full.state)
    assert intake_next == read_all(s, s.intake)[-1][0] + 1


def test_snapshots_in_parts_restore_and_a_fenced_writers_parts_are_ignored(
    settings: KafkaSettings, services: list[Service], tmp_path: Path
) -> None:
    """Written in parts (``scheduler.fold.snapshot``), a snapshot still restores to the full
    replay's state; the parts a fenced snapshot writer had sent are aborted with its
    transaction and never read, and its commit fails."""
    from aiokafka.errors import KafkaError

    from events.kafka_admin import new_producer
    from scheduler.fold.snapshot import SNAPSHOT_PART, split_snapshot, state_bytes
    from scheduler.runtime.service import SchedulerService, ServiceConfig

    s = settings
    cluster(s)
    svc = start(services, s, tmp_path, "--snapshot-every", "40", "--snapshot-part-bytes", "512")
    for wave in range(3):
        send_events(s, "default", [job(f"a{wave}-{i}", pods=2) for i in range(10)])
        wait_for(lambda: caught_up(s), 30, "the scheduler")
    wait_for(lambda: len(read_all(s, s.snapshots)) >= 4, 30, "snapshots")
    parts = [h[SNAPSHOT_PART] for _, _, h in read_all(s, s.snapshots)]
    assert parts[:2] == [b"0/" + parts[0].split(b"/")[1], b"1/" + parts[0].split(b"/")[1]]
    assert int(parts[0].split(b"/")[1]) >= 2, "a snapshot larger than a part is in parts"
    svc.stop()

    # A zombie snapshot writer (the domain's snapshot transactional id) has sent a whole
    # snapshot's parts, of garbage, and not committed yet when a new owner starts.
    async def zombie_sends() -> Any:
        producer = new_producer(s.bootstrap, s.snapshot_transactional_id("default"))
        await producer.start()
        await producer.begin_transaction()
        for key, value, headers in split_snapshot("default", b"\xc1" * 2000, 512, b"zombie"):
            await producer.send_and_wait(s.snapshots, value, key=key, partition=0, headers=headers)
        return producer

    zombie = run_sync(zombie_sends())
    start(services, s, tmp_path, "--snapshot-every", "40", "--snapshot-part-bytes", "512")
    for wave in range(3):
        send_events(s, "default", [job(f"b{wave}-{i}", pods=2) for i in range(10)])
        wait_for(lambda: caught_up(s), 60, "the new owner")

    async def zombie_commits() -> None:
        try:
            await zombie.commit_transaction()
        finally:
            await zombie.stop()

    with pytest.raises(KafkaError):
        run_sync(zombie_commits())
    ids = {h.get("snapshot-id") for _, _, h in read_all(s, s.snapshots)}
    assert b"zombie" not in ids
    restored = run_sync(SchedulerService(ServiceConfig(settings=s, domain="default")).restore())
    with KafkaReader(s.bootstrap, s.ledger) as reader:
        full = replay(reader)
    assert full.ok
    assert state_bytes(restored[0]) == state_bytes(full.state)
    assert_exactly_once_and_replays(s)


def test_the_service_records_its_policy_and_a_switch(
    settings: KafkaSettings, services: list[Service], tmp_path: Path
) -> None:
    s = settings

    def policies() -> list[str]:
        events = [decode_event(e) for e in ledger_envelopes(s)]
        return [e.policy for e in events if isinstance(e, PolicyConfigured)]

    first = start(services, s, tmp_path, "--policy", "kai")
    cluster(s)
    wait_for(lambda: caught_up(s), 30, "the scheduler")
    assert policies() == ["kai"], "a new ledger starts with the policy asked for"
    first.stop()
    start(services, s, tmp_path)  # the default policy, on the same ledger
    send_events(s, "default", [job("after-switch")])
    wait_for(lambda: caught_up(s), 30, "the second scheduler")
    assert policies() == ["kai", "gpuledger"], "another policy is recorded as a switch"
    assert_exactly_once_and_replays(s)
    # a policy sent through intake stands: the switch is decided once, at take-over
    send_events(s, "default", [PolicyConfigured(policy="drf", requeue_lost=False)])
    send_events(s, "default", [job("after-drf")])
    wait_for(lambda: caught_up(s), 30, "the scheduler")
    assert policies() == ["kai", "gpuledger", "drf"]

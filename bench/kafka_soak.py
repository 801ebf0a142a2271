"""Soak on the live path: the real scheduler service on the real broker, normal rate, then
ten times that, then normal again, bounded in wall-clock time (``make kafka-up``).

    python -m bench.soak --kafka [--minutes 3.5] [--rate 100] [--factor 10] [--window 15]
                                 [--max-batch N] [--snapshot-every N]

The scheduler runs as its own process (``gpuledger scheduler run`` with its default
knobs, on fresh topics with a unique prefix), so the RSS sampled from
``/proc/<pid>/status`` is the scheduler's alone. This process is the rest of the world:

* it submits one-pod jobs at ``rate`` per second (``factor`` times that during the burst),
  each small enough to fit at once, so latency measures the pipeline and not a wait for
  capacity;
* it follows the ledger topic (``read_committed``) and, ``runtime_s`` after a job's
  ``pods_allocated`` arrives, reports its pod finished (``pod_finished`` to intake, as a
  binder would), so the set of running jobs stays bounded as in a steady state;
* per window it records the events it offered (submissions + finishes), the
  submission→decision latency of the jobs submitted in that window (from producing the
  ``job_submitted`` to receiving the ledger record that decides it: ``pods_allocated``
  or ``job_unschedulable``; it includes the transaction commit and a consumer fetch, as
  ``bench.kafka_bench`` measures), the intake lag at the window's end (intake end offset
  minus the ``intake-next`` header of the last ledger transaction) and the scheduler's RSS.

After the last window it stops producing and waits (bounded) until every submitted job
has been decided and every input it sent is in the ledger, then reads the dead-letter
topic and stops the scheduler with SIGTERM. Nothing here asserts on time: it prints a
table and a summary and writes JSON; ``tests/test_bench_soak_kafka.py`` runs a tiny
configuration and checks only the accounting.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from bench.measure import nearest_rank, status_mib
from events.codec import decode_envelope, encode_envelope, wrap
from events.kafka_admin import (
    DEFAULT_BOOTSTRAP,
    KafkaSettings,
    ensure_topics,
    new_consumer,
    new_producer,
    run_sync,
)
from events.kafkalog import end_offset_of
from events.model import (
    JobSubmitted,
    JobUnschedulable,
    NodeRegistered,
    PodFinished,
    PodsAllocated,
    PodSpec,
    QueueConfigured,
    tag_of,
)
from scheduler.runtime.intake import read_dead_letters, send_events
from scheduler.runtime.service import INTAKE_NEXT

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = "default"
QUEUE = "q"
NODES = 4
ALLOCATED = tag_of(PodsAllocated)
DECISIONS = frozenset({ALLOCATED, tag_of(JobUnschedulable)})
SUBMITTED = tag_of(JobSubmitted)
FINISHED = tag_of(PodFinished)
FLAT_BOUND = 0.25
"""RSS counts as flat when the end of the run is at most this much (relative) above the
end of the first normal phase."""
RECOVERED_BOUND = 2.0
"""Latency counts as recovered when the last window's p99 is at most this many times the
first normal phase's p99."""


@dataclass(frozen=True)
class Plan:
    """The shape of one soak: phases as whole windows, rates, and the scheduler's knobs."""

    rate: float = 100.0
    """Job submissions per second at the normal rate (about as many finishes follow)."""
    factor: float = 10.0
    """Rate multiplier during the burst."""
    window_s: float = 15.0
    normal_windows: int = 4
    burst_windows: int = 4
    after_windows: int = 6
    runtime_s: float = 2.0
    """How long an allocated job runs before this process reports its pod finished."""
    drain_s: float = 60.0
    """After the last window: how long to wait for outstanding decisions."""
    ready_s: float = 60.0
    """How long the scheduler may take to become active."""
    scheduler_args: tuple[str, ...] = ()
    """Extra ``gpuledger scheduler run`` arguments (none: its defaults)."""

    @classmethod
    def for_minutes(cls, minutes: float, window_s: float = 15.0, **kw: Any) -> Plan:
        """About ``minutes`` of windows: 2/7 normal, 2/7 burst, 3/7 normal again."""
        total = max(3, round(minutes * 60 / window_s))
        normal = max(1, round(total * 2 / 7))
        burst = max(1, round(total * 2 / 7))
        after = max(1, total - normal - burst)
        return cls(
            window_s=window_s,
            normal_windows=normal,
            burst_windows=burst,
            after_windows=after,
            **kw,
        )

    def phases(self) -> list[str]:
        """The phase of each window."""
        return (
            ["normal"] * self.normal_windows
            + ["burst"] * self.burst_windows
            + ["after"] * self.after_windows
        )


@dataclass
class Window:
    """What one window measured."""

    index: int
    phase: str
    start_s: float
    end_s: float
    target_jobs_per_s: float
    submitted: int = 0
    finishes: int = 0
    decided: int = 0
    """Decisions that arrived during the window (whenever their job was submitted)."""
    latencies_ms: list[float] = field(default_factory=list)
    """Of the jobs submitted during the window (filled in at the end)."""
    lag: int | None = None
    rss_mib: float = 0.0
    """Scheduler RSS at the window's end."""
    rss_max_mib: float = 0.0
    """Highest scheduler RSS sampled during the window."""

    @property
    def offered_per_s(self) -> float:
        """Events offered to intake per second (submissions + finishes)."""
        return (self.submitted + self.finishes) / (self.end_s - self.start_s)

    def row(self) -> dict[str, Any]:
        """The JSON form (latency as percentiles)."""
        lat = sorted(self.latencies_ms)
        out = asdict(self)
        del out["latencies_ms"]
        out.update(
            offered_per_s=self.offered_per_s,
            decided_per_s=self.decided / (self.end_s - self.start_s),
            latency_n=len(lat),
            p50_ms=_pct(lat, 0.50),
            p99_ms=_pct(lat, 0.99),
            max_ms=lat[-1] if lat else None,
        )
        return out


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values (None when empty)."""
    return nearest_rank(values, q) if values else None


def rss_mib(pid: int) -> float:
    """Resident set size of a process from /proc/<pid>/status (0 if it is gone)."""
    return status_mib(pid, "VmRSS", 0.0)


def _hwm_mib(pid: int) -> float:
    return status_mib(pid, "VmHWM", 0.0)


class _Soak:
    """The load generator, ledger follower and sampler of one run (one event loop)."""

    def __init__(self, s: KafkaSettings, plan: Plan, proc: subprocess.Popen[bytes]) -> None:
        self.s = s
        self.plan = plan
        self.proc = proc
        self.pid = proc.pid
        self.setup_records = 0
        self.intake_tp = TopicPartition(s.intake, s.partition(DOMAIN))
        self.ledger_tp = TopicPartition(s.ledger, s.partition(DOMAIN))
        w = plan.window_s
        self.windows = [
            Window(
                index=i,
                phase=phase,
                start_s=i * w,
                end_s=(i + 1) * w,
                target_jobs_per_s=plan.rate * (plan.factor if phase == "burst" else 1),
            )
            for i, phase in enumerate(plan.phases())
        ]
        self.current = 0
        self.t0 = 0.0
        self.sent: dict[str, tuple[float, int]] = {}
        """job → (perf_counter at send, window index)."""
        self.decided: dict[str, float] = {}
        """job → perf_counter when its first decision arrived."""
        self.allocated = 0
        self.finishes: collections.deque[tuple[float, str]] = collections.deque()
        self.finishes_sent = 0
        self.ledger_submitted = 0
        self.ledger_finished = 0
        self.intake_next = 0
        self.cycles = 0
        self.producing = True
        self.following = True
        self.drain_s = 0.0
        self.rss_after_drain = 0.0
        self.rss_peak = 0.0
        self.follow_task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Wait for the scheduler, run every window, then drain."""
        s = self.s
        producer = new_producer(s.bootstrap)
        follower = new_consumer(s.bootstrap)
        probe = new_consumer(s.bootstrap)
        await producer.start()
        await follower.start()
        await probe.start()
        follow = None
        sample = None
        try:
            follower.assign([self.ledger_tp])
            follower.seek(self.ledger_tp, 0)
            follow = self.follow_task = asyncio.create_task(self._follow(follower))
            deadline = time.perf_counter() + self.plan.ready_s
            while self.intake_next < self.setup_records:
                if time.perf_counter() > deadline:
                    raise RuntimeError("the scheduler did not become active in time")
                self._check_alive()
                await asyncio.sleep(0.05)
            self.t0 = time.perf_counter()
            sample = asyncio.create_task(self._sample())
            await self._produce(producer, probe)
            self.producing = False
            started = time.perf_counter()
            deadline = started + self.plan.drain_s
            while not self._settled() and time.perf_counter() < deadline:
                self._check_alive()
                await asyncio.sleep(0.05)
            self.drain_s = time.perf_counter() - started
            self.rss_after_drain = rss_mib(self.pid)
        finally:
            self.following = False
            for task in (follow, sample):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await producer.stop()
            await follower.stop()
            await probe.stop()

    def _settled(self) -> bool:
        return (
            len(self.decided) >= len(self.sent)
            and self.ledger_submitted >= len(self.sent)
            and self.ledger_finished >= self.finishes_sent
        )

    def _check_alive(self) -> None:
        if self.follow_task is not None and self.follow_task.done():
            self.follow_task.result()  # raises what stopped the ledger follower
            raise RuntimeError("the ledger follower stopped")
        if self.proc.poll() is not None:
            raise RuntimeError(f"the scheduler exited with status {self.proc.returncode}")

    async def _produce(self, producer: Any, probe: Any) -> None:
        s = self.s
        key = DOMAIN.encode()
        partition = s.partition(DOMAIN)
        n = 0
        for win in self.windows:
            self.current = win.index
            end = self.t0 + win.end_s
            owed = 0.0
            last = self.t0 + win.start_s
            while (now := time.perf_counter()) < end:
                owed += win.target_jobs_per_s * (now - last)
                last = now
                due = int(owed)
                owed -= due
                for _ in range(due):
                    name = f"j{n}"
                    n += 1
                    event = JobSubmitted(
                        job=name, queue=QUEUE, pods=(PodSpec(name="p", cpu_milli=1),)
                    )
                    value = encode_envelope(wrap(event, time.time_ns() // 1_000_000))
                    self.sent[name] = (time.perf_counter(), win.index)
                    await producer.send(s.intake, value, key=key, partition=partition)
                    win.submitted += 1
                while self.finishes and self.finishes[0][0] <= now:
                    _, job = self.finishes.popleft()
                    fin = PodFinished(job=job, pod="p")
                    value = encode_envelope(wrap(fin, time.time_ns() // 1_000_000))
                    await producer.send(s.intake, value, key=key, partition=partition)
                    self.finishes_sent += 1
                    win.finishes += 1
                await asyncio.sleep(0.005)
            intake_end = await end_offset_of(probe, self.intake_tp)
            win.lag = max(intake_end - self.intake_next, 0)
            win.rss_mib = rss_mib(self.pid)
            win.rss_max_mib = max(win.rss_max_mib, win.rss_mib)
            self._check_alive()
            print(
                f"  window {win.index + 1}/{len(self.windows)} ({win.phase}): "
                f"{win.submitted} jobs submitted, lag {win.lag}, RSS {win.rss_mib:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
        await producer.flush()

    async def _follow(self, consumer: Any) -> None:
        tp = self.ledger_tp
        while self.following:
            got = await consumer.getmany(tp, timeout_ms=100, max_records=5000)
            now = time.perf_counter()
            for m in got.get(tp, ()):
                env = decode_envelope(m.value, m.offset)
                kind = env.type
                if kind == SUBMITTED:
                    self.ledger_submitted += 1
                elif kind == FINISHED:
                    self.ledger_finished += 1
                elif kind in DECISIONS:
                    if env.key not in self.decided and env.key in self.sent:
                        self.decided[env.key] = now
                        self.windows[self.current].decided += 1
                    if kind == ALLOCATED:
                        self.allocated += 1
                        if self.producing:
                            self.finishes.append((now + self.plan.runtime_s, env.key))
                elif kind == "cycle_completed":
                    self.cycles += 1
                for hkey, hval in m.headers or ():
                    if hkey == INTAKE_NEXT:
                        self.intake_next = int(hval)

    async def _sample(self) -> None:
        while True:
            rss = rss_mib(self.pid)
            win = self.windows[self.current]
            win.rss_max_mib = max(win.rss_max_mib, rss)
            self.rss_peak = max(self.rss_peak, rss)
            await asyncio.sleep(0.5)

    def finish(self) -> None:
        """Attribute each decided job's latency to the window it was submitted in."""
        for job, (at, index) in self.sent.items():
            done = self.decided.get(job)
            if done is not None:
                self.windows[index].latencies_ms.append((done - at) * 1000)


def _setup_events(s: KafkaSettings) -> int:
    """One queue and nodes so large that every job fits at once; returns the record count."""
    events = [
        QueueConfigured(queue=QUEUE),
        *(
            NodeRegistered(node=f"n{i}", gpus=0, cpu_milli=10**9, memory_mib=10**9)
            for i in range(NODES)
        ),
    ]
    send_events(s, DOMAIN, events)
    return len(events)


def _start_scheduler(s: KafkaSettings, plan: Plan, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "scheduler", "run",
             "--bootstrap", s.bootstrap, "--prefix", s.prefix, *plan.scheduler_args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )  # fmt: skip


def soak(bootstrap: str = DEFAULT_BOOTSTRAP, plan: Plan | None = None) -> dict[str, Any]:
    """Run one soak against the broker at ``bootstrap``; return the windows and summary."""
    plan = plan or Plan()
    s = KafkaSettings(bootstrap=bootstrap, prefix=f"soak{uuid.uuid4().hex[:8]}")
    run_sync(ensure_topics(s))
    fd, log_name = tempfile.mkstemp(prefix="gpuledger-soak-", suffix=".log")
    os.close(fd)
    log = Path(log_name)
    proc = _start_scheduler(s, plan, log)
    runner = _Soak(s, plan, proc)
    ok = False
    try:
        runner.setup_records = _setup_events(s)
        asyncio.run(runner.run())
        runner.finish()
        dead = len(read_dead_letters(s, DOMAIN))
        rss_end_hwm = _hwm_mib(proc.pid)
        proc.terminate()
        exit_code = proc.wait(30)
        ok = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if not ok:
            tail = log.read_text(errors="replace").splitlines()[-20:]
            print("scheduler log (tail):", *tail, sep="\n  ", file=sys.stderr)
        log.unlink(missing_ok=True)
    return _report(s, plan, runner, dead, exit_code, rss_end_hwm)


def _report(
    s: KafkaSettings, plan: Plan, r: _Soak, dead: int, exit_code: int, hwm: float
) -> dict[str, Any]:
    rows = [w.row() for w in r.windows]
    normal = [w for w in r.windows if w.phase == "normal"]
    burst = [w for w in r.windows if w.phase == "burst"]
    after = [w for w in r.windows if w.phase == "after"]
    pre = sorted(x for w in normal for x in w.latencies_ms)
    pre_p99 = _pct(pre, 0.99)
    last_p99 = rows[-1]["p99_ms"]
    recovered = (
        pre_p99 is not None and last_p99 is not None and last_p99 <= RECOVERED_BOUND * pre_p99
    )
    # The first window after the burst from which every later one is within the bound.
    recovery_s: float | None = None
    if pre_p99 is not None:
        for i, w in enumerate(after):
            tail = [rows[v.index]["p99_ms"] for v in after[i:]]
            if all(p is not None and p <= RECOVERED_BOUND * pre_p99 for p in tail):
                recovery_s = w.start_s - burst[-1].end_s if burst else 0.0
                break
    rss_normal = normal[-1].rss_mib
    rss_burst = burst[-1].rss_mib if burst else rss_normal
    rss_end = r.windows[-1].rss_mib
    growth = rss_end - rss_normal
    later_jobs = sum(w.submitted for w in r.windows if w.phase != "normal")
    burst_jobs = sum(w.submitted for w in burst)
    # After the burst, from the end of its first window: the steady slope, not the drop
    # when the burst's transient memory (snapshot buffers) is freed.
    after_jobs = sum(w.submitted for w in after[1:])
    rss_after_start = after[0].rss_mib if after else rss_end
    summary = {
        "prefix": s.prefix,
        "jobs_submitted": len(r.sent),
        "jobs_decided": len(r.decided),
        "jobs_undecided": len(r.sent) - len(r.decided),
        "jobs_allocated": r.allocated,
        "finishes_sent": r.finishes_sent,
        "ledger_job_submitted": r.ledger_submitted,
        "ledger_pod_finished": r.ledger_finished,
        "ledger_cycles": r.cycles,
        "dead_letters": dead,
        "drain_s": r.drain_s,
        "scheduler_exit_code": exit_code,
        "pre_burst_p99_ms": pre_p99,
        "burst_p99_ms": _pct(sorted(x for w in burst for x in w.latencies_ms), 0.99),
        "last_window_p99_ms": last_p99,
        "recovered": recovered,
        "recovered_bound": RECOVERED_BOUND,
        "recovery_s": recovery_s,
        "rss_normal_end_mib": rss_normal,
        "rss_end_mib": rss_end,
        "rss_after_drain_mib": r.rss_after_drain,
        "rss_peak_mib": max(r.rss_peak, hwm),
        "rss_growth_mib": growth,
        "rss_growth_pct": 100 * growth / rss_normal if rss_normal else None,
        "rss_growth_bytes_per_job": growth * 2**20 / later_jobs if later_jobs else None,
        # Per phase: similar figures mean growth in proportion to jobs kept, not to the burst;
        # the burst's includes whatever it still holds at its end.
        "rss_burst_bytes_per_job": (rss_burst - rss_normal) * 2**20 / burst_jobs
        if burst_jobs
        else None,
        "rss_after_bytes_per_job": (rss_end - rss_after_start) * 2**20 / after_jobs
        if after_jobs
        else None,
        "flat": rss_normal > 0 and rss_end <= (1 + FLAT_BOUND) * rss_normal,
        "flat_bound_pct": 100 * FLAT_BOUND,
    }
    return {"plan": asdict(plan), "windows": rows, "summary": summary}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def render(result: dict[str, Any]) -> str:
    """The per-window table and the summary lines."""
    plan = result["plan"]
    sm = result["summary"]
    lines = [
        f"kafka soak: {plan['rate']:g} jobs/s normal, {plan['factor']:g}x during the burst, "
        f"{plan['window_s']:g} s windows ({sm['prefix']})",
        f"{'win':>3}  {'phase':<6}  {'end s':>5}  {'jobs/s':>6}  {'offered ev/s':>12}  "
        f"{'decided/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}  {'max ms':>7}  {'lag':>6}  "
        f"{'RSS MiB':>7}  {'max RSS':>7}",
    ]
    for w in result["windows"]:
        lines.append(
            f"{w['index'] + 1:>3}  {w['phase']:<6}  {w['end_s']:>5.0f}  "
            f"{w['target_jobs_per_s']:>6g}  {w['offered_per_s']:>12.0f}  "
            f"{w['decided_per_s']:>9.0f}  {_ms(w['p50_ms']):>7}  {_ms(w['p99_ms']):>7}  "
            f"{_ms(w['max_ms']):>7}  {'-' if w['lag'] is None else w['lag']:>6}  "
            f"{w['rss_mib']:>7.0f}  {w['rss_max_mib']:>7.0f}"
        )
    rec = sm["recovery_s"]
    lines += [
        f"jobs: {sm['jobs_submitted']:,} submitted, {sm['jobs_decided']:,} decided "
        f"({sm['jobs_undecided']} undecided after a {sm['drain_s']:.1f} s drain), "
        f"{sm['finishes_sent']:,} finishes; ledger has {sm['ledger_job_submitted']:,} "
        f"job_submitted and {sm['ledger_pod_finished']:,} pod_finished; "
        f"dead letters {sm['dead_letters']}; scheduler exit {sm['scheduler_exit_code']}",
        f"memory: RSS {sm['rss_normal_end_mib']:.0f} MiB at the end of the first normal phase, "
        f"{sm['rss_end_mib']:.0f} MiB at the end of the run "
        f"({sm['rss_growth_mib']:+.0f} MiB, {_signed_pct(sm['rss_growth_pct'])}, "
        f"{_per_job(sm['rss_growth_bytes_per_job'])} submitted since; burst "
        f"{_per_job(sm['rss_burst_bytes_per_job'])}, after it "
        f"{_per_job(sm['rss_after_bytes_per_job'])}); peak {sm['rss_peak_mib']:.0f} MiB: "
        + ("flat" if sm["flat"] else "NOT flat")
        + f" (bound +{sm['flat_bound_pct']:g}%)",
        f"latency: p99 {_ms(sm['pre_burst_p99_ms'])} ms before the burst, "
        f"{_ms(sm['burst_p99_ms'])} ms during it, {_ms(sm['last_window_p99_ms'])} ms in the "
        "last window: "
        + ("recovered" if sm["recovered"] else "NOT recovered")
        + f" (bound {sm['recovered_bound']:g}x)"
        + (
            ""
            if rec is None
            else "; p99 within the bound from the first window after the burst on"
            if rec == 0
            else f"; p99 within the bound from {rec:.0f} s after the burst on"
        ),
    ]
    return "\n".join(lines)


def _signed_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0f}%"


def _per_job(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} B/job"


def main(args: argparse.Namespace) -> int:
    """``python -m bench.soak --kafka``: run, print the table and summary, write JSON."""
    passed: list[str] = []
    for flag, value in (("--max-batch", args.max_batch), ("--snapshot-every", args.snapshot_every)):
        if value is not None:
            passed += [flag, str(value)]
    kw: dict[str, Any] = {"rate": args.rate, "factor": args.factor, "scheduler_args": tuple(passed)}
    plan = Plan.for_minutes(args.minutes, args.window, **kw)
    result = soak(args.bootstrap, plan)
    print(render(result))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


__all__ = ["Plan", "Window", "main", "render", "rss_mib", "soak"]

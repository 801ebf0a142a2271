"""The one runtime step, as every runner uses it: validate → apply → cycle → record.

The embedded loop (``kube schedule``) is driven here over real file ledgers: what intake
validation refuses goes to its dead letters with the reason and never reaches the ledger,
a producer's clock cannot move the scheduler's time, and a new ledger starts with the live
policy. The Kafka service's side is in tests/test_live_kafka.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from events.codec import Envelope, decode_event, wrap
from events.filelog import LedgerDirReader
from events.localfiles import open_source
from events.model import (
    JobSubmitted,
    NodeRegistered,
    PodSpec,
    PolicyConfigured,
    QueueConfigured,
    Resources,
    Tick,
)
from scheduler.fold.step import Refusal, Runtime, live_policy
from scheduler.fold.verify import run as replay_run
from scheduler.runtime.embedded import EmbeddedRunner
from tests.waiting import wait_until


def _run_until(
    runner: EmbeddedRunner, done: Callable[[], object], what: str, timeout: float = 10.0
) -> None:
    stop = threading.Event()
    t = threading.Thread(target=runner.run, args=(stop.is_set,), daemon=True)
    t.start()
    try:
        wait_until(done, timeout, what)
    finally:
        stop.set()
        t.join(timeout=10)


def test_the_embedded_loop_validates_and_dead_letters(tmp_path: Path) -> None:
    intake, ledger = tmp_path / "intake", tmp_path / "ledger"
    now = int(time.time() * 1000)
    src = open_source(intake, "cli")
    src.append(
        [
            wrap(QueueConfigured(queue="a", deserved=Resources(gpu_milli=8000)), now),
            wrap(QueueConfigured(queue="orphan", parent="missing"), now),
            wrap(NodeRegistered(node="n1", gpus=8), now),
            wrap(JobSubmitted(job="ok", queue="a", pods=(PodSpec(name="p", gpu_milli=1000),)), now),
            wrap(JobSubmitted(job="lost", queue="nope", pods=(PodSpec(name="p"),)), now),
            wrap(
                JobSubmitted(
                    job="ultra", queue="a", pods=(PodSpec(name="p"),), priority_class="ultra"
                ),
                now,
            ),
            wrap(Tick(), now + 365 * 86_400_000),
            wrap(PolicyConfigured(requeue_lost=True), now),
            Envelope(type="tick", key="", at=now, payload=msgspec.Raw(b"\x80"), version=99),
        ]
    )
    src.close()
    runner = EmbeddedRunner(intake, ledger)
    dead_path = runner.dead_path
    _run_until(
        runner,
        lambda: dead_path.exists() and len(dead_path.read_text().splitlines()) >= 6,
        "six dead letters",
    )
    runner.close()
    rows = [json.loads(line) for line in dead_path.read_text().splitlines()]
    reasons = {r["offset"]: (r["kind"], r["reason"]) for r in rows}
    assert reasons[1] == ("invalid", "queue orphan: unknown parent queue 'missing'")
    assert reasons[4] == ("invalid", "job lost: unknown queue 'nope'")
    assert reasons[5][0] == "invalid" and "unknown priority_class 'ultra'" in reasons[5][1]
    assert reasons[6][0] == "clock"
    assert reasons[7][0] == "invalid" and "requeue_lost" in reasons[7][1]
    assert reasons[8][0] == "schema" and "version 99" in reasons[8][1]
    records = list(LedgerDirReader(ledger).read())
    events = [decode_event(e, o) for o, e in records]
    assert events[0] == live_policy(), "a new ledger starts with the live policy"
    assert {getattr(e, "job", "") for e in events} >= {"ok"}
    assert not {"lost", "ultra"} & {getattr(e, "job", "") for e in events}
    assert max(e.at for _, e in records) < now + 60_000, "a producer's clock moved time"
    assert replay_run(LedgerDirReader(ledger)).ok


def test_refusals_keep_their_place_in_the_batch() -> None:
    rt = Runtime(live=True, max_skew_ms=1000)
    result = rt.step(
        [
            (QueueConfigured(queue="a"), 0),
            Refusal(-1, "decode", "bad bytes"),
            (Tick(), 10_000),
            (QueueConfigured(queue="b", parent="zz"), 0),
        ],
        now=5,
    )
    assert [(r.index, r.kind) for r in result.refused] == [
        (1, "decode"),
        (2, "clock"),
        (3, "invalid"),
    ]
    assert result.accepted == 1
    assert [e.type for e in result.records] == ["queue_configured", "cycle_completed"]
    assert all(e.at == 5 for e in result.records), "inputs recorded at the runner's clock"


def test_the_embedded_loop_records_its_policy_and_a_switch(tmp_path: Path) -> None:
    intake, ledger = tmp_path / "intake", tmp_path / "ledger"
    intake.mkdir()

    def policies() -> list[str]:
        events = [decode_event(e, o) for o, e in LedgerDirReader(ledger).read()]
        return [e.policy for e in events if isinstance(e, PolicyConfigured)]

    EmbeddedRunner(intake, ledger, policy="kai").close()
    assert policies() == ["kai"], "a new ledger starts with the policy asked for"
    EmbeddedRunner(intake, ledger, policy="kai").close()
    assert policies() == ["kai"], "the same policy again records nothing"
    runner = EmbeddedRunner(intake, ledger)
    runner.close()
    assert policies() == ["kai", "gpuledger"], "another policy is recorded as a switch"
    assert runner.engine.state.policy == "gpuledger"
    assert replay_run(LedgerDirReader(ledger)).ok

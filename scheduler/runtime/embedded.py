"""The embedded scheduler loop: follow an intake directory, run the engine, append to a ledger.

The production path is the Kafka service; this runner is the same loop over the embedded
file log, for a single machine and for the Kubernetes adapters' tests. It adds no policy:
it decodes intake records, hands them to ``Engine.step`` and lets the engine append the
inputs and the cycle's decisions to the ledger.

Intake layout. The embedded file log has one writer per directory, while intake has several
producers (the Kubernetes ingestor, the binder's outcomes, a CLI). So an intake directory
holds one ledger per producer, ``INTAKE/<source>/``; the runner follows every one of them and
the order in which it interleaves them is fixed by what it writes to the ledger.

Exactly-once consumption. Before each append the runner writes ``<ledger>.runner.json``
with the ledger's end offset and the intake positions both before and after the batch. On
restart the ledger's end decides which of the two is true: if it moved past the recorded
end, the append happened and the "after" positions hold; otherwise the "before" ones. The
state is rebuilt by replaying the ledger (which also re-verifies it).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from events.codec import Envelope, encode_envelope
from events.filelog import FileLedger, LedgerDirReader, LedgerError
from events.localfiles import read_json, wall_ms, write_json_atomic
from events.model import Tick
from scheduler.fold.step import Input, Refusal, Runtime, StepResult, live_policy
from scheduler.fold.verify import run as replay_run
from scheduler.runtime.engine import Engine

log = logging.getLogger(__name__)


def _sources(intake: Path) -> list[str]:
    if not intake.is_dir():
        return []
    return sorted(p.name for p in intake.iterdir() if p.is_dir() and any(p.glob("*.seg")))


@dataclass(slots=True)
class RunnerStats:
    """Counters of one ``EmbeddedRunner.run``."""

    inputs: int = 0
    cycles: int = 0
    decisions: int = 0
    skipped: list[str] = field(default_factory=list)
    """``source@offset`` of every intake record refused (its dead letter says why)."""


class EmbeddedRunner:
    """Follows ``intake`` (a directory of per-producer ledgers) and appends to ``ledger``."""

    def __init__(
        self,
        intake: str | os.PathLike[str],
        ledger: str | os.PathLike[str],
        *,
        batch_max: int = 2000,
        poll_s: float = 0.02,
        max_skew_ms: int = 60_000,
        policy: str = "gpuledger",
    ) -> None:
        """Open (or create) the ledger, rebuild the state from it, load intake positions.

        Refused intake records go to ``<ledger>.deadletters.jsonl`` with the reason.
        """
        self.intake = Path(intake)
        self.ledger_path = Path(ledger)
        self.state_path = self.ledger_path.with_name(self.ledger_path.name + ".runner.json")
        self.dead_path = self.ledger_path.with_name(self.ledger_path.name + ".deadletters.jsonl")
        self.policy = policy
        self.batch_max = batch_max
        self.poll_s = poll_s
        self.writer = FileLedger.open(self.ledger_path)
        self.engine = Engine(self.writer, runtime=Runtime(live=True, max_skew_ms=max_skew_ms))
        self.positions: dict[str, int] = {}
        self.stats = RunnerStats()
        self._recover()

    def _recover(self) -> None:
        end = self.writer.end_offset()
        saved = read_json(self.state_path)
        if saved is None:
            if end:
                raise LedgerError(
                    f"{self.ledger_path}: has {end} records but {self.state_path} is missing"
                )
            self._start_ledger()
            return
        before = int(str(saved["ledger_end_before"]))
        key = "after" if end > before else "before"
        raw = saved[key]
        assert isinstance(raw, dict)
        self.positions = {str(k): int(v) for k, v in raw.items()}
        if end:
            result = replay_run(LedgerDirReader(self.ledger_path))
            if not result.ok:
                raise LedgerError(f"{self.ledger_path}: does not replay: {result.mismatch}")
            self.engine.state = result.state
            if result.state.policy != self.policy:
                self._start_ledger()  # a ledger kept under another policy: record the switch
        else:
            self._start_ledger()

    def _start_ledger(self) -> None:
        """Record the live policy: a new ledger starts with it, so that a replay knows it."""
        policy = self.policy
        now = wall_ms()
        self._commit_then(
            dict(self.positions), lambda: self.engine.run_step([(live_policy(policy), now)], now)
        )

    def close(self) -> None:
        """Release the ledger's writer lock."""
        self.writer.close()

    def _step(self, batch: list[tuple[str, int, Envelope]], now: int) -> None:
        after = dict(self.positions)
        inputs: list[Input | Refusal] = []
        for source, offset, env in batch:
            after[source] = offset + 1
            admitted = Runtime.admit(env, offset)
            inputs.append(admitted if isinstance(admitted, Refusal) else (admitted, env.at))

        def step() -> StepResult:
            result = self.engine.run_step(inputs, now, cycle_if_idle=False)
            self._dead_letters(batch, result.refused)
            return result

        result = self._commit_then(after, step)
        self.stats.inputs += result.accepted

    def _dead_letters(self, batch: list[tuple[str, int, Envelope]], refused: list[Refusal]) -> None:
        """Append refused intake records, with why, to the dead-letter file (durably)."""
        if not refused:
            return
        with open(self.dead_path, "a", encoding="utf-8") as f:
            for r in refused:
                source, offset, env = batch[r.index]
                self.stats.skipped.append(f"{source}@{offset}")
                log.warning("intake %s@%d refused (%s): %s", source, offset, r.kind, r.reason)
                row = {
                    "source": source,
                    "offset": offset,
                    "kind": r.kind,
                    "reason": r.reason,
                    "record": encode_envelope(env).hex(),
                }
                f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _commit_then(self, after: dict[str, int], append: Callable[[], StepResult]) -> StepResult:
        write_json_atomic(
            self.state_path,
            {
                "ledger_end_before": self.writer.end_offset(),
                "before": self.positions,
                "after": after,
            },
        )
        result = append()
        self.positions = after
        if result.decisions:
            self.stats.cycles += 1
            self.stats.decisions += len(result.decisions) - 1  # not CycleCompleted
        return result

    def run(self, stop: Callable[[], bool] = lambda: False) -> RunnerStats:
        """Follow intake until ``stop()``; one engine step per drained batch of inputs."""
        inbox: queue.Queue[tuple[str, int, Envelope]] = queue.Queue()
        followers: dict[str, threading.Thread] = {}
        halt = threading.Event()

        def follow(source: str, start: int) -> None:
            reader = LedgerDirReader(self.intake / source)
            for offset, env in reader.follow(start, poll_s=self.poll_s, stop=halt.is_set):
                inbox.put((source, offset, env))

        try:
            while not stop():
                for source in _sources(self.intake):
                    if source not in followers:
                        t = threading.Thread(
                            target=follow,
                            args=(source, self.positions.get(source, 0)),
                            name=f"intake-{source}",
                            daemon=True,
                        )
                        t.start()
                        followers[source] = t
                batch: list[tuple[str, int, Envelope]] = []
                try:
                    batch.append(inbox.get(timeout=0.1))
                    while len(batch) < self.batch_max:
                        batch.append(inbox.get_nowait())
                except queue.Empty:
                    pass
                now = wall_ms()
                if batch:
                    self._step(batch, now)
                    continue
                wakeup = self.engine.state.wakeup
                if wakeup is not None and now >= wakeup:
                    # Time-based rules (min runtimes, stale gangs) need a cycle on an idle
                    # cluster: a Tick input records the time that cycle ran at.
                    def tick(t: int = now) -> StepResult:
                        return self.engine.run_step([(Tick(), t)], t)

                    self._commit_then(dict(self.positions), tick)
        finally:
            halt.set()
            for t in followers.values():
                t.join(timeout=5)
        return self.stats

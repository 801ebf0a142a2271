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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from events.codec import DecodeError, Envelope, UnknownEventType, decode_event
from events.filelog import FileLedger, LedgerDirReader, LedgerError
from events.model import Event, Tick
from scheduler.engine import Engine

log = logging.getLogger(__name__)


def wall_ms() -> int:
    """Wall-clock time in milliseconds: adapters stamp inputs with it, never the core."""
    return time.time_ns() // 1_000_000


def write_json_atomic(path: Path, data: object) -> None:
    """Replace ``path`` with ``data`` as JSON, durably (write, fsync, rename, fsync dir)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, object] | None:
    """The JSON object stored at ``path``, or None if there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def open_source(intake: str | os.PathLike[str], source: str) -> FileLedger:
    """The writer of one producer's intake ledger, ``INTAKE/<source>/`` (created if missing)."""
    root = Path(intake)
    root.mkdir(parents=True, exist_ok=True)
    return FileLedger.open(root / source)


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


class EmbeddedRunner:
    """Follows ``intake`` (a directory of per-producer ledgers) and appends to ``ledger``."""

    def __init__(
        self,
        intake: str | os.PathLike[str],
        ledger: str | os.PathLike[str],
        *,
        batch_max: int = 2000,
        poll_s: float = 0.02,
    ) -> None:
        """Open (or create) the ledger, rebuild the state from it, load intake positions."""
        self.intake = Path(intake)
        self.ledger_path = Path(ledger)
        self.state_path = self.ledger_path.with_name(self.ledger_path.name + ".runner.json")
        self.batch_max = batch_max
        self.poll_s = poll_s
        self.writer = FileLedger.open(self.ledger_path)
        self.engine = Engine(self.writer)
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
            return
        before = int(str(saved["ledger_end_before"]))
        key = "after" if end > before else "before"
        raw = saved[key]
        assert isinstance(raw, dict)
        self.positions = {str(k): int(v) for k, v in raw.items()}
        if end:
            from replay.verify import run as replay_run  # noqa: PLC0415  # replay imports core

            result = replay_run(LedgerDirReader(self.ledger_path))
            if not result.ok:
                raise LedgerError(f"{self.ledger_path}: does not replay: {result.mismatch}")
            self.engine.state = result.state

    def close(self) -> None:
        """Release the ledger's writer lock."""
        self.writer.close()

    def _step(self, batch: list[tuple[str, int, Envelope]], now: int) -> None:
        after = dict(self.positions)
        inputs: list[tuple[Event, int]] = []
        for source, offset, env in batch:
            after[source] = offset + 1
            try:
                inputs.append((decode_event(env, offset), env.at))
            except UnknownEventType:
                # A newer producer's event: parked (its position still advances).
                self.stats.skipped.append(f"{source}@{offset}")
            except DecodeError:
                log.exception("intake %s offset %d undecodable; skipped", source, offset)
                self.stats.skipped.append(f"{source}@{offset}")
        if not inputs:
            self.positions = after
            return
        self._commit_then(after, lambda: self.engine.step(inputs, now))
        self.stats.inputs += len(inputs)

    def _commit_then(self, after: dict[str, int], append: Callable[[], list[Event]]) -> None:
        write_json_atomic(
            self.state_path,
            {
                "ledger_end_before": self.writer.end_offset(),
                "before": self.positions,
                "after": after,
            },
        )
        decisions = append()
        self.positions = after
        self.stats.cycles += 1
        self.stats.decisions += len(decisions) - 1  # CycleCompleted is not a decision to act on

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
                    def tick(t: int = now) -> list[Event]:
                        return self.engine.step([(Tick(), t)], t)

                    self._commit_then(dict(self.positions), tick)
        finally:
            halt.set()
            for t in followers.values():
                t.join(timeout=5)
        return self.stats

"""Helpers for tests that run whole simulations into memory."""

from __future__ import annotations

from collections.abc import Sequence

from events.codec import Envelope, encode_envelope
from replay.config import ClusterFile, QueuesFile, WorkloadFile, load
from replay.sim import SimResult, Simulation

EXAMPLES = "replay/examples"


class ListLedger:
    """A ledger writer and reader over a Python list (tests only)."""

    def __init__(self) -> None:
        self.records: list[Envelope] = []

    def append(self, envelopes: Sequence[Envelope]) -> int:
        first = len(self.records)
        self.records.extend(envelopes)
        return first

    def end_offset(self) -> int:
        return len(self.records)

    def close(self) -> None:
        pass

    def read(self, start: int = 0, end: int | None = None):  # type: ignore[no-untyped-def]
        stop = len(self.records) if end is None else min(end, len(self.records))
        for offset in range(start, stop):
            yield offset, self.records[offset]

    def blob(self) -> bytes:
        return b"".join(encode_envelope(e) for e in self.records)


def demo_inputs() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    return (
        load(f"{EXAMPLES}/demo-cluster.yaml", ClusterFile),
        load(f"{EXAMPLES}/demo-queues.yaml", QueuesFile),
        load(f"{EXAMPLES}/demo-workload.yaml", WorkloadFile),
    )


def simulate(
    cluster: ClusterFile, queues: QueuesFile, workload: WorkloadFile, policy: str
) -> tuple[SimResult, ListLedger]:
    ledger = ListLedger()
    result = Simulation(cluster, queues, workload, policy, ledger, flush_every=1).run()
    return result, ledger

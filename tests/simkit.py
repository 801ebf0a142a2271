"""Helpers for tests that run whole simulations into memory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from events.memlog import MemoryLedger
from events.model import PolicyConfigured
from replay import examples
from replay.config import ClusterFile, QueuesFile, WorkloadFile
from replay.sim import SimResult, Simulation

ListLedger = MemoryLedger


def demo_inputs() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    return examples.EXAMPLES["demo"].inputs()


def simulate(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policy: str | PolicyConfigured,
) -> tuple[SimResult, ListLedger]:
    ledger = ListLedger()
    result = Simulation(cluster, queues, workload, policy, ledger, flush_every=1).run()
    return result, ledger


@contextmanager
def switched(module: ModuleType, **values: object) -> Iterator[None]:
    """The module's switches (``allocate.SKIP_HELD`` and the like: module-level names the
    code reads at each use) set to ``values`` for the block, and put back after it."""
    was = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in was.items():
            setattr(module, name, value)

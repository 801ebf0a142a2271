"""Helpers for tests that run whole simulations into memory."""

from __future__ import annotations

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

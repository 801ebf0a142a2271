"""Helpers for tests that run whole simulations into memory."""

from __future__ import annotations

from events.memlog import MemoryLedger
from events.model import PolicyConfigured
from replay import examples
from replay.config import ClusterFile, QueuesFile, WorkloadFile
from replay.sim import SimResult, Simulation
from scheduler.core.tuning import DEFAULT, Tuning

ListLedger = MemoryLedger


def demo_inputs() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    return examples.EXAMPLES["demo"].inputs()


def simulate(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policy: str | PolicyConfigured,
    tuning: Tuning = DEFAULT,
) -> tuple[SimResult, ListLedger]:
    """The run into memory; ``tuning``: the core's shortcuts and bounds for it."""
    ledger = ListLedger()
    sim = Simulation(cluster, queues, workload, policy, ledger, flush_every=1, tuning=tuning)
    return sim.run(), ledger

"""Built-in example scenarios (YAML files beside this module), from the seed article."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from events.model import PolicyConfigured
from events.port import LedgerWriter
from replay.config import ClusterFile, QueuesFile, WorkloadFile, load
from replay.sim import SimResult, Simulation

HERE = Path(__file__).parent


@dataclass(frozen=True, slots=True)
class Example:
    """A scenario: its three files, what it shows, and the jobs to watch."""

    name: str
    story: str
    watch: tuple[str, ...] = ()

    def path(self, kind: str) -> Path:
        """``cluster``, ``queues`` or ``workload`` file of the example."""
        return HERE / f"{self.name}-{kind}.yaml"

    def inputs(self) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
        """The example's cluster, queues and workload, loaded."""
        return (
            load(self.path("cluster"), ClusterFile),
            load(self.path("queues"), QueuesFile),
            load(self.path("workload"), WorkloadFile),
        )


EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in (
        Example(
            "demo",
            "a 64-GPU day shared 60/30/10 by training, interactive and experiments",
            ("flagship-finetune",),
        ),
        Example(
            "fintech",
            "16 A100s: notebooks fill the pool on a Sunday night; a 2-GPU fine-tune arrives",
            ("priya-finetune",),
        ),
        Example(
            "big-gang",
            "a 512-GPU job behind thirty 2-GPU notebooks and a steady stream of more",
            ("llm-pretrain-512",),
        ),
        Example(
            "pipelines",
            "seven 06:00 pipelines, half a GPU each, on one 4-GPU node",
        ),
        Example(
            "pinned",
            "a job pinned to gpu-07, a node decommissioned two weeks ago",
            ("nightly-pinned",),
        ),
        Example(
            "backfill",
            "a 16-GPU gang among a stream of 1-GPU jobs in two queues",
            ("big-gang",),
        ),
    )
}


def simulate(name: str, policy: str | PolicyConfigured, ledger: LedgerWriter) -> SimResult:
    """Run the example ``name`` through the simulator under ``policy``, writing its ledger
    to ``ledger``: the one way the digests, the replay tests and the projection tests
    build an example's ledger."""
    return Simulation(*EXAMPLES[name].inputs(), policy, ledger).run()

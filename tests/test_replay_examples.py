"""Every built-in example, and a 10,000-job run, replays with zero mismatches."""

from __future__ import annotations

import msgspec
import pytest

from bench.__main__ import MONTH_CLUSTER, MONTH_QUEUES, MONTH_WORKLOAD, fold
from events.memlog import MemoryLedger
from replay.config import ClusterFile, QueuesFile, WorkloadFile, parse
from replay.examples import EXAMPLES, simulate
from replay.sim import Simulation
from scheduler.core import State
from scheduler.fold.snapshot import decode_snapshot, encode_snapshot, state_bytes, state_to_dict
from scheduler.fold.verify import run as replay


@pytest.mark.parametrize("policy", ["gpuledger", "fifo", "drf", "easy"])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_replays_with_zero_mismatches(name: str, policy: str) -> None:
    ledger = MemoryLedger()
    simulate(name, policy, ledger)
    result = replay(ledger)
    assert result.ok, result.mismatch and result.mismatch.diff()
    assert result.decisions > 0
    # The snapshot encoding (msgspec straight from the dataclasses) gives the bytes of the
    # state's builtin form, and a snapshot restores a state with the same bytes.
    state = result.state
    assert state_bytes(state) == msgspec.msgpack.encode(state_to_dict(state))
    _, restored = decode_snapshot(encode_snapshot(name, state, 1, 2, 3))
    assert state_bytes(restored) == state_bytes(state)


def test_a_ten_thousand_job_run_replays_with_zero_mismatches() -> None:
    workload = parse(MONTH_WORKLOAD, WorkloadFile)
    workload = msgspec.structs.replace(workload, horizon_s=workload.horizon_s / 10)
    ledger = MemoryLedger()
    result = Simulation(
        parse(MONTH_CLUSTER, ClusterFile), parse(MONTH_QUEUES, QueuesFile), workload,
        "gpuledger", ledger,
    ).run()  # fmt: skip
    assert result.jobs >= 9_900
    replayed = replay(ledger)
    assert replayed.ok, replayed.mismatch and replayed.mismatch.diff()
    assert replayed.records == len(ledger.records) > 100_000
    # The bench's fold (decisions applied as recorded, as `state --at` does) ends in the
    # state that re-running every cycle does, but for the next wake-up, which only a cycle
    # works out; in particular it does not collect every job ever submitted as "fresh".
    folded, records, _ = fold(ledger)
    assert records == replayed.records
    assert folded.fresh == [] and folded.dirty == replayed.state.dirty

    def facts(state: State) -> dict[str, object]:
        content = msgspec.msgpack.decode(state_bytes(state))
        assert "wakeup" in content
        return {k: v for k, v in content.items() if k != "wakeup"}

    assert facts(folded) == facts(replayed.state)

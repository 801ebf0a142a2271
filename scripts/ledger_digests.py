"""Print a SHA-256 of the ledger every built-in example writes under every policy.

A refactoring of the policy core must leave every ledger byte-identical; a change of
semantics bumps the core's revision and changes some of these digests on purpose. Run it
before and after a change and diff the outputs:

    python scripts/ledger_digests.py > before.txt
    ... change ...
    python scripts/ledger_digests.py | diff before.txt -

``tests/test_ledger_digests.py`` pins the built-in examples' lines (``tests/ledger_digests.txt``):
a deliberate change of decisions rewrites that file in the same commit
(``python scripts/ledger_digests.py > tests/ledger_digests.txt``) and adds a row to
docs/policy.md's revision table.

``--month`` adds the bench's month-scale workload (10,000 jobs at one tenth of its horizon).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec

# The tree this script sits in, ahead of any installed copy (worktrees, wheel checks).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events.codec import encode_envelope
from events.memlog import MemoryLedger
from replay.config import ClusterFile, QueuesFile, WorkloadFile, parse
from replay.examples import EXAMPLES, simulate
from replay.sim import Simulation
from scheduler.core import POLICIES


def digest(ledger: MemoryLedger) -> str:
    h = hashlib.sha256()
    for envelope in ledger.records:
        h.update(encode_envelope(envelope))
    return f"{h.hexdigest()[:16]} {len(ledger.records):>8} records"


def example_lines() -> Iterator[str]:
    """One line per policy and built-in example: what ``tests/ledger_digests.txt`` pins."""
    for policy in POLICIES:
        for name in sorted(EXAMPLES):
            ledger = MemoryLedger()
            simulate(name, policy, ledger)
            yield f"{policy:10} {name:12} {digest(ledger)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--month", action="store_true", help="add the month-scale workload")
    args = parser.parse_args()
    for line in example_lines():
        print(line, flush=True)
    if args.month:
        from bench.__main__ import MONTH_CLUSTER, MONTH_QUEUES, MONTH_WORKLOAD  # noqa: PLC0415

        workload = parse(MONTH_WORKLOAD, WorkloadFile)
        workload = msgspec.structs.replace(workload, horizon_s=workload.horizon_s / 10)
        ledger = MemoryLedger()
        Simulation(
            parse(MONTH_CLUSTER, ClusterFile),
            parse(MONTH_QUEUES, QueuesFile),
            workload,
            "gpuledger",
            ledger,
        ).run()
        print(f"{'gpuledger':10} {'month/10':12} {digest(ledger)}", flush=True)


if __name__ == "__main__":
    main()

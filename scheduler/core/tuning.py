"""``Tuning``: how the gang policy does its work, as one explicit value.

A cycle reads it from the state it runs on (``State.tuning``, given by the runner when it
makes the state, never folded from an event), never from a module-level name. Two kinds
of field:

* **shortcuts** decide exactly as the long way round: a shortcut off walks, ranks or
  reads every item that the shortcut passes over. Each has a test that runs whole
  simulations with it on and off and compares the ledgers byte for byte (the file named
  beside it). They exist for speed only.
* **bounds** are part of the policy: another value decides differently, so a ledger
  replays only under the default. Tests construct other values to show what a bound does.

The runners (``scheduler.fold.step.Runtime``'s state, the simulator's ``tuning=``) use
``DEFAULT`` unless a test gives another; no configuration file or event sets a tuning, so
a recorded ledger always means ``DEFAULT``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT", "Tuning"]


@dataclass(frozen=True, slots=True)
class Tuning:
    """The shortcuts and bounds of one cycle of the gang policy."""

    # -- shortcuts: the same decisions on and off -----------------------------------------
    skip_held: bool = True
    """The walk behind a blocked head passes over the jobs admission holds back in one tight
    loop (``allocate._skip_known``) rather than trying each (``tests/test_skip_held.py``)."""
    held_blocks: bool = True
    """That loop passes over a whole block of the queue's pending order at once where
    admission holds back each of its jobs (``pendingblocks``; ``tests/test_skip_held.py``)."""
    probe: int = 8
    """Jobs that loop looks at one by one before it turns to the blocks: most walks stop
    within a few jobs, and a block's summary costs its whole block."""
    block: int = 32
    """Jobs per block of a pending order as first cut (``pendingblocks.PendingBlocks``); a
    block that grows past twice this is cut in two."""
    rerank_moved: bool = True
    """After a placement the flat queue order moves only the queue placed in
    (``allocate._rerank``) rather than ranking every queue again (``tests/test_skip_held.py``)."""
    carry_plans: bool = True
    """A cycle reuses the reservations the last one worked out where nothing they rest on
    changed (``backfill.carried_plans``; ``tests/test_skip_held.py``)."""
    ceiling_stops: bool = True
    """Reading the victims allowed alone stops at the first one dearer than the node-by-node
    ceiling, and that choice is skipped when every victim within it could not make room
    together (``victims._by_node``; ``tests/test_node_by_node.py``)."""

    carry_failures: bool = True
    """A cycle tries no placement for a job of a shape that found no room by the end of the
    last cycle, while nothing has given capacity back since; it fails as it would
    (``allocate.carried_failures``; ``tests/test_skip_held.py``)."""

    share_memo: bool = True
    """A cycle reuses the last cycle's fair shares where the only inputs that changed are
    demands no share reached (``fairshare.cycle_shares``; ``tests/test_skip_held.py``)."""

    budget_stops: bool = True
    """Reclaim's pass over the victim order stops at the first victim dearer than the job's
    lost-work budget once one was counted (none after it can be kept), and reads on only
    when the node-by-node choice needs to know whether the bounds clipped it
    (``victims._Take.settle``; ``tests/test_node_by_node.py``)."""

    lost_floor: bool = True
    """Reclaim beyond a job's deserved quota reads no victim when a lower bound on the work
    any victims holding the GPUs it lacks would lose is above its lost-work budget, and no
    victim can be protected by a time window (``victims._beyond_budget``;
    ``tests/test_lost_floor.py``)."""

    # -- output: what a cycle records besides its decisions -----------------------------
    reasons: bool = True
    """A cycle records why each waiting job waits (``JobUnschedulable``, worded in
    ``blocked`` and ``admission``). Off, it records its decisions only, and the same ones
    (``tests/test_skip_held.py``): for the forecast's forward run, which reads starts and
    takes the reasons from its first cycle alone."""

    # -- bounds: part of the policy's decisions -------------------------------------------
    backfill_tries: int = 64
    """Failed backfill attempts per queue and cycle before the queue stops looking further
    (as Slurm's bf_max_job_test): keeps a cycle bounded with thousands of pending jobs."""
    one_instead_tries: int = 16
    """The most placements ``victims._one_instead`` tries for one gang."""
    exact_gangs: bool = True
    """``FailedShapes`` remembers gangs whose fit depends on more than GPU sizes
    (``placement._gang_kind``; revision 12). Off, each such gang behind a blocked head is
    tried and counts towards ``backfill_tries``, as at revision 11."""

    def __post_init__(self) -> None:
        for name in ("probe", "block", "backfill_tries", "one_instead_tries"):
            if getattr(self, name) < (0 if name == "probe" else 1):
                raise ValueError(f"Tuning.{name} = {getattr(self, name)!r} is out of range")


DEFAULT: Final = Tuning()
"""The tuning every runner uses, and the only one a recorded ledger replays under."""

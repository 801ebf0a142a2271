"""The victim-search back-off (``victim_search_backoff_ms``, docs/policy.md §5).

A head that would reclaim beyond its deserved quota searches for victims in the first
cycle with fresh inputs after its submission, then once per period of ledger time (its
periods shifted by a hash of its id); reclaim within deserved quota never waits. The
scenarios place their cycles around the period boundaries of their head, a0.
"""

from __future__ import annotations

import zlib

from events.memlog import MemoryLedger
from events.model import Event, JobPreempted, PodsAllocated
from scheduler.core.victims import backing_off
from scheduler.fold.state_at import fold
from scheduler.fold.verify import run as verify
from tests.builders import World, job, node, queue

PERIOD_S = 100
"""The back-off period of these scenarios (seconds)."""

PHASE_S = zlib.crc32(b"a0") % (PERIOD_S * 1000) / 1000
"""Where a0's periods begin (its id's hash), in seconds past each multiple of the period."""

CHECKPOINT_S = round(PHASE_S + 5.5 * PERIOD_S)
"""B's jobs (started at 0.5 s) checkpoint every ``CHECKPOINT_S``, which falls in the middle
of one of a0's periods: just before it they would lose more work than a0 has waited, just
after it next to none."""

BEFORE, AFTER, LATER = CHECKPOINT_S - 9.5, CHECKPOINT_S + 1.5, PHASE_S + 6 * PERIOD_S + 1
"""The cycles after a0's arrival at 100 s: just before the checkpoint, just after it in the
same period of a0's, and in a0's next period."""


def _boundary_after(seconds: float) -> float:
    """The first of a0's period boundaries after ``seconds``."""
    return (int((seconds - PHASE_S) // PERIOD_S) + 1) * PERIOD_S + PHASE_S


def _world(deserved_a: float, backoff_s: int, writer: MemoryLedger | None = None) -> World:
    """One 8-GPU node; B borrows all of it with eight 1-GPU jobs checkpointing every
    ``CHECKPOINT_S``; A (deserving ``deserved_a``) asks for 4 GPUs at 100 s; queue C takes
    the inputs that only make cycles run."""
    w = World(
        node("n0"),
        queue("A", deserved=deserved_a),
        queue("B", deserved=2),
        queue("C"),
        writer=writer,
        lost_work_ratio_milli=1000,  # a budget of the GPU time waited
        victim_search_backoff_ms=backoff_s * 1000,
        reclaim_hysteresis_ms=0,
    )
    w.at(0, *(job(f"b{k}", "B", checkpoint_s=CHECKPOINT_S) for k in range(8)))
    for k in range(8):
        w.start(0.5, f"b{k}")
    w.at(100, job("a0", "A", gpus=4))
    return w


def _reclaimed(got: list[Event]) -> bool:
    return any(isinstance(d, PodsAllocated) and d.job == "a0" for d in got) and any(
        isinstance(d, JobPreempted) and d.preemptor == "a0" for d in got
    )


def _cycle_with_input(w: World, seconds: float, name: str) -> list[Event]:
    """A cycle with a fresh input (a job that never fits beside B's, in a queue of its own)."""
    return w.at(seconds, job(name, "C", gpus=8, preemptible=False))


def _scenario(deserved_a: float, backoff_s: int, writer: MemoryLedger | None = None) -> list[bool]:
    """Whether a0 reclaimed at 100 s, then in each cycle of ``_times`` until it does."""
    w = _world(deserved_a, backoff_s, writer)
    reclaimed = [w.gpus_of("A") == 4]
    for k, seconds in enumerate((BEFORE, AFTER, LATER)):
        if reclaimed[-1]:
            break
        got = _cycle_with_input(w, seconds, f"c{k}")
        reclaimed.append(_reclaimed(got))
    return reclaimed


def test_the_scenario_places_its_cycles_around_a0s_boundaries() -> None:
    assert 100 < BEFORE < CHECKPOINT_S + 0.5 < AFTER < LATER
    assert _boundary_after(BEFORE) > AFTER  # before and after share a period
    assert _boundary_after(AFTER) < LATER < _boundary_after(AFTER) + PERIOD_S


def test_without_back_off_the_head_reclaims_in_the_first_cycle_after_the_checkpoint() -> None:
    # at 100 s and just before the checkpoint B's jobs would lose more than a0 has waited
    assert _scenario(deserved_a=2, backoff_s=0) == [False, False, True]


def test_a_head_beyond_its_quota_searches_again_only_in_its_next_period() -> None:
    # the cycle just after the checkpoint is in the same period as the one before it: no
    # search; the first cycle of the next period reclaims
    assert _scenario(deserved_a=2, backoff_s=PERIOD_S) == [False, False, False, True]


def test_reclaim_within_deserved_quota_never_waits() -> None:
    # A deserves 4: its 4 GPUs are a guarantee, reclaimed at once whatever B's jobs lose
    assert _scenario(deserved_a=4, backoff_s=PERIOD_S) == [True]


def test_the_back_off_follows_the_ledger() -> None:
    """``policy_ran_at`` is folded from ``CycleCompleted``: a state folded from the ledger
    (as ``state --at`` and a restored scheduler rebuild it) backs off exactly as the
    scheduler that wrote the ledger, and verify re-runs every cycle to the same
    decisions."""
    ledger = MemoryLedger()
    assert _scenario(deserved_a=2, backoff_s=PERIOD_S, writer=ledger)[-1]
    result = verify(ledger)
    assert result.ok and result.cycles > 0, result
    state, _ = fold(ledger, ("time", round(AFTER * 1000) - 1))
    assert state.policy_ran_at == round(BEFORE * 1000)
    state.now = round(AFTER * 1000)
    assert backing_off(state, state.jobs["a0"])
    state.now = round(LATER * 1000)
    assert not backing_off(state, state.jobs["a0"])

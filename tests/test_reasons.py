"""Why-pending reasons name what blocks the job, one kind per blocking cause, and a
reservation's time is a promise: it moves later only with the reason saying why
(docs/policy.md §7)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings

from events.codec import decode, encode_envelope
from events.ledgertime import format_at
from events.memlog import MemoryLedger
from events.model import BindFailed, Event, JobUnschedulable, NodeRemoved, PodsAllocated
from replay.config import PolicyFile, policy_event
from replay.sim import Simulation
from tests.builders import World, job, node, queue
from tests.test_work_conservation import with_estimates


@dataclass(frozen=True)
class Case:
    """A situation, the job whose reason is read, and what the reason must say."""

    world: Callable[[], World]
    job: str
    cause: str
    says: tuple[str, ...]
    final: bool = False


def _last(w: World, job_id: str) -> JobUnschedulable:
    """The last ``job_unschedulable`` recorded for the job."""
    found = [e for e in w.events if isinstance(e, JobUnschedulable) and e.job == job_id]
    assert found, f"no reason recorded for {job_id}"
    return found[-1]


class Recording(World):
    """A world that keeps every decision, so a case reads the job's latest reason."""

    def __init__(self, *setup: Event, **knobs: object) -> None:
        self.events: list[Event] = []
        super().__init__(*setup, **knobs)

    def at(self, seconds: float, *events: Event) -> list[Event]:
        got = super().at(seconds, *events)
        self.events.extend(got)
        return got


# --------------------------------------------------------------------------- situations


def never_fits() -> World:
    w = Recording(node("n1"), queue("a"))
    w.at(1, job("huge", "a", pods=3, gpus=8))
    return w


def queue_at_its_limit() -> World:
    w = Recording(node("n1"), queue("a", limit=4))
    w.at(0, job("j1", "a", gpus=4))
    w.at(1, job("j2", "a", gpus=2))
    return w


def ancestor_at_its_limit() -> World:
    w = Recording(node("n1"), queue("org", limit=4), queue("x", parent="org"))
    w.at(0, job("j1", "x", gpus=4))
    w.at(1, job("j2", "x", gpus=2))
    return w


def non_preemptible_beyond_quota() -> World:
    w = Recording(node("n1"), queue("a", deserved=4), queue("b", deserved=4))
    w.at(0, job("np1", "a", gpus=4, cls="build"))
    w.at(1, job("np2", "a", gpus=2, cls="build"))
    return w


def gang_behind_in_quota_work_of_another_queue() -> World:
    # research deserves 8 of 16 GPUs and its gang needs all 16; notebooks holds its 8
    # within its own quota: reclaim may not take them, and notebooks' next jobs go first.
    w = Recording(
        node("n1"),
        node("n2"),
        queue("research", deserved=8),
        queue("notebooks", deserved=8),
        backfill=True,
    )
    w.at(0, job("nb", "notebooks", gpus=8, runtime_s=600))
    w.start(1, "nb")
    w.at(2, job("gang", "research", pods=2, gpus=8, runtime_s=3600))
    return w


def gang_beyond_its_fair_share() -> World:
    # a deserves nothing and holds 4, its fair share; b's fair share is the other 12 of
    # 16 GPUs: b's 16-GPU gang is beyond it, so b reclaims nothing.
    w = Recording(node("n1"), node("n2"), queue("a"), queue("b", deserved=8))
    w.at(0, job("small", "a", gpus=4))
    w.at(1, job("g", "b", pods=2, gpus=8))
    return w


def selector_matches_only_full_nodes() -> World:
    w = Recording(node("n1", pool="a"), node("n2", pool="b"), queue("q"))
    w.at(0, job("busy", "q", gpus=8, selector={"pool": "a"}))
    w.at(1, job("j", "q", gpus=4, selector={"pool": "a"}))
    return w


def taint_not_tolerated() -> World:
    w = Recording(node("n1"), node("n2", taints=("gpu=reserved",)), queue("q"))
    w.at(0, job("busy", "q", gpus=8))
    w.at(1, job("j", "q", gpus=4))
    return w


def cpu_exhausted_beside_free_gpus() -> World:
    w = Recording(node("n1", cpu=8000), queue("q"))
    w.at(0, job("cpu-hog", "q", gpus=0, cpu=8000))
    w.at(1, job("j", "q", gpus=4, cpu=1000))
    return w


def free_gpus_scattered() -> World:
    w = Recording(node("n1", host="n1"), node("n2", host="n2"), queue("q"))
    w.at(0, job("x", "q", gpus=4, selector={"host": "n1"}))
    w.at(0, job("y", "q", gpus=4, selector={"host": "n2"}))
    w.at(1, job("whole", "q", gpus=8))
    return w


def gang_with_a_reservation() -> World:
    """n1 busy until t=1001 (a job with a known runtime); the 2-node gang reserves."""
    w = Recording(node("n1"), node("n2"), queue("big", deserved=16), queue("small"), backfill=True)
    w.at(0, job("long", "big", gpus=8, runtime_s=1000, cls="build"))
    w.start(1, "long")
    w.at(2, job("gang", "big", pods=2, gpus=8, runtime_s=5000))
    return w


def reservation_draining() -> World:
    """Two preemptible jobs with no runtime backfilled onto n2 under the gang's reservation
    have run longer than the give-way bound when n1 frees: the reservation drains. The jobs
    are named in victim order (least lost work, then the newer first)."""
    w = Recording(
        node("n1"),
        node("n2"),
        queue("big", deserved=16),
        backfill=True,
        backfill_give_way_ms=600_000,
    )
    w.at(0, job("long", "big", gpus=8, runtime_s=1000, cls="build"))
    w.start(1, "long")
    w.at(2, job("gang", "big", pods=2, gpus=8))
    for name in ("f1", "f2"):
        w.at(10, job(name, "big", gpus=4))
        w.start(11, name)
    w.finish(1001, "long")
    return w


def reservation_due_while_a_job_overruns() -> World:
    w = gang_with_a_reservation()
    w.at(1500, job("poke", "small", gpus=16))  # any input runs a cycle
    return w


def head_of_another_queue_behind_a_reservation() -> World:
    # The gang (within big's quota) goes first and reserves n1 and n2 from t=1001, when
    # blk (protected by x's reclaim min-runtime) ends; other, non-preemptible and with no
    # runtime, fits only n2's free GPUs, which the reservation holds.
    w = Recording(
        node("n1"),
        node("n2"),
        queue("big", deserved=16),
        queue("small", deserved=8),
        queue("x", reclaim_min_runtime_s=3600),
        backfill=True,
    )
    w.at(0, job("blk", "x", gpus=8, runtime_s=1000))
    w.start(1, "blk")
    w.at(2, job("gang", "big", pods=2, gpus=8, runtime_s=5000))
    w.at(10, job("other", "small", gpus=8, cls="build"))
    return w


def job_behind_its_blocked_head() -> World:
    w = gang_with_a_reservation()
    w.at(10, job("next", "big", gpus=8, preemptible=False))  # behind the gang, no gap fits
    return w


def job_behind_a_head_held_by_quota() -> World:
    w = Recording(node("n1"), queue("a", deserved=4), queue("b", deserved=4), backfill=True)
    w.at(0, job("np1", "a", gpus=4, cls="build"))
    # np2 is held by a's quota and blocks nothing: t is the head in its place, reserving
    w.at(1, job("np2", "a", gpus=2, cls="build"), job("t", "a", gpus=8), job("u", "a", gpus=6))
    return w


def nothing_reclaimable_non_preemptible(want_at: float = 4, **knobs: object) -> World:
    # b holds 4 non-preemptible (within its quota) and 4 preemptible GPUs on n1, above its
    # fair share; reclaiming the 4 would not give want's single 8-GPU pod one node.
    w = Recording(node("n1"), node("n2"), queue("a", deserved=12), queue("b", deserved=4), **knobs)
    w.at(0, job("np", "b", gpus=4, cls="build"), job("p", "b", gpus=4))
    w.start(1, "np")
    w.start(1, "p")
    w.at(2, job("fill", "a", gpus=4))
    w.start(3, "fill")
    w.at(want_at, job("want", "a", gpus=8))
    return w


def nothing_reclaimable_min_runtime() -> World:
    w = Recording(
        node("n1"),
        node("n2"),
        queue("a", deserved=12),
        queue("b", deserved=4, reclaim_min_runtime_s=3600),
    )
    w.at(0, job("young", "b", gpus=8))
    w.start(1, "young")
    w.at(2, job("fill", "a", gpus=8))
    w.start(3, "fill")
    w.at(4, job("want", "a", gpus=4))
    return w


def in_quota_reclaim_short_of_room_under_a_budget() -> World:
    """As ``nothing_reclaimable_non_preemptible``, with a lost-work budget and b's
    preemptible job run for 999 s: a (deserving 12, holding 4) asks within its quota, so
    its reclaim is not held to the budget, and b's job is reclaimable however much it
    would lose."""
    return nothing_reclaimable_non_preemptible(want_at=1000, lost_work_ratio_milli=100)


def backing_off_after_a_failed_bind() -> World:
    w = Recording(node("n1"), queue("a"), bind_backoff_ms=10_000)
    w.at(0, job("j", "a"))
    w.at(1, BindFailed(job="j", pod="j-0", node="n1", reason="node not ready"))
    return w


CASES = {
    "never fits the cluster": Case(
        never_fits, "huge", "never_fits", ("cannot be packed onto the cluster",), final=True
    ),
    "queue at its limit": Case(
        queue_at_its_limit,
        "j2",
        "limit",
        ("queue 'a' is at its limit: 4 of 4 GPUs in use, job needs 2",),
    ),
    "ancestor at its limit": Case(
        ancestor_at_its_limit,
        "j2",
        "limit",
        ("queue 'org' is at its limit: 4 of 4 GPUs in use", "its queue 'x' is under 'org'"),
    ),
    "non-preemptible job beyond deserved quota": Case(
        non_preemptible_beyond_quota,
        "np2",
        "quota",
        ("non-preemptible job waits for deserved quota of 'a': 4 of 4 GPUs",),
    ),
    "gang behind in-quota work of another queue": Case(
        gang_behind_in_quota_work_of_another_queue,
        "gang",
        "share",
        (
            "needs 16 GPUs; queue 'research' deserves 8 and cannot reclaim in-quota work of "
            "'notebooks'; starts when the usage of 'notebooks' falls to 0 or the share of "
            "'research' grows",
        ),
    ),
    "gang beyond its queue's fair share": Case(
        gang_beyond_its_fair_share,
        "g",
        "share",
        (
            "needs 16 GPUs; queue 'b' deserves 8 (fair share 12) and cannot reclaim work of "
            "'a' within its fair share; starts when the usage of 'a' falls to 0",
        ),
    ),
    "node selector matches only full nodes": Case(
        selector_matches_only_full_nodes,
        "j",
        "mismatch",
        ("node selector {pool=a} matches none of the nodes with room",),
    ),
    "taint not tolerated": Case(
        taint_not_tolerated, "j", "mismatch", ("does not tolerate the taints of any node",)
    ),
    "CPU exhausted beside free GPUs": Case(
        cpu_exhausted_beside_free_gpus,
        "j",
        "mismatch",
        ("the nodes with room lack the CPU or memory it asks for (1000 millicores",),
    ),
    "free GPUs scattered over nodes": Case(
        free_gpus_scattered,
        "whole",
        "mismatch",
        (
            "enough GPUs are free but scattered: pod 'whole-0' (8 GPUs, 0 pods of the gang "
            "placed before it) needs 8 on one node, and no node has that many free",
        ),
    ),
    "reservation for itself": Case(
        gang_with_a_reservation,
        "gang",
        "reservation",
        ("waiting for a reservation of 2 nodes at +00:16:41; smaller jobs backfill the gap",),
    ),
    "reservation draining for jobs backfilled onto it": Case(
        reservation_draining,
        "gang",
        "reservation",
        (
            "waiting for a reservation of 2 nodes, due now but for the 2 jobs backfilled onto "
            "them ('f2' of queue 'big', 'f1' of queue 'big'), which would lose 2.2 GPU-h of "
            "work if evicted now; it starts when they end, and no more jobs are backfilled "
            "there",
        ),
    ),
    "reservation due while a job overruns": Case(
        reservation_due_while_a_job_overruns,
        "gang",
        "reservation",
        ("as soon as job 'long' of queue 'big' ends (past its runtime estimate, +00:16:41)",),
    ),
    "head of another queue behind a reservation": Case(
        head_of_another_queue_behind_a_reservation,
        "other",
        "reserved",
        ("fits the free GPUs only on nodes reserved for job 'gang' (from +00:16:41)",),
    ),
    "job behind its blocked head": Case(
        job_behind_its_blocked_head,
        "next",
        "behind",
        ("waits behind job 'gang', the head of queue 'big' holding a reservation",),
    ),
    "job behind a head held back by quota": Case(
        job_behind_a_head_held_by_quota,
        "u",
        "behind",
        ("waits behind job 't', the head of queue 'a' holding a reservation; it does not fit",),
    ),
    "nothing reclaimable: non-preemptible": Case(
        nothing_reclaimable_non_preemptible,
        "want",
        "capacity",
        ("cannot reclaim 'b' (4 GPUs non-preemptible, 4 GPUs reclaimable, but not enough",),
    ),
    "nothing reclaimable: min-runtime": Case(
        nothing_reclaimable_min_runtime,
        "want",
        "capacity",
        ("cannot reclaim 'b' (8 GPUs within reclaim min-runtime)",),
    ),
    "in-quota reclaim short of room, with a lost-work budget": Case(
        in_quota_reclaim_short_of_room_under_a_budget,
        "want",
        "capacity",
        # not "beyond the lost-work budget": reclaim within quota is not held to it
        ("cannot reclaim 'b' (4 GPUs non-preemptible, 4 GPUs reclaimable, but not enough",),
    ),
    "backing off after a failed bind": Case(
        backing_off_after_a_failed_bind,
        "j",
        "backoff",
        ("backing off after 1 failed binds until +00:00:11",),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_the_reason_names_what_blocks_the_job(case: Case) -> None:
    w = case.world()
    event = _last(w, case.job)
    for words in case.says:
        assert words in event.reason
    assert event.cause == case.cause
    assert event.final == case.final


def test_a_reason_without_a_reservation_promises_no_time() -> None:
    w = gang_behind_in_quota_work_of_another_queue()
    event = _last(w, "gang")
    assert event.start == -1 and "t=" not in event.reason
    assert w.state.jobs["gang"].promise == -1


def test_a_reservation_records_the_time_it_promises() -> None:
    w = gang_with_a_reservation()
    event = _last(w, "gang")
    assert event.start == 1_001_000
    assert w.state.jobs["gang"].promise == 1_001_000


# --------------------------------------------------------------------------- the promise

_TIME = re.compile(r"at t=([0-9.e+]+)s")


def _moves(reasons: list[str]) -> list[tuple[float, float, str]]:
    """Each reason whose reservation time is later than the one before: (was, now, text)."""
    moves = []
    last: float | None = None
    for text in reasons:
        found = _TIME.search(text)
        if found is None:
            continue
        at = float(found.group(1))
        if last is not None and at > last:
            moves.append((last, at, text))
        last = at
    return moves


def test_a_reservation_moved_by_a_job_placed_first_says_so() -> None:
    w = Recording(
        node("n1"),
        node("n2"),
        queue("big", deserved=16),
        queue("hi", priority=5),
        backfill=True,
    )
    w.at(0, job("long", "big", gpus=8, runtime_s=1000, cls="build"))
    w.start(1, "long")
    w.at(2, job("gang", "big", pods=2, gpus=8, runtime_s=5000))
    assert _last(w, "gang").start == 1_001_000
    # A higher-priority queue's job ranks first and takes n2, the gang's other node.
    w.at(10, job("h", "hi", gpus=8, runtime_s=2000))
    event = _last(w, "gang")
    assert event.start == 2_010_000
    assert (
        "moved from +00:16:41 because job 'h' of queue 'hi' was placed before it (+00:00:10) "
        "on GPUs it counted on" in event.reason
    )
    w.start(11, "h")
    w.at(12, job("tiny", "hi", gpus=0.5, runtime_s=10))  # runs a cycle
    event = _last(w, "gang")
    assert event.start == 2_011_000
    assert (
        "moved from +00:33:30 because job 'h' started only at +00:00:11, and its expected end "
        "counts from its start" in event.reason
    )


def test_a_reservation_resting_on_a_job_placed_but_not_started_holds_still() -> None:
    # long is placed at t=0 but its pod does not start for 600 s (an image pull, say).
    # The gang's reservation rests on its end: counted from its placement it stays at
    # +00:16:40 through 60 cycles; counted from each cycle's time it moved at every one.
    w = Recording(node("n1"), node("n2"), queue("big", deserved=16), queue("other"),
                  backfill=True)  # fmt: skip
    w.at(0, job("long", "big", gpus=8, runtime_s=1000, cls="build"))
    w.at(2, job("gang", "big", pods=2, gpus=8, runtime_s=5000))
    for k in range(60):
        w.at(10 + 10 * k, job(f"o{k}", "other", gpus=8, cls="build"))  # runs a cycle
    gang = [e for e in w.events if isinstance(e, JobUnschedulable) and e.job == "gang"]
    assert [e.start for e in gang] == [1_000_000]
    assert "waiting for a reservation of 2 nodes at +00:16:40" in gang[0].reason
    # Once it starts, its end counts from its start: one move, saying why.
    w.start(600, "long")
    w.at(605, job("o60", "other", gpus=8, cls="build"))
    event = _last(w, "gang")
    assert event.start == 1_600_000
    assert (
        "moved from +00:16:40 because job 'long' started only at +00:10:00, and its expected end "
        "counts from its start" in event.reason
    )


def test_a_reservation_on_a_job_not_started_within_its_estimate_names_it() -> None:
    w = Recording(node("n1"), queue("big", deserved=8), queue("other"), backfill=True)
    w.at(0, job("long", "big", gpus=8, runtime_s=100, cls="build"))
    w.at(2, job("gang", "big", gpus=8, runtime_s=5000))
    assert _last(w, "gang").start == 100_000
    w.at(150, job("o", "other", gpus=8, cls="build"))  # runs a cycle
    event = _last(w, "gang")
    assert event.start == -1
    assert (
        "as soon as job 'long' of queue 'big' ends (placed at +00:00:00 and not started yet, so "
        "past its runtime estimate, +00:01:40)" in event.reason
    )


def test_a_reservation_moved_by_a_removed_node_says_so() -> None:
    w = Recording(node("n1"), node("n2"), node("n3"), queue("q"), backfill=True)
    w.at(0, job("a", "q", gpus=8, runtime_s=1000), job("b", "q", gpus=8, runtime_s=2000))
    w.start(1, "a")
    w.start(1, "b")
    w.at(2, job("gang", "q", pods=2, gpus=8, runtime_s=500))
    assert _last(w, "gang").start == 1_001_000
    free = next(n for n in ("n1", "n2", "n3") if not w.state.nodes[n].pods)
    w.at(5, NodeRemoved(node=free))
    event = _last(w, "gang")
    assert event.start == 2_001_000
    assert f"moved from +00:16:41 because node '{free}' was removed or cordoned" in event.reason


def test_a_reservation_never_moves_later_without_saying_why() -> None:
    # The shape: a 64-GPU gang in a queue deserving 32 beside a stream of in-quota
    # notebooks, one ending and one arriving every 2 minutes, 48 times. The notebooks go
    # first (within quota), so any reservation time the gang got would move each time.
    setup = [node(f"n{k}") for k in range(8)]
    w = Recording(
        *setup, queue("research", deserved=32), queue("notebooks", deserved=32), backfill=True
    )
    for k in range(4):
        w.at(0, job(f"nb{k}", "notebooks", gpus=8, runtime_s=480 + 120 * k))
        w.start(0, f"nb{k}")
    w.at(1, job("gang", "research", pods=8, gpus=8, runtime_s=3600))
    for step in range(48):
        t = 480 + 120 * step
        w.finish(t, f"nb{step}")
        w.at(t, job(f"nb{step + 4}", "notebooks", gpus=8, runtime_s=480))
        w.start(t, f"nb{step + 4}")
    reasons = [e.reason for e in w.events if isinstance(e, JobUnschedulable) and e.job == "gang"]
    unexplained = [m for m in _moves(reasons) if "moved from" not in m[2]]
    assert unexplained == []
    assert len(reasons) <= 2  # recorded when the cause changes, not at every hand-over
    assert "cannot reclaim in-quota work of 'notebooks'" in reasons[-1]
    assert w.status("gang") == "pending"


def test_an_explained_move_is_recorded_once_and_the_promise_then_holds() -> None:
    w = Recording(
        node("n1"),
        node("n2"),
        queue("big", deserved=16),
        queue("hi", priority=5),
        backfill=True,
    )
    w.at(0, job("long", "big", gpus=8, runtime_s=1000, cls="build"))
    w.start(1, "long")
    w.at(2, job("gang", "big", pods=2, gpus=8, runtime_s=5000))
    w.at(10, job("h", "hi", gpus=8, runtime_s=2000))
    w.start(10, "h")
    before = len(w.events)
    w.at(20, job("tiny", "hi", gpus=0.5, runtime_s=10))  # runs a cycle; changes nothing
    again = [e for e in w.events[before:] if isinstance(e, JobUnschedulable) and e.job == "gang"]
    assert again == []
    assert w.state.jobs["gang"].promise == 2_010_000


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_estimates())
def test_no_reservation_time_is_in_the_past_or_moves_later_unexplained(scenario) -> None:  # type: ignore[no-untyped-def]
    """On random clusters, queue trees and workloads (some jobs with runtime estimates):
    every time a reason promises is ahead of the cycle that records it, and a job's
    promised time moves later only with the reason saying why (a reason of another kind
    in between says instead why the job has no time, and ends the promise)."""
    ledger = MemoryLedger()
    Simulation(*scenario, policy_event("gpuledger", PolicyFile()), ledger).run()
    promised: dict[str, int] = {}
    for _, envelope in ledger.read():
        event = decode(encode_envelope(envelope), 0).event
        if isinstance(event, PodsAllocated):
            promised.pop(event.job, None)  # a new attempt starts without a promise
        if not isinstance(event, JobUnschedulable):
            continue
        if event.start < 0:
            if event.cause != "reservation":
                promised.pop(event.job, None)  # another cause, given instead of a time
            continue
        assert event.start > envelope.at, event
        before = promised.get(event.job)
        if before is not None and event.start > before:
            assert f"moved from {format_at(before, False)} because " in event.reason, event
        promised[event.job] = event.start


def test_state_shows_each_pending_job_with_the_kind_of_its_block() -> None:
    w = gang_behind_in_quota_work_of_another_queue()
    assert w.state.jobs["gang"].cause == "share"
    w.at(700, job("more", "notebooks", gpus=8))
    assert w.state.jobs["gang"].cause == "share"
    # more took n2 backfilled under the gang's reservation: it gives way, so it is not
    # among what the gang waits for
    assert w.state.jobs["more"].backfill_for == "gang"
    assert "falls to 0" in w.state.jobs["gang"].reason
    w.finish(800, "nb")
    assert w.status("gang") != "pending"
    assert w.state.jobs["gang"].cause == ""

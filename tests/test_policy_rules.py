"""The gang policy's numbered rules (docs/policy.md) as scenarios: given -> expect."""

from __future__ import annotations

import copy

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from events.model import (
    BindFailed,
    JobPreempted,
    JobUnschedulable,
    PodFinished,
    PodsAllocated,
    Tick,
)
from scheduler.core import apply, fair_shares
from scheduler.core.backfill import BACKFILL_TRIES
from scheduler.core.fairshare import decay
from scheduler.core.victims import recently_reclaimed
from tests.builders import World, job, node, queue
from tests.test_policy import allocated, reasons


def preempted(decisions: list) -> list[tuple[str, str, str]]:  # type: ignore[type-arg]
    return [(d.job, d.rule, d.preemptor) for d in decisions if isinstance(d, JobPreempted)]


# --------------------------------------------------------------------------- 1. fair share


def test_decay_halves_per_half_life_exactly() -> None:
    assert decay(1 << 40, 1000, 1000) == 1 << 39
    assert decay(1 << 40, 3000, 1000) == 1 << 37
    assert decay(1000, 0, 1000) == 1000
    assert 1 << 39 < decay(1 << 40, 500, 1000) < 1 << 40


def test_time_based_fair_share_gives_over_quota_to_the_queue_that_used_less() -> None:
    w = World(node("n1"), node("n2"), queue("a"), queue("b"), half_life_ms=3_600_000)
    w.at(0, job("hog", "a", pods=2, gpus=8))  # a uses the whole cluster for an hour
    w.start(1, "hog")
    w.finish(3600, "hog")
    w.at(3601, job("a2", "a", pods=2, gpus=8), job("b2", "b", pods=2, gpus=8))
    shares = fair_shares(w.state)
    assert shares.fair["b"][0] > shares.fair["a"][0]
    assert shares.fair["a"][0] + shares.fair["b"][0] == 16_000


def test_without_a_half_life_past_usage_does_not_matter() -> None:
    w = World(node("n1"), node("n2"), queue("a"), queue("b"))
    w.at(0, job("hog", "a", pods=2, gpus=8))
    w.start(1, "hog")
    w.finish(3600, "hog")
    w.at(3601, job("a2", "a", pods=2, gpus=8), job("b2", "b", pods=2, gpus=8))
    shares = fair_shares(w.state)
    assert shares.fair["a"][0] == shares.fair["b"][0] == 8000


# --------------------------------------------------------------------------- 2. queue order


def test_a_queue_below_its_deserved_quota_goes_first() -> None:
    w = World(node("n1"), queue("rich", deserved=0, priority=5), queue("poor", deserved=8))
    got = w.at(1, job("r", "rich", gpus=8), job("p", "poor", gpus=8))
    assert list(allocated(got)) == ["p"]


def test_queue_priority_orders_queues_both_above_deserved() -> None:
    w = World(node("n1"), queue("low"), queue("high", priority=3))
    got = w.at(1, job("l", "low", gpus=8), job("h", "high", gpus=8))
    assert list(allocated(got)) == ["h"]


def test_lower_share_of_fair_share_goes_first() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8))
    w.at(0, job("a0", "a", gpus=4))
    got = w.at(1, job("a1", "a", gpus=8), job("b1", "b", gpus=8))
    assert next(iter(allocated(got))) == "b1"


def test_a_queue_within_its_fair_share_goes_before_one_that_would_exceed_it() -> None:
    # Neither queue deserves anything; by weight y's fair share is 12 GPUs and x's 4. y
    # holds 8 and asks 4 more (within its fair share), x holds nothing and asks 8 (beyond
    # its). x has the lower dominant share, yet y goes first, and x's job then does not fit.
    w = World(node("n1"), node("n2"), queue("x"), queue("y", weight=3))
    w.at(0, job("y0", "y", gpus=8))
    w.start(1, "y0")
    got = w.at(2, job("x1", "x", gpus=8), job("y1", "y", gpus=4))
    shares = fair_shares(w.state)
    assert (shares.fair["x"][0], shares.fair["y"][0]) == (4000, 12000)
    assert allocated(got) == {"y1": {"y1-0": "n2"}}


# --------------------------------------------------------------------------- 3. priority classes


def test_build_class_is_not_preemptible_unless_overridden() -> None:
    w = World(node("n1"), queue("a", deserved=8))
    w.at(0, job("b", "a", gpus=8, cls="build"))
    assert preempted(w.at(1, job("i", "a", gpus=8, cls="inference"))) == []
    w2 = World(node("n1"), queue("a", deserved=8))
    w2.at(0, job("b", "a", gpus=8, cls="build", preemptible=True))
    assert preempted(w2.at(1, job("i", "a", gpus=8, cls="inference"))) == [("b", "preempt", "i")]


def test_train_made_non_preemptible_is_protected() -> None:
    w = World(node("n1"), queue("a", deserved=8))
    w.at(0, job("t", "a", gpus=8, preemptible=False))
    assert preempted(w.at(1, job("hi", "a", gpus=8, cls="build-preemptible"))) == []


def test_numeric_priority_class_is_its_own_value() -> None:
    w = World(node("n1"), queue("a", deserved=8))
    w.at(0, job("x", "a", gpus=8, cls="60"))
    assert w.state.jobs["x"].priority == 60 and w.state.jobs["x"].preemptible


# --------------------------------------------------------------------------- 4. gangs


def test_sub_group_minimums_must_all_be_placed() -> None:
    w = World(node("n1", gpus=4), queue("a"))
    roles = ("leader", "worker", "worker", "worker", "worker")
    got = w.at(
        1,
        job("g", "a", pods=5, gpus=1, min_members=3, groups=roles,
            min_per_group={"leader": 1, "worker": 2}),
    )  # fmt: skip
    placed = allocated(got)["g"]
    assert "g-0" in placed and len(placed) == 4  # leader + 2 required workers + 1 extra


def test_a_gang_whose_leader_cannot_fit_places_nothing() -> None:
    # The leader needs 4 GPUs on one node; the workers need 1. With n1 half busy only the
    # two workers fit (on n2): they would make the gang's minimum of 2 pods, but not its
    # minimum of 1 leader, so the gang waits whole, and starts once n1 frees up.
    w = World(node("n1", gpus=4, host="n1"), node("n2", gpus=2, host="n2"), queue("a"))
    w.at(0, job("busy", "a", gpus=2, selector={"host": "n1"}))
    w.start(1, "busy")
    gang = job("g", "a", pods=3, gpus=1, groups=("leader", "worker", "worker"), min_members=2,
               min_per_group={"leader": 1})  # fmt: skip
    leader = msgspec.structs.replace(gang.pods[0], gpu_milli=4000)
    gang = msgspec.structs.replace(gang, pods=(leader, *gang.pods[1:]))
    got = w.at(2, gang)
    assert allocated(got) == {}
    assert reasons(got)["g"] == (
        "waiting for capacity: gang needs 2 pods (5 GPUs), free capacity fits 0 of them now",
        False,
    )
    got = w.finish(3, "busy")
    assert allocated(got) == {"g": {"g-0": "n1", "g-1": "n2", "g-2": "n2"}}


def stale_world(*, evict: bool = True) -> World:
    w = World(node("n1"), queue("a"), stale_gang_eviction=evict, stale_gang_grace_ms=60_000)
    w.at(0, job("g", "a", pods=2, gpus=4))
    w.start(1, "g")
    w.at(100, PodFinished(job="g", pod="g-1", succeeded=False))
    return w


def test_a_running_gang_below_its_minimum_is_evicted_after_the_grace_period() -> None:
    w = stale_world()
    assert w.state.jobs["g"].stale_since == 100_000
    assert w.state.wakeup == 160_000
    assert preempted(w.at(120, Tick())) == []
    got = w.at(160, Tick())
    assert preempted(got) == [("g", "stale-gang", "")]
    # back in the queue, and placed again at once on the node it no longer holds
    assert allocated(got) == {"g": {"g-0": "n1", "g-1": "n1"}}
    assert w.status("g") == "allocated"


def test_stale_gang_eviction_can_be_turned_off() -> None:
    # The same world as above but for the knob: the gang goes stale and stays running
    # well past the grace period, and no cycle is asked for on its account.
    w = stale_world(evict=False)
    assert w.state.jobs["g"].stale_since == 100_000
    assert w.state.wakeup is None
    assert preempted(w.at(160, Tick())) == []
    assert preempted(w.at(1000, Tick())) == []
    assert w.status("g") == "running"


# --------------------------------------------------------------------------- 5. reclaim, preempt


def test_quota_reclaim_may_leave_the_victim_queue_below_its_fair_share() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8))
    w.at(0, job("a1", "a", pods=2, gpus=8))  # one 16-GPU gang: a is over its quota
    w.start(1, "a1")
    got = w.at(10, job("b1", "b", gpus=8))
    assert preempted(got) == [("a1", "reclaim", "b1")]


def test_a_quota_edit_keeps_the_queue_s_running_jobs_reclaimable() -> None:
    # Re-configuring a queue keeps its running jobs on the core's books: still victims,
    # still counted against non-preemptible quota.
    w = World(node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8))
    w.at(0, job("a1", "a", pods=2, gpus=8))
    w.start(1, "a1")
    w.at(5, queue("a", deserved=6))  # a quota edit while a1 runs
    assert w.state.queues["a"].active == {"a1": None}
    got = w.at(10, job("b1", "b", gpus=8))
    assert preempted(got) == [("a1", "reclaim", "b1")]


def test_a_quota_edit_keeps_non_preemptible_usage_counted() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=8))
    w.at(0, job("np", "a", gpus=8, cls="build"))
    w.at(5, queue("a", deserved=8, weight=2))
    assert w.state.queues["a"].allocated_np == 8000
    reason, _ = reasons(w.at(10, job("np2", "a", gpus=8, cls="build")))["np2"]
    assert reason.startswith("non-preemptible job waits for deserved quota of 'a'")


def test_reclaim_respects_the_branch_where_two_queues_meet() -> None:
    # org deserves 8 and holds exactly 8; inside it a1 is over its own share because a2
    # asks for nothing. b (deserved 8) wants more: at the org/b level org is not above its
    # share, so nothing of org is reclaimed even though a1 is above its leaf share.
    w = World(
        node("n1"), node("n2"),
        queue("org", deserved=8), queue("a1", parent="org", deserved=2),
        queue("a2", parent="org", deserved=6), queue("b", deserved=8),
    )  # fmt: skip
    w.at(0, job("x", "a1", gpus=8))
    w.start(1, "x")
    w.at(2, job("b1", "b", gpus=8))
    w.start(3, "b1")
    got = w.at(10, job("b2", "b", gpus=8))
    assert preempted(got) == []


def test_reclaim_min_runtime_protects_young_jobs() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=8, reclaim_min_runtime_s=600),
              queue("b", deserved=8))  # fmt: skip
    w.at(0, job("a1", "a", gpus=8), job("a2", "a", gpus=8))
    w.start(1, "a1")
    w.start(1, "a2")
    assert preempted(w.at(100, job("b1", "b", gpus=8))) == []
    assert preempted(w.at(700, Tick(), job("b-nudge", "b", gpus=0.5))) != []


def test_preempt_min_runtime_protects_young_jobs() -> None:
    w = World(node("n1"), queue("a", deserved=8, preempt_min_runtime_s=300))
    w.at(0, job("low", "a", gpus=8))
    w.start(1, "low")
    assert preempted(w.at(100, job("hi", "a", gpus=8, cls="build-preemptible"))) == []
    assert preempted(w.at(400, Tick(), job("hi2", "a", gpus=1, cls="build-preemptible"))) == [
        ("low", "preempt", "hi")
    ]


def test_reclaim_can_be_turned_off() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8), reclaim=False)
    w.at(0, job("a1", "a", gpus=8), job("a2", "a", gpus=8))
    assert preempted(w.at(10, job("b1", "b", gpus=8))) == []


# --------------------------------------------------------------------------- 6. backfill


def backfill_world(**knobs: object) -> World:
    """n1 busy until t=1001 (a job with a known runtime); a 2-node gang has to wait."""
    w = World(
        node("n1"), node("n2"), queue("big", deserved=16), queue("small"), backfill=True, **knobs
    )
    w.at(0, job("long", "big", gpus=8, runtime_s=1000, cls="build"))
    w.start(1, "long")
    w.at(2, job("gang", "big", pods=2, gpus=8, runtime_s=5000))
    return w


def test_a_blocked_gang_reserves_the_nodes_it_will_get_and_says_when() -> None:
    w = backfill_world()
    reason = w.state.jobs["gang"].reason
    assert "waiting for a reservation of 2 nodes at t=1001s" in reason


def test_a_short_job_backfills_the_gap_before_the_reservation() -> None:
    w = backfill_world()
    got = w.at(10, job("short", "big", gpus=8, runtime_s=500, preemptible=False))
    assert allocated(got) == {"short": {"short-0": "n2"}}


def test_a_long_non_preemptible_job_may_not_delay_the_reservation() -> None:
    w = backfill_world()
    got = w.at(10, job("late", "big", gpus=8, runtime_s=5000, preemptible=False))
    assert allocated(got) == {}


def test_a_preemptible_backfilled_job_gives_way_when_the_reservation_starts() -> None:
    w = backfill_world()
    got = w.at(10, job("filler", "big", gpus=8))  # behind the gang, preemptible, no runtime
    assert allocated(got) == {"filler": {"filler-0": "n2"}}
    assert w.state.jobs["filler"].backfill_for == "gang"
    w.start(11, "filler")
    got = w.finish(1001, "long")
    assert preempted(got) == [("filler", "backfill", "gang")]
    assert sorted(allocated(got)["gang"].values()) == ["n1", "n2"]


def test_a_backfilled_job_gives_way_only_if_its_lost_work_is_small_beside_the_wait() -> None:
    # Preemption that pays for itself: at t=1001 the gang (16 GPUs, waiting since t=2) may
    # throw away at most ratio x 16 GPUs x 999 s of work; the filler has run 8 GPUs x 990 s.
    for ratio_milli, gives_way in ((100, False), (1000, True)):
        w = backfill_world(lost_work_ratio_milli=ratio_milli)
        w.at(10, job("filler", "big", gpus=8))
        w.start(11, "filler")
        got = w.finish(1001, "long")
        assert (preempted(got) == [("filler", "backfill", "gang")]) is gives_way, ratio_milli
        assert ("gang" in allocated(got)) is gives_way


def test_a_job_that_started_by_reclaim_is_not_reclaimed_back_within_the_hysteresis() -> None:
    w = World(node("n1", gpus=4), queue("a", deserved=2), queue("b", deserved=2),
              reclaim_hysteresis_ms=600_000)  # fmt: skip
    w.at(0, *(job(f"b{k}", "b", gpus=1) for k in range(4)))
    for k in range(4):
        w.start(1, f"b{k}")
    got = w.at(10, job("a1", "a", gpus=2))  # a takes its deserved quota back from b
    assert [rule for _, rule, _ in preempted(got)] == ["reclaim", "reclaim"]
    assert w.state.jobs["a1"].reclaimed_at == 10_000
    assert recently_reclaimed(w.state, w.state.jobs["a1"])
    w.at(610)
    assert not recently_reclaimed(w.state, w.state.jobs["a1"])


def test_without_backfill_a_queue_waits_behind_its_blocked_head() -> None:
    w = World(node("n1"), queue("a"))
    w.at(0, job("busy", "a", gpus=4, runtime_s=100))
    got = w.at(1, job("head", "a", gpus=8), job("behind", "a", gpus=2, runtime_s=10))
    assert allocated(got) == {}


def test_with_backfill_small_jobs_do_not_wait_behind_a_big_gang_when_capacity_is_idle() -> None:
    w = World(node("n1"), queue("a"), backfill=True)
    w.at(0, job("busy", "a", gpus=4, runtime_s=100))
    w.start(0.5, "busy")
    got = w.at(1, job("head", "a", gpus=8), job("behind", "a", gpus=2, runtime_s=10))
    assert list(allocated(got)) == ["behind"]


def test_backfill_looks_past_jobs_that_do_not_fit_the_gap() -> None:
    w = backfill_world()
    got = w.at(10, job("wide", "big", pods=2, gpus=8), job("filler", "big", gpus=8))
    assert allocated(got) == {"filler": {"filler-0": "n2"}}


def test_backfill_stops_looking_after_its_tries() -> None:
    # Every job behind the blocked gang tried in the gap and failing is a try; after
    # BACKFILL_TRIES of them the queue is done for the cycle (the cycle stays bounded).
    # Gangs asking for CPU are always tried (no memo judges them).
    wide = [job(f"wide{k}", "big", pods=2, gpus=8, cpu=k + 1) for k in range(BACKFILL_TRIES)]
    w = backfill_world()
    got = w.at(10, *wide[:-1], job("filler", "big", gpus=8))
    assert allocated(got) == {"filler": {"filler-0": "n2"}}
    w = backfill_world()
    got = w.at(10, *wide, job("filler", "big", gpus=8))
    assert allocated(got) == {}


def test_jobs_passed_over_because_a_no_smaller_one_failed_are_not_tries() -> None:
    # Work conservation: hundreds of jobs of one shape that cannot fit the gap are judged
    # by the first of them; the small job far behind still takes the gap.
    wide = [job(f"wide{k}", "big", pods=2, gpus=8) for k in range(5 * BACKFILL_TRIES)]
    w = backfill_world()
    got = w.at(10, *wide, job("filler", "big", gpus=8))
    assert allocated(got) == {"filler": {"filler-0": "n2"}}


# --------------------------------------------------------------------------- 7. placement


def test_spread_placement_per_queue() -> None:
    w = World(node("n1"), node("n2"), queue("a", placement="spread"))
    got = w.at(1, job("x", "a", gpus=2), job("y", "a", gpus=2))
    assert set(allocated(got)["x"].values()) != set(allocated(got)["y"].values())


def test_spread_placement_per_job_overrides_the_queue() -> None:
    w = World(node("n1"), node("n2"), queue("a"))
    got = w.at(1, job("g", "a", pods=2, gpus=2, placement="spread"))
    assert sorted(allocated(got)["g"].values()) == ["n1", "n2"]


def test_required_topology_keeps_the_gang_in_one_rack() -> None:
    w = World(
        node("r1-a", rack="r1"), node("r1-b", rack="r1"), node("r2-a", rack="r2"),
        node("r2-b", rack="r2"), queue("a"),
    )  # fmt: skip
    w.at(0, job("busy", "a", gpus=4))  # lands on r1-a: r1 has 12 free, r2 has 16
    got = w.at(1, job("g", "a", pods=2, gpus=8, topology="rack", topology_required=True))
    assert sorted(allocated(got)["g"].values()) == ["r2-a", "r2-b"]


def test_required_topology_that_no_domain_can_hold_is_rejected() -> None:
    w = World(node("r1-a", rack="r1"), node("r2-a", rack="r2"), queue("a"))
    got = w.at(1, job("g", "a", pods=2, gpus=8, topology="rack", topology_required=True))
    reason, final = reasons(got)["g"]
    assert final and "in one 'rack' domain" in reason


def test_preferred_topology_falls_back_to_several_domains() -> None:
    w = World(node("r1-a", rack="r1"), node("r2-a", rack="r2"), queue("a"))
    got = w.at(1, job("g", "a", pods=2, gpus=8, topology="rack"))
    assert sorted(allocated(got)["g"].values()) == ["r1-a", "r2-a"]


def test_taints_keep_off_pods_that_do_not_tolerate_them() -> None:
    w = World(node("gpu-spot", taints=("spot=true:NoSchedule",)), node("plain", gpus=1), queue("a"))
    got = w.at(1, job("x", "a", gpus=2))
    assert allocated(got) == {}
    got = w.at(2, job("y", "a", gpus=2, tolerations=("spot",)))
    assert allocated(got) == {"y": {"y-0": "gpu-spot"}}


def test_a_gpu_memory_request_takes_its_share_of_the_device() -> None:
    w = World(node("n1", gpus=1, gpu_memory=81_920), queue("a"))
    got = w.at(
        1, job("m1", "a", gpus=0, gpu_memory=20_480), job("m2", "a", gpus=0, gpu_memory=40_960)
    )
    slots = {d.job: d.placements[0].gpus[0].milli for d in got if isinstance(d, PodsAllocated)}
    assert slots == {"m1": 250, "m2": 500}
    assert w.state.nodes["n1"].free_devices == [250]


def test_a_gpu_memory_request_larger_than_any_device_is_rejected() -> None:
    w = World(node("n1", gpus=1, gpu_memory=16_384), queue("a"))
    reason, final = reasons(w.at(1, job("m", "a", gpus=0, gpu_memory=40_960)))["m"]
    assert final and "40960 MiB of one GPU" in reason


def test_consolidation_moves_a_preemptible_job_to_fit_a_gang() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=16), consolidation=True, preempt=False)
    w.at(0, job("p1", "a", gpus=4, placement="spread"), job("p2", "a", gpus=4, placement="spread"))
    got = w.at(1, job("whole", "a", gpus=8, cls="build", preemptible=False))
    # Neither p1 nor p2 has started, so neither loses work: the newer one, p2, moves.
    assert preempted(got) == [("p2", "consolidation", "whole")]
    assert allocated(got) == {"p2": {"p2-0": "n1"}, "whole": {"whole-0": "n2"}}
    assert w.status("p2") == "allocated"


def test_a_job_placed_in_this_cycle_is_never_a_victim_in_it() -> None:
    # p2 is placed in the same cycle as the gang, so it has lost nothing and would be the
    # cheapest to move; taking back what this cycle placed would only be churn, so p1,
    # running since t=1, moves instead.
    w = World(node("n1"), node("n2"), queue("a", deserved=16), consolidation=True, preempt=False)
    w.at(0, job("p1", "a", gpus=4, placement="spread"))
    w.start(1, "p1")
    got = w.at(100, job("p2", "a", gpus=4, placement="spread"), job("whole", "a", gpus=8))
    assert preempted(got) == [("p1", "consolidation", "whole")]
    assert allocated(got) == {
        "p2": {"p2-0": "n2"}, "p1": {"p1-0": "n2"}, "whole": {"whole-0": "n1"}
    }  # fmt: skip


def test_consolidation_leaves_a_job_that_would_land_where_it_is() -> None:
    # n1: v1 (pinned there) beside non-preemptible work; n2: v2 and 4 free; n3: 4 free
    # beside non-preemptible work. v1 is cheaper (started later), so it is evicted first,
    # which frees no node whole; then v2, which frees n2 for the gang. Put back, v1 lands
    # where it was: it did not need to move and is neither preempted nor re-allocated.
    w = World(
        node("n1", host="n1"), node("n2", host="n2"), node("n3", host="n3"),
        queue("a", deserved=24), consolidation=True, preempt=False,
    )  # fmt: skip
    w.at(0, job("fixed1", "a", gpus=4, cls="build", selector={"host": "n1"}),
         job("fixed3", "a", gpus=4, cls="build", selector={"host": "n3"}))  # fmt: skip
    w.at(1, job("v2", "a", gpus=4, placement="spread"))
    w.start(2, "v2")
    w.at(10, job("v1", "a", gpus=4, selector={"host": "n1"}))
    w.start(11, "v1")
    assert w.state.jobs["v2"].placements["v2-0"].node == "n2"
    got = w.at(100, job("whole", "a", gpus=8))
    assert preempted(got) == [("v2", "consolidation", "whole")]
    assert allocated(got) == {"v2": {"v2-0": "n3"}, "whole": {"whole-0": "n2"}}
    assert w.status("v1") == "running"


def test_without_consolidation_fragmentation_blocks_the_gang() -> None:
    w = World(node("n1"), node("n2"), queue("a"), preempt=False)
    w.at(0, job("p1", "a", gpus=4, placement="spread"), job("p2", "a", gpus=4, placement="spread"))
    assert allocated(w.at(1, job("whole", "a", gpus=8))) == {}


# --------------------------------------------------------------------------- 8, 9. why pending, backoff


def test_a_failed_bind_backs_off_and_doubles() -> None:
    w = World(node("n1"), queue("a"), bind_backoff_ms=10_000)
    w.at(0, job("j", "a", gpus=8))
    got = w.at(1, BindFailed(job="j", pod="j-0", node="n1", reason="node not ready"))
    assert allocated(got) == {}
    assert reasons(got)["j"][0] == "backing off after 1 failed binds until t=11s"
    assert list(allocated(w.at(11, Tick()))) == ["j"]
    w.at(12, BindFailed(job="j", pod="j-0", node="n1", reason="again"))
    assert w.state.jobs["j"].backoff_until == 32_000


def test_reasons_name_the_shape_of_the_gang() -> None:
    w = World(node("n1"), node("n2"), queue("a"))
    w.at(0, job("busy", "a", gpus=1))
    reason, _ = reasons(w.at(1, job("g", "a", pods=2, gpus=8)))["g"]
    assert (
        reason
        == "waiting for capacity: gang needs 2 pods (2×8 GPUs), free capacity fits 1 of them now"
    )


# --------------------------------------------------------------------------- drf baseline


def test_drf_serves_the_lowest_dominant_share_first_and_never_evicts() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=16), queue("b"), policy="drf")
    w.at(0, job("a1", "a", gpus=8))
    got = w.at(1, job("a2", "a", gpus=8), job("b1", "b", gpus=8))
    assert list(allocated(got)) == ["b1"]
    assert preempted(w.at(2, job("a3", "a", gpus=8))) == []


def test_drf_ignores_queue_limits_and_hierarchy() -> None:
    w = World(node("n1"), queue("capped", limit=2), policy="drf")
    assert list(allocated(w.at(1, job("x", "capped", gpus=8)))) == ["x"]


def test_unschedulable_reason_events_are_emitted_once_per_change() -> None:
    w = World(node("n1"), queue("a"))
    w.at(0, job("busy", "a", gpus=8))
    first = w.at(1, job("j", "a", gpus=8))
    again = w.at(2, job("k", "a", gpus=1))
    assert "j" in reasons(first) and "j" not in reasons(again)
    assert [d for d in again if isinstance(d, JobUnschedulable)] == []  # k waits behind j


def test_fair_share_golden_limits_weights_and_priorities_by_hand() -> None:
    # 32 GPUs. top: prod (priority 1, deserved 8, limit 12), dev (deserved 8, weight 1),
    # research (deserved 0, weight 3, children r1 deserved 0 w1 / r2 deserved 0 w2).
    # Everyone wants everything. Deserved: prod 8, dev 8, research 0 -> 16 left.
    # Priority bucket 1 (prod): capped by its limit 12 -> +4; 12 left for dev:research 1:3
    # -> dev +3, research +9. Inside research: 9 split 1:2 -> r1 3, r2 6.
    w = World(
        *(node(f"n{i}") for i in range(4)),
        queue("prod", deserved=8, limit=12, priority=1),
        queue("dev", deserved=8),
        queue("research", weight=3),
        queue("r1", parent="research"),
        queue("r2", parent="research", weight=2),
    )
    # each wants 32 GPUs, as four 8-GPU jobs (one 32-GPU job would exceed prod's limit)
    w.at(1, *(job(f"{q}-{i}", q, gpus=8) for q in ("prod", "dev", "r1", "r2") for i in range(4)))
    shares = fair_shares(w.state)
    fair = {q: shares.fair[q][0] for q in ("prod", "dev", "research", "r1", "r2")}
    assert fair == {"prod": 12_000, "dev": 11_000, "research": 9000, "r1": 3000, "r2": 6000}


def test_a_queue_within_its_quota_goes_before_one_that_would_borrow() -> None:
    """q1, within its quota, goes before q0, which would borrow: otherwise q0 borrows 4
    GPUs and loses them to q1's quota reclaim in the same cycle."""
    w = World(node("a", gpus=2), node("b", gpus=2), queue("q0", deserved=1, weight=0),
              queue("q1", deserved=1, weight=0))  # fmt: skip
    got = w.at(1, job("gang", "q0", pods=4, gpus=1), job("svc", "q1", gpus=1, cls="build"))
    assert list(allocated(got)) == ["svc"]
    assert preempted(got) == []


# --------------------------------------------------------------------------- KAI parity


def test_quota_reclaim_picks_a_victim_only_while_its_queue_is_above_its_deserved_quota() -> None:
    # b deserves 2 and holds 4 (two 2-GPU jobs) on n1; c holds its deserved 1 GPU on n2.
    # a (deserves 4) asks for a whole 4-GPU node: only n1 could be it, but taking both of
    # b's jobs would pick the second with b already at its quota (KAI: never) — a waits.
    w = World(node("n1", gpus=4), node("n2", gpus=4), queue("a", deserved=4, weight=0),
              queue("b", deserved=2, weight=0), queue("c", deserved=1, weight=0))  # fmt: skip
    w.at(0, job("b1", "b", gpus=2), job("b2", "b", gpus=2))
    w.at(0.5, job("c1", "c", gpus=1))
    for j in ("b1", "b2", "c1"):
        w.start(1, j)
    assert {p.node for p in w.state.jobs["c1"].placements.values()} == {"n2"}
    got = w.at(10, job("a1", "a", gpus=4))
    assert preempted(got) == []
    assert w.state.jobs["a1"].placements == {}


def test_a_queue_whose_fair_share_is_zero_gives_up_its_last_job_to_fair_share_reclaim() -> None:
    # z deserves nothing and has no over-quota weight (fair share 0) but runs the only
    # 2-GPU job; a (deserved 0, weight 1) has a fair share of 2 and asks for 2.
    w = World(node("n1", gpus=2), queue("a", weight=1), queue("z", weight=0))
    w.at(0, job("z1", "z", gpus=2))
    w.start(1, "z1")
    got = w.at(10, job("a1", "a", gpus=2))
    assert preempted(got) == [("z1", "reclaim", "a1")]
    assert "a1" in allocated(got)


def test_a_queue_at_its_limit_preempts_its_own_lower_priority_job() -> None:
    # a may hold 8 GPUs and holds them with a train job on n1; a build-preemptible job of
    # a asks for 8. n2 is free, but starting there would take a to 16: the newcomer starts
    # only by preempting its own lower-priority job, kept as a victim although the gang
    # does not sit on its node (the limit needs it gone, not the placement).
    w = World(node("n1"), node("n2"), queue("a", deserved=8, limit=8))
    w.at(0, job("low", "a", gpus=8))
    w.start(1, "low")
    got = w.at(10, job("hi", "a", gpus=8, cls="build-preemptible"))
    assert preempted(got) == [("low", "preempt", "hi")]
    assert "hi" in allocated(got)
    assert w.gpus_of("a") == 8


def test_a_queue_at_its_limit_preempts_only_what_brings_it_back_within_it() -> None:
    # a's parent org may hold 8 (a itself has no limit); a holds 4 + 2 + 2 in three train
    # jobs on two nodes. A 4-GPU build-preemptible job needs 4 GPUs freed: the cheapest
    # victim that frees them (big, checkpointed 3 s ago) goes, and nothing more.
    w = World(node("n1", gpus=4), node("n2", gpus=8),
              queue("org", deserved=8, limit=8), queue("a", parent="org", deserved=8))  # fmt: skip
    w.at(0, job("big", "a", gpus=4, checkpoint_s=5))
    w.at(1, job("s1", "a", gpus=2), job("s2", "a", gpus=2))
    for j in ("big", "s1", "s2"):
        w.start(2, j)
    got = w.at(20, job("hi", "a", gpus=4, cls="build-preemptible"))
    assert preempted(got) == [("big", "preempt", "hi")]
    assert "hi" in allocated(got)
    assert w.gpus_of("org") == 8


def test_a_queue_at_its_limit_waits_when_lower_priority_jobs_cannot_free_enough() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=8, limit=8))
    w.at(0, job("peer", "a", gpus=4, cls="build-preemptible"), job("low", "a", gpus=4))
    w.start(1, "peer")
    w.start(1, "low")
    got = w.at(10, job("hi", "a", gpus=8, cls="build-preemptible"))
    assert preempted(got) == []
    reason, _ = reasons(got)["hi"]
    assert reason.startswith("queue 'a' is at its limit")


def test_a_cpu_only_job_reclaims_cpu_from_a_queue_above_its_cpu_fair_share() -> None:
    # One node of 8 cores. b runs two 4-core jobs; a (equal weight) asks for 4 cores: the
    # CPU fair shares are 4 and 4, so b is 4 cores above its share and gives one job back.
    w = World(node("n1", cpu=8000), queue("a"), queue("b"))
    w.at(0, job("b1", "b", gpus=0, cpu=4000), job("b2", "b", gpus=0, cpu=4000))
    w.start(1, "b1")
    w.start(1, "b2")
    got = w.at(10, job("a1", "a", gpus=0, cpu=4000))
    assert [(rule, by) for _, rule, by in preempted(got)] == [("reclaim", "a1")]
    assert "a1" in allocated(got)
    assert w.state.queues["b"].allocated[1] == 4000


def _gpu_and_cpu_holder(b_cpu: int) -> World:
    # n1: 8 GPUs, 8 cores. a deserves the 8 GPUs and 8 cores; b deserves no GPU and
    # ``b_cpu`` cores, and runs an 8-GPU job (no CPU) and a CPU-only job of 8 cores.
    w = World(node("n1", cpu=8000), queue("a", deserved=8, cpu=8000, weight=0),
              queue("b", cpu=b_cpu, weight=0))  # fmt: skip
    w.at(0, job("bg", "b", gpus=8), job("bc", "b", gpus=0, cpu=8000))
    w.start(1, "bg")
    w.start(1, "bc")
    return w


def test_a_cpu_only_job_is_no_free_victim_for_a_gpu_job_s_reclaim() -> None:
    # a's 8-GPU, 4-core job needs bg's GPUs and bc's cores. b is above its GPU quota but
    # holds exactly its deserved 8 cores: bc frees no GPU and is within b's CPU share, so
    # it is no victim, and without it a1 cannot start: nothing is evicted in vain.
    w = _gpu_and_cpu_holder(b_cpu=8000)
    got = w.at(10, job("a1", "a", gpus=8, cpu=4000))
    assert preempted(got) == []
    assert w.status("bc") != "pending" and w.status("bg") != "pending"


def test_a_cpu_only_job_above_its_queue_s_cpu_quota_gives_way_to_a_gpu_job() -> None:
    # The same, but b deserves no CPU: its 8 cores are above its CPU quota, so bc may go
    # for the cores a1 asks for, and bg for its GPUs.
    w = _gpu_and_cpu_holder(b_cpu=0)
    got = w.at(10, job("a1", "a", gpus=8, cpu=4000))
    assert sorted(preempted(got)) == [("bc", "reclaim", "a1"), ("bg", "reclaim", "a1")]
    assert "a1" in allocated(got)


_MIXED = st.lists(
    st.tuples(st.sampled_from("ab"), st.sampled_from([0, 1, 4]), st.sampled_from([0, 2000, 6000])),
    min_size=1,
    max_size=8,
)


# b above its GPU quota holds CPU-only jobs within its CPU quota; a's mixed job needs
# their cores: they are no free victims.
@example(
    [("b", 4, 0), ("b", 4, 0), ("b", 4, 0), ("a", 0, 6000), ("b", 0, 6000), ("b", 0, 2000)],
    [("a", 4, 6000)],
)
@settings(max_examples=60, deadline=None)
@given(_MIXED, _MIXED)
def test_every_reclaim_victim_frees_a_resource_its_queue_holds_above_its_share(
    first, later
) -> None:  # type: ignore[no-untyped-def]
    # GPU, CPU and mixed jobs of two queues on two 8-GPU, 8-core nodes. Whatever reclaim
    # takes, each victim holds a resource the job it makes room for asks for, of which
    # the victim's queue held more than its deserved quota or its fair share.
    w = World(node("n1", cpu=8000), node("n2", cpu=8000),
              queue("a", deserved=4, cpu=4000), queue("b", deserved=4, cpu=8000, weight=3))  # fmt: skip

    def jobs(batch, tag):  # type: ignore[no-untyped-def]
        return [job(f"{tag}{k}", q, gpus=g, cpu=c) for k, (q, g, c) in enumerate(batch) if g or c]

    w.at(0, *jobs(first, "f"))
    for j in list(w.state.jobs):
        if w.state.jobs[j].placements:
            w.start(1, j)
    arrivals = jobs(later, "l")
    before = copy.deepcopy(w.state)  # the shares the cycle at t=10 divides
    for event in arrivals:
        apply(before, event, 10_000)
    shares = fair_shares(before)
    got = w.at(10, *arrivals)
    for victim, rule, by in preempted(got):
        if rule != "reclaim":
            continue
        held, asked = w.state.jobs[victim].request, w.state.jobs[by].request
        q = before.queues[w.state.jobs[victim].queue]
        above = [
            r
            for r in range(3)
            if held[r] > 0
            and asked[r] > 0
            and q.allocated[r] > min(shares.deserved[q.name][r], shares.fair[q.name][r])
        ]
        assert above, (victim, by)


def test_a_gpu_job_over_its_gpu_share_takes_no_gpus_on_the_strength_of_its_cpu_share() -> None:
    # a holds its 8 deserved GPUs and asks for 8 more with 1 core; it is within its CPU
    # share, but beyond its GPU quota and fair share: b's GPU job stays.
    w = World(node("n1", cpu=8000), node("n2", cpu=8000),
              queue("a", deserved=8, cpu=16000, weight=0), queue("b", weight=1))  # fmt: skip
    w.at(0, job("a0", "a", gpus=8), job("b1", "b", gpus=8, cpu=1000))
    w.start(1, "a0")
    w.start(1, "b1")
    assert preempted(w.at(10, job("a1", "a", gpus=8, cpu=1000))) == []

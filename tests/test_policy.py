"""The gang policy as scenarios: given events, expect decisions."""

from __future__ import annotations

from events.model import (
    JobCancelled,
    JobPreempted,
    JobUnschedulable,
    NodeCordoned,
    NodeRemoved,
    PodsAllocated,
)
from scheduler.core import fair_shares
from tests.builders import World, job, node, queue


def allocated(decisions: list) -> dict[str, dict[str, str]]:  # type: ignore[type-arg]
    """job -> {pod: node} for every PodsAllocated among decisions."""
    return {
        d.job: {p.pod: p.node for p in d.placements}
        for d in decisions
        if isinstance(d, PodsAllocated)
    }


def reasons(decisions: list) -> dict[str, tuple[str, bool]]:  # type: ignore[type-arg]
    return {d.job: (d.reason, d.final) for d in decisions if isinstance(d, JobUnschedulable)}


def two_nodes() -> World:
    return World(node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8))


# --------------------------------------------------------------------------- gangs


def test_gang_that_fits_is_placed_whole_in_one_decision() -> None:
    w = two_nodes()
    got = w.at(1, job("g", "a", pods=2, gpus=8))
    assert allocated(got) == {"g": {"g-0": "n1", "g-1": "n2"}}
    assert w.status("g") == "allocated"


def test_gang_that_does_not_fit_now_places_nothing_and_says_why() -> None:
    w = two_nodes()
    w.at(1, job("small", "a", pods=1, gpus=4))
    got = w.at(2, job("g", "b", pods=2, gpus=8))
    assert allocated(got) == {}
    reason, final = reasons(got)["g"]
    assert not final
    # b deserves 8 of the 16 GPUs: it may not reclaim a's 4, held within a's quota.
    assert reason == (
        "needs 16 GPUs; queue 'b' deserves 8 and cannot reclaim in-quota work of 'a'; "
        "starts when the usage of 'a' falls to 0 or the share of 'b' grows"
    )
    assert w.state.jobs["g"].placements == {}


def test_min_members_places_the_required_part_and_extras_that_fit() -> None:
    w = World(node("n1", gpus=4), queue("a", deserved=4))
    got = w.at(1, job("elastic", "a", pods=6, gpus=1, min_members=2))
    assert len(allocated(got)["elastic"]) == 4


# --------------------------------------------------------------------------- never fits


def test_pod_larger_than_any_node_is_rejected_at_once() -> None:
    got = two_nodes().at(1, job("huge", "a", gpus=16))
    assert reasons(got)["huge"] == (
        "pod 'huge-0' needs 16 GPUs but the largest matching node has 8",
        True,
    )


def test_selector_matching_no_node_is_rejected_at_once() -> None:
    w = World(node("gpu-01", pool="a"), queue("a", deserved=8))
    got = w.at(1, job("pinned", "a", selector={"kubernetes.io/hostname": "gpu-07"}))
    reason, final = reasons(got)["pinned"]
    assert final and "kubernetes.io/hostname=gpu-07" in reason and "matches no" in reason
    assert w.status("pinned") == "unschedulable"


def test_unknown_queue_is_rejected() -> None:
    got = two_nodes().at(1, job("lost", "nope"))
    assert reasons(got)["lost"] == ("queue 'nope' does not exist", True)


def test_gang_larger_than_the_cluster_is_rejected() -> None:
    got = two_nodes().at(1, job("big", "a", pods=3, gpus=8))
    reason, final = reasons(got)["big"]
    assert final and "cannot be packed" in reason and "16 schedulable GPUs" in reason


def test_job_above_its_queue_limit_is_rejected() -> None:
    w = World(node("n1"), queue("capped", deserved=2, limit=4))
    reason, final = reasons(w.at(1, job("j", "capped", gpus=8)))["j"]
    assert final and reason == "job needs 8 GPUs but queue 'capped' is limited to 4"


def test_submitting_to_an_inner_queue_is_rejected() -> None:
    w = World(node("n1"), queue("org"), queue("team", parent="org"))
    reason, final = reasons(w.at(1, job("j", "org")))["j"]
    assert final and "has child queues" in reason


def test_cordoned_nodes_take_no_pods_and_do_not_count() -> None:
    w = World(node("n1"), node("n2"), queue("a"), NodeCordoned(node="n1"))
    assert allocated(w.at(1, job("j", "a", gpus=8))) == {"j": {"j-0": "n2"}}
    reason, final = reasons(w.at(2, job("k", "a", pods=2, gpus=8)))["k"]
    assert final and "8 schedulable GPUs on 1 nodes" in reason


# --------------------------------------------------------------------------- quotas, order


def test_queue_limit_holds_work_back_with_a_reason() -> None:
    w = World(node("n1"), queue("a", limit=4))
    w.at(1, job("j1", "a", gpus=4))
    got = w.at(2, job("j2", "a", gpus=2))
    assert allocated(got) == {}
    assert reasons(got)["j2"][0] == "queue 'a' is at its limit: 4 of 4 GPUs in use, job needs 2"


def test_parent_limit_applies_to_children() -> None:
    w = World(
        node("n1"), queue("org", limit=4), queue("t1", parent="org"), queue("t2", parent="org")
    )
    w.at(1, job("x", "t1", gpus=3))
    got = w.at(2, job("y", "t2", gpus=2))
    assert "queue 'org' is at its limit" in reasons(got)["y"][0]


def test_priority_then_age_inside_a_queue() -> None:
    w = World(node("n1", gpus=1), queue("a", deserved=1))
    w.at(1, job("first", "a", preemptible=False))  # takes the only GPU, cannot be evicted
    w.at(2, job("old", "a"), job("young", "a"))
    w.at(3, job("urgent", "a", cls="build-preemptible"))
    order = list(allocated(w.finish(10, "first")))
    order += list(allocated(w.finish(20, order[-1])))
    order += list(allocated(w.finish(30, order[-1])))
    assert order == ["urgent", "old", "young"]


def test_a_big_gang_at_the_head_is_not_starved_by_small_jobs_behind_it() -> None:
    w = World(node("n1"), queue("a"))
    w.at(1, job("busy", "a", gpus=4))
    w.at(2, job("big", "a", gpus=8), job("small", "a", gpus=1))
    assert w.status("small") == "pending"  # held behind the head, which is waiting for 8
    got = w.finish(3, "busy")
    assert list(allocated(got)) == ["big"]


def test_non_preemptible_job_runs_only_within_deserved_quota() -> None:
    w = World(node("n1"), queue("a", deserved=2), queue("b", deserved=6))
    w.at(1, job("nb1", "a", gpus=2, cls="build"))
    got = w.at(2, job("nb2", "a", gpus=1, cls="build"))
    assert allocated(got) == {}
    assert "non-preemptible job waits for deserved quota of 'a'" in reasons(got)["nb2"][0]


def test_non_preemptible_job_larger_than_deserved_is_rejected() -> None:
    w = World(node("n1"), queue("a", deserved=2))
    reason, final = reasons(w.at(1, job("inf", "a", gpus=4, cls="inference")))["inf"]
    assert final and "deserves only 2" in reason


def test_reason_is_recorded_only_when_it_changes() -> None:
    w = World(node("n1"), queue("a", limit=4))
    w.at(1, job("j1", "a", gpus=4))
    assert reasons(w.at(2, job("j2", "a", gpus=2)))
    assert reasons(w.at(3, job("j3", "a", gpus=2))) == {}  # j2's reason unchanged


# --------------------------------------------------------------------------- placement


def test_bin_packing_fills_one_node_before_the_next() -> None:
    w = World(node("n1"), node("n2"), queue("a"))
    got = w.at(1, job("x", "a", gpus=4), job("y", "a", gpus=4))
    assert allocated(got) == {"x": {"x-0": "n1"}, "y": {"y-0": "n1"}}


def test_fractional_pods_share_one_device() -> None:
    w = World(node("n1", gpus=2), queue("a"))
    got = w.at(1, job("h1", "a", gpus=0.5), job("h2", "a", gpus=0.5), job("q", "a", gpus=0.25))
    devices = {
        d.job: [(s.device, s.milli) for s in d.placements[0].gpus]
        for d in got
        if isinstance(d, PodsAllocated)
    }
    assert devices == {"h1": [(0, 500)], "h2": [(0, 500)], "q": [(1, 250)]}
    assert w.state.nodes["n1"].free_devices == [0, 750]


def test_cpu_is_respected_where_nodes_model_it() -> None:
    w = World(node("n1", cpu=8000), node("n2", cpu=32000), queue("a"))
    got = w.at(1, job("cpu-heavy", "a", gpus=1, cpu=16000))
    assert allocated(got) == {"cpu-heavy": {"cpu-heavy-0": "n2"}}


# --------------------------------------------------------------------------- fair share


def test_fair_share_by_percent_divides_a_full_cluster_60_30_10() -> None:
    w = World(
        *(node(f"n{i}") for i in range(8)),
        queue("train", percent=60),
        queue("interactive", percent=30),
        queue("experiments", percent=10),
    )
    for q in ("train", "interactive", "experiments"):
        w.at(1, job(f"demand-{q}", q, pods=8, gpus=8))  # each asks for the whole cluster
    shares = fair_shares(w.state)
    assert shares.deserved["train"][0] == 38_400
    # all three want everything: deserved first, the rest equally by weight 1:1:1
    fair = {q: shares.fair[q][0] for q in ("train", "interactive", "experiments")}
    assert fair == {"train": 38_400, "interactive": 19_200, "experiments": 6_400}


def test_over_quota_divides_by_weight_and_caps_by_request() -> None:
    w = World(
        *(node(f"n{i}") for i in range(4)),  # 32 GPUs
        queue("heavy", deserved=4, weight=2),
        queue("light", deserved=4, weight=1),
        queue("tiny", deserved=4, weight=5),
    )
    w.at(1, job("h", "heavy", pods=4, gpus=8), job("l", "light", pods=4, gpus=8))
    w.at(1, job("t", "tiny", pods=1, gpus=2))
    shares = fair_shares(w.state)
    fair = {q: shares.fair[q][0] for q in ("heavy", "light", "tiny")}
    # tiny asks for 2; 32 - (4+4+2) = 22 left, split 2:1 between heavy and light
    assert fair["tiny"] == 2000
    assert fair["heavy"] == 4000 + 14_666 + 1 and fair["light"] == 4000 + 7333
    assert sum(fair.values()) == 32_000


def test_fair_share_is_divided_down_a_three_level_tree() -> None:
    w = World(
        *(node(f"n{i}") for i in range(2)),  # 16 GPUs
        queue("org", deserved=12),
        queue("other", deserved=4),
        queue("ml", parent="org", deserved=8),
        queue("vision", parent="ml", deserved=6),
        queue("nlp", parent="ml", deserved=2, weight=3),
        queue("data", parent="org", deserved=4),
    )
    w.at(1, job("v", "vision", pods=2, gpus=8), job("n", "nlp", pods=2, gpus=8))
    w.at(1, job("o", "other", pods=1, gpus=1))
    shares = fair_shares(w.state)
    fair = {q: shares.fair[q][0] // 1000 for q in ("org", "other", "ml", "data", "vision", "nlp")}
    # other wants 1; org gets 12 + the 3 left over; data wants nothing so ml gets all 15;
    # vision 6 + nlp 2 deserved, the remaining 7 split 1:3 -> 1.75 and 5.25
    assert fair == {"org": 15, "other": 1, "ml": 15, "data": 0, "vision": 7, "nlp": 7}
    assert shares.fair["vision"][0] == 7750 and shares.fair["nlp"][0] == 7250


def test_over_subscribed_deserved_quotas_are_each_given_whatever_the_names() -> None:
    # 16 GPUs, three queues deserving 12, 12 and 2 (26 in all): alpha and zulu ask for 16,
    # mid for 1. Every queue gets min(deserved, request), as in KAI-Scheduler, however its
    # name sorts; the shares add up to more than the cluster and none is over quota.
    w = World(
        *(node(f"n{i}") for i in range(2)),
        queue("alpha", deserved=12),
        queue("zulu", deserved=12),
        queue("mid", deserved=2),
    )
    w.at(1, job("a", "alpha", pods=2, gpus=8), job("z", "zulu", pods=2, gpus=8))
    w.at(1, job("m", "mid", gpus=1))
    shares = fair_shares(w.state)
    fair = {q: shares.fair[q][0] for q in ("alpha", "zulu", "mid")}
    assert fair == {"alpha": 12_000, "zulu": 12_000, "mid": 1000}
    assert {q: shares.deserved[q][0] for q in fair} == {
        "alpha": 12_000,
        "zulu": 12_000,
        "mid": 2000,
    }


def test_higher_priority_queue_takes_over_quota_first() -> None:
    w = World(
        *(node(f"n{i}") for i in range(2)),
        queue("prod", deserved=4, priority=10),
        queue("dev", deserved=4, weight=100),
    )
    w.at(1, job("p", "prod", pods=2, gpus=8), job("d", "dev", pods=2, gpus=8))
    shares = fair_shares(w.state)
    assert shares.fair["prod"][0] == 12_000 and shares.fair["dev"][0] == 4000


# --------------------------------------------------------------------------- reclaim, preempt


def reclaim_world() -> World:
    w = World(node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8))
    w.at(0, job("a1", "a", gpus=8, checkpoint_s=600), job("a2", "a", gpus=8))
    w.start(10, "a1")
    w.start(100, "a2")
    return w


def test_queue_under_deserved_reclaims_from_queue_over_it() -> None:
    w = reclaim_world()
    got = w.at(1000, job("b1", "b", gpus=8))
    preempted = [d for d in got if isinstance(d, JobPreempted)]
    assert len(preempted) == 1
    victim = preempted[0]
    # a1 checkpointed at 610 s, so it loses 390 s x 8 GPUs; a2 would lose 900 s x 8
    assert (victim.job, victim.rule, victim.preemptor, victim.preemptor_queue) == (
        "a1",
        "reclaim",
        "b1",
        "b",
    )
    assert victim.lost_gpu_ms == 390_000 * 8 and victim.checkpointed_ms == 600_000
    assert allocated(got) == {"b1": {"b1-0": "n1"}}
    assert w.status("a1") == "pending" and w.gpus_of("a") == 8 and w.gpus_of("b") == 8


def test_reclaim_never_evicts_non_preemptible_work() -> None:
    w = World(node("n1"), queue("a", deserved=8), queue("b", deserved=0))
    w.at(0, job("svc", "a", gpus=8, cls="inference"))
    got = w.at(10, job("b1", "b", gpus=8))
    assert [d for d in got if isinstance(d, JobPreempted)] == []


def test_no_eviction_for_a_gang_that_would_still_not_fit() -> None:
    w = reclaim_world()
    got = w.at(1000, job("b-big", "b", pods=3, gpus=8))  # 24 > 16 in the cluster
    assert [d for d in got if isinstance(d, JobPreempted)] == []


def test_queue_at_its_fair_share_is_not_reclaimed_from() -> None:
    w = World(node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8))
    w.at(0, job("a1", "a", gpus=8), job("b1", "b", gpus=8))
    got = w.at(10, job("b2", "b", gpus=8))  # b is at its share; a is not above its own
    assert [d for d in got if isinstance(d, JobPreempted)] == []


def test_preempt_within_a_queue_takes_strictly_lower_priority_only() -> None:
    w = World(node("n1"), queue("a", deserved=8))
    w.at(0, job("low", "a", gpus=8, cls="train"))
    same = w.at(5, job("peer", "a", gpus=8, cls="train"))
    assert [d for d in same if isinstance(d, JobPreempted)] == []
    w.at(6, JobCancelled(job="peer"))
    got = w.at(10, job("hi", "a", gpus=8, cls="build-preemptible"))
    (victim,) = [d for d in got if isinstance(d, JobPreempted)]
    assert (victim.job, victim.rule) == ("low", "preempt")
    assert allocated(got) == {"hi": {"hi-0": "n1"}}


def test_victims_are_no_more_than_needed() -> None:
    w = World(node("n1"), queue("a", deserved=0), queue("b", deserved=8))
    w.at(0, *(job(f"s{i}", "a", gpus=2) for i in range(4)))
    got = w.at(10, job("b1", "b", gpus=4))
    victims = [d.job for d in got if isinstance(d, JobPreempted)]
    assert len(victims) == 2


# --------------------------------------------------------------------------- lifecycle


def test_cancel_releases_gpus_and_the_next_job_starts() -> None:
    w = World(node("n1"), queue("a"))
    w.at(1, job("x", "a", gpus=8), job("y", "a", gpus=8))
    got = w.at(2, JobCancelled(job="x"))
    assert list(allocated(got)) == ["y"]
    assert w.status("x") == "cancelled"


def test_gang_runs_when_min_members_started_and_finishes_when_all_pods_finish() -> None:
    w = World(node("n1"), queue("a"))
    w.at(1, job("g", "a", pods=2, gpus=2))
    w.start(2, "g")
    assert w.status("g") == "running" and w.state.jobs["g"].started_at == 2000
    w.finish(3, "g")
    assert w.status("g") == "succeeded" and w.gpus_of("a") == 0


def test_a_removed_node_sends_its_jobs_back_to_pending() -> None:
    w = World(node("n1"), node("n2"), queue("a"))
    w.at(1, job("g", "a", pods=2, gpus=8))
    got = w.at(2, NodeRemoved(node="n2"))
    assert w.status("g") == "pending" and w.gpus_of("a") == 0
    assert allocated(got) == {}


# --------------------------------------------------------------------------- fifo


def test_fifo_places_gang_pods_one_by_one_and_can_half_place_a_gang() -> None:
    w = World(node("n1"), node("n2"), queue("a"), policy="fifo")
    w.at(1, job("busy", "a", gpus=8))
    got = w.at(2, job("g", "a", pods=2, gpus=8))
    assert allocated(got) == {"g": {"g-0": "n2"}}  # half a gang, holding 8 GPUs idle
    assert w.status("g") == "pending"


def test_fifo_spreads_pods_and_takes_whole_gpus_for_fractions() -> None:
    w = World(node("n1"), node("n2"), queue("a"), policy="fifo")
    got = w.at(1, job("f1", "a", gpus=0.5), job("f2", "a", gpus=0.5))
    assert allocated(got) == {"f1": {"f1-0": "n1"}, "f2": {"f2-0": "n2"}}
    assert w.state.nodes["n1"].free_devices[0] == 0


def test_fifo_never_rejects_and_never_preempts() -> None:
    w = World(node("n1"), queue("a", deserved=0), queue("b", deserved=8), policy="fifo")
    w.at(0, job("a1", "a", gpus=8))
    got = w.at(1, job("b1", "b", gpus=8), job("huge", "b", gpus=64))
    assert got == []

"""KAI-Scheduler parity (issue 15, part C): scenarios written from KAI's rules.

Each test names the rule of KAI-Scheduler it follows (``pkg/scheduler/plugins/proportion``
and ``pkg/scheduler/actions``) or the knob that selects KAI's behaviour where gpuledger
deliberately differs (docs/policy.md, "Where gpuledger differs from KAI-Scheduler").
"""

from __future__ import annotations

import pytest

from events.model import JobPreempted
from replay.config import ConfigError, PolicyFile, policy_event
from replay.whatif import renamed
from scheduler.core.policy import KAI_KNOBS
from scheduler.fold.step import live_policy
from tests.builders import World, job, node, queue
from tests.test_policy import allocated


def preempted(decisions: list) -> list[tuple[str, str, str]]:  # type: ignore[type-arg]
    return [(d.job, d.rule, d.preemptor) for d in decisions if isinstance(d, JobPreempted)]


def victims_of(decisions: list) -> list[str]:  # type: ignore[type-arg]
    return sorted(d.job for d in decisions if isinstance(d, JobPreempted))


# --------------------------------------------------------------------------- C.5 ancestors


def departments(**knobs: object) -> World:
    """Departments A and B (deserved 4 GPUs each) on four 4-GPU nodes. In A, a1 deserves
    all of A's 4 and a2 nothing; b1 deserves all of B's. a2 borrows 6 GPUs (1-GPU jobs
    started at 1 s), b1 borrows 10 (started at 50 s, so the cheaper victims)."""
    w = World(
        *(node(f"n{i}", gpus=4) for i in range(4)),
        queue("A", deserved=4), queue("B", deserved=4),
        queue("a1", parent="A", deserved=4), queue("a2", parent="A", deserved=0),
        queue("b1", parent="B", deserved=4),
        **knobs,
    )  # fmt: skip
    w.at(0, *(job(f"a2-{k}", "a2") for k in range(6)), *(job(f"b1-{k}", "b1") for k in range(10)))
    for k in range(6):
        w.start(1, f"a2-{k}")
    for k in range(10):
        w.start(50, f"b1-{k}")
    return w


def test_a_leaf_within_its_quota_does_not_reclaim_for_a_department_above_its_share() -> None:
    # a1 asks for 4 GPUs: within its own deserved quota. Taking them from b1 would put A at
    # 10 GPUs — above its deserved 4 and its fair share 8 — while B falls to 6 of its 8:
    # KAI's leveled check (A against B where the branches meet) refuses it. a1 takes from
    # its own department's borrower a2 instead, the dearer victims notwithstanding.
    w = departments()
    got = w.at(100, job("big", "a1", pods=4))
    assert victims_of(got) == ["a2-2", "a2-3", "a2-4", "a2-5"]  # same start: newest first
    assert "big" in allocated(got)
    assert w.gpus_of("A") == 6 and w.gpus_of("B") == 10


# --------------------------------------------------------------------------- C.7 budget


def test_a_cheap_victim_counted_first_does_not_block_the_one_that_alone_makes_room() -> None:
    # a and b deserve nothing, equal weights: a's fair share is 4 of the 8 GPUs and b may
    # give 3 (keeping a saturation at least a's). b runs b3 (3 GPUs, n1), and b1 (1 GPU) and
    # b3x (3 GPUs) on n2; b1 is the cheapest victim. a's 4-GPU pod fits only where b3 runs.
    # Counting b1 first would leave 2 of the 3 GPUs b may give: b3 alone makes room.
    w = World(node("n1", gpus=4, host="n1"), node("n2", gpus=4, host="n2"),
              queue("a"), queue("b"))  # fmt: skip
    w.at(0, job("b3", "b", gpus=3, selector={"host": "n1"}),
         job("b3x", "b", gpus=3, selector={"host": "n2"}),
         job("b1", "b", gpus=1, selector={"host": "n2"}))  # fmt: skip
    w.start(10, "b3")
    w.start(20, "b3x")
    w.start(50, "b1")
    got = w.at(100, job("a4", "a", gpus=4))
    assert preempted(got) == [("b3", "reclaim", "a4")]
    assert allocated(got) == {"a4": {"a4-0": "n1"}}


def test_victims_that_only_together_exceed_the_bound_are_not_taken() -> None:
    # The same, but the 4-GPU pod needs n2, where b1 and b3x together (4 GPUs) would be
    # more than the 3 b may give: a waits.
    w = World(node("n1", gpus=4, host="n1"), node("n2", gpus=4, host="n2"),
              queue("a"), queue("b"))  # fmt: skip
    w.at(0, job("b3", "b", gpus=3, selector={"host": "n1"}),
         job("b3x", "b", gpus=3, selector={"host": "n2"}),
         job("b1", "b", gpus=1, selector={"host": "n2"}))  # fmt: skip
    for j in ("b3", "b3x", "b1"):
        w.start(10, j)
    got = w.at(100, job("a4", "a", gpus=4, selector={"host": "n2"}))
    assert preempted(got) == []


# --------------------------------------------------------------------------- C.10 victims


def victim_world(**knobs: object) -> World:
    """Queue q on two 4-GPU nodes: v1 (1 GPU) and v3 (3 GPUs) on n1, v4 (4 GPUs) on n2, all
    train. At 1000 s v1 has run 8 min (8 GPU-min to lose), v3 3 min (9), v4 3.25 min (13)."""
    w = World(node("n1", gpus=4, host="n1"), node("n2", gpus=4, host="n2"),
              queue("q", deserved=8), **knobs)  # fmt: skip
    w.at(0, job("v1", "q", gpus=1, selector={"host": "n1"}),
         job("v3", "q", gpus=3, selector={"host": "n1"}),
         job("v4", "q", gpus=4, selector={"host": "n2"}))  # fmt: skip
    w.start(520, "v1")
    w.start(820, "v3")
    w.start(805, "v4")
    return w


def test_one_victim_losing_less_replaces_two_cheaper_ones() -> None:
    # A build-preemptible gang of four 1-GPU pods preempts train jobs. In least-lost-work
    # order v1 and v3 make room (17 GPU-min together); v4 alone makes room losing 13:
    # fewer victims and less work lost.
    w = victim_world()
    got = w.at(1000, job("hi", "q", pods=4, gpus=1, cls="build-preemptible"))
    assert preempted(got) == [("v4", "preempt", "hi")]
    lost = {d.job: d.lost_gpu_ms for d in got if isinstance(d, JobPreempted)}
    assert lost == {"v4": 13 * 60_000}
    assert set(allocated(got)["hi"].values()) == {"n2"}


def test_kai_victim_order_takes_lower_priority_then_newer_jobs_first() -> None:
    # The inference job may preempt v1, v3 (train, 50) and v4 (build-preemptible, 75).
    # KAI's order takes lower priority first, then the newest: v3, then v1 — they make
    # room on n1, although v4, the newest by far, would have lost almost nothing.
    w = World(node("n1", gpus=4, host="n1"), node("n2", gpus=4, host="n2"),
              queue("q", deserved=8), victim_order="kai")  # fmt: skip
    w.at(0, job("v1", "q", gpus=1, selector={"host": "n1"}),
         job("v3", "q", gpus=3, selector={"host": "n1"}),
         job("v4", "q", gpus=4, selector={"host": "n2"}, cls="build-preemptible"))  # fmt: skip
    w.start(520, "v1")
    w.start(820, "v3")
    w.start(990, "v4")  # the cheapest victim by far
    got = w.at(1000, job("hi", "q", pods=4, gpus=1, cls="inference", preemptible=True))
    assert sorted(preempted(got)) == [("v1", "preempt", "hi"), ("v3", "preempt", "hi")]


def test_gpuledger_victim_order_takes_the_cheapest_whatever_the_priority() -> None:
    w = World(node("n1", gpus=4, host="n1"), node("n2", gpus=4, host="n2"),
              queue("q", deserved=8))  # fmt: skip
    w.at(0, job("v1", "q", gpus=1, selector={"host": "n1"}),
         job("v3", "q", gpus=3, selector={"host": "n1"}),
         job("v4", "q", gpus=4, selector={"host": "n2"}, cls="build-preemptible"))  # fmt: skip
    w.start(520, "v1")
    w.start(820, "v3")
    w.start(990, "v4")
    got = w.at(1000, job("hi", "q", pods=4, gpus=1, cls="inference", preemptible=True))
    assert preempted(got) == [("v4", "preempt", "hi")]


def test_kai_victim_order_reclaims_from_the_lower_priority_queue_first() -> None:
    # hi (priority 2) and lo (priority 1) deserve nothing and hold 4 GPUs each; a deserves
    # 4 and asks for 4 (quota reclaim). lo's job is the dearer victim (it ran longer):
    # gpuledger's order takes hi's, KAI's takes lo's.
    def world(order: str) -> World:
        w = World(node("n1", gpus=4), node("n2", gpus=4), queue("a", deserved=4),
                  queue("hi", priority=2), queue("lo", priority=1),
                  victim_order=order)  # fmt: skip
        w.at(0, job("h", "hi", gpus=4), job("l", "lo", gpus=4))
        w.start(10, "l")
        w.start(500, "h")
        return w

    assert preempted(world("gpuledger").at(1000, job("x", "a", gpus=4))) == [("h", "reclaim", "x")]
    assert preempted(world("kai").at(1000, job("x", "a", gpus=4))) == [("l", "reclaim", "x")]


# --------------------------------------------------------------------------- C.9 queue order


def order_world(order: str) -> World:
    """One 8-GPU node; b holds 2 GPUs. a deserves 6 and asks for 6; b deserves 4 and asks
    for 1 more. Only one of the two fits the 6 GPUs left."""
    w = World(node("n1"), queue("a", deserved=6), queue("b", deserved=4), queue_order=order)
    w.at(0, job("b0", "b", gpus=2))
    w.start(1, "b0")
    return w


def test_kai_queue_order_ranks_by_the_share_after_the_head_job() -> None:
    # Both heads are within their deserved quotas. gpuledger ranks by the share held now:
    # a (0) before b (2 of 3). KAI ranks by the share each would hold with its head job,
    # of max(deserved, fair share): a 6/6, b 3/4 — b goes first and takes its GPU.
    got = order_world("kai").at(10, job("a1", "a", gpus=6), job("b1", "b", gpus=1))
    assert list(allocated(got)) == ["b1"]
    got = order_world("gpuledger").at(10, job("a1", "a", gpus=6), job("b1", "b", gpus=1))
    assert list(allocated(got)) == ["a1"]


def tree_world(order: str) -> World:
    """Departments X and Y deserve 4 GPUs each of 9 (an 8-GPU and a 1-GPU node). In X, x1
    (deserves 2) holds 6 (protected from reclaim) and x2 deserves 2; y1 (deserves 4, all of
    Y's) holds 2. x2 and y1 each ask for the one free GPU."""
    w = World(
        node("n1"), node("n2", gpus=1),
        queue("X", deserved=4), queue("Y", deserved=4),
        queue("x1", parent="X", deserved=2, reclaim_min_runtime_s=100_000),
        queue("x2", parent="X", deserved=2), queue("y1", parent="Y", deserved=4),
        queue_order=order,
    )  # fmt: skip
    w.at(0, job("x1-0", "x1", gpus=6), job("y1-0", "y1", gpus=2))
    w.start(1, "x1-0")
    w.start(1, "y1-0")
    return w


def test_kai_queue_order_ranks_level_by_level_down_the_tree() -> None:
    # As leaves, x2 (nothing held, within its quota) goes before y1 (2 of its 3). KAI
    # ranks the departments first: X would hold 7 with x2's job, above its deserved 4,
    # while Y stays within its own: Y, and so y1, goes first.
    got = tree_world("kai").at(10, job("x2-0", "x2"), job("y1-1", "y1"))
    assert list(allocated(got)) == ["y1-1"]
    got = tree_world("gpuledger").at(10, job("x2-0", "x2"), job("y1-1", "y1"))
    assert list(allocated(got)) == ["x2-0"]


# --------------------------------------------------------------------------- --policy kai


def test_policy_kai_is_the_gang_policy_with_kai_s_knobs() -> None:
    config = policy_event("kai", PolicyFile(lost_work_ratio=0.5, share_rounding="milli"))
    assert config.policy == "kai"
    assert (config.share_rounding, config.victim_order, config.queue_order) == (
        "whole",
        "kai",
        "kai",
    )
    assert (config.lost_work_ratio_milli, config.reclaim_hysteresis_ms) == (0, 0)
    assert config.consolidation and config.backfill
    assert (
        policy_event("gpuledger").victim_order
        == policy_event("gpuledger").queue_order
        == "gpuledger"
    )
    live = live_policy("kai")
    assert live.victim_order == "kai" and not live.consolidation and not live.requeue_lost
    with pytest.raises(ConfigError, match="victim_order must be gpuledger or kai, not 'lifo'"):
        policy_event("gpuledger", PolicyFile(victim_order="lifo"))


def test_policy_kai_reclaims_as_the_gang_policy_does() -> None:
    w = World(node("n1", gpus=4), node("n2", gpus=4), queue("a", deserved=4),
              queue("hi", priority=2), queue("lo", priority=1), policy="kai",
              **{k: v for k, v in KAI_KNOBS.items() if k != "consolidation"})  # fmt: skip
    w.at(0, job("h", "hi", gpus=4), job("l", "lo", gpus=4))
    w.start(10, "l")
    w.start(500, "h")
    assert preempted(w.at(1000, job("x", "a", gpus=4))) == [("l", "reclaim", "x")]


# --------------------------------------------------------------------------- reservations


def test_without_reservations_a_long_job_takes_the_gap_before_a_blocked_gang() -> None:
    # n1 is busy until t=1001, the 2-node gang waits. With reservations (gpuledger's EASY
    # backfill) a long non-preemptible job may not take n2, which the gang will need;
    # KAI-Scheduler holds nothing for the gang, so the long job starts on n2.
    def world(reservations: bool) -> World:
        w = World(node("n1"), node("n2"), queue("big", deserved=16), backfill=True,
                  reservations=reservations)  # fmt: skip
        w.at(0, job("long", "big", gpus=8, runtime_s=1000, cls="build"))
        w.start(1, "long")
        w.at(2, job("gang", "big", pods=2, gpus=8, runtime_s=5000))
        return w

    late = job("late", "big", gpus=8, runtime_s=5000, preemptible=False)
    assert allocated(world(True).at(10, late)) == {}
    kai = world(False)
    assert kai.state.jobs["gang"].reason.startswith("waiting for capacity")
    assert allocated(kai.at(10, late)) == {"late": {"late-0": "n2"}}


def test_a_what_if_under_kai_puts_kai_s_knobs_in_force_and_back() -> None:
    recorded = policy_event("gpuledger")
    kai = renamed(recorded, "kai")
    assert (kai.policy, kai.victim_order, kai.reservations, kai.lost_work_ratio_milli) == (
        "kai", "kai", False, 0,
    )  # fmt: skip
    back = renamed(kai, "gpuledger")
    assert back == recorded

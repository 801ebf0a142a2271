"""The quota guarantee as a property (docs/policy.md §5): a queue below its deserved quota,
whose pending jobs fit in capacity held reclaimably by a queue above its deserved quota,
starts them in the cycle it asks — whole nodes included, whatever the borrowers' jobs would
lose and however their checkpoints are staggered.

Random clusters (2-5 nodes of 2, 4 or 8 GPUs), trees (the two queues at the top or under a
department), borrowers' jobs of fractions, single and several GPUs (each on one node, with
random checkpoint intervals and start times), the asking queue's jobs of whole nodes or
gangs of whole-node pods, and the policy's lost-work budget, backfill and hysteresis knobs.

Where a rule keeps the borrower's GPUs (here its queue's reclaim min-runtime), the asking
queue's jobs that wait say which in their reason.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from events.model import JobSubmitted
from scheduler.core.state import PENDING
from tests.builders import World, job, node, queue


@st.composite
def borrowed_cluster(draw: st.DrawFn) -> dict[str, Any]:
    gpus = draw(st.sampled_from([2, 4, 8]))
    nodes = draw(st.integers(2, 5))
    capacity = gpus * nodes
    asked_nodes = draw(st.integers(1, nodes - 1))  # what A asks for, in whole nodes
    a_deserved = draw(st.integers(asked_nodes * gpus, capacity))
    b_deserved = draw(st.integers(0, capacity - asked_nodes * gpus))  # B is above by that
    sizes: list[float] = []
    while sum(sizes) < capacity:
        left = capacity - sum(sizes)
        size = draw(st.sampled_from([s for s in (0.5, 1, 1, 2, gpus) if s <= left]))
        sizes.append(size)
    gang_pods = draw(st.sampled_from([1, 1, 2])) if asked_nodes % 2 == 0 else 1
    return {
        "gpus": gpus,
        "nodes": nodes,
        "asked_nodes": asked_nodes,
        "gang_pods": gang_pods,
        "a_deserved": a_deserved,
        "b_deserved": b_deserved,
        "department": draw(st.booleans()),
        "b_jobs": [
            (size, draw(st.sampled_from([None, 300, 1800, 3600, 7200])), draw(st.integers(0, 29)))
            for size in sizes
        ],
        "asks_at": draw(st.integers(2 * 3600, 4 * 3600)),
        "knobs": {
            "lost_work_ratio_milli": draw(st.sampled_from([0, 100, 1000])),
            "backfill": draw(st.booleans()),
            "reclaim_hysteresis_ms": draw(st.sampled_from([0, 600_000])),
            # reclaim within deserved quota never backs off, whatever the period
            "victim_search_backoff_ms": draw(st.sampled_from([0, 30_000, 3_600_000])),
        },
    }


def _world(c: dict[str, Any]) -> tuple[World, list[str]]:
    """B borrows every GPU, one job a minute (each reported running a minute later);
    then A asks for its whole nodes. Returns the world and A's jobs."""
    parent = "dept" if c["department"] else ""
    setup = [node(f"n{i}", gpus=c["gpus"]) for i in range(c["nodes"])]
    if parent:
        setup.append(queue("dept", deserved=c["a_deserved"] + c["b_deserved"]))
    setup += [
        queue("A", parent=parent, deserved=c["a_deserved"]),
        queue(
            "B",
            parent=parent,
            deserved=c["b_deserved"],
            reclaim_min_runtime_s=c.get("b_min_runtime_s", 0),
        ),
    ]
    w = World(*setup, **c["knobs"])
    t = 0
    for k, (size, checkpoint, jitter) in enumerate(c["b_jobs"]):
        t = 60 * k + jitter
        w.at(t, job(f"b{k:03d}", "B", gpus=size, checkpoint_s=checkpoint))
        w.start(t + 30, f"b{k:03d}")
    pods, per = c["gang_pods"], c["gpus"]
    asks: list[JobSubmitted] = [
        job(f"a{i}", "A", pods=pods, gpus=per) for i in range(c["asked_nodes"] // pods)
    ]
    w.at(max(c["asks_at"], t + 3600), *asks)
    return w, [a.job for a in asks]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(borrowed_cluster())
def test_a_queue_below_its_quota_gets_whole_nodes_in_the_cycle_it_asks(c: dict[str, Any]) -> None:
    w, asked = _world(c)
    state = w.state
    not_started = [a for a in asked if state.jobs[a].status == PENDING]
    reasons = {a: state.jobs[a].reason for a in not_started}
    assert not not_started, f"A's jobs still pending: {reasons}"
    assert w.gpus_of("A") == c["asked_nodes"] * c["gpus"]


RULES = (
    "within reclaim min-runtime",
    "placed by reclaim within the hysteresis window",
    "not where its pods fit (all or nothing across its pods)",
    "not enough where the gang fits",
)
"""The rules a waiting head within its deserved quota may name (``blocked._KEPT_WORDS`` as
a reservation's reason words them, ``blocked._kept`` as a capacity wait does)."""


OVERSUBSCRIBED = {
    "gpus": 2,
    "nodes": 2,
    "asked_nodes": 1,
    "gang_pods": 1,
    "a_deserved": 4,
    "b_deserved": 2,
    "department": True,
    "b_jobs": [(0.5, None, 0)] * 3 + [(1, None, 0)] * 2 + [(0.5, None, 0)],
    "asks_at": 7200,
    "knobs": {
        "lost_work_ratio_milli": 0,
        "backfill": False,
        "reclaim_hysteresis_ms": 0,
        "victim_search_backoff_ms": 0,
    },
}
"""The department's queues deserve 6 GPUs of 4: B, above its deserved 2, is within a fair
share of 4, and A (a capacity wait, no backfill) must still name B's min-runtime."""


@example(OVERSUBSCRIBED, 7200)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(borrowed_cluster(), st.sampled_from([3600, 7200, 6 * 3600]))
def test_a_queue_below_its_quota_that_waits_is_told_the_rule(
    c: dict[str, Any], min_runtime_s: int
) -> None:
    w, asked = _world({**c, "b_min_runtime_s": min_runtime_s})
    state = w.state
    waiting = [a for a in asked if state.jobs[a].status == PENDING]
    if not waiting:
        return
    # the first waiting job is A's head: the one that made room, or says why it could not
    # (without backfill the jobs behind it wait behind it for the cycle, untried)
    head = state.jobs[waiting[0]]
    assert any(rule in head.reason for rule in RULES), f"{head.job}: {head.reason}"
    if len(waiting) == len(asked) and min_runtime_s >= 6 * 3600:
        # every borrowed job started within the last 6 h: all of them were protected
        assert "within reclaim min-runtime" in head.reason, head.reason

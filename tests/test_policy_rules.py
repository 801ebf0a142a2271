"""The `drf` baseline, and reclaim's per-resource rule as a property over random mixes of
GPU, CPU and mixed jobs; the numbered rules of docs/policy.md are tables in
tests/test_policy_spec.py."""

from __future__ import annotations

import copy

from hypothesis import example, given, settings
from hypothesis import strategies as st

from events.model import JobPreempted
from scheduler.core import apply, fair_shares
from tests.builders import World, job, node, queue
from tests.test_policy import allocated


def preempted(decisions: list) -> list[tuple[str, str, str]]:  # type: ignore[type-arg]
    return [(d.job, d.rule, d.preemptor) for d in decisions if isinstance(d, JobPreempted)]


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

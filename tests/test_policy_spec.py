"""docs/policy.md's numbered rules as tables, one test per rule.

Each case is a small cluster (``given``: nodes and queues, and the policy's knobs), the
cycles that bring it to the situation (``steps``: ``(seconds, *events)``, where
``started("j")`` / ``finished("j")`` report a job's placed pods running or done), and what
the core decides in the last cycle (``then``). ``then`` names only what the case is about:

- ``placed``: the jobs allocated, in the order the cycle placed them;
- ``allocated``: job -> {pod: node} of those allocations;
- ``devices``: job -> [(device, milli-GPU)] of each allocation's first pod;
- ``backfilled``: job -> the reservation it was backfilled under ("" for none);
- ``preempted``: [(victim, rule, preemptor)] in decision order; ``preemptions``: the
  ``job_preempted`` decisions whole (lost work, checkpoint, queues);
- ``reasons``: job -> (reason, final) of the ``job_unschedulable`` decisions;
- ``status``: job -> status after the cycle; ``gpus``: queue -> GPUs allocated;
- ``fair`` / ``deserved``: queue -> GPU fair share / deserved quota in milli-GPUs.

§8 (fair share measured) is `tests/test_sim.py`, §9 (what a cycle costs) is
`tests/test_scale_paths.py`, §10 (the cluster is the truth) is `tests/test_cluster_truth.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from events.model import (
    BindFailed,
    Event,
    JobPreempted,
    JobSubmitted,
    JobUnschedulable,
    NodeCordoned,
    PodFinished,
    PodsAllocated,
    PodStarted,
    Tick,
)
from scheduler.core import fair_shares
from scheduler.core.fairshare import decay
from tests.builders import World, job, node, queue


@dataclass(frozen=True)
class _Report:
    """Every placed pod of ``job`` reports ``started`` or finished (not ``started``)."""

    job: str
    started: bool


def started(job_id: str) -> _Report:
    return _Report(job_id, started=True)


def finished(job_id: str) -> _Report:
    return _Report(job_id, started=False)


Step = tuple[Any, ...]  # (seconds, *events or reports)


def case(
    case_id: str,
    given: Iterable[Event],
    *steps: Step,
    then: dict[str, Any],
    marks: Any = (),
    **knobs: object,
) -> Any:  # a pytest ParameterSet
    return pytest.param(tuple(given), steps, knobs, then, id=case_id, marks=marks)


def _events(w: World, items: Iterable[object]) -> list[Event]:
    out: list[Event] = []
    for item in items:
        if isinstance(item, _Report):
            kind = PodStarted if item.started else PodFinished
            out += [kind(job=item.job, pod=p) for p in w.state.jobs[item.job].placements]
        else:
            out.append(item)  # type: ignore[arg-type]
    return out


def observe(w: World, got: list[Event], then: dict[str, Any]) -> dict[str, Any]:
    """What the cycle that returned ``got`` decided, in the terms ``then`` asks about."""
    allocs = [d for d in got if isinstance(d, PodsAllocated)]
    out: dict[str, Any] = {}
    for key, expected in then.items():
        match key:
            case "placed":
                out[key] = [d.job for d in allocs]
            case "allocated":
                out[key] = {d.job: {p.pod: p.node for p in d.placements} for d in allocs}
            case "backfilled":
                out[key] = {d.job: d.backfill_for for d in allocs}
            case "devices":
                out[key] = {
                    d.job: [(s.device, s.milli) for s in d.placements[0].gpus] for d in allocs
                }
            case "preempted":
                out[key] = [
                    (d.job, d.rule, d.preemptor) for d in got if isinstance(d, JobPreempted)
                ]
            case "preemptions":
                out[key] = [d for d in got if isinstance(d, JobPreempted)]
            case "reasons":
                out[key] = {
                    d.job: (d.reason, d.final) for d in got if isinstance(d, JobUnschedulable)
                }
            case "status":
                out[key] = {j: w.status(j) for j in expected}
            case "gpus":
                out[key] = {q: w.gpus_of(q) for q in expected}
            case "fair" | "deserved":
                shares = getattr(fair_shares(w.state), key)
                out[key] = {q: shares[q][0] for q in expected}
            case _:
                raise KeyError(key)
    return out


def play(
    given: tuple[Event, ...], steps: tuple[Step, ...], knobs: dict[str, object]
) -> tuple[World, list[Event]]:
    """Run the steps, one cycle each; the world and the last cycle's decisions."""
    w = World(*given, **knobs)
    got: list[Event] = []
    for seconds, *items in steps:
        got = w.at(seconds, *_events(w, items))
    return w, got


SPEC = ("given", "steps", "knobs", "then")


def check(
    given: tuple[Event, ...],
    steps: tuple[Step, ...],
    knobs: dict[str, object],
    then: dict[str, Any],
) -> None:
    w, got = play(given, steps, knobs)
    assert observe(w, got, then) == then


# --------------------------------------------------------------------------- §1 fair share

EIGHT_NODES = tuple(node(f"n{i}") for i in range(8))

FAIR_SHARE = [
    case(
        "percent-quotas-60-30-10-of-a-full-cluster",
        (
            *EIGHT_NODES,
            queue("train", percent=60),
            queue("interactive", percent=30),
            queue("experiments", percent=10),
        ),
        (
            1,
            *(
                job(f"demand-{q}", q, pods=8, gpus=8)
                for q in ("train", "interactive", "experiments")
            ),
        ),
        then={
            "deserved": {"train": 38_400, "interactive": 19_200, "experiments": 6_400},
            "fair": {"train": 38_400, "interactive": 19_200, "experiments": 6_400},
        },
    ),
    case(
        # tiny asks for 2 of its 4; the 22 GPUs left over go 2:1 to heavy and light
        "over-quota-divides-by-weight-capped-by-request",
        (
            *EIGHT_NODES[:4],
            queue("heavy", deserved=4, weight=2),
            queue("light", deserved=4),
            queue("tiny", deserved=4, weight=5),
        ),
        (
            1,
            job("h", "heavy", pods=4, gpus=8),
            job("l", "light", pods=4, gpus=8),
            job("t", "tiny", gpus=2),
        ),
        then={"fair": {"heavy": 4000 + 14_667, "light": 4000 + 7333, "tiny": 2000}},
    ),
    case(
        # other wants 1; org gets 12 and the 3 left; data wants nothing, so ml gets 15;
        # vision 6 and nlp 2 deserved, the 7 left split 1:3
        "divided-down-a-three-level-tree",
        (
            *EIGHT_NODES[:2],
            queue("org", deserved=12),
            queue("other", deserved=4),
            queue("ml", parent="org", deserved=8),
            queue("vision", parent="ml", deserved=6),
            queue("nlp", parent="ml", deserved=2, weight=3),
            queue("data", parent="org", deserved=4),
        ),
        (
            1,
            job("v", "vision", pods=2, gpus=8),
            job("n", "nlp", pods=2, gpus=8),
            job("o", "other", gpus=1),
        ),
        then={
            "fair": {
                "org": 15_000,
                "other": 1000,
                "ml": 15_000,
                "data": 0,
                "vision": 7750,
                "nlp": 7250,
            }
        },
    ),
    case(
        # deserved 12 + 12 + 2 on 16 GPUs: each gets min(deserved, request) whatever its name
        "over-subscribed-deserved-quotas-are-each-given-whatever-the-names",
        (
            *EIGHT_NODES[:2],
            queue("alpha", deserved=12),
            queue("zulu", deserved=12),
            queue("mid", deserved=2),
        ),
        (
            1,
            job("a", "alpha", pods=2, gpus=8),
            job("z", "zulu", pods=2, gpus=8),
            job("m", "mid", gpus=1),
        ),
        then={
            "fair": {"alpha": 12_000, "zulu": 12_000, "mid": 1000},
            "deserved": {"alpha": 12_000, "zulu": 12_000, "mid": 2000},
        },
    ),
    case(
        "higher-priority-queue-takes-the-over-quota-first",
        (
            *EIGHT_NODES[:2],
            queue("prod", deserved=4, priority=10),
            queue("dev", deserved=4, weight=100),
        ),
        (1, job("p", "prod", pods=2, gpus=8), job("d", "dev", pods=2, gpus=8)),
        then={"fair": {"prod": 12_000, "dev": 4000}},
    ),
    case(
        # prod (priority 1) is capped by its limit of 12; the 12 left go 1:3 to dev and
        # research, whose 9 split 1:2 between r1 and r2
        "limits-weights-and-priorities-by-hand",
        (
            *EIGHT_NODES[:4],
            queue("prod", deserved=8, limit=12, priority=1),
            queue("dev", deserved=8),
            queue("research", weight=3),
            queue("r1", parent="research"),
            queue("r2", parent="research", weight=2),
        ),
        (1, *(job(f"{q}-{i}", q, gpus=8) for q in ("prod", "dev", "r1", "r2") for i in range(4))),
        then={"fair": {"prod": 12_000, "dev": 11_000, "research": 9000, "r1": 3000, "r2": 6000}},
    ),
    case(
        # a held all 16 GPUs for an hour; b's over-quota weight rises, a's falls (kValue)
        "time-based-share-gives-over-quota-to-the-queue-that-used-less",
        (*EIGHT_NODES[:2], queue("a"), queue("b")),
        (0, job("hog", "a", pods=2, gpus=8)),
        (1, started("hog")),
        (3600, finished("hog")),
        (3601, job("a2", "a", pods=2, gpus=8), job("b2", "b", pods=2, gpus=8)),
        then={"fair": {"a": 4000, "b": 12_000}},
        half_life_ms=3_600_000,
    ),
    case(
        "without-a-half-life-past-usage-does-not-matter",
        (*EIGHT_NODES[:2], queue("a"), queue("b")),
        (0, job("hog", "a", pods=2, gpus=8)),
        (1, started("hog")),
        (3600, finished("hog")),
        (3601, job("a2", "a", pods=2, gpus=8), job("b2", "b", pods=2, gpus=8)),
        then={"fair": {"a": 8000, "b": 8000}},
    ),
    case(
        "a-queue-that-asks-for-nothing-gets-no-share",
        (*EIGHT_NODES[:2], queue("busy", deserved=4), queue("idle", deserved=4)),
        (1, job("b", "busy", pods=2, gpus=8)),
        then={"fair": {"busy": 16_000, "idle": 0}},
    ),
]


@pytest.mark.parametrize(SPEC, FAIR_SHARE)
def test_fair_share(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


@pytest.mark.parametrize(
    ("usage", "elapsed_ms", "expected"),
    [
        pytest.param(1 << 40, 1000, 1 << 39, id="one-half-life-halves"),
        pytest.param(1 << 40, 3000, 1 << 37, id="three-half-lives-take-an-eighth"),
        pytest.param(1000, 0, 1000, id="no-time-no-decay"),
    ],
)
def test_usage_decays_by_half_per_half_life_exactly(
    usage: int, elapsed_ms: int, expected: int
) -> None:
    assert decay(usage, elapsed_ms, 1000) == expected


def test_usage_decays_between_half_lives() -> None:
    assert 1 << 39 < decay(1 << 40, 500, 1000) < 1 << 40


# --------------------------------------------------------------------------- §2 queue and job order

QUEUE_ORDER = [
    case(
        # a's head is held by a's quota (5 of 6 held, needs 4): a is ranked by a2, which
        # fits its quota, so a goes before b (above its own) and nothing b would borrow
        # in the cycle is reclaimed in it; ranked by its head, b went first, borrowed the
        # free GPUs and a2 reclaimed them at once
        "a-queue-is-ranked-by-the-job-it-tries-not-by-a-head-its-quota-holds",
        (node("n1"), queue("a", deserved=6), queue("b", deserved=2)),
        (0, job("a1", "a", gpus=5, cls="build"), job("b1", "b", gpus=1)),
        (1, started("a1"), started("b1")),
        (
            10,
            job("big", "a", gpus=4, cls="build"),
            job("a2", "a", gpus=1, cls="build"),
            job("b2", "b", gpus=2),
        ),
        then={"placed": ["a2"], "preempted": []},
        backfill=True,
    ),
    case(
        # rich has the higher priority but no quota; poor's head fits within its quota
        # both heads fit their fair share of 8; rich has the higher priority, but only
        # poor's head fits within its deserved quota
        "a-queue-whose-head-fits-its-deserved-quota-goes-first",
        (node("n1"), node("n2"), queue("rich", priority=5), queue("poor", deserved=8)),
        (1, job("r", "rich", gpus=8), job("p", "poor", gpus=8)),
        then={"placed": ["p", "r"], "fair": {"rich": 8000, "poor": 8000}},
    ),
    case(
        # q0's gang would borrow beyond its quota of 1; q1's job fits its own: q1 goes
        # first, and nothing borrowed in the cycle is reclaimed in it
        "a-queue-within-its-quota-goes-before-one-that-would-borrow",
        (
            node("a", gpus=2),
            node("b", gpus=2),
            queue("q0", deserved=1, weight=0),
            queue("q1", deserved=1, weight=0),
        ),
        (1, job("gang", "q0", pods=4, gpus=1), job("svc", "q1", gpus=1, cls="build")),
        then={"placed": ["svc"], "preempted": []},
    ),
    case(
        # by weight y's fair share is 12 and x's 4; y holds 8 and asks 4 more (within),
        # x asks 8 (beyond): y goes first though x's dominant share is lower
        "a-queue-within-its-fair-share-goes-before-one-that-would-exceed-it",
        (node("n1"), node("n2"), queue("x"), queue("y", weight=3)),
        (0, job("y0", "y", gpus=8)),
        (1, started("y0")),
        (2, job("x1", "x", gpus=8), job("y1", "y", gpus=4)),
        then={"allocated": {"y1": {"y1-0": "n2"}}, "fair": {"x": 4000, "y": 12_000}},
    ),
    case(
        # both heads are above their quota of 0 and within their fair share; low's job
        # is the older
        "higher-queue-priority-goes-first-when-both-are-above-their-quota",
        (*(node(f"n{i}") for i in range(4)), queue("low"), queue("high", priority=3)),
        (1, job("l", "low", gpus=8), job("h", "high", gpus=8)),
        then={"placed": ["h", "l"]},
    ),
    case(
        # both heads fit within quota and fair share; a's job is the older
        "lower-dominant-share-goes-first",
        (node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8)),
        (0, job("a0", "a", gpus=2)),
        (1, job("a1", "a", gpus=4), job("b1", "b", gpus=4)),
        then={"placed": ["b1", "a1"]},
    ),
    case(
        # everything else equal, b has waited longer; a's name sorts first
        "the-queue-with-the-oldest-pending-job-goes-first",
        (node("n1"), queue("a"), queue("b"), queue("svc", deserved=8)),
        (0, job("busy", "svc", gpus=8, cls="build")),
        (1, job("b1", "b", gpus=8)),
        (2, job("a1", "a", gpus=8)),
        (3, finished("busy")),
        then={"placed": ["b1"]},
    ),
]


@pytest.mark.parametrize(SPEC, QUEUE_ORDER)
def test_queue_order(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


_ONE_GPU_HELD = (
    (node("n1", gpus=1), queue("a", deserved=1)),
    (1, job("first", "a", preemptible=False)),  # takes the only GPU and cannot be evicted
)

JOB_ORDER = [
    case(
        "a-higher-priority-class-goes-first",
        _ONE_GPU_HELD[0],
        _ONE_GPU_HELD[1],
        (2, job("old", "a"), job("young", "a")),
        (3, job("urgent", "a", cls="build-preemptible")),
        (10, finished("first")),
        then={"placed": ["urgent"]},
    ),
    case(
        "within-a-class-the-job-submitted-first-goes-first",
        _ONE_GPU_HELD[0],
        _ONE_GPU_HELD[1],
        (2, job("old", "a")),
        (3, job("young", "a")),
        (10, finished("first")),
        then={"placed": ["old"]},
    ),
    case(
        "submitted-in-one-cycle-the-first-submitted-goes-first",
        _ONE_GPU_HELD[0],
        _ONE_GPU_HELD[1],
        (2, job("zed", "a"), job("abe", "a")),
        (10, finished("first")),
        then={"placed": ["zed"]},
    ),
    case(
        # a big gang at its queue's head is not overtaken by the small job behind it
        "a-blocked-head-holds-its-queue-back",
        (node("n1"), queue("a")),
        (1, job("busy", "a", gpus=4)),
        (2, job("big", "a", gpus=8), job("small", "a", gpus=1)),
        then={"placed": [], "status": {"small": "pending"}},
    ),
    case(
        "the-head-starts-once-the-capacity-is-back",
        (node("n1"), queue("a")),
        (1, job("busy", "a", gpus=4)),
        (2, job("big", "a", gpus=8), job("small", "a", gpus=1)),
        (3, finished("busy")),
        then={"placed": ["big"]},
    ),
]


@pytest.mark.parametrize(SPEC, JOB_ORDER)
def test_job_order_within_a_queue(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


# --------------------------------------------------------------------------- §3 admission

_AT_LIMIT = (node("n1"), node("n2"), queue("a", deserved=8, limit=8))

ADMISSION = [
    case(
        "a-queue-limit-holds-work-back-with-a-reason",
        (node("n1"), queue("a", limit=4)),
        (1, job("j1", "a", gpus=4)),
        (2, job("j2", "a", gpus=2)),
        then={
            "placed": [],
            "reasons": {
                "j2": ("queue 'a' is at its limit: 4 of 4 GPUs in use, job needs 2", False)
            },
        },
    ),
    case(
        "a-parent-limit-holds-its-children",
        (node("n1"), queue("org", limit=4), queue("t1", parent="org"), queue("t2", parent="org")),
        (1, job("x", "t1", gpus=3)),
        (2, job("y", "t2", gpus=2)),
        then={
            "placed": [],
            "reasons": {
                "y": (
                    "queue 'org' is at its limit: 3 of 4 GPUs in use, job needs 2 "
                    "(its queue 't2' is under 'org')",
                    False,
                )
            },
        },
    ),
    case(
        # starting on free n2 would take a to 16: hi starts by preempting low
        "at-its-limit-a-queue-preempts-its-own-lower-priority-job",
        _AT_LIMIT,
        (0, job("low", "a", gpus=8)),
        (1, started("low")),
        (10, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": [("low", "preempt", "hi")], "placed": ["hi"], "gpus": {"a": 8}},
    ),
    case(
        # hi is pinned to free n2: low is kept as a victim although hi does not sit on
        # its node (the limit needs it gone, not the placement)
        "a-limit-s-victim-is-kept-off-the-gang-s-nodes",
        (node("n1", host="n1"), node("n2", host="n2"), queue("a", deserved=8, limit=8)),
        (0, job("low", "a", gpus=8, selector={"host": "n1"})),
        (1, started("low")),
        (10, job("hi", "a", gpus=8, cls="build-preemptible", selector={"host": "n2"})),
        then={
            "preempted": [("low", "preempt", "hi")],
            "allocated": {"hi": {"hi-0": "n2"}},
            "gpus": {"a": 8},
        },
    ),
    case(
        # b is above its quota and a within its own, but reclaiming b1 would leave a
        # over its limit: only a's own lower-priority job may go
        "at-its-limit-a-queue-takes-nothing-from-other-queues",
        (node("n1"), node("n2"), queue("a", deserved=16, limit=8), queue("b")),
        (0, job("low", "a", gpus=8), job("b1", "b", gpus=8)),
        (1, started("low"), started("b1")),
        (10, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": [("low", "preempt", "hi")], "gpus": {"a": 8}},
    ),
    case(
        # org may hold 8; a holds 4 + 2 + 2. The cheapest victim freeing 4 (big,
        # checkpointed 3 s ago) goes, and nothing more
        "at-its-limit-a-queue-preempts-only-what-brings-it-back-within-it",
        (
            node("n1", gpus=4),
            node("n2", gpus=8),
            queue("org", deserved=8, limit=8),
            queue("a", parent="org", deserved=8),
        ),
        (0, job("big", "a", gpus=4, checkpoint_s=5)),
        (1, job("s1", "a", gpus=2), job("s2", "a", gpus=2)),
        (2, started("big"), started("s1"), started("s2")),
        (20, job("hi", "a", gpus=4, cls="build-preemptible")),
        then={"preempted": [("big", "preempt", "hi")], "placed": ["hi"], "gpus": {"org": 8}},
    ),
    case(
        # a may hold 8 and holds x (4 GPUs, on n1) and y (2, on n2); hi (4) is pinned to
        # free n3, so 4 must go. y, the cheaper, is evicted first but frees too little;
        # with x evicted too, y is given back: x alone brings a within its limit
        "a-limit-s-victims-are-no-more-than-the-limit-needs",
        (
            node("n1", host="n1"),
            node("n2", host="n2"),
            node("n3", host="n3"),
            queue("a", deserved=8, limit=8),
        ),
        (
            0,
            job("x", "a", gpus=4, selector={"host": "n1"}),
            job("z", "a", gpus=2, selector={"host": "n2"}, cls="build-preemptible"),
        ),
        (1, started("x"), started("z")),
        (5, job("y", "a", gpus=2, selector={"host": "n2"})),
        (6, started("y")),
        (20, job("hi", "a", gpus=4, cls="build-preemptible", selector={"host": "n3"})),
        then={
            "preempted": [("x", "preempt", "hi")],
            "allocated": {"hi": {"hi-0": "n3"}},
            "gpus": {"a": 8},
        },
    ),
    case(
        # hi (4) needs all of n2, where y holds 2; a must shed 4 for its limit. y is
        # evicted first and frees too little, x then frees enough: both are kept, y for
        # the placement and x for the limit
        "a-limit-s-victims-and-the-placement-s-are-both-kept",
        (node("n1", host="n1"), node("n2", gpus=4, host="n2"), queue("a", deserved=8, limit=8)),
        (
            0,
            job("x", "a", gpus=4, selector={"host": "n1"}),
            job("z", "a", gpus=2, selector={"host": "n1"}, cls="build-preemptible"),
        ),
        (1, started("x"), started("z")),
        (5, job("y", "a", gpus=2, selector={"host": "n2"})),
        (6, started("y")),
        (20, job("hi", "a", gpus=4, cls="build-preemptible", selector={"host": "n2"})),
        then={
            "preempted": [("y", "preempt", "hi"), ("x", "preempt", "hi")],
            "allocated": {"hi": {"hi-0": "n2"}},
            "gpus": {"a": 6},
        },
    ),
    case(
        # peer has hi's priority: only low may go, and it frees 4 of the 8 needed
        "at-its-limit-a-queue-waits-when-lower-priority-jobs-cannot-free-enough",
        _AT_LIMIT,
        (0, job("peer", "a", gpus=4, cls="build-preemptible"), job("low", "a", gpus=4)),
        (1, started("peer"), started("low")),
        (10, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={
            "preempted": [],
            "reasons": {
                "hi": ("queue 'a' is at its limit: 8 of 8 GPUs in use, job needs 8", False)
            },
        },
    ),
    case(
        "a-non-preemptible-job-runs-only-within-the-deserved-quota",
        (node("n1"), queue("a", deserved=2), queue("b", deserved=6)),
        (1, job("nb1", "a", gpus=2, cls="build")),
        (2, job("nb2", "a", gpus=1, cls="build")),
        then={
            "placed": [],
            "reasons": {
                "nb2": (
                    "non-preemptible job waits for deserved quota of 'a': 2 of 2 GPUs held by "
                    "non-preemptible jobs, job needs 1",
                    False,
                )
            },
        },
    ),
    case(
        "preemptible-jobs-do-not-count-against-the-non-preemptible-quota",
        (node("n1"), queue("a", deserved=2)),
        (1, job("t", "a", gpus=4)),
        (2, job("nb", "a", gpus=2, cls="build")),
        then={"placed": ["nb"]},
    ),
    case(
        "a-quota-edit-keeps-non-preemptible-usage-counted",
        (node("n1"), node("n2"), queue("a", deserved=8)),
        (0, job("np", "a", gpus=8, cls="build")),
        (5, queue("a", deserved=8, weight=2)),
        (10, job("np2", "a", gpus=8, cls="build")),
        then={
            "placed": [],
            "reasons": {
                "np2": (
                    "non-preemptible job waits for deserved quota of 'a': 8 of 8 GPUs held by "
                    "non-preemptible jobs, job needs 8",
                    False,
                )
            },
        },
    ),
    case(
        "a-failed-bind-backs-off",
        (node("n1"), queue("a")),
        (0, job("j", "a", gpus=8)),
        (1, BindFailed(job="j", pod="j-0", node="n1", reason="node not ready")),
        then={
            "placed": [],
            "reasons": {"j": ("backing off after 1 failed binds until +00:00:11", False)},
        },
        bind_backoff_ms=10_000,
    ),
    case(
        "a-job-is-placed-again-when-its-back-off-ends",
        (node("n1"), queue("a")),
        (0, job("j", "a", gpus=8)),
        (1, BindFailed(job="j", pod="j-0", node="n1", reason="node not ready")),
        (11, Tick()),
        then={"placed": ["j"]},
        bind_backoff_ms=10_000,
    ),
    case(
        "a-second-failed-bind-doubles-the-back-off",
        (node("n1"), queue("a")),
        (0, job("j", "a", gpus=8)),
        (1, BindFailed(job="j", pod="j-0", node="n1", reason="node not ready")),
        (11, Tick()),
        (12, BindFailed(job="j", pod="j-0", node="n1", reason="again")),
        then={
            "placed": [],
            "reasons": {"j": ("backing off after 2 failed binds until +00:00:32", False)},
        },
        bind_backoff_ms=10_000,
    ),
]


@pytest.mark.parametrize(SPEC, ADMISSION)
def test_admission(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


# --------------------------------------------------------------------------- §4 gang placement


def _leader_gang() -> JobSubmitted:
    """Two 1-GPU workers and a leader needing 4 GPUs on one node; at least 2 pods and
    the leader must start."""
    gang = job("g", "a", pods=3, gpus=1, groups=("worker", "worker", "leader"), min_members=2,
               min_per_group={"leader": 1})  # fmt: skip
    leader = msgspec.structs.replace(gang.pods[2], gpu_milli=4000)
    return msgspec.structs.replace(gang, pods=(*gang.pods[:2], leader))


_LEADER_WORLD = (node("n1", gpus=4, host="n1"), node("n2", gpus=2, host="n2"), queue("a"))
_RACKS = (node("r1-a", rack="r1"), node("r1-b", rack="r1"), node("r2-a", rack="r2"),
          node("r2-b", rack="r2"), queue("a"))  # fmt: skip

GANG_PLACEMENT = [
    case(
        "a-gang-that-fits-is-placed-whole-in-one-decision",
        (node("n1"), node("n2"), queue("a")),
        (1, job("g", "a", pods=2, gpus=8)),
        then={"allocated": {"g": {"g-0": "n1", "g-1": "n2"}}, "status": {"g": "allocated"}},
    ),
    case(
        "a-gang-that-does-not-fit-now-places-nothing-and-says-why",
        (node("n1"), node("n2"), queue("a")),
        (1, job("small", "a", gpus=4)),
        (2, job("g", "a", pods=2, gpus=8)),
        then={
            "placed": [],
            "reasons": {
                "g": (
                    "waiting for capacity: gang needs 2 pods (2×8 GPUs), free capacity fits 1 of "
                    "them now",
                    False,
                )
            },
        },
    ),
    case(
        "min-members-places-the-required-part-and-the-extras-that-fit",
        (node("n1", gpus=4), queue("a")),
        (1, job("elastic", "a", pods=6, gpus=1, min_members=2)),
        then={"allocated": {"elastic": {f"elastic-{k}": "n1" for k in range(4)}}},
    ),
    case(
        # leader + 2 required workers + 1 extra fill the 4 GPUs
        "every-sub-group-minimum-is-placed-and-extras-that-fit",
        (node("n1", gpus=4), queue("a")),
        (
            1,
            job(
                "g",
                "a",
                pods=5,
                gpus=1,
                min_members=3,
                groups=("leader", "worker", "worker", "worker", "worker"),
                min_per_group={"leader": 1, "worker": 2},
            ),
        ),
        then={"allocated": {"g": {f"g-{k}": "n1" for k in range(4)}}},
    ),
    case(
        # with n1 half busy only the two workers fit (on n2): the gang's 2 pods, but not
        # its leader
        "a-gang-whose-leader-cannot-fit-places-nothing",
        _LEADER_WORLD,
        (0, job("busy", "a", gpus=2, selector={"host": "n1"})),
        (1, started("busy")),
        (2, _leader_gang()),
        then={
            "placed": [],
            "reasons": {
                "g": (
                    "waiting for capacity: gang needs 2 pods (5 GPUs), free capacity fits 1 of them "
                    "now",
                    False,
                )
            },
        },
    ),
    case(
        "a-gang-whose-leader-fits-again-starts-whole",
        _LEADER_WORLD,
        (0, job("busy", "a", gpus=2, selector={"host": "n1"})),
        (1, started("busy")),
        (2, _leader_gang()),
        (3, finished("busy")),
        then={"allocated": {"g": {"g-0": "n2", "g-1": "n2", "g-2": "n1"}}},
    ),
    case(
        "bin-packing-fills-one-node-before-the-next",
        (node("n1"), node("n2"), queue("a")),
        (1, job("x", "a", gpus=4), job("y", "a", gpus=4)),
        then={"allocated": {"x": {"x-0": "n1"}, "y": {"y-0": "n1"}}},
    ),
    case(
        "bin-packing-takes-the-node-left-with-the-least-free-gpu",
        (node("n1"), node("n2"), queue("a")),
        (0, job("x", "a", gpus=2, placement="spread"), job("y", "a", gpus=6, placement="spread")),
        (1, job("z", "a", gpus=2)),
        then={"allocated": {"z": {"z-0": "n2"}}},
    ),
    case(
        "fractional-pods-share-one-device",
        (node("n1", gpus=2), queue("a")),
        (1, job("h1", "a", gpus=0.5), job("h2", "a", gpus=0.5), job("q", "a", gpus=0.25)),
        then={"devices": {"h1": [(0, 500)], "h2": [(0, 500)], "q": [(1, 250)]}},
    ),
    case(
        "a-fraction-goes-to-the-device-it-fills-best",
        (node("n1", gpus=2), queue("a")),
        (0, job("h", "a", gpus=0.5), job("q", "a", gpus=0.75, placement="spread")),
        (1, job("f", "a", gpus=0.25)),
        then={"devices": {"f": [(1, 250)]}},
    ),
    case(
        "whole-gpus-take-the-lowest-numbered-free-devices",
        (node("n1", gpus=4), queue("a")),
        (0, job("x", "a", gpus=1)),
        (1, job("y", "a", gpus=2)),
        then={"devices": {"y": [(1, 1000), (2, 1000)]}},
    ),
    case(
        "a-gpu-memory-request-takes-its-share-of-the-device",
        (node("n1", gpus=1, gpu_memory=81_920), queue("a")),
        (1, job("m1", "a", gpus=0, gpu_memory=20_480), job("m2", "a", gpus=0, gpu_memory=40_960)),
        then={"devices": {"m1": [(0, 250)], "m2": [(0, 500)]}},
    ),
    case(
        "cpu-is-respected-where-nodes-model-it",
        (node("n1", cpu=8000), node("n2", cpu=32_000), queue("a")),
        (1, job("cpu-heavy", "a", gpus=1, cpu=16_000)),
        then={"allocated": {"cpu-heavy": {"cpu-heavy-0": "n2"}}},
    ),
    case(
        "cordoned-nodes-take-no-pods",
        (node("n1"), node("n2"), queue("a"), NodeCordoned(node="n1")),
        (1, job("j", "a", gpus=8), job("k", "a", gpus=1)),
        then={"allocated": {"j": {"j-0": "n2"}}},
    ),
    case(
        "a-node-selector-is-honoured",
        (node("n1", pool="x"), node("n2", pool="y"), queue("a")),
        (1, job("j", "a", gpus=1, selector={"pool": "y"})),
        then={"allocated": {"j": {"j-0": "n2"}}},
    ),
    case(
        "taints-keep-off-pods-that-do-not-tolerate-them",
        (node("gpu-spot", taints=("spot=true:NoSchedule",)), node("plain", gpus=1), queue("a")),
        (1, job("x", "a", gpus=2)),
        then={"placed": []},
    ),
    case(
        "a-pod-tolerating-the-taint-by-key-may-use-the-node",
        (node("gpu-spot", taints=("spot=true:NoSchedule",)), node("plain", gpus=1), queue("a")),
        (1, job("y", "a", gpus=2, tolerations=("spot",))),
        then={"allocated": {"y": {"y-0": "gpu-spot"}}},
    ),
    case(
        "a-pod-tolerating-the-taint-by-key-and-value-may-use-the-node",
        (node("gpu-spot", taints=("spot=true:NoSchedule",)), node("plain", gpus=1), queue("a")),
        (
            1,
            job("y", "a", gpus=2, tolerations=("spot=true",)),
            job("z", "a", gpus=2, tolerations=("spot=false",)),
        ),
        then={"allocated": {"y": {"y-0": "gpu-spot"}}},
    ),
    case(
        "spread-per-queue-puts-jobs-on-the-least-allocated-node",
        (node("n1"), node("n2"), queue("a", placement="spread")),
        (1, job("x", "a", gpus=2), job("y", "a", gpus=2)),
        then={"allocated": {"x": {"x-0": "n1"}, "y": {"y-0": "n2"}}},
    ),
    case(
        "spread-per-job-overrides-the-queue",
        (node("n1"), node("n2"), queue("a")),
        (1, job("g", "a", pods=2, gpus=2, placement="spread")),
        then={"allocated": {"g": {"g-0": "n1", "g-1": "n2"}}},
    ),
    case(
        "spread-by-policy",
        (node("n1"), node("n2"), queue("a")),
        (1, job("x", "a", gpus=2), job("y", "a", gpus=2)),
        then={"allocated": {"x": {"x-0": "n1"}, "y": {"y-0": "n2"}}},
        placement="spread",
    ),
    case(
        # busy lands on r1-a: r1 has 12 free, r2 16; the gang fits only in r2
        "required-topology-keeps-the-gang-in-one-rack",
        _RACKS,
        (0, job("busy", "a", gpus=4)),
        (1, job("g", "a", pods=2, gpus=8, topology="rack", topology_required=True)),
        then={"allocated": {"g": {"g-0": "r2-a", "g-1": "r2-b"}}},
    ),
    case(
        "topology-places-in-the-fullest-domain-that-holds-the-gang",
        _RACKS,
        (0, job("busy", "a", gpus=4)),
        (1, job("g", "a", pods=2, gpus=2, topology="rack", topology_required=True)),
        then={"allocated": {"g": {"g-0": "r1-a", "g-1": "r1-a"}}},
    ),
    case(
        # each rack has one node half busy: no rack holds the gang now
        "required-topology-waits-rather-than-spread",
        _RACKS,
        (
            0,
            job("b1", "a", gpus=4, selector={"rack": "r1"}),
            job("b2", "a", gpus=4, selector={"rack": "r2"}),
        ),
        (1, job("g", "a", pods=2, gpus=8, topology="rack", topology_required=True)),
        then={"placed": []},
    ),
    case(
        "preferred-topology-falls-back-to-several-domains",
        (node("r1-a", rack="r1"), node("r2-a", rack="r2"), queue("a")),
        (1, job("g", "a", pods=2, gpus=8, topology="rack")),
        then={"allocated": {"g": {"g-0": "r1-a", "g-1": "r2-a"}}},
    ),
]


@pytest.mark.parametrize(SPEC, GANG_PLACEMENT)
def test_gang_placement(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


# --------------------------------------------------------------------------- §5 reclaim and preempt

_TWO_QUEUES = (node("n1"), node("n2"), queue("a", deserved=8), queue("b", deserved=8))
_A_RUNS_TWO = (  # a1 checkpoints every 600 s and started at 10 s; a2 started at 100 s
    (0, job("a1", "a", gpus=8, checkpoint_s=600), job("a2", "a", gpus=8)),
    (10, started("a1")),
    (100, started("a2")),
)

_ORG_HOLDS_ITS_QUOTA = (
    node("n1"),
    queue("org", deserved=8),
    queue("a1", parent="org", deserved=2),
    queue("a2", parent="org", deserved=6),
)


def _pinned(name: str, q: str, host: str) -> JobSubmitted:
    return job(name, q, gpus=1, selector={"host": host})


# Four 4-GPU nodes filled one GPU per job. a deserves 8 and holds 14, so quota reclaim may
# take 6 of its GPUs; c holds 2 within its quota, one on n2 and one on n3. a's newest
# jobs sit beside c's on n2 and n3, and as new on n1; n4 holds a's older (dearer) jobs.
_SCATTERED = (
    (*(node(f"n{i}", gpus=4, host=f"n{i}") for i in range(1, 5)),
     queue("a", deserved=8), queue("b", deserved=4), queue("c", deserved=4)),
    (0, *(_pinned(f"d{k}", "a", "n4") for k in range(4)),
     *(_pinned(f"w{k}", "a", "n1") for k in range(4)),
     _pinned("c2", "c", "n2"), _pinned("c3", "c", "n3"),
     *(_pinned(f"x{k}", "a", "n2") for k in range(3)),
     *(_pinned(f"y{k}", "a", "n3") for k in range(3))),
    (1, *(started(f"d{k}") for k in range(4)), started("c2"), started("c3")),
    (3, *(started(f"w{k}") for k in range(4)), *(started(f"x{k}") for k in range(3)),
     *(started(f"y{k}") for k in range(3))),
)  # fmt: skip

# 4 nodes x 8 GPUs; A deserves 24, B 8. B borrows all 32 GPUs with 1-GPU train jobs, one
# a minute, each checkpointing every 30 min, so their checkpoints are staggered. At 2 h 10 min
# A asks for three whole nodes: every one fits its deserved quota, and B holds 24 above its
# own, so all three start in that cycle. The third's victims (n2's b16-b23, 156 GPU-min
# together; n1's lose 160) are each dearer than any the victim order counted for it; in-quota
# reclaim is a guarantee, not bounded by that ceiling (docs/policy.md §5).
_B_BORROWS_ALL = (
    *(
        (60 * k, job(f"b{k:02d}", "B", checkpoint_s=1800), started(f"b{k - 1:02d}"))
        for k in range(1, 32)
    ),
    (60 * 32, started("b31")),
)
_A_ASKS_THREE_NODES = (7800, *(job(f"a{i}", "A", gpus=8, checkpoint_s=1800) for i in range(3)))
_WHOLE_NODES = (*(node(f"n{i}") for i in range(4)), queue("A", deserved=24), queue("B", deserved=8))


RECLAIM = [
    case(
        "in-quota-reclaim-frees-whole-nodes-whose-victims-are-dearer-than-the-order-counted",
        _WHOLE_NODES,
        (0, job("b00", "B", checkpoint_s=1800)),
        *_B_BORROWS_ALL,
        _A_ASKS_THREE_NODES,
        then={
            "allocated": {"a0": {"a0-0": "n0"}, "a1": {"a1-0": "n3"}, "a2": {"a2-0": "n2"}},
            "gpus": {"A": 24, "B": 8},
        },
        lost_work_ratio_milli=100,  # the shipped default (0.1)
        backfill=True,
    ),
    case(
        # in victim order 6 of a's newest jobs (x, y on n2, n3 first: same lost work, newest
        # first) spend its bound of 6 GPUs, and c's jobs keep those nodes from the 4-GPU
        # gang; node by node, n1 and n4 are the nodes whose every job may go, n1 the
        # cheaper (n4's jobs are also dearer than any the victim order counted)
        "reclaim-frees-the-cheapest-whole-node-when-scattered-victims-would-not-do",
        _SCATTERED[0],
        *_SCATTERED[1:],
        (10, job("b1", "b", gpus=4)),
        then={
            "preempted": [(f"w{k}", "reclaim", "b1") for k in range(4)],
            "allocated": {"b1": {"b1-0": "n1"}},
            "gpus": {"a": 10, "b": 4, "c": 2},
        },
        lost_work_ratio_milli=100,  # the shipped default (0.1): no search beyond the order
    ),
    case(
        # a's head needs 4 more of its non-preemptible quota (4 of 6 used): its quota holds
        # it back, not capacity, so it blocks nothing; a2 fits a's quota and reclaims b1
        # (b holds 4 against its quota of 2), as the queue's head would; the first is
        # then held at 6 of 6
        "a-head-held-by-its-quota-lets-the-next-job-reclaim",
        (node("n1"), queue("a", deserved=6), queue("b", deserved=2)),
        (0, job("a1", "a", gpus=4, cls="build"), job("b1", "b", gpus=4)),
        (1, started("a1"), started("b1")),
        (10, job("big", "a", gpus=4, cls="build"), job("a2", "a", gpus=2, cls="build")),
        then={
            "preempted": [("b1", "reclaim", "a2")],
            "placed": ["a2"],
            "reasons": {
                "big": (
                    "non-preemptible job waits for deserved quota of 'a': 6 of 6 GPUs held by "
                    "non-preemptible jobs, job needs 4",
                    False,
                )
            },
        },
        backfill=True,
    ),
    case(
        # a1 checkpointed at 610 s and loses 390 s x 8 GPUs; a2 would lose 900 s x 8
        "a-queue-under-its-quota-reclaims-the-cheapest-job-of-a-queue-over-it",
        _TWO_QUEUES,
        *_A_RUNS_TWO,
        (1000, job("b1", "b", gpus=8)),
        then={
            "preemptions": [
                JobPreempted(
                    job="a1",
                    queue="a",
                    pods=("a1-0",),
                    preemptor="b1",
                    preemptor_queue="b",
                    rule="reclaim",
                    lost_gpu_ms=390_000 * 8,
                    checkpointed_ms=600_000,
                )
            ],
            "allocated": {"b1": {"b1-0": "n1"}},
            "status": {"a1": "pending"},
            "gpus": {"a": 8, "b": 8},
        },
    ),
    case(
        "quota-reclaim-may-leave-the-victim-queue-below-its-fair-share",
        _TWO_QUEUES,
        (0, job("a1", "a", pods=2, gpus=8)),
        (1, started("a1")),
        (10, job("b1", "b", gpus=8)),
        then={"preempted": [("a1", "reclaim", "b1")], "placed": ["b1"]},
    ),
    case(
        # b deserves 2 and holds 4 on n1; a (deserves 4) needs a whole 4-GPU node: taking
        # b's second job would pick it with b already at its quota
        "quota-reclaim-picks-a-victim-only-while-its-queue-is-above-its-quota",
        (
            node("n1", gpus=4),
            node("n2", gpus=4),
            queue("a", deserved=4, weight=0),
            queue("b", deserved=2, weight=0),
            queue("c", deserved=1, weight=0),
        ),
        (0, job("b1", "b", gpus=2), job("b2", "b", gpus=2)),
        (0.5, job("c1", "c", gpus=1)),
        (1, started("b1"), started("b2"), started("c1")),
        (10, job("a1", "a", gpus=4)),
        then={"preempted": [], "placed": []},
    ),
    case(
        # z has no quota and no weight (fair share 0) but runs the only 2-GPU job
        "a-queue-whose-fair-share-is-zero-gives-up-its-last-job",
        (node("n1", gpus=2), queue("a", weight=1), queue("z", weight=0)),
        (0, job("z1", "z", gpus=2)),
        (1, started("z1")),
        (10, job("a1", "a", gpus=2)),
        then={"preempted": [("z1", "reclaim", "a1")], "placed": ["a1"]},
    ),
    case(
        # no quotas, equal weights: a's fair share is 8 of the 16 b holds
        "fair-share-reclaim-takes-from-a-queue-above-its-fair-share",
        (node("n1"), node("n2"), queue("a"), queue("b")),
        (0, job("b1", "b", gpus=8), job("b2", "b", gpus=8)),
        (1, started("b1"), started("b2")),
        (10, job("a1", "a", gpus=8)),
        then={"preempted": [("b2", "reclaim", "a1")], "placed": ["a1"]},
    ),
    case(
        # a's 12-GPU job would take it beyond its fair share of 8
        "fair-share-reclaim-keeps-the-reclaimer-within-its-fair-share",
        (node("n1", gpus=16), queue("a"), queue("b")),
        (0, job("b1", "b", gpus=8), job("b2", "b", gpus=8)),
        (1, started("b1"), started("b2")),
        (10, job("a1", "a", gpus=12)),
        then={"preempted": [], "placed": []},
    ),
    case(
        # fair shares 4 / 4 / 8 by weight: c holds 4 of its 8, b 12 of its 4 and a asks for
        # 4 of its 4: the victim comes from b, never from c, which is below its share
        "fair-share-reclaim-takes-only-from-queues-above-their-share",
        (node("n1", gpus=16), queue("a"), queue("b"), queue("c", weight=2)),
        (0, job("c1", "c", gpus=4)),
        (0.5, job("b1", "b", gpus=4), job("b2", "b", gpus=4), job("b3", "b", gpus=4)),
        (1, started("c1"), started("b1"), started("b2"), started("b3")),
        (10, job("a1", "a", gpus=4)),
        then={"preempted": [("b3", "reclaim", "a1")], "placed": ["a1"]},
    ),
    case(
        "a-queue-at-its-fair-share-is-not-reclaimed-from",
        _TWO_QUEUES,
        (0, job("a1", "a", gpus=8), job("b1", "b", gpus=8)),
        (10, job("b2", "b", gpus=8)),
        then={"preempted": []},
    ),
    case(
        # 8 GPUs; org and team each deserve 8 (both are given it, §1); b in team holds
        # nothing. Inside org, a1 holds 8 against its quota of 2, but org holds exactly
        # its 8: where the branches meet org is not above its quota, so b takes nothing
        "reclaim-respects-the-branch-where-two-queues-meet",
        (*_ORG_HOLDS_ITS_QUOTA, queue("team", deserved=8), queue("b", parent="team", deserved=8)),
        (0, job("x", "a1", gpus=8)),
        (1, started("x")),
        (10, job("b1", "b", gpus=8)),
        then={"preempted": [], "placed": []},
    ),
    case(
        # the same with b a top-level queue: the branches meet at b itself and org, and
        # org is judged there although b is the reclaimer's own leaf (KAI-Scheduler's
        # leveled queues: b and org)
        "reclaim-respects-the-branch-where-a-top-level-queue-meets-another",
        (*_ORG_HOLDS_ITS_QUOTA, queue("b", deserved=8)),
        (0, job("x", "a1", gpus=8)),
        (1, started("x")),
        (10, job("b1", "b", gpus=8)),
        then={"preempted": [], "placed": []},
    ),
    case(
        # a (under org) reclaims from the top-level queue b, 2 above its quota of 2: the
        # branches meet at org and b itself, so b is judged once per victim, not once as
        # a leaf and again where the branches meet; both 1-GPU victims are taken
        "reclaim-counts-a-top-level-victim-queue-once",
        (
            node("n1", gpus=4),
            queue("org", deserved=4),
            queue("a", parent="org", deserved=4),
            queue("b", deserved=2),
        ),
        (0, *(job(f"b{i}", "b", gpus=1) for i in range(1, 5))),
        (1, *(started(f"b{i}") for i in range(1, 5))),
        (10, job("a1", "a", gpus=2)),
        then={"preempted": [("b4", "reclaim", "a1"), ("b3", "reclaim", "a1")], "placed": ["a1"]},
    ),
    case(
        "reclaim-never-evicts-non-preemptible-work",
        (node("n1"), queue("a", deserved=8), queue("b")),
        (0, job("svc", "a", gpus=8, cls="inference")),
        (10, job("b1", "b", gpus=8)),
        then={"preempted": []},
    ),
    case(
        # only a1 may go (c's job is non-preemptible): it frees n1, not the two nodes the
        # gang needs, so nothing is evicted
        "nothing-is-evicted-for-a-gang-that-would-still-not-fit",
        (node("n1"), node("n2"), queue("a"), queue("b", deserved=16), queue("c", deserved=8)),
        (0, job("a1", "a", gpus=8), job("svc", "c", gpus=8, cls="build")),
        (1, started("a1"), started("svc")),
        (10, job("b1", "b", pods=2, gpus=8)),
        then={"preempted": [], "placed": []},
    ),
    case(
        "victims-are-no-more-than-needed",
        (node("n1"), queue("a"), queue("b", deserved=8)),
        (0, *(job(f"s{i}", "a", gpus=2) for i in range(4))),
        (10, job("b1", "b", gpus=4)),
        then={"preempted": [("s3", "reclaim", "b1"), ("s2", "reclaim", "b1")], "placed": ["b1"]},
    ),
    case(
        # b1 is pinned to n1, under a1. Cheapest first c, d and e (on n2, n3) are evicted
        # before a1; placed, the gang sits on n1 alone, so c, d and e are given back
        "victims-the-placement-does-not-need-are-given-back",
        (
            node("n1", host="n1"),
            node("n2", host="n2"),
            node("n3", host="n3"),
            queue("a"),
            queue("b", deserved=32),
        ),
        (
            0,
            job("a1", "a", gpus=8, selector={"host": "n1"}),
            job("e", "a", gpus=8, selector={"host": "n3"}),
            job("d", "a", gpus=4, selector={"host": "n2"}),
            job("c", "a", gpus=4, selector={"host": "n2"}),
        ),
        (1, started("a1")),
        (5, started("e")),
        (6, started("d")),
        (7, started("c")),
        (10, job("b1", "b", gpus=8, selector={"host": "n1"})),
        then={"preempted": [("a1", "reclaim", "b1")], "allocated": {"b1": {"b1-0": "n1"}}},
    ),
    case(
        # the same with two victims: a2 (cheaper, on n2) is evicted first and the gang
        # tried and failed; a1 is then evicted but no placement is tried after it
        # (``_Room.evict_until_fits`` waits for one more victim that never comes)
        "reclaim-reaches-a-dearer-victim-under-a-pinned-gang",
        (node("n1", host="n1"), node("n2", host="n2"), queue("a"), queue("b", deserved=16)),
        (0, job("a1", "a", gpus=8, selector={"host": "n1"})),
        (1, started("a1")),
        (5, job("a2", "a", gpus=8, selector={"host": "n2"})),
        (6, started("a2")),
        (10, job("b1", "b", gpus=8, selector={"host": "n1"})),
        then={"preempted": [("a1", "reclaim", "b1")], "placed": ["b1"]},
    ),
    case(
        "a-quota-edit-keeps-the-queue-s-running-jobs-reclaimable",
        _TWO_QUEUES,
        (0, job("a1", "a", pods=2, gpus=8)),
        (1, started("a1")),
        (5, queue("a", deserved=6)),
        (10, job("b1", "b", gpus=8)),
        then={"preempted": [("a1", "reclaim", "b1")]},
    ),
    case(
        "reclaim-can-be-turned-off",
        _TWO_QUEUES,
        (0, job("a1", "a", gpus=8), job("a2", "a", gpus=8)),
        (10, job("b1", "b", gpus=8)),
        then={"preempted": [], "placed": []},
        reclaim=False,
    ),
]


@pytest.mark.parametrize(SPEC, RECLAIM)
def test_reclaim(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


_ONE_QUEUE = (node("n1"), queue("a", deserved=8))

PREEMPT = [
    case(
        "a-higher-priority-job-preempts-a-lower-one-of-its-queue",
        _ONE_QUEUE,
        (0, job("low", "a", gpus=8)),
        (10, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": [("low", "preempt", "hi")], "allocated": {"hi": {"hi-0": "n1"}}},
    ),
    case(
        "a-job-of-the-same-priority-preempts-nothing",
        _ONE_QUEUE,
        (0, job("low", "a", gpus=8)),
        (5, job("peer", "a", gpus=8)),
        then={"preempted": [], "placed": []},
    ),
    case(
        "a-build-job-is-not-preemptible",
        _ONE_QUEUE,
        (0, job("b", "a", gpus=8, cls="build")),
        (1, job("i", "a", gpus=8, cls="inference")),
        then={"preempted": []},
    ),
    case(
        "a-build-job-marked-preemptible-is",
        _ONE_QUEUE,
        (0, job("b", "a", gpus=8, cls="build", preemptible=True)),
        (1, job("i", "a", gpus=8, cls="inference")),
        then={"preempted": [("b", "preempt", "i")]},
    ),
    case(
        "a-train-job-marked-non-preemptible-is-protected",
        _ONE_QUEUE,
        (0, job("t", "a", gpus=8, preemptible=False)),
        (1, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": []},
    ),
    case(
        "a-numeric-priority-class-is-its-own-value-below",
        _ONE_QUEUE,
        (0, job("x", "a", gpus=8, cls="60")),
        (1, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": [("x", "preempt", "hi")]},
    ),
    case(
        "a-numeric-priority-class-is-its-own-value-above",
        _ONE_QUEUE,
        (0, job("x", "a", gpus=8, cls="80")),
        (1, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": []},
    ),
    case(
        "preemption-can-be-turned-off",
        _ONE_QUEUE,
        (0, job("low", "a", gpus=8)),
        (10, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": []},
        preempt=False,
    ),
]


@pytest.mark.parametrize(SPEC, PREEMPT)
def test_preempt(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


def _gpu_and_cpu_holder(b_cpu: int) -> tuple[Event, ...]:
    """n1: 8 GPUs, 8 cores. a deserves all of both; b deserves no GPU and ``b_cpu``
    cores."""
    return (node("n1", cpu=8000), queue("a", deserved=8, cpu=8000, weight=0),
            queue("b", cpu=b_cpu, weight=0))  # fmt: skip


_B_HOLDS_GPU_AND_CPU = (  # b runs an 8-GPU job (no CPU) and a CPU-only job of 8 cores
    (0, job("bg", "b", gpus=8), job("bc", "b", gpus=0, cpu=8000)),
    (1, started("bg"), started("bc")),
)

RECLAIM_PER_RESOURCE = [
    case(
        # 8 cores, equal weights: CPU fair shares 4 and 4, b holds 8
        "a-cpu-only-job-reclaims-cpu-from-a-queue-above-its-cpu-fair-share",
        (node("n1", cpu=8000), queue("a"), queue("b")),
        (0, job("b1", "b", gpus=0, cpu=4000), job("b2", "b", gpus=0, cpu=4000)),
        (1, started("b1"), started("b2")),
        (10, job("a1", "a", gpus=0, cpu=4000)),
        then={"preempted": [("b2", "reclaim", "a1")], "placed": ["a1"]},
    ),
    case(
        # the same on a node with no GPUs: the victims kept are judged by cores alone
        "a-cpu-only-job-reclaims-cpu-on-a-node-without-gpus",
        (node("c1", gpus=0, cpu=8000), queue("a"), queue("b")),
        (0, job("b1", "b", gpus=0, cpu=4000), job("b2", "b", gpus=0, cpu=4000)),
        (1, started("b1"), started("b2")),
        (10, job("a1", "a", gpus=0, cpu=4000)),
        then={"preempted": [("b2", "reclaim", "a1")], "allocated": {"a1": {"a1-0": "c1"}}},
    ),
    case(
        # bc frees no GPU and b holds exactly its deserved 8 cores: no victim, and
        # without it a1 cannot start, so nothing is evicted in vain
        "a-cpu-only-job-within-its-cpu-share-is-no-free-victim-for-a-gpu-job",
        _gpu_and_cpu_holder(b_cpu=8000),
        *_B_HOLDS_GPU_AND_CPU,
        (10, job("a1", "a", gpus=8, cpu=4000)),
        then={"preempted": [], "status": {"bg": "running", "bc": "running"}},
    ),
    case(
        "a-cpu-only-job-above-its-queue-s-cpu-quota-gives-way-to-a-gpu-job",
        _gpu_and_cpu_holder(b_cpu=0),
        *_B_HOLDS_GPU_AND_CPU,
        (10, job("a1", "a", gpus=8, cpu=4000)),
        then={"preempted": [("bc", "reclaim", "a1"), ("bg", "reclaim", "a1")], "placed": ["a1"]},
    ),
    case(
        # a is within its CPU share but beyond its GPU quota and fair share
        "a-gpu-job-over-its-gpu-share-takes-no-gpus-on-the-strength-of-its-cpu-share",
        (
            node("n1", cpu=8000),
            node("n2", cpu=8000),
            queue("a", deserved=8, cpu=16_000, weight=0),
            queue("b", weight=1),
        ),
        (0, job("a0", "a", gpus=8), job("b1", "b", gpus=8, cpu=1000)),
        (1, started("a0"), started("b1")),
        (10, job("a1", "a", gpus=8, cpu=1000)),
        then={"preempted": []},
    ),
]


@pytest.mark.parametrize(SPEC, RECLAIM_PER_RESOURCE)
def test_reclaim_judges_each_resource_the_job_asks_for(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


_RECLAIM_AFTER_600 = (node("n1"), node("n2"), queue("a", deserved=8, reclaim_min_runtime_s=600),
                      queue("b", deserved=8))  # fmt: skip
_PREEMPT_AFTER_300 = (node("n1"), queue("a", deserved=8, preempt_min_runtime_s=300))
_B_RECLAIMS_BACK = (
    # 4 GPUs; b holds them all, then a takes back its deserved 2 (b2 and b3 wait again)
    (node("n1", gpus=4), queue("a", deserved=2), queue("b", deserved=2)),
    (0, *(job(f"b{k}", "b", gpus=1) for k in range(4))),
    (1, *(started(f"b{k}") for k in range(4))),
    (10, job("a1", "a", gpus=2)),
    (11, started("a1")),
    # then b deserves all 4 and a nothing: b is under its quota, a above
    (12, queue("a"), queue("b", deserved=4)),
)

VICTIM_LIMITS = [
    case(
        # started at 500 s, 200 s ago
        "reclaim-min-runtime-protects-a-young-job",
        _RECLAIM_AFTER_600,
        (0, job("a1", "a", gpus=8), job("a2", "a", gpus=8)),
        (500, started("a1"), started("a2")),
        (700, job("b1", "b", gpus=8)),
        then={"preempted": []},
    ),
    case(
        # started exactly 600 s ago
        "reclaim-min-runtime-lets-an-older-job-go",
        _RECLAIM_AFTER_600,
        (0, job("a1", "a", gpus=8), job("a2", "a", gpus=8)),
        (1, started("a1"), started("a2")),
        (601, job("b1", "b", gpus=8)),
        then={"preempted": [("a2", "reclaim", "b1")]},
    ),
    case(
        "preempt-min-runtime-protects-a-young-job",
        _PREEMPT_AFTER_300,
        (0, job("low", "a", gpus=8)),
        (1, started("low")),
        (100, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": []},
    ),
    case(
        "preempt-min-runtime-lets-an-older-job-go",
        _PREEMPT_AFTER_300,
        (0, job("low", "a", gpus=8)),
        (1, started("low")),
        (400, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": [("low", "preempt", "hi")]},
    ),
    case(
        "a-job-that-started-by-reclaim-is-not-reclaimed-back-within-the-hysteresis",
        *_B_RECLAIMS_BACK,
        then={"preempted": [], "placed": []},
        reclaim_hysteresis_ms=600_000,
    ),
    case(
        "a-job-that-started-by-reclaim-may-be-reclaimed-after-the-hysteresis",
        *_B_RECLAIMS_BACK,
        (610, job("b9", "b", gpus=1)),  # exactly 600 s after a1 reclaimed
        then={"preempted": [("a1", "reclaim", "b2")], "placed": ["b2", "b3"]},
        reclaim_hysteresis_ms=600_000,
    ),
    case(
        # nothing happens after t=12: the end of the hysteresis asks for a cycle
        # (``State.wakeup``), which a runner's tick at that time runs
        "the-end-of-the-hysteresis-is-a-cycle-of-its-own",
        *_B_RECLAIMS_BACK,
        (610, Tick()),
        then={"preempted": [("a1", "reclaim", "b2")], "placed": ["b2", "b3"]},
        reclaim_hysteresis_ms=600_000,
    ),
    case(
        # a2 is protected until 500 + 600 s; b1 waits for that moment, not for an input
        "the-end-of-a-reclaim-min-runtime-is-a-cycle-of-its-own",
        _RECLAIM_AFTER_600,
        (0, job("a1", "a", gpus=8), job("a2", "a", gpus=8)),
        (500, started("a1"), started("a2")),
        (700, job("b1", "b", gpus=8)),
        (1100, Tick()),
        then={"preempted": [("a2", "reclaim", "b1")], "placed": ["b1"]},
    ),
    case(
        "the-end-of-a-preempt-min-runtime-is-a-cycle-of-its-own",
        _PREEMPT_AFTER_300,
        (0, job("low", "a", gpus=8)),
        (1, started("low")),
        (100, job("hi", "a", gpus=8, cls="build-preemptible")),
        (301, Tick()),
        then={"preempted": [("low", "preempt", "hi")], "placed": ["hi"]},
    ),
    case(
        "without-hysteresis-a-job-that-started-by-reclaim-is-reclaimed-back-at-once",
        *_B_RECLAIMS_BACK,
        then={"preempted": [("a1", "reclaim", "b2")], "placed": ["b2", "b3"]},
    ),
]


@pytest.mark.parametrize(SPEC, VICTIM_LIMITS)
def test_min_runtime_and_hysteresis_protect_victims(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


_SPREAD_PAIR = (node("n1"), node("n2"), queue("a", deserved=16))
_FRAGMENTED = (  # v2 on n2 and 4 free there; n1 and n3 half held by non-preemptible work
    (node("n1", host="n1"), node("n2", host="n2"), node("n3", host="n3"),
     queue("a", deserved=24)),
    (0, job("fixed1", "a", gpus=4, cls="build", selector={"host": "n1"}),
     job("fixed3", "a", gpus=4, cls="build", selector={"host": "n3"})),
    (1, job("v2", "a", gpus=4, placement="spread")),
    (2, started("v2")),
)  # fmt: skip

CONSOLIDATION = [
    case(
        # g's first pod has finished: moved (requeued), it would need both pods placed
        # again, and consolidation places only live ones; so it is not moved, and the
        # non-preemptible job waits (before, g was requeued holding one pod, and a later
        # cycle could loop on it forever)
        "a-gang-with-a-finished-pod-is-never-moved",
        _SPREAD_PAIR,
        (0, job("g", "a", pods=2, gpus=2, min_members=1, placement="spread")),
        (1, started("g")),
        (2, PodFinished(job="g", pod="g-0")),
        (3, job("p", "a", gpus=4, placement="spread", cls="build", preemptible=False)),
        (4, job("whole", "a", gpus=8, cls="build", preemptible=False)),
        then={"preempted": [], "placed": [], "status": {"g": "running", "whole": "pending"}},
        consolidation=True,
        preempt=False,
    ),
    case(
        # neither p1 nor p2 has started, so neither loses work: the newer one, p2, moves
        "a-preemptible-job-moves-to-fit-a-gang",
        _SPREAD_PAIR,
        (0, job("p1", "a", gpus=4, placement="spread"), job("p2", "a", gpus=4, placement="spread")),
        (1, job("whole", "a", gpus=8, cls="build", preemptible=False)),
        then={
            "preempted": [("p2", "consolidation", "whole")],
            "allocated": {"p2": {"p2-0": "n1"}, "whole": {"whole-0": "n2"}},
            "status": {"p2": "allocated"},
        },
        consolidation=True,
        preempt=False,
    ),
    case(
        # p2, placed in the same cycle, would be the cheapest to move; p1 moves instead
        "a-job-placed-in-this-cycle-is-never-a-victim-in-it",
        _SPREAD_PAIR,
        (0, job("p1", "a", gpus=4, placement="spread")),
        (1, started("p1")),
        (100, job("p2", "a", gpus=4, placement="spread"), job("whole", "a", gpus=8)),
        then={
            "preempted": [("p1", "consolidation", "whole")],
            "allocated": {"p2": {"p2-0": "n2"}, "p1": {"p1-0": "n2"}, "whole": {"whole-0": "n1"}},
        },
        consolidation=True,
        preempt=False,
    ),
    case(
        # v1 (pinned to n1) is cheaper and evicted first, freeing no node whole; then v2,
        # freeing n2. Put back, v1 lands where it was, so it is neither moved nor evicted
        "a-job-that-would-land-where-it-is-stays-put",
        *_FRAGMENTED,
        (10, job("v1", "a", gpus=4, selector={"host": "n1"})),
        (11, started("v1")),
        (100, job("whole", "a", gpus=8)),
        then={
            "preempted": [("v2", "consolidation", "whole")],
            "allocated": {"v2": {"v2-0": "n3"}, "whole": {"whole-0": "n2"}},
            "status": {"v1": "running"},
        },
        consolidation=True,
        preempt=False,
    ),
    case(
        # v2 could only go back to n2, where the gang must go: nothing moves
        "jobs-move-only-if-each-is-placed-again-at-once",
        (node("n1", host="n1"), node("n2", host="n2"), queue("a", deserved=16)),
        (
            0,
            job("fixed1", "a", gpus=4, cls="build", selector={"host": "n1"}),
            job("v2", "a", gpus=4, selector={"host": "n2"}),
        ),
        (1, started("v2")),
        (10, job("whole", "a", gpus=8)),
        then={"preempted": [], "placed": []},
        consolidation=True,
        preempt=False,
    ),
    case(
        "without-consolidation-fragmentation-blocks-the-gang",
        _SPREAD_PAIR,
        (0, job("p1", "a", gpus=4, placement="spread"), job("p2", "a", gpus=4, placement="spread")),
        (1, job("whole", "a", gpus=8)),
        then={"preempted": [], "placed": []},
        preempt=False,
    ),
]


@pytest.mark.parametrize(SPEC, CONSOLIDATION)
def test_consolidation(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


_STALE = (  # a 2-pod gang runs; one pod fails at t=100, below the gang's minimum
    (node("n1"), queue("a")),
    (0, job("g", "a", pods=2, gpus=4)),
    (1, started("g")),
    (100, PodFinished(job="g", pod="g-1", succeeded=False)),
)

STALE_GANGS = [
    case(
        "a-gang-below-its-minimum-runs-on-within-the-grace-period",
        *_STALE,
        (120, Tick()),
        then={"preempted": [], "status": {"g": "running"}},
        stale_gang_eviction=True,
        stale_gang_grace_ms=60_000,
    ),
    case(
        # evicted whole, back in its queue, and placed again at once
        "a-gang-below-its-minimum-is-evicted-after-the-grace-period",
        *_STALE,
        (160, Tick()),
        then={
            "preempted": [("g", "stale-gang", "")],
            "allocated": {"g": {"g-0": "n1", "g-1": "n1"}},
            "status": {"g": "allocated"},
        },
        stale_gang_eviction=True,
        stale_gang_grace_ms=60_000,
    ),
    case(
        "stale-gang-eviction-turned-off-leaves-the-gang-running",
        *_STALE,
        (1000, Tick()),
        then={"preempted": [], "status": {"g": "running"}},
        stale_gang_eviction=False,
        stale_gang_grace_ms=60_000,
    ),
    case(
        "a-gang-at-its-minimum-is-not-stale",
        (node("n1"), queue("a")),
        (0, job("g", "a", pods=2, gpus=4, min_members=1)),
        (1, started("g")),
        (100, PodFinished(job="g", pod="g-1", succeeded=False)),
        (1000, Tick()),
        then={"preempted": [], "status": {"g": "running"}},
        stale_gang_eviction=True,
        stale_gang_grace_ms=60_000,
    ),
]


@pytest.mark.parametrize(SPEC, STALE_GANGS)
def test_stale_gangs(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


# --------------------------------------------------------------------------- §6 backfill

# n1 busy until t=1001 (a job with a known runtime); a 2-node gang waits for it from t=2
_BLOCKED = (
    (node("n1"), node("n2"), queue("big", deserved=16), queue("small")),
    (0, job("long", "big", gpus=8, runtime_s=1000, cls="build")),
    (1, started("long")),
    (2, job("gang", "big", pods=2, gpus=8, runtime_s=5000)),
)
_FILLER_RUNS = (  # a preemptible job behind the gang, no runtime, backfilled onto n2
    (10, job("filler", "big", gpus=8)),
    (11, started("filler")),
)
_DRAINING = (  # the filler has run 8 GPUs x 990 s = 2.2 GPU-h
    "waiting for a reservation of 2 nodes, due now but for the job backfilled onto them "
    "('filler' of queue 'big'), which would lose 2.2 GPU-h of work if evicted now; it "
    "starts when that job ends, and no more jobs are backfilled there"
)
# Tuning.backfill_tries as docs/policy.md §6 states it (a literal, so that changing the bound in
# the core fails these cases)
_TRIES = 64


def _wide(k: int) -> JobSubmitted:
    """A gang of two 8-GPU pods that cannot fit the gap, asking k + 1 millicores and
    ``_TRIES`` - k MiB a pod: no failure among ``_WIDE`` rules out another (``FailedShapes``
    judges a gang of like pods by one asking no less of everything), so each is a try."""
    gang = job(f"wide{k}", "big", pods=2, gpus=8, cpu=k + 1)
    pods = tuple(msgspec.structs.replace(p, memory_mib=_TRIES - k) for p in gang.pods)
    return msgspec.structs.replace(gang, pods=pods)


_WIDE = [_wide(k) for k in range(_TRIES)]

BACKFILL = [
    case(
        "without-backfill-a-queue-waits-behind-its-blocked-head",
        (node("n1"), queue("a")),
        (0, job("busy", "a", gpus=4, runtime_s=100)),
        (1, job("head", "a", gpus=8), job("behind", "a", gpus=2, runtime_s=10)),
        then={"placed": []},
    ),
    case(
        "with-backfill-a-small-job-does-not-wait-behind-a-big-head",
        (node("n1"), queue("a")),
        (0, job("busy", "a", gpus=4, runtime_s=100)),
        (0.5, started("busy")),
        (1, job("head", "a", gpus=8), job("behind", "a", gpus=2, runtime_s=10)),
        then={"placed": ["behind"]},
        backfill=True,
    ),
    case(
        "a-blocked-gang-reserves-the-nodes-it-will-get-and-says-when",
        *_BLOCKED,
        then={
            "reasons": {
                "gang": (
                    "waiting for a reservation of 2 nodes at +00:16:41; smaller jobs backfill the gap",
                    False,
                )
            }
        },
        backfill=True,
    ),
    case(
        "a-reservation-held-by-overrunning-jobs-waits-for-them",
        *_BLOCKED,
        (1100, job("nudge", "small", gpus=9)),
        then={
            "reasons": {
                "gang": (
                    "waiting for a reservation of 2 nodes as soon as job 'long' of queue 'big' "
                    "ends (past its runtime estimate, +00:16:41); smaller jobs backfill the gap",
                    False,
                ),
                "nudge": ("pod 'nudge-0' needs 9 GPUs but the largest matching node has 8", True),
            }
        },
        backfill=True,
    ),
    case(
        "a-short-job-backfills-the-gap-before-the-reservation",
        *_BLOCKED,
        (10, job("short", "big", gpus=8, runtime_s=500, preemptible=False)),
        then={"allocated": {"short": {"short-0": "n2"}}},
        backfill=True,
    ),
    case(
        "a-long-non-preemptible-job-may-not-delay-the-reservation",
        *_BLOCKED,
        (10, job("late", "big", gpus=8, runtime_s=5000, preemptible=False)),
        then={"placed": []},
        backfill=True,
    ),
    case(
        "another-queue-s-long-job-may-not-use-the-reserved-nodes-either",
        *_BLOCKED,
        (10, job("other", "small", gpus=8, runtime_s=5000, preemptible=False)),
        then={"placed": []},
        backfill=True,
    ),
    case(
        "a-preemptible-job-backfills-onto-the-reserved-nodes",
        *_BLOCKED,
        (10, job("filler", "big", gpus=8)),
        then={"allocated": {"filler": {"filler-0": "n2"}}},
        backfill=True,
    ),
    case(
        "a-preemptible-backfilled-job-gives-way-when-the-reservation-starts",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        then={
            "preempted": [("filler", "backfill", "gang")],
            "allocated": {"gang": {"gang-0": "n1", "gang-1": "n2"}},
        },
        backfill=True,
    ),
    case(
        # at t=1001 the gang (16 GPUs, waiting since t=2) may throw away 0.1 x 16 x 999
        # GPU-s; the filler has run 8 GPUs x 990 s
        "a-backfilled-job-whose-lost-work-exceeds-the-budget-stays",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        then={"preempted": [], "placed": []},
        backfill=True,
        lost_work_ratio_milli=100,  # the shipped default (0.1): no search beyond the order
    ),
    case(
        "a-backfilled-job-whose-lost-work-is-within-the-budget-gives-way",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        then={"preempted": [("filler", "backfill", "gang")], "placed": ["gang"]},
        backfill=True,
        lost_work_ratio_milli=1000,
    ),
    case(
        # within the budget, but the filler has run 990 s, longer than the give-way bound:
        # it is waited for, and the reservation drains
        "a-backfilled-job-older-than-the-give-way-bound-stays",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        then={"preempted": [], "placed": [], "reasons": {"gang": (_DRAINING, False)}},
        backfill=True,
        lost_work_ratio_milli=1000,
        backfill_give_way_ms=600_000,
    ),
    case(
        "a-backfilled-job-younger-than-the-give-way-bound-gives-way",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        then={"preempted": [("filler", "backfill", "gang")], "placed": ["gang"]},
        backfill=True,
        lost_work_ratio_milli=1000,
        backfill_give_way_ms=1_800_000,
    ),
    case(
        # a job that has not started loses nothing: it gives way under any bound
        "a-backfilled-job-not-started-yet-gives-way-under-a-give-way-bound-of-0",
        *_BLOCKED,
        (10, job("filler", "big", gpus=8)),
        (1001, finished("long")),
        then={"preempted": [("filler", "backfill", "gang")], "placed": ["gang"]},
        backfill=True,
        backfill_give_way_ms=0,
    ),
    case(
        # n1 is free, but the reservation waits only for the filler: a second preemptible
        # job would have to give way too, so it is kept off the draining reservation's nodes
        "a-draining-reservation-takes-no-more-backfilled-jobs",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        (1002, job("filler2", "big", gpus=8)),
        then={"placed": []},
        backfill=True,
        backfill_give_way_ms=600_000,
    ),
    case(
        # n1 is busy with `long`: the reservation is not due, so a preemptible job may
        # still fill its gap under the bound
        "a-preemptible-job-still-backfills-onto-a-reservation-not-due",
        *_BLOCKED,
        (10, job("filler", "big", gpus=8)),
        then={"allocated": {"filler": {"filler-0": "n2"}}},
        backfill=True,
        backfill_give_way_ms=600_000,
    ),
    case(
        # without a give-way bound (revision 12) nothing drains: the filler stays, beyond
        # the budget, and filler2 still fills n1 in the gap
        "without-a-give-way-bound-a-second-job-backfills-onto-a-due-reservation",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        (1002, job("filler2", "big", gpus=8)),
        then={"allocated": {"filler2": {"filler2-0": "n1"}}},
        backfill=True,
        lost_work_ratio_milli=100,
    ),
    case(
        "a-drained-gang-starts-when-its-backfilled-job-ends",
        *_BLOCKED,
        *_FILLER_RUNS,
        (1001, finished("long")),
        (1500, finished("filler")),
        then={"preempted": [], "allocated": {"gang": {"gang-0": "n1", "gang-1": "n2"}}},
        backfill=True,
        backfill_give_way_ms=600_000,
    ),
    case(
        # b is within its deserved quota: quota is a guarantee, taken back whatever the
        # work lost (b1 has waited no time, so its budget is 0)
        "reclaim-within-the-deserved-quota-is-not-bounded-by-the-lost-work-budget",
        _TWO_QUEUES,
        *_A_RUNS_TWO,
        (1000, job("b1", "b", gpus=8)),
        then={"preempted": [("a1", "reclaim", "b1")]},
        lost_work_ratio_milli=100,  # the shipped default (0.1): no search beyond the order
    ),
    case(
        # no quotas: b reclaims by fair share, beyond its quota of 0, so the budget holds
        "reclaim-beyond-the-deserved-quota-is-bounded-by-the-lost-work-budget",
        (node("n1"), node("n2"), queue("a"), queue("b")),
        (0, job("a1", "a", gpus=8), job("a2", "a", gpus=8)),
        (1, started("a1"), started("a2")),
        (100, job("b1", "b", gpus=8)),
        then={"preempted": [], "placed": []},
        lost_work_ratio_milli=100,  # the shipped default (0.1): no search beyond the order
    ),
    case(
        "the-same-reclaim-without-a-budget",
        (node("n1"), node("n2"), queue("a"), queue("b")),
        (0, job("a1", "a", gpus=8), job("a2", "a", gpus=8)),
        (1, started("a1"), started("a2")),
        (100, job("b1", "b", gpus=8)),
        then={"preempted": [("a2", "reclaim", "b1")], "placed": ["b1"]},
    ),
    case(
        # strictly higher priority is a promise: preempt is not bounded
        "preempt-is-not-bounded-by-the-lost-work-budget",
        (node("n1"), queue("a", deserved=8)),
        (0, job("low", "a", gpus=8)),
        (1, started("low")),
        (100, job("hi", "a", gpus=8, cls="build-preemptible")),
        then={"preempted": [("low", "preempt", "hi")]},
        lost_work_ratio_milli=100,  # the shipped default (0.1): no search beyond the order
    ),
    case(
        "a-preemptible-job-that-fits-off-the-reserved-nodes-goes-there",
        (node("n1"), node("n2"), node("n3", gpus=4), queue("big", deserved=16), queue("small")),
        (0, job("long", "big", gpus=8, runtime_s=1000, cls="build")),
        (1, started("long")),
        (2, job("gang", "big", pods=2, gpus=8, runtime_s=5000)),
        (10, job("filler", "big", gpus=4)),
        then={"allocated": {"filler": {"filler-0": "n3"}}},
        backfill=True,
    ),
    case(
        # capped's head waits for its queue's limit (since t=2), not for capacity: it
        # reserves nothing (its reason stays the limit's) and other's job takes n2
        "a-head-held-back-by-a-limit-reserves-nothing",
        (node("n1"), node("n2"), queue("capped", deserved=16, limit=16), queue("other")),
        (0, job("held", "capped", gpus=8, runtime_s=1000)),
        (1, started("held")),
        (2, job("next", "capped", pods=2, gpus=8)),
        (10, job("late", "other", gpus=8)),
        then={"allocated": {"late": {"late-0": "n2"}}, "backfilled": {"late": ""}, "reasons": {}},
        backfill=True,
    ),
    case(
        "backfill-looks-past-jobs-that-do-not-fit-the-gap",
        *_BLOCKED,
        (10, job("wide", "big", pods=2, gpus=8), job("filler", "big", gpus=8)),
        then={"allocated": {"filler": {"filler-0": "n2"}}},
        backfill=True,
    ),
    case(
        # gangs no earlier failure rules out are each tried: all but one of the tries
        # fail before the filler
        "backfill-tries-up-to-its-bound",
        *_BLOCKED,
        (10, *_WIDE[:-1], job("filler", "big", gpus=8)),
        then={"allocated": {"filler": {"filler-0": "n2"}}},
        backfill=True,
    ),
    case(
        "backfill-stops-looking-after-its-tries",
        *_BLOCKED,
        (10, *_WIDE, job("filler", "big", gpus=8)),
        then={"placed": []},
        backfill=True,
    ),
    case(
        # hundreds of jobs of one shape that cannot fit the gap are judged by the first
        "jobs-passed-over-because-a-no-smaller-one-failed-are-not-tries",
        *_BLOCKED,
        (
            10,
            *(job(f"wide{k}", "big", pods=2, gpus=8) for k in range(5 * _TRIES)),
            job("filler", "big", gpus=8),
        ),
        then={"allocated": {"filler": {"filler-0": "n2"}}},
        backfill=True,
    ),
]


@pytest.mark.parametrize(SPEC, BACKFILL)
def test_backfill(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


# --------------------------------------------------------------------------- §7 waiting, never fitting

_TWO = (node("n1"), node("n2"), queue("a", deserved=8))
_TOO_BIG = (
    "gang of 3 pods needing 24 GPUs cannot be packed onto the cluster even when it is empty "
    "(16 schedulable GPUs on 2 nodes)"
)

WAITING = [
    case(
        "the-reason-names-the-shape-of-the-gang",
        (node("n1"), node("n2"), queue("a")),
        (0, job("busy", "a", gpus=1)),
        (1, job("g", "a", pods=2, gpus=8)),
        then={
            "reasons": {
                "g": (
                    "waiting for capacity: gang needs 2 pods (2×8 GPUs), free capacity fits 1 of "
                    "them now",
                    False,
                )
            }
        },
    ),
    case(
        "a-reason-is-recorded-only-when-it-changes",
        (node("n1"), queue("a", limit=4)),
        (1, job("j1", "a", gpus=4)),
        (2, job("j2", "a", gpus=2)),
        (3, job("j3", "a", gpus=2)),
        then={"reasons": {}},
    ),
    case(
        "a-job-behind-a-waiting-head-records-no-reason",
        (node("n1"), queue("a")),
        (0, job("busy", "a", gpus=8)),
        (1, job("j", "a", gpus=8)),
        (2, job("k", "a", gpus=1)),
        then={"reasons": {}},
    ),
]

NEVER_FITS = [
    case(
        "an-unknown-queue",
        _TWO,
        (1, job("lost", "nope")),
        then={"reasons": {"lost": ("queue 'nope' does not exist", True)}},
    ),
    case(
        "a-queue-with-children",
        (node("n1"), queue("org"), queue("team", parent="org")),
        (1, job("j", "org")),
        then={"reasons": {"j": ("queue 'org' has child queues; submit to one of ['team']", True)}},
    ),
    case(
        "a-request-above-a-queue-limit",
        (node("n1"), queue("capped", deserved=2, limit=4)),
        (1, job("j", "capped", gpus=8)),
        then={"reasons": {"j": ("job needs 8 GPUs but queue 'capped' is limited to 4", True)}},
    ),
    case(
        "a-pod-larger-than-every-node",
        _TWO,
        (1, job("huge", "a", gpus=16)),
        then={
            "reasons": {
                "huge": ("pod 'huge-0' needs 16 GPUs but the largest matching node has 8", True)
            }
        },
    ),
    case(
        "a-selector-no-node-matches",
        (node("gpu-01", pool="a"), queue("a", deserved=8)),
        (1, job("pinned", "a", selector={"kubernetes.io/hostname": "gpu-07"})),
        then={
            "reasons": {
                "pinned": (
                    "pod 'pinned-0': node selector {kubernetes.io/hostname=gpu-07} matches no "
                    "schedulable node",
                    True,
                )
            },
            "status": {"pinned": "unschedulable"},
        },
    ),
    case(
        "a-gang-that-cannot-be-packed-onto-the-empty-cluster",
        _TWO,
        (1, job("big", "a", pods=3, gpus=8)),
        then={
            "reasons": {
                "big": (
                    "gang of 3 pods needing 24 GPUs cannot be packed onto the cluster even when it "
                    "is empty (16 schedulable GPUs on 2 nodes)",
                    True,
                )
            }
        },
    ),
    case(
        "cordoned-nodes-do-not-count",
        (node("n1"), node("n2"), queue("a"), NodeCordoned(node="n1")),
        (1, job("k", "a", pods=2, gpus=8)),
        then={
            "reasons": {
                "k": (
                    "gang of 2 pods needing 16 GPUs cannot be packed onto the cluster even when it "
                    "is empty (8 schedulable GPUs on 1 nodes)",
                    True,
                )
            }
        },
    ),
    case(
        "a-required-topology-no-domain-can-hold",
        (node("r1-a", rack="r1"), node("r2-a", rack="r2"), queue("a")),
        (1, job("g", "a", pods=2, gpus=8, topology="rack", topology_required=True)),
        then={
            "reasons": {
                "g": (
                    "gang of 2 pods needing 16 GPUs cannot be packed onto the cluster even when it "
                    "is empty (16 schedulable GPUs on 2 nodes, in one 'rack' domain)",
                    True,
                )
            }
        },
    ),
    case(
        "a-gpu-memory-request-larger-than-any-device",
        (node("n1", gpus=1, gpu_memory=16_384), queue("a")),
        (1, job("m", "a", gpus=0, gpu_memory=40_960)),
        then={
            "reasons": {
                "m": (
                    "pod 'm-0' needs 40960 MiB of one GPU but the largest matching GPU has 16384 "
                    "MiB",
                    True,
                )
            }
        },
    ),
    # The verdict is remembered per job shape until a node event (neverfits._cluster_reason):
    # the cases below would pass a memory that forgot a node event or part of a shape.
    case(
        "a-shape-that-fitted-is-judged-again-after-a-node-event",
        (node("n1", pool="a"), node("n2", pool="b"), queue("a")),
        (1, job("first", "a", selector={"pool": "a"})),
        (2, NodeCordoned(node="n1"), job("second", "a", selector={"pool": "a"})),
        then={
            "reasons": {
                "second": (
                    "pod 'second-0': node selector {pool=a} matches no schedulable node",
                    True,
                )
            }
        },
    ),
    case(
        "like-jobs-are-judged-by-their-own-selector-and-tolerations",
        (
            node("n1", taints=("dedicated=x:NoSchedule",), pool="a"),
            node("n2", pool="b"),
            queue("a"),
        ),
        (
            1,
            job("ok", "a", selector={"pool": "a"}, tolerations=("dedicated",)),
            job("other-pool", "a", selector={"pool": "c"}, tolerations=("dedicated",)),
            job("untolerated", "a", selector={"pool": "a"}),
        ),
        then={
            "reasons": {
                "other-pool": (
                    "pod 'other-pool-0': node selector {pool=c} matches no schedulable node",
                    True,
                ),
                "untolerated": (
                    "gang of 1 pods needing 1 GPUs cannot be packed onto the cluster even when "
                    "it is empty (16 schedulable GPUs on 2 nodes)",
                    True,
                ),
            },
            "placed": ["ok"],
        },
    ),
    case(
        "a-shape-that-cannot-be-packed-is-rejected-each-time",
        _TWO,
        (
            1,
            job("big", "a", pods=3, gpus=8),
            job("big2", "a", pods=3, gpus=8),
            job("small", "a", pods=2, gpus=8),
        ),
        then={
            "reasons": {
                "big": (_TOO_BIG, True),
                "big2": (_TOO_BIG, True),
            },
            "placed": ["small"],
        },
    ),
    case(
        "a-non-preemptible-job-larger-than-its-queue-s-deserved-quota",
        (node("n1"), queue("a", deserved=2)),
        (1, job("inf", "a", gpus=4, cls="inference")),
        then={
            "reasons": {
                "inf": (
                    "non-preemptible job needs 4 GPUs but queue 'a' deserves only 2; "
                    "non-preemptible work runs only within deserved quota (lower its priority "
                    "class or raise the quota)",
                    True,
                )
            }
        },
    ),
]


@pytest.mark.parametrize(SPEC, WAITING)
def test_waiting_reasons(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)


@pytest.mark.parametrize(SPEC, NEVER_FITS)
def test_never_fits_is_rejected_at_once(given, steps, knobs, then) -> None:  # type: ignore[no-untyped-def]
    check(given, steps, knobs, then)

"""The memo of failed shapes (``placement.FailedShapes``) passes a job over only when it
could not have fit: a job it rules out after another failed must fail too, on the same
capacity or on less. For gangs of like pods asking for CPU or memory (revision 12) this
is exact — the count of such pods each node holds does not depend on where the others
went — so it is checked here against real placements on random fragmented clusters."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from events.model import PodSpec
from scheduler.core.apply import apply
from scheduler.core.placement import FailedShapes, Statement, binpack_score, spread_score
from scheduler.core.state import State
from tests.builders import job, node

GPU_SIZES = [0, 250, 500, 1000, 2000, 4000]


@st.composite
def pod_request(draw: st.DrawFn) -> tuple[int, int, int]:
    return (
        draw(st.sampled_from(GPU_SIZES)),
        draw(st.sampled_from([0, 2000, 8000, 16000])),
        draw(st.sampled_from([0, 4096, 32768])),
    )


@st.composite
def fragmented(draw: st.DrawFn) -> tuple[State, list[tuple[int, int, int]]]:
    """Nodes of 2–8 GPUs with cores and memory, and pods (GPU, CPU, memory) to place on
    them first, so the free capacity is scattered over devices, cores and memory."""
    state = State()
    for i in range(draw(st.integers(1, 5))):
        apply(
            state,
            node(
                f"n{i}",
                gpus=draw(st.sampled_from([2, 4, 8])),
                cpu=draw(st.sampled_from([16000, 64000])),
                memory=draw(st.sampled_from([65536, 262144])),
            ),
            0,
        )
    return state, draw(st.lists(pod_request(), max_size=12))


def pod(name: str, request: tuple[int, int, int]) -> PodSpec:
    gpu, cpu, memory = request
    return PodSpec(name=name, gpu_milli=gpu, cpu_milli=cpu, memory_mib=memory)


def gang(name: str, pods: int, request: tuple[int, int, int]) -> object:
    base = job(name, "q", pods=pods)
    return msgspec.structs.replace(base, pods=tuple(pod(p.name, request) for p in base.pods))


@settings(max_examples=300, deadline=None)
@given(
    fragmented(),
    st.integers(2, 6),
    pod_request(),
    st.integers(0, 3),
    st.tuples(st.sampled_from([0, 1000]), st.sampled_from([0, 4000]), st.sampled_from([0, 8192])),
    st.sampled_from([binpack_score, spread_score]),
    st.lists(pod_request(), max_size=4),
    st.integers(2, 6),
    st.one_of(st.none(), pod_request()),
)
def test_a_gang_of_like_pods_the_memo_rules_out_cannot_fit(  # type: ignore[no-untyped-def]
    cluster, pods, request, more_pods, more, score, taken_between, other_pods, other_request
) -> None:
    """A gang of like pods fails; one asking no less of every resource, with at least as
    many pods, is ruled out by the memo — and really fails, with the same free capacity
    or after more pods were placed in between; so does any other gang the memo rules
    out."""
    state, fillers = cluster
    small = gang("small", pods, request)
    bigger = (request[0] + more[0], request[1] + more[1], request[2] + more[2])
    if request[0] and bigger[0] > 1000 and bigger[0] % 1000:
        bigger = (request[0], bigger[1], bigger[2])  # a pod is a fraction or whole GPUs
    big = gang("big", pods + more_pods, bigger)
    # another gang: of any shape, or of the failed gang's pods in another number
    other = gang("other", other_pods, request if other_request is None else other_request)
    for g in (small, big, other):
        apply(state, g, 0)
    small_job, big_job, other_job = state.jobs["small"], state.jobs["big"], state.jobs["other"]
    memo = FailedShapes()
    with Statement(state.nodes, score=score) as stmt:
        for i, request_i in enumerate(fillers):
            stmt.place(f"f{i}", pod(f"f{i}", request_i), None)
        if stmt.place_gang(small_job) is not None:
            return  # nothing failed: nothing to remember
        memo.add(small_job)
        if request[1] or request[2]:
            assert not memo.may_fit(big_job)  # like pods asking for CPU or memory
        for taken in (0, len(taken_between)):  # on the same capacity, then on less
            for i, request_i in enumerate(taken_between[:taken]):
                stmt.place(f"t{i}", pod(f"t{i}", request_i), None)
            assert stmt.place_gang(big_job) is None
            if not memo.may_fit(other_job):
                assert stmt.place_gang(other_job) is None

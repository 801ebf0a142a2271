"""Semantic validation, case by case, through every entry point that takes the input.

| case | live intake (``validate``) | YAML loaders | ``gpuledger simulate`` | the core |
|---|---|---|---|---|
| cyclic queue tree | refused: own parent / cycle | ``ConfigError``: parent chain loops | exit 2 | never raises |
| children deserve more than the parent | refused: ``deserved.gpu_milli`` / ``deserved_gpu_percent`` | ``ConfigError`` | exit 2 | never raises |
| negative, NaN, infinite resources | refused: negative field; NaN is a schema error (dead letter) | ``ConfigError`` naming the field path | exit 2 | never raises |
| gang larger than the cluster | accepted; the cycle rejects it: final ``job_unschedulable`` | loaded; same decision | exit 0, job unschedulable | final decision |
| ``min_members`` above the gang | refused | ``ConfigError`` | exit 2 | never raises |
| duplicate job id | refused | ``ConfigError`` | exit 2 | first submission wins |
| unknown ``priority_class`` | refused, with the accepted classes | ``ConfigError`` naming file, field and the accepted values | exit 2 | taken as ``train`` (intake refuses it first) |
| a number the ledger cannot hold exactly (``deserved_percent: 12.5``, ``at_s: 0.0004``) | integers by type | ``ConfigError`` naming file, field, value and what it would be rounded to | exit 2 | — |
| undefined parent | refused: unknown parent | ``ConfigError`` naming the file | exit 2 | a queue whose parent is missing is top-level |
| events out of order | refused: unknown job / pod / queue / parent / node; decisions refused at intake | file order does not matter (parents first) | — | ignores them; time never runs backwards |

Every row that intake refuses is also folded straight into the core (as a ledger imported
with ``gpuledger log import`` would be, bypassing intake): it must not raise.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from events.codec import DecodeError, Envelope, decode_event, encode, wrap
from events.model import (
    MAX_NODE_GPUS,
    BindFailed,
    Event,
    JobCancelled,
    JobSubmitted,
    JobUnschedulable,
    NodeCordoned,
    NodeRemoved,
    PodBound,
    PodEvicted,
    PodFinished,
    PodsAllocated,
    PodSpec,
    PodStarted,
    QueueRemoved,
    Tick,
)
from replay.config import (
    ClusterFile,
    ConfigError,
    QueuesFile,
    WorkloadFile,
    node_events,
    parse,
    queue_events,
)
from replay.sim import expand
from scheduler.cli import main
from scheduler.core import State, apply, cycle
from scheduler.fold.validate import validate
from tests.builders import job, node, queue

# --------------------------------------------------------------------------- live intake

N1, N2 = node("n1"), node("n2")
P4 = queue("p", deserved=4)

# (id, setup accepted first, the event, what the refusal must say)
INTAKE: list[tuple[str, list[Event], Event, str]] = [
    # cyclic queue trees
    ("own-parent", [], queue("a", parent="a"), "queue a is its own parent"),
    (
        "two-cycle",
        [queue("a"), queue("b", parent="a")],
        queue("a", parent="b"),
        "would make a cycle",
    ),
    (
        "three-cycle",
        [queue("a"), queue("b", parent="a"), queue("c", parent="b")],
        queue("a", parent="c"),
        "parent 'c' would make a cycle",
    ),
    # children deserving more than their parent
    (
        "child-over-parent",
        [P4],
        queue("c", parent="p", deserved=6),
        "deserved.gpu_milli of the children of 'p' would add up to 6000, more than its 4000",
    ),
    (
        "siblings-over-parent",
        [P4, queue("c1", parent="p", deserved=3)],
        queue("c2", parent="p", deserved=2),
        "deserved.gpu_milli of the children of 'p' would add up to 5000",
    ),
    (
        "parent-shrinks-below-children",
        [queue("p", deserved=8), queue("c", parent="p", deserved=6)],
        queue("p", deserved=4),
        "queue p: deserved.gpu_milli 4000 is less than its children's 6000",
    ),
    (
        "children-percent-over-100",
        [queue("p"), queue("c1", parent="p", percent=60)],
        queue("c2", parent="p", percent=50),
        "deserved_gpu_percent of the children of 'p' would add up to 110",
    ),
    (
        "top-level-percent-over-100",
        [queue("a", percent=70)],
        queue("b", percent=40),
        "deserved_gpu_percent of the top-level queues would add up to 110",
    ),
    ("percent-over-100", [], queue("a", percent=150), "deserved_gpu_percent 150 outside 0..100"),
    # negative (and absurd) resources
    ("node-negative-gpus", [], node("n", gpus=-1), "node n: negative gpus (-1)"),
    ("node-negative-cpu", [], node("n", cpu=-1), "node n: negative cpu_milli (-1)"),
    ("node-negative-memory", [], node("n", memory=-1), "node n: negative memory_mib (-1)"),
    (
        "node-too-many-gpus",
        [],
        node("n", gpus=2**40),
        f"node n: gpus {2**40} is more than {MAX_NODE_GPUS}",
    ),
    (
        "pod-negative-gpu",
        [queue("q")],
        job("j", "q", gpus=-1),
        "pod j-0: negative gpu_milli (-1000)",
    ),
    ("pod-negative-cpu", [queue("q")], job("j", "q", cpu=-5), "pod j-0: negative cpu_milli (-5)"),
    (
        "pod-negative-gpu-memory",
        [queue("q")],
        job("j", "q", gpus=0, gpu_memory=-1),
        "pod j-0: negative gpu_memory_mib (-1)",
    ),
    (
        "negative-runtime",
        [queue("q")],
        job("j", "q", runtime_s=-5),
        "job j: negative expected_runtime_ms (-5000)",
    ),
    (
        "queue-negative-deserved",
        [],
        queue("a", deserved=-1),
        "queue a: negative deserved gpu_milli -1000",
    ),
    ("queue-bad-limit", [], queue("a", limit=-5), "queue a: limit gpu_milli -5000"),
    (
        "queue-negative-weight",
        [],
        queue("a", weight=-1),
        "queue a: negative over_quota_weight (-1)",
    ),
    (
        "mixed-whole-and-fraction",
        [queue("q")],
        job("j", "q", gpus=1.5),
        "gpu_milli 1500 is neither a fraction of one GPU",
    ),
    # gangs that cannot be a gang
    (
        "min-members-above-pods",
        [queue("q")],
        job("j", "q", pods=2, min_members=3),
        "job j: min_members 3 is outside 0..2",
    ),
    ("no-pods", [queue("q")], job("j", "q", pods=0), "job j: no pods"),
    # duplicate ids
    ("duplicate-job", [queue("q"), job("j", "q")], job("j", "q", gpus=8), "duplicate job id 'j'"),
    (
        "duplicate-pod",
        [queue("q")],
        JobSubmitted(job="j", queue="q", pods=(PodSpec(name="p"), PodSpec(name="p"))),
        "job j: duplicate pod names",
    ),
    # events out of order
    ("started-before-submitted", [], PodStarted(job="j", pod="j-0"), "unknown job 'j'"),
    ("finished-before-submitted", [], PodFinished(job="j", pod="j-0"), "unknown job 'j'"),
    ("bound-before-submitted", [], PodBound(job="j", pod="j-0", node="n1"), "unknown job 'j'"),
    (
        "bind-failed-before-submitted",
        [],
        BindFailed(job="j", pod="j-0", node="n1", reason="x"),
        "unknown job 'j'",
    ),
    ("evicted-before-submitted", [], PodEvicted(job="j", pod="j-0", node="n1"), "unknown job 'j'"),
    ("cancel-before-submitted", [], JobCancelled(job="j"), "unknown job 'j'"),
    ("job-before-queue", [], job("j", "q"), "job j: unknown queue 'q'"),
    ("child-before-parent", [], queue("c", parent="p"), "queue c: unknown parent queue 'p'"),
    ("cordon-before-registered", [], NodeCordoned(node="n9"), "unknown node 'n9'"),
    ("remove-before-registered", [], NodeRemoved(node="n9"), "unknown node 'n9'"),
    ("queue-removed-before-configured", [], QueueRemoved(queue="q"), "unknown queue 'q'"),
    (
        "pod-of-another-gang",
        [queue("q"), job("j", "q")],
        PodStarted(job="j", pod="k-0"),
        "job j: unknown pod 'k-0'",
    ),
    (
        "decision-at-intake",
        [queue("q"), job("j", "q")],
        PodsAllocated(job="j", queue="q", placements=()),
        "PodsAllocated is a scheduler decision",
    ),
    ("job-to-inner-queue", [P4, queue("c", parent="p")], job("j", "p"), "not a leaf queue"),
]


def _intake(setup: list[Event], at: int = 0) -> State:
    """A state built from inputs intake accepted, with a cycle run over them."""
    state = State()
    for event in [N1, N2, *setup]:
        assert validate(state, event) is None, event
        apply(state, event, at)
    cycle(state, at)
    return state


@pytest.mark.parametrize(
    ("setup", "event", "reason"), [r[1:] for r in INTAKE], ids=[r[0] for r in INTAKE]
)
def test_intake_refuses_with_a_reason_and_the_core_survives_it(
    setup: list[Event], event: Event, reason: str
) -> None:
    state = _intake(setup)
    why = validate(state, event)
    assert why is not None and reason in why, why
    # Had it reached the ledger anyway (an import bypasses intake), the fold and the next
    # cycles must not raise, and what they decide must encode.
    apply(state, event, 1000)
    for now in (1000, 90_000_000):
        for decision in cycle(state, now):
            encode(decision, now)


def test_a_valid_tree_and_workload_pass_intake() -> None:
    """The limits above are limits: right at them, everything is accepted."""
    state = _intake(
        [
            queue("p", deserved=6),
            queue("c1", parent="p", deserved=3),
            queue("c2", parent="p", deserved=3),
            queue("x", percent=60),
            queue("y", percent=40),
            queue("z", parent="x", percent=100),
            node("big", gpus=MAX_NODE_GPUS),
            job("j", "c1", pods=2, min_members=2),
        ]
    )
    assert validate(state, queue("p", deserved=6, weight=3)) is None  # re-configure in place
    assert validate(state, queue("p", deserved=0)) is None  # 0 states no quota of its own
    assert validate(state, PodStarted(job="j", pod="j-1")) is None


def test_nan_is_a_schema_error_naming_the_field() -> None:
    """Resources are integers: a NaN cannot even decode (the live path dead-letters it)."""
    payload = {"type": "job_submitted", "job": "j", "queue": "q"}
    payload["pods"] = [{"name": "p", "gpu_milli": float("nan")}]  # type: ignore[assignment]
    env = Envelope(
        type="job_submitted", key="j", at=0, payload=msgspec.Raw(msgspec.msgpack.encode(payload))
    )
    with pytest.raises(DecodeError, match=r"bad job_submitted payload.*\$\.pods\[0\]\.gpu_milli"):
        decode_event(env, 5)


def test_a_gang_larger_than_the_cluster_is_refused_by_the_cycle_with_its_size() -> None:
    state = _intake([queue("q")])
    big = job("big", "q", pods=3, gpus=8)
    assert validate(state, big) is None  # nodes may still join: the cycle decides
    apply(state, big, 1000)
    decisions = cycle(state, 1000)
    refusal = next(d for d in decisions if isinstance(d, JobUnschedulable))
    assert refusal.final and "16 schedulable GPUs" in refusal.reason, refusal.reason
    huge = job("huge", "q", gpus=2**40)
    apply(state, huge, 2000)
    refusal = next(d for d in cycle(state, 2000) if isinstance(d, JobUnschedulable))
    assert refusal.final and "largest matching node has 8" in refusal.reason, refusal.reason


def test_a_duplicate_submission_changes_nothing_in_the_core() -> None:
    state = _intake([queue("q"), job("j", "q", gpus=2)])
    apply(state, job("j", "q", pods=3, gpus=8), 1000)
    assert len(state.jobs["j"].pods) == 1 and state.jobs["j"].request[0] == 2000


def test_time_never_runs_backwards_in_the_core() -> None:
    """Producers' clocks differ, so intake takes an event stamped in the past; the fold
    applies it at the current time (the ledger keeps its stamp for replay)."""
    state = _intake([queue("q")], at=5000)
    late = job("late", "q")
    assert validate(state, late) is None
    apply(state, late, 1000)
    assert state.now == 5000 and state.jobs["late"].submitted_at == 1000
    decisions = cycle(state, 2000)
    assert all(wrap(d, state.now).at == 5000 for d in decisions)
    apply(state, Tick(), 0)
    assert state.now == 5000


# --------------------------------------------------------------------------- YAML loaders

GEN = "generators:\n  - {name: g, queue: q, arrival: {type: periodic, every_s: 60}, runtime_s: 60%s}\n"

# (id, file kind, text, what the ConfigError must say)
YAML: list[tuple[str, type, str, str]] = [
    ("own-parent", QueuesFile, "queues:\n  - {name: a, parent: a}\n", "loops through 'a'"),
    (
        "three-cycle",
        QueuesFile,
        "queues:\n  - {name: a, parent: c}\n  - {name: b, parent: a}\n  - {name: c, parent: b}\n",
        "the parent chain loops",
    ),
    (
        "child-over-parent",
        QueuesFile,
        "queues:\n  - {name: p, deserved_gpus: 4}\n  - {name: c1, parent: p, deserved_gpus: 3}\n"
        "  - {name: c2, parent: p, deserved_gpus: 2}\n",
        "queue p: children deserve 5 GPUs, more than its 4",
    ),
    (
        "children-percent",
        QueuesFile,
        "queues:\n  - {name: p}\n  - {name: a, parent: p, deserved_percent: 60}\n"
        "  - {name: b, parent: p, deserved_percent: 50}\n",
        "queue p: children's deserved_percent adds up to 110",
    ),
    (
        "queue-negative",
        QueuesFile,
        "queues:\n  - {name: a, deserved_gpus: -4}\n",
        "$.queues[0].deserved_gpus",
    ),
    (
        "queue-nan",
        QueuesFile,
        "queues:\n  - {name: a, limit_gpus: .nan}\n",
        "$.queues[0].limit_gpus",
    ),
    (
        "queue-inf",
        QueuesFile,
        "queues:\n  - {name: a, deserved_gpus: .inf}\n",
        "$.queues[0].deserved_gpus",
    ),
    (
        "node-negative-gpus",
        ClusterFile,
        "nodes:\n  - {name: n, count: 1, gpus: -8}\n",
        "$.nodes[0].gpus",
    ),
    (
        "node-nan-cpu",
        ClusterFile,
        "nodes:\n  - {name: n, count: 1, gpus: 8, cpu: .nan}\n",
        "$.nodes[0].cpu",
    ),
    (
        "node-too-many-gpus",
        ClusterFile,
        f"nodes:\n  - {{name: n, count: 1, gpus: {MAX_NODE_GPUS + 1}}}\n",
        f"<= {MAX_NODE_GPUS} - at `$.nodes[0].gpus`",
    ),
    (
        "job-nan-gpus",
        WorkloadFile,
        "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5, gpus_per_pod: .nan}\n",
        "$.jobs[0].gpus_per_pod",
    ),
    (
        "job-inf-runtime",
        WorkloadFile,
        "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: .inf}\n",
        "$.jobs[0].runtime_s",
    ),
    (
        "generator-negative-gpus",
        WorkloadFile,
        GEN % ", gpus_per_pod: -1",
        "$.generators[0].gpus_per_pod",
    ),
    ("generator-nan-gang", WorkloadFile, GEN % ", gang_size: .nan", "$.generators[0].gang_size"),
    (
        "generator-choice-weights",
        WorkloadFile,
        GEN % ", gpus_per_pod: {type: choice, values: [1, 2], weights: [1]}",
        "1 weights for 2 values - at `$.generators[0].gpus_per_pod`",
    ),
    (
        "min-members-above-pods",
        WorkloadFile,
        "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5, pods: 2, min_members: 3}\n",
        "workload.jobs[0] (j).min_members: 3 is more than its 2 pods",
    ),
    (
        "duplicate-job",
        WorkloadFile,
        "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5}\n  - {name: j, queue: q, at_s: 1, runtime_s: 5}\n",
        "duplicate job name 'j'",
    ),
    (
        "job-named-like-a-generated-one",
        WorkloadFile,
        "jobs:\n  - {name: g-00000, queue: q, at_s: 0, runtime_s: 5}\n" + GEN % "",
        "duplicate job name 'g-00000'",
    ),
    (
        "unknown-priority-class",
        WorkloadFile,
        "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5, priority_class: inferense}\n",
        "input.yaml: $.jobs[0].priority_class: 'inferense' is not one of train, "
        "build-preemptible, build, inference",
    ),
    (
        "fractional-percent",
        QueuesFile,
        "queues:\n  - {name: a, deserved_percent: 12.5}\n",
        "input.yaml: $.queues[0].deserved_percent: 12.5 is not exact",
    ),
    (
        "sub-millisecond-time",
        WorkloadFile,
        "jobs:\n  - {name: j, queue: q, at_s: 0.0004, runtime_s: 5}\n",
        "input.yaml: $.jobs[0].at_s: 0.0004 is not exact",
    ),
    (
        "undefined-parent-names-the-file",
        QueuesFile,
        "queues:\n  - {name: a, parent: ghost}\n",
        "input.yaml: queue a: parent 'ghost' is not defined",
    ),
    (
        "duplicate-node",
        ClusterFile,
        "nodes:\n  - {name: a, count: 1, gpus: 8}\n  - {name: a, count: 2, gpus: 8}\n",
        "duplicate node name 'a-000'",
    ),
]


def _load_events(text: str, kind: type) -> list[object]:
    parsed = parse(text, kind, "input.yaml")
    if kind is QueuesFile:
        return list(queue_events(parsed))
    if kind is ClusterFile:
        return list(node_events(parsed))
    return [j.submitted for j in expand(parsed)]


@pytest.mark.parametrize(
    ("kind", "text", "reason"), [r[1:] for r in YAML], ids=[r[0] for r in YAML]
)
def test_yaml_loaders_refuse_with_the_field_named(kind: type, text: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load_events(text, kind)
    assert reason in str(err.value), err.value


def test_yaml_order_does_not_matter_parents_come_first() -> None:
    events = _load_events(
        "queues:\n  - {name: c, parent: b}\n  - {name: b, parent: a}\n  - {name: a}\n", QueuesFile
    )
    assert [e.queue for e in events] == ["a", "b", "c"]  # type: ignore[attr-defined]
    state = State()
    for event in events:  # and intake accepts them in that order
        assert validate(state, event) is None  # type: ignore[arg-type]
        apply(state, event, 0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the CLI

CLUSTER = "nodes:\n  - {name: n, count: 2, gpus: 8}\n"
QUEUES = "queues:\n  - {name: q, deserved_gpus: 16}\n"
WORKLOAD = "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 60}\n"

# (id, files replaced, exit status, what stderr (2) or stdout (0) must say)
CLI: list[tuple[str, dict[str, str], int, str]] = [
    (
        "cyclic-queues",
        {"queues": "queues:\n  - {name: a, parent: b}\n  - {name: b, parent: a}\n"},
        2,
        "the parent chain loops",
    ),
    (
        "children-over-parent",
        {
            "queues": "queues:\n  - {name: p, deserved_gpus: 4}\n  - {name: q, parent: p, deserved_gpus: 6}\n"
        },
        2,
        "children deserve 6 GPUs, more than its 4",
    ),
    (
        "negative-cpu",
        {"cluster": "nodes:\n  - {name: n, count: 1, gpus: 8, cpu: -1}\n"},
        2,
        "$.nodes[0].cpu",
    ),
    (
        "nan-runtime",
        {"workload": "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: .nan}\n"},
        2,
        "$.jobs[0].runtime_s",
    ),
    ("inf-startup", {"cluster": CLUSTER + "timing: {startup_s: .inf}\n"}, 2, "$.timing.startup_s"),
    (
        "unknown-priority-class",
        {"workload": WORKLOAD.replace("}", ", priority_class: inferense}")},
        2,
        "workload.yaml: $.jobs[0].priority_class: 'inferense' is not one of train,",
    ),
    (
        "fractional-percent",
        {"queues": "queues:\n  - {name: q, deserved_percent: 12.5}\n"},
        2,
        "queues.yaml: $.queues[0].deserved_percent: 12.5 is not exact",
    ),
    (
        "undefined-parent",
        {"queues": QUEUES + "  - {name: r, parent: ghost}\n"},
        2,
        "queues.yaml: queue r: parent 'ghost' is not defined",
    ),
    (
        "duplicate-job",
        {"workload": WORKLOAD + "  - {name: j, queue: q, at_s: 5, runtime_s: 60}\n"},
        2,
        "duplicate job name 'j'",
    ),
    (
        "min-members-above-pods",
        {
            "workload": "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 60, pods: 1, min_members: 2}\n"
        },
        2,
        "min_members: 2 is more than its 1 pods",
    ),
    (
        "gang-larger-than-cluster",
        {
            "workload": "jobs:\n  - {name: big, queue: q, at_s: 0, runtime_s: 60, pods: 3, gpus_per_pod: 8}\n"
        },
        0,
        "unschedulable 1",
    ),
]


@pytest.mark.parametrize(("files", "code", "says"), [r[1:] for r in CLI], ids=[r[0] for r in CLI])
def test_simulate_cli_refuses_bad_inputs_by_name(
    files: dict[str, str],
    code: int,
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = {}
    for kind, default in (("cluster", CLUSTER), ("queues", QUEUES), ("workload", WORKLOAD)):
        paths[kind] = tmp_path / f"{kind}.yaml"
        paths[kind].write_text(files.get(kind, default))
    argv = ["simulate", *(f"--{k}={p}" for k, p in paths.items()), "--ledger", str(tmp_path / "l")]
    assert main([*argv, "--no-fairness"]) == code
    out, err = capsys.readouterr()
    if code:
        assert err.startswith("gpuledger: ") and "Traceback" not in err
        assert err.count("\n") == 1, err  # one line
        assert says in err, err
        assert not (tmp_path / "l").exists()  # nothing left behind
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    else:
        assert says in out, out

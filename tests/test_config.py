"""The three YAML formats: exact unit conversion, and errors that name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.config import (
    ClusterFile,
    ConfigError,
    QueuesFile,
    WorkloadFile,
    json_schema,
    kinds,
    load,
    node_events,
    parse,
    queue_events,
)
from replay.sim import expand


def test_node_groups_expand_to_named_nodes_in_exact_units() -> None:
    cluster = parse(
        "nodes:\n  - {name: a100, count: 2, gpus: 8, cpu: 95.5, memory_gib: 0.5, labels: {pool: x}}\n",
        ClusterFile,
    )
    events = node_events(cluster)
    assert [e.node for e in events] == ["a100-000", "a100-001"]
    assert (events[0].cpu_milli, events[0].memory_mib, events[0].labels) == (
        95_500,
        512,
        {"pool": "x"},
    )


def test_bad_field_is_named_with_file_and_path(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n  - {name: a, count: 0, gpus: 8}\n")
    with pytest.raises(ConfigError) as err:
        load(bad, ClusterFile)
    assert str(bad) in str(err.value) and "$.nodes[0].count" in str(err.value)


def test_unknown_field_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"unknown field `gpu`"):
        parse("nodes:\n  - {name: a, count: 1, gpu: 8}\n", ClusterFile)


def test_not_yaml_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse("nodes: [\n", ClusterFile, "c.yaml")


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "nope.yaml", QueuesFile)


def test_queue_tree_is_ordered_parents_first_and_validated() -> None:
    queues = parse(
        "queues:\n"
        "  - {name: vision, parent: ml, deserved_gpus: 4}\n"
        "  - {name: ml, deserved_gpus: 8, limit_gpus: 12.5}\n",
        QueuesFile,
    )
    events = queue_events(queues)
    assert [e.queue for e in events] == ["ml", "vision"]
    assert events[0].limit.gpu_milli == 12_500 and events[1].deserved.gpu_milli == 4000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("queues:\n  - {name: a, parent: b}\n  - {name: b, parent: a}\n", "loops"),
        ("queues:\n  - {name: a, parent: ghost}\n", "parent 'ghost' is not defined"),
        # found by fuzzing: a grandparent missing used to crash the loop check (KeyError)
        (
            "queues:\n  - {name: c, parent: b}\n  - {name: b, parent: a}\n",
            "parent 'a' is not defined",
        ),
        ("queues:\n  - {name: a}\n  - {name: a}\n", "duplicate queue name"),
        (
            "queues:\n  - {name: p, deserved_gpus: 4}\n  - {name: c, parent: p, deserved_gpus: 6}\n",
            "children deserve 6 GPUs, more than its 4",
        ),
        (
            "queues:\n  - {name: a, deserved_percent: 70}\n  - {name: b, deserved_percent: 40}\n",
            "adds up to 110",
        ),
        ("queues:\n  - {name: a, deserved_gpus: 1, deserved_percent: 5}\n", "not both"),
        ("queues:\n  - {name: a, deserved_percent: 101}\n", "$.queues[0].deserved_percent"),
    ],
)
def test_bad_queue_trees_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        queue_events(parse(text, QueuesFile))
    assert message in str(err.value)


def test_generators_are_seeded_and_reproducible() -> None:
    text = (
        "seed: 3\nhorizon_s: 36000\ngenerators:\n"
        "  - name: nb\n    queue: q\n    arrival: {type: poisson, rate_per_h: 4}\n"
        "    runtime_s: {type: lognormal, median: 600, sigma: 0.5}\n"
        "    gpus_per_pod: {type: choice, values: [0.5, 1, 2]}\n"
    )
    one = expand(parse(text, WorkloadFile))
    two = expand(parse(text, WorkloadFile))
    assert one == two and 20 <= len(one) <= 60
    assert {j.submitted.pods[0].gpu_milli for j in one} <= {500, 1000, 2000}
    other = expand(parse(text.replace("seed: 3", "seed: 4"), WorkloadFile))
    assert [j.at for j in other] != [j.at for j in one]


def test_mixed_whole_and_fractional_gpus_are_rejected() -> None:
    text = "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5, gpus_per_pod: 1.5}\n"
    with pytest.raises(ConfigError, match="fraction of one GPU or whole GPUs"):
        expand(parse(text, WorkloadFile))


def test_duplicate_job_names_are_rejected() -> None:
    text = (
        "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5}\n"
        "  - {name: j, queue: q, at_s: 1, runtime_s: 5}\n"
    )
    with pytest.raises(ConfigError, match="duplicate job name 'j'"):
        expand(parse(text, WorkloadFile))


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_json_schema_is_generated_for_each_format(kind: str) -> None:
    schema = json_schema(kinds()[kind])
    assert "$defs" in schema and schema["$ref"].startswith("#/$defs/")


def test_built_in_examples_load() -> None:
    for name, kind in (
        ("cluster", ClusterFile),
        ("queues", QueuesFile),
        ("workload", WorkloadFile),
    ):
        load(f"replay/examples/demo-{name}.yaml", kind)  # type: ignore[type-var]


def test_documented_schemas_are_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_schemas", "scripts/gen_schemas.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for kind in kinds():
        path = Path("docs/schemas") / f"{kind}.schema.json"
        assert path.read_text() == gen.render(kind), f"{path} is stale: run scripts/gen_schemas.py"

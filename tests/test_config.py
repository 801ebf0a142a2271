"""The three YAML formats: exact unit conversion, and errors that name file and field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from replay.config import (
    ClusterFile,
    ConfigError,
    PolicyFile,
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
        # a missing grandparent is named, not a KeyError in the loop check
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


# --------------------------------------------------------------------------- exact inputs


def test_unknown_priority_class_names_file_field_and_the_accepted_values(tmp_path: Path) -> None:
    path = tmp_path / "workload.yaml"
    path.write_text(
        "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5, priority_class: inferense}\n"
    )
    with pytest.raises(ConfigError) as err:
        load(path, WorkloadFile)
    message = str(err.value)
    assert message.startswith(f"{path}: $.jobs[0].priority_class: 'inferense' is not one of")
    assert "train, build-preemptible, build, inference" in message


def test_unknown_priority_class_of_a_generator_is_rejected_too() -> None:
    text = (
        "generators:\n  - name: g\n    queue: q\n    arrival: {type: poisson, rate_per_h: 1}\n"
        "    runtime_s: 60\n    priority_class: Inference\n"
    )
    with pytest.raises(ConfigError, match=r"generators\[0\]\.priority_class: 'Inference' is not"):
        parse(text, WorkloadFile, "w.yaml")


@pytest.mark.parametrize(
    ("kind", "text", "field", "stored"),
    [
        (QueuesFile, "queues:\n  - {name: a, deserved_percent: 12.5}\n",
         "$.queues[0].deserved_percent: 12.5", "rounded to 12"),
        (QueuesFile, "queues:\n  - {name: a, deserved_gpus: 0.0005}\n",
         "$.queues[0].deserved_gpus: 0.0005", "rounded to 0"),
        (QueuesFile, "queues:\n  - {name: a, limit_memory_gib: 0.1}\n",
         "$.queues[0].limit_memory_gib: 0.1", "102.4 MiB would be rounded to 102"),
        (QueuesFile, "queues:\n  - {name: a, reclaim_min_runtime_s: 1.0001}\n",
         "$.queues[0].reclaim_min_runtime_s: 1.0001", "rounded to 1000"),
        (ClusterFile, "nodes:\n  - {name: a, count: 1, gpus: 8, cpu: 95.0001}\n",
         "$.nodes[0].cpu: 95.0001", "rounded to 95000"),
        (ClusterFile, "nodes:\n  - {name: a, count: 1, gpus: 8}\ntiming: {bind_latency_s: 0.0004}\n",
         "$.timing.bind_latency_s: 0.0004", "rounded to 0"),
        (WorkloadFile, "jobs:\n  - {name: j, queue: q, at_s: 0.0004, runtime_s: 5}\n",
         "$.jobs[0].at_s: 0.0004", "rounded to 0"),
        (WorkloadFile, "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5, cpu_per_pod: 0.0001}\n",
         "$.jobs[0].cpu_per_pod: 0.0001", "rounded to 0"),
        (WorkloadFile,
         "generators:\n  - {name: g, queue: q, arrival: {type: poisson, rate_per_h: 1},"
         " runtime_s: {type: fixed, value: 1.0005}}\n",
         "$.generators[0].runtime_s.value: 1.0005", "rounded to 1000"),
        (WorkloadFile,
         "generators:\n  - {name: g, queue: q, arrival: {type: poisson, rate_per_h: 1},"
         " runtime_s: 60, gang_size: {type: choice, values: [1, 2.5]}}\n",
         "$.generators[0].gang_size.values[1]: 2.5", "rounded to 2"),
        (WorkloadFile,
         "generators:\n  - {name: g, queue: q, arrival: {type: poisson, rate_per_h: 1},"
         " runtime_s: 60, gpus_per_pod: 0.0001}\n",
         "$.generators[0].gpus_per_pod: 0.0001", "rounded to 0"),
        (PolicyFile, "k_value: 1.0005\n", "$.k_value: 1.0005", "rounded to 1000"),
        (PolicyFile, "half_life_s: 0.5005\n", "$.half_life_s: 0.5005", "rounded to 500"),
    ],
)  # fmt: skip
def test_a_number_the_ledger_cannot_keep_exactly_is_rejected_with_file_field_and_value(
    kind: type[object], text: str, field: str, stored: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text, kind, "in.yaml")
    message = str(err.value)
    assert message.startswith(f"in.yaml: {field} is not exact"), message
    assert stored in message


def test_choice_weights_are_relative_and_need_no_unit() -> None:
    text = (
        "generators:\n  - {name: g, queue: q, arrival: {type: poisson, rate_per_h: 1},"
        " runtime_s: 60, gang_size: {type: choice, values: [1, 2], weights: [0.25, 0.75]}}\n"
    )
    assert parse(text, WorkloadFile).generators[0].gang_size is not None


def test_exact_fractions_are_kept() -> None:
    queues = parse(
        "queues:\n  - {name: a, deserved_percent: 12}\n"
        "  - {name: b, deserved_gpus: 0.125, limit_memory_gib: 0.5}\n",
        QueuesFile,
    )
    a, b = queue_events(queues)
    assert a.deserved_gpu_percent == 12
    assert (b.deserved.gpu_milli, b.limit.memory_mib) == (125, 512)
    jobs = expand(
        parse("jobs:\n  - {name: j, queue: q, at_s: 0.001, runtime_s: 1.5}\n", WorkloadFile)
    )
    assert (jobs[0].at, jobs[0].runtime_ms) == (1, 1500)


def test_children_deserving_exactly_their_parent_are_accepted() -> None:
    queues = parse(
        "queues:\n  - {name: p, deserved_gpus: 0.3}\n"
        "  - {name: a, parent: p, deserved_gpus: 0.1}\n  - {name: b, parent: p, deserved_gpus: 0.2}\n",
        QueuesFile,
    )
    assert [e.deserved.gpu_milli for e in queue_events(queues)] == [300, 100, 200]


@pytest.mark.parametrize(
    ("kind", "text", "field"),
    [
        (ClusterFile, "nodes:\n  - {name: a, count: 1, gpus: 8.5}\n", "$.nodes[0].gpus"),
        (ClusterFile, "nodes:\n  - {name: a, count: 2.0, gpus: 8}\n", "$.nodes[0].count"),
        (QueuesFile, "queues:\n  - {name: a, over_quota_weight: 1.5}\n",
         "$.queues[0].over_quota_weight"),
        (QueuesFile, "queues:\n  - {name: a, priority: 10.5}\n", "$.queues[0].priority"),
        (WorkloadFile, "jobs:\n  - {name: j, queue: q, at_s: 0, runtime_s: 5, pods: 1.5}\n",
         "$.jobs[0].pods"),
        (WorkloadFile, "seed: 1.5\n", "$.seed"),
    ],
)  # fmt: skip
def test_a_float_where_an_integer_is_stored_is_rejected(
    kind: type[object], text: str, field: str
) -> None:
    with pytest.raises(ConfigError, match=r"in\.yaml: Expected `int`, got `float` - at `") as err:
        parse(text, kind, "in.yaml")
    assert f"`{field}`" in str(err.value)


def test_an_undefined_parent_is_reported_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text("queues:\n  - {name: a}\n  - {name: b, parent: ghost}\n")
    with pytest.raises(ConfigError) as err:
        load(path, QueuesFile)
    assert str(err.value) == f"{path}: queue b: parent 'ghost' is not defined"


def _stored_numbers(info: object, path: str, unit: str | None) -> Iterator[tuple[str, str | None]]:
    """(path, exact unit) of every float field reachable in a format's type."""
    match info:
        case msgspec.inspect.Metadata():
            yield from _stored_numbers(info.type, path, (info.extra or {}).get("exact", unit))
        case msgspec.inspect.UnionType():
            for option in info.types:
                yield from _stored_numbers(option, path, unit)
        case msgspec.inspect.StructType():
            for field in info.fields:
                carried = unit if field.name in ("value", "values") else None
                yield from _stored_numbers(field.type, f"{path}.{field.encode_name}", carried)
        case msgspec.inspect.ListType():
            yield from _stored_numbers(info.item_type, f"{path}[]", unit)
        case msgspec.inspect.FloatType():
            yield path, unit


# Parameters of random draws and bounds of arrival windows: never stored as they are.
DRAWN = {
    "$.generators[].arrival.rate_per_h", "$.generators[].arrival.every_s",
    "$.generators[].arrival.jitter_s", "$.generators[].start_s", "$.generators[].end_s",
    "$.horizon_s",
}  # fmt: skip


def test_every_stored_number_of_every_format_has_an_exact_unit() -> None:
    missing = []
    for name, kind in sorted(kinds().items()):
        for path, unit in _stored_numbers(msgspec.inspect.type_info(kind), "$", None):
            parameter = any(
                path.endswith(p)
                for p in (".min", ".max", ".mean", ".median", ".sigma", ".weights[]")
            )
            if unit is None and not parameter and path not in DRAWN:
                missing.append(f"{name}: {path}")
    assert missing == []

"""The simulator's three input files: ``cluster.yaml``, ``queues.yaml``, ``workload.yaml``.

Each is a msgspec Struct, so a bad file fails with the file name and the exact field path
(``$.generators[2].runtime.median_s``), and ``gpuledger schema`` prints a JSON Schema
generated from these very types (docs/formats.md). People write GPUs, cores, GiB and
seconds; the loaders convert to the ledger's integer units exactly.
"""

from __future__ import annotations

import functools
import graphlib
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, get_args

import msgspec

from events.knobs import Knob
from events.model import (
    MAX_NODE_GPUS,
    MILLI,
    POLICY_KNOBS,
    JobSubmitted,
    NodeRegistered,
    PolicyConfigured,
    QueueConfigured,
    Resources,
)
from scheduler.core.policy import REVISION, kai_knobs

MAX_QUANTITY = 1e12
"""The largest amount or duration a file may give (GPUs, cores, GiB, seconds, rates).

Far beyond any real cluster, yet in milli units and milliseconds it still fits the
ledger's 64-bit integers; it also keeps out ``.inf``, which has no integer form (an
infinite duration could not be converted to milliseconds).
"""

NonNeg = Annotated[float, msgspec.Meta(ge=0, le=MAX_QUANTITY)]
Positive = Annotated[float, msgspec.Meta(gt=0, le=MAX_QUANTITY)]


def _exact(unit: str) -> msgspec.Meta:
    """Metadata naming the integer unit a field is stored in (see ``EXACT_UNITS``)."""
    return msgspec.Meta(extra={"exact": unit})


EXACT_UNITS: dict[str, tuple[Decimal, str]] = {
    "milli": (Decimal(1000), "milli-units (1/1000 GPU or core)"),
    "mib": (Decimal(1024), "MiB"),
    "ms": (Decimal(1000), "milliseconds"),
    "whole": (Decimal(1), "numbers"),
}
"""Integer units the ledger stores numbers in: multiplier from the file's unit, and a name.

A field annotated with ``_exact(unit)`` must convert to a whole number of that unit, so
no value is rounded on its way to the ledger (``deserved_percent: 12.5`` or ``at_s:
0.0004`` is refused with file, field and value instead of becoming 12 or 0). Fields of
sampled distributions (means, medians, rates) are parameters, not stored amounts, and
carry no unit.
"""

Milli = Annotated[float, msgspec.Meta(ge=0, le=MAX_QUANTITY), _exact("milli")]
"""GPUs, cores or a plain factor, stored in thousandths."""
GiB = Annotated[float, msgspec.Meta(ge=0, le=MAX_QUANTITY), _exact("mib")]
"""Memory in GiB, stored in whole MiB."""
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_QUANTITY), _exact("ms")]
"""A time or duration in seconds, stored in whole milliseconds."""
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_QUANTITY), _exact("ms")]
Count = Annotated[int, msgspec.Meta(ge=1)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An integer the ledger can store (msgpack's signed 64 bits)."""


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file and the field."""


# --------------------------------------------------------------------------- cluster.yaml


class NodeGroup(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``count`` identical nodes named ``{name}-000``, ``{name}-001``, …"""

    name: str
    count: Count
    gpus: Annotated[int, msgspec.Meta(ge=0, le=MAX_NODE_GPUS)]
    gpu_model: str = ""
    gpu_memory_gib: GiB = 0
    cpu: Milli = 0
    """Cores; 0 means CPU is not modelled on these nodes."""
    memory_gib: GiB = 0
    """0 means memory is not modelled on these nodes."""
    labels: dict[str, str] = {}


class Timing(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How long the simulated binder and kubelet take."""

    bind_latency_s: Seconds = 0.5
    startup_s: Seconds = 2.0


class ClusterFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``cluster.yaml``: node groups and binder/kubelet timing."""

    nodes: list[NodeGroup]
    timing: Timing = Timing()


# --------------------------------------------------------------------------- queues.yaml


class QueueSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One queue of the tree. Give ``deserved_gpus`` or ``deserved_percent``, not both."""

    name: str
    parent: str = ""
    deserved_gpus: Milli | None = None
    deserved_percent: Annotated[float, msgspec.Meta(ge=0, le=100), _exact("whole")] | None = None
    """A whole percent of the parent's deserved GPUs (the ledger records an integer); for a
    fraction give ``deserved_gpus`` in milli-GPU precision."""
    deserved_cpu: Milli = 0
    deserved_memory_gib: GiB = 0
    over_quota_weight: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 1
    limit_gpus: Milli | None = None
    limit_cpu: Milli | None = None
    limit_memory_gib: GiB | None = None
    priority: Int64 = 0
    reclaim_min_runtime_s: Seconds = 0
    """Its jobs that started less than this ago are not reclaimed by other queues."""
    preempt_min_runtime_s: Seconds = 0
    """Its jobs that started less than this ago are not preempted within the queue."""
    placement: str = ""
    """``binpack`` or ``spread`` for its jobs (empty: the policy's)."""


class QueuesFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``queues.yaml``: the queue tree."""

    queues: list[QueueSpec]


# --------------------------------------------------------------------------- workload.yaml


class Fixed(msgspec.Struct, tag="fixed", forbid_unknown_fields=True, frozen=True):
    """Always ``value``."""

    value: NonNeg


class Choice(msgspec.Struct, tag="choice", forbid_unknown_fields=True, frozen=True):
    """One of ``values``, with optional relative ``weights`` (one per value)."""

    values: Annotated[list[NonNeg], msgspec.Meta(min_length=1)]
    weights: list[Positive] | None = None

    def __post_init__(self) -> None:
        """Refuse weights that do not pair with the values."""
        if self.weights is not None and len(self.weights) != len(self.values):
            raise ValueError(f"{len(self.weights)} weights for {len(self.values)} values")


class Uniform(msgspec.Struct, tag="uniform", forbid_unknown_fields=True, frozen=True):
    """Uniform between ``min`` and ``max``."""

    min: NonNeg
    max: NonNeg


class Exponential(msgspec.Struct, tag="exponential", forbid_unknown_fields=True, frozen=True):
    """Exponential with mean ``mean``."""

    mean: Positive


class LogNormal(msgspec.Struct, tag="lognormal", forbid_unknown_fields=True, frozen=True):
    """Log-normal with the given ``median`` and shape ``sigma`` (heavy-tailed runtimes)."""

    median: Positive
    sigma: NonNeg = 1.0
    max: Positive | None = None


Distribution = Fixed | Choice | Uniform | Exponential | LogNormal
Number = NonNeg | Distribution


class Poisson(msgspec.Struct, tag="poisson", forbid_unknown_fields=True, frozen=True):
    """Arrivals at ``rate_per_h`` on average, memoryless."""

    rate_per_h: Positive


class Periodic(msgspec.Struct, tag="periodic", forbid_unknown_fields=True, frozen=True):
    """``burst`` jobs every ``every_s`` seconds (cron-like pipelines, notebook waves)."""

    every_s: Positive
    burst: Count = 1
    jitter_s: NonNeg = 0


Arrival = Poisson | Periodic


PriorityClass = Literal["train", "build-preemptible", "build", "inference"]
"""The priority classes a workload file may name (KAI's; intake also takes a whole number)."""

_LITERALS: dict[str, tuple[str, ...]] = {"priority_class": get_args(PriorityClass)}
"""Accepted values of each enumerated field, for error messages."""


class JobSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """An explicit job."""

    name: str
    queue: str
    at_s: Seconds
    runtime_s: PositiveSeconds
    pods: Count = 1
    gpus_per_pod: Milli = 1
    cpu_per_pod: Milli = 0
    memory_gib_per_pod: GiB = 0
    min_members: Annotated[int, msgspec.Meta(ge=0)] = 0
    priority_class: PriorityClass = "train"
    preemptible: bool | None = None
    checkpoint_interval_s: PositiveSeconds | None = None
    expected_runtime_s: PositiveSeconds | None = None
    node_selector: dict[str, str] = {}


class Generator(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A Clusterloader2-style generator of similar jobs."""

    name: str
    queue: str
    arrival: Arrival
    runtime_s: Annotated[Number, _exact("ms")]
    count: Annotated[int, msgspec.Meta(ge=0)] | None = None
    start_s: NonNeg = 0
    end_s: NonNeg | None = None
    gang_size: Annotated[Number, _exact("whole")] = 1
    gpus_per_pod: Annotated[Number, _exact("milli")] = 1
    cpu_per_pod: Milli = 0
    memory_gib_per_pod: GiB = 0
    priority_class: PriorityClass = "train"
    preemptible: bool | None = None
    checkpoint_interval_s: PositiveSeconds | None = None
    expected_runtime: bool = False
    """Tell the scheduler each job's true runtime as its expected runtime."""
    node_selector: dict[str, str] = {}


class WorkloadFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``workload.yaml``: explicit jobs and generators, with a seed and a horizon."""

    seed: int = 0
    horizon_s: Positive = 86_400
    jobs: list[JobSpec] = []
    generators: list[Generator] = []


def _file_type(knob: Knob) -> Any:
    """A knob's type in ``policy.yaml``: seconds or a ratio checked exact in the ledger's
    unit, ``null`` where the knob has one, its line of doc as the schema's description."""
    kind: Any = {"ms": Seconds, "milli": Milli}.get(knob.unit, knob.kind)
    if kind is int:
        kind = Int64
    if knob.null is not None:
        kind = kind | None
    return Annotated[kind, msgspec.Meta(description=knob.doc)]


_POLICY_FILE_DOC = """``policy.yaml``: the policy's knobs, recorded as ``policy_configured``.

A field per knob of ``events.model.POLICY_KNOBS``, named and in the unit ``policy.yaml``
writes it (seconds, ratios). Defaults here are the recommended configuration; an event's
own defaults are the neutral ones that keep older ledgers' behaviour."""

if TYPE_CHECKING:

    class PolicyFile(msgspec.Struct, frozen=True):
        """The type checker's view of the class built below: each knob by its file name."""

        def __init__(self, **knobs: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

else:
    PolicyFile = msgspec.defstruct(
        "PolicyFile",
        [(k.file_name, _file_type(k), k.file_default) for k in POLICY_KNOBS],
        module=__name__,
        namespace={"__doc__": _POLICY_FILE_DOC},
        forbid_unknown_fields=True,
        frozen=True,
    )


def policy_event(name: str, knobs: PolicyFile | None = None) -> PolicyConfigured:
    """The ``policy_configured`` event for a policy name and its knobs, each converted to
    the ledger's unit (``events.knobs.Knob.to_event``). ``kai`` is the gang policy with
    KAI-Scheduler's knobs (``scheduler.core.policy.KAI_KNOBS``) in force, whatever the
    file says of them."""
    k = knobs or PolicyFile()
    fields: dict[str, Any] = {}
    for knob in POLICY_KNOBS:
        value = getattr(k, knob.file_name)
        if knob.choices and value not in knob.choices:
            raise ConfigError(
                f"policy: {knob.file_name} must be {' or '.join(knob.choices)}, not {value!r}"
            )
        fields[knob.field] = knob.to_event(value)
    event = PolicyConfigured(policy=name, revision=REVISION, **fields)
    return kai_knobs(event) if name == "kai" else event


T = TypeVar("T")


def load(path: str | Path, kind: type[T]) -> T:
    """Read and validate a YAML file as ``kind``; ConfigError names file and field."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse(raw, kind, str(path))


def parse(raw: bytes | str, kind: type[T], source: str = "<input>") -> T:
    """Validate YAML text as ``kind``: types, ranges, exact units, and a queue tree's shape.

    Every error starts with ``source`` (the file's name) and names the field.
    """
    try:
        value = msgspec.yaml.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_explain(str(exc))}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    check = _exactness(kind)
    problem = None if check is None else check(value, "$")
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    if isinstance(value, QueuesFile):
        try:
            queue_events(value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
    return value


class _Jobs(msgspec.Struct, forbid_unknown_fields=True):
    jobs: list[JobSubmitted]


def parse_jobs(raw: bytes, source: str) -> list[JobSubmitted]:
    """``job.yaml`` (``gpuledger submit``): one ``job_submitted`` event's fields, or
    ``jobs:`` with a list of them; ``ConfigError`` names ``source``."""
    try:
        data = msgspec.yaml.decode(raw)
        if isinstance(data, dict) and "jobs" in data:
            return msgspec.convert(data, _Jobs).jobs
        if isinstance(data, dict):
            data.setdefault("type", "job_submitted")
        return [msgspec.convert(data, JobSubmitted)]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"{source}: {exc}") from exc


_ENUM = re.compile(r"^Invalid enum value (?P<value>.+) - at `(?P<path>[^`]+)`$")


def _explain(message: str) -> str:
    """msgspec's message, with the accepted values when it names an unknown enum value."""
    found = _ENUM.match(message)
    if found is None:
        return message
    field = found["path"].rsplit(".", 1)[-1]
    accepted = _LITERALS.get(field)
    if accepted is None:  # pragma: no cover - every Literal field of the formats is listed
        return message
    return (
        f"{found['path']}: {found['value']} is not one of {', '.join(accepted)} "
        f"(the accepted values of {field})"
    )


Check = Callable[[Any, str], "str | None"]
"""A compiled check of a decoded value: the first problem with its field path, or None."""


_CHECKS: dict[Any, Check | None] = {}


def _exactness(kind: Any) -> Check | None:
    """The check of every number of a format that the ledger keeps in an integer unit."""
    if kind not in _CHECKS:
        _CHECKS[kind] = _compile(msgspec.inspect.type_info(kind), None)
    return _CHECKS[kind]


def _compile(info: Any, unit: str | None) -> Check | None:
    """A check for values of type ``info``; None when nothing in it needs one.

    ``unit`` is the nearest enclosing ``_exact`` unit; it also applies to the ``value`` of
    a ``fixed`` and the ``values`` of a ``choice`` distribution (those are drawn and stored
    as they are), not to weights or other parameters. Compiled once per format, since a
    workload has thousands of jobs of the same few types.
    """
    match info:
        case msgspec.inspect.Metadata():
            return _compile(info.type, (info.extra or {}).get("exact", unit))
        case msgspec.inspect.FloatType() if unit is not None:
            return functools.partial(_check_number, unit=unit)
        case msgspec.inspect.UnionType():
            return _compile_union(info, unit)
        case msgspec.inspect.ListType():
            return _compile_list(info, unit)
        case msgspec.inspect.StructType():
            return _compile_struct(info, unit)
    return None


def _compile_struct(info: Any, unit: str | None) -> Check | None:
    fields = []
    for field in info.fields:
        carried = unit if field.name in ("value", "values") else None
        check = _compile(field.type, carried)
        if check is not None:
            fields.append((field.name, f".{field.encode_name}", check))
    if not fields:
        return None

    def check_struct(value: Any, path: str) -> str | None:
        for name, key, check in fields:
            item = getattr(value, name)
            if item is not None and (problem := check(item, path + key)) is not None:
                return problem
        return None

    return check_struct


def _compile_list(info: Any, unit: str | None) -> Check | None:
    item_check = _compile(info.item_type, unit)
    if item_check is None:
        return None

    def check_list(value: Any, path: str) -> str | None:
        for index, item in enumerate(value):
            if (problem := item_check(item, f"{path}[{index}]")) is not None:
                return problem
        return None

    return check_list


def _compile_union(info: Any, unit: str | None) -> Check | None:
    by_type: dict[type[Any], Check] = {}
    for option in info.types:
        check = _compile(option, unit)
        inner = option
        while isinstance(inner, msgspec.inspect.Metadata):
            inner = inner.type
        if check is None:
            continue
        if isinstance(inner, msgspec.inspect.StructType):
            by_type[inner.cls] = check
        elif isinstance(inner, msgspec.inspect.FloatType):
            by_type[float] = by_type[int] = check
    if not by_type:
        return None

    def check_union(value: Any, path: str) -> str | None:
        check = by_type.get(type(value))
        return None if check is None else check(value, path)

    return check_union


def _check_number(value: float, path: str, unit: str) -> str | None:
    if isinstance(value, int):  # an integer scales exactly
        return None
    scale, name = EXACT_UNITS[unit]
    stored = Decimal(str(value)) * scale
    if stored == stored.to_integral_value():
        return None
    amount = "it" if unit == "whole" else f"{stored.normalize():f} {name}"
    hint = _HINTS.get(path.rsplit(".", 1)[-1], "")
    return (
        f"{path}: {value} is not exact: the ledger stores whole {name}, and "
        f"{amount} would be rounded to {stored.to_integral_value()}{hint}"
    )


_HINTS = {"deserved_percent": " (for a fraction of the GPUs give deserved_gpus, in milli-GPUs)"}


def json_schema(kind: type[Any]) -> dict[str, Any]:
    """The JSON Schema of a file format, generated from its type."""
    schema: dict[str, Any] = msgspec.json.schema(kind)
    return schema


# --------------------------------------------------------------------------- to events


def milli(value: float, what: str) -> int:
    """An exact conversion of a human number (GPUs, cores) to milli units."""
    try:
        return int((Decimal(str(value)) * MILLI).to_integral_value())
    except InvalidOperation as exc:  # pragma: no cover - msgspec already rejects NaN
        raise ConfigError(f"{what}: not a number: {value!r}") from exc


def mib(gib: float) -> int:
    """GiB to whole MiB."""
    return int((Decimal(str(gib)) * 1024).to_integral_value())


def gpu_milli(value: float, what: str) -> int:
    """GPUs per pod: a fraction of one device, or whole devices."""
    amount = milli(value, what)
    if amount > MILLI and amount % MILLI:
        raise ConfigError(
            f"{what}: {value} GPUs: a pod takes a fraction of one GPU or whole GPUs, not both"
        )
    return amount


def node_events(cluster: ClusterFile) -> list[NodeRegistered]:
    """One NodeRegistered per node, in file order."""
    events: list[NodeRegistered] = []
    seen: dict[str, None] = {}
    for group in cluster.nodes:
        width = max(3, len(str(group.count - 1)))
        for index in range(group.count):
            name = f"{group.name}-{index:0{width}d}"
            if name in seen:
                raise ConfigError(f"cluster: duplicate node name {name!r}")
            seen[name] = None
            events.append(
                NodeRegistered(
                    node=name,
                    gpus=group.gpus,
                    gpu_model=group.gpu_model,
                    gpu_memory_mib=mib(group.gpu_memory_gib),
                    cpu_milli=milli(group.cpu, f"nodes[{group.name}].cpu"),
                    memory_mib=mib(group.memory_gib),
                    labels=dict(group.labels),
                )
            )
    return events


def queue_events(queues: QueuesFile) -> list[QueueConfigured]:
    """QueueConfigured events, parents before children; validates the tree."""
    by_name: dict[str, QueueSpec] = {}
    for index, spec in enumerate(queues.queues):
        where = f"queues[{index}] ({spec.name})"
        if spec.name in by_name:
            raise ConfigError(f"{where}: duplicate queue name")
        if spec.deserved_gpus is not None and spec.deserved_percent is not None:
            raise ConfigError(f"{where}: give deserved_gpus or deserved_percent, not both")
        by_name[spec.name] = spec
    for name, spec in by_name.items():
        if spec.parent and spec.parent not in by_name:
            raise ConfigError(f"queue {name}: parent {spec.parent!r} is not defined")
    # Every parent exists (checked above); a parent comes before its children.
    graph = {name: ({spec.parent} if spec.parent else set()) for name, spec in by_name.items()}
    try:
        parents_first = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        loop = exc.args[1]
        raise ConfigError(f"queue {loop[0]}: the parent chain loops through {loop[1]!r}") from None
    depth: dict[str, int] = {}
    for name in parents_first:
        parent = by_name[name].parent
        depth[name] = depth[parent] + 1 if parent else 0
    for name, spec in by_name.items():
        kids = [k for k in by_name.values() if k.parent == name]
        # in milli-GPUs: a float sum (0.1 + 0.2) would exceed a parent's 0.3
        kid_sum = sum(milli(k.deserved_gpus or 0, f"queue {k.name}") for k in kids)
        if spec.deserved_gpus is not None and kid_sum > milli(spec.deserved_gpus, name):
            raise ConfigError(
                f"queue {name}: children deserve {kid_sum / MILLI:g} GPUs, "
                f"more than its {spec.deserved_gpus:g}"
            )
        pct = sum(k.deserved_percent or 0 for k in kids)
        if pct > 100:
            raise ConfigError(f"queue {name}: children's deserved_percent adds up to {pct:g}")
    top_pct = sum(s.deserved_percent or 0 for s in by_name.values() if not s.parent)
    if top_pct > 100:
        raise ConfigError(f"top-level queues' deserved_percent adds up to {top_pct:g}")

    ordered = sorted(by_name.values(), key=lambda s: (depth[s.name], s.name))
    return [_queue_event(s) for s in ordered]


def _queue_event(spec: QueueSpec) -> QueueConfigured:
    def limit(value: float | None, conv: int) -> int:
        if value is None:
            return -1
        return milli(value, spec.name) if conv == 0 else mib(value)

    return QueueConfigured(
        queue=spec.name,
        parent=spec.parent,
        deserved=Resources(
            gpu_milli=milli(spec.deserved_gpus or 0, f"queue {spec.name}.deserved_gpus"),
            cpu_milli=milli(spec.deserved_cpu, f"queue {spec.name}.deserved_cpu"),
            memory_mib=mib(spec.deserved_memory_gib),
        ),
        deserved_gpu_percent=(
            None if spec.deserved_percent is None else round(spec.deserved_percent)
        ),
        over_quota_weight=spec.over_quota_weight,
        limit=Resources(
            gpu_milli=limit(spec.limit_gpus, 0),
            cpu_milli=limit(spec.limit_cpu, 0),
            memory_mib=limit(spec.limit_memory_gib, 1),
        ),
        priority=spec.priority,
        reclaim_min_runtime_ms=round(spec.reclaim_min_runtime_s * 1000),
        preempt_min_runtime_ms=round(spec.preempt_min_runtime_s * 1000),
        placement=spec.placement,
    )


def kinds() -> dict[str, type[Any]]:
    """The file formats by name, for ``gpuledger schema``."""
    return {
        "cluster": ClusterFile,
        "queues": QueuesFile,
        "workload": WorkloadFile,
        "policy": PolicyFile,
    }

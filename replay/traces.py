"""Trace importers: public GPU-cluster traces into the simulator's YAML formats.

Four formats (docs/traces.md): ``alibaba-openb`` (the Alibaba 2023 pod list), ``helios``
(SenseTime Helios ``cluster_log.csv``), ``philly`` (Microsoft Philly ``cluster_job_log``
JSON) and ``csv`` (any CSV, through a column mapping). Each reader turns rows into
``TraceJob``s with integer resources; one builder applies the mapping file (tenant to queue,
class key to priority class, limit, time scale), shifts time so the first submission is 0
and produces ``WorkloadFile``/``QueuesFile`` Structs. Output is encoded from those Structs,
so what we write is valid by construction.

A bad value raises ``ConfigError`` naming ``file:line`` and the column; rows that are
well-formed but unusable (a Philly job that never started) are skipped and counted.
"""

from __future__ import annotations

import csv
import functools
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, cast, get_args

import msgspec

from events.model import MILLI
from replay.config import (
    ClusterFile,
    ConfigError,
    JobSpec,
    NodeGroup,
    PriorityClass,
    QueuesFile,
    QueueSpec,
    WorkloadFile,
    load,
)
from scheduler.core.state import PRIORITY_CLASSES

FORMATS = ("alibaba-openb", "helios", "philly", "csv")

ALIBABA_CLASSES: dict[str, str] = {
    "LS": "inference",  # latency-sensitive long-running services: never preempted
    "Guaranteed": "build",  # requests == limits: protected, like build jobs
    "Burstable": "build-preemptible",  # may burst above requests: preemptible, above batch
    "BE": "train",  # best effort: the first to yield
}
"""Alibaba QoS class -> priority class, unless the mapping file says otherwise."""

Positive = Annotated[float, msgspec.Meta(gt=0)]

MAX_TIME_SCALE = 1e6
"""The largest time scale a mapping may give: beyond it a trace's times outgrow the
workload format (what is still too long for it is refused on import, naming the field)."""


# --------------------------------------------------------------------------- mapping file


class Columns(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Column names of a generic ``csv`` trace; ``None`` means the trace has no such column."""

    submit: str = "submit_time"
    """Submission time: seconds (see ``units.time``) or a date-time string."""
    gpus: str | None = None
    """GPUs of the whole job, split evenly over its pods."""
    gpus_per_pod: str | None = None
    """GPUs of each pod (instead of ``gpus``)."""
    pods: str | None = None
    """Gang size; absent = 1 pod."""
    duration: str | None = None
    """Run time in seconds (see ``units.time``)."""
    start: str | None = None
    """Start time; with ``end`` gives the run time when there is no ``duration``."""
    end: str | None = None
    """End time; the run time is ``end - start`` (or ``end - submit`` without ``start``)."""
    tenant: str | None = None
    """User, team or virtual cluster: looked up in ``queues``."""
    name: str | None = None
    """Job id; absent = ``job-<row number>``."""
    cpu: str | None = None
    """Cores of the whole job, split evenly over its pods."""
    memory_gib: str | None = None
    """Memory of the whole job (see ``units.memory_gib``), split evenly over its pods."""
    priority: str | None = None
    """A class key (QoS, priority) looked up in ``priority_classes``."""
    state: str | None = None
    """The job's final state, matched against ``exclude_states``."""
    parent: str | None = None
    """The tenant's parent (department, virtual cluster): a parent queue in ``--queues-out``."""
    runtime_estimate: str | None = None
    """The user's run-time estimate in seconds (see ``units.time``): ``expected_runtime_s``."""


class Units(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Divisors from a csv trace's units to seconds, GPUs, cores and GiB."""

    time: Positive = 1
    """1000 for milliseconds, 1000000 for microseconds (numeric times and durations)."""
    gpus: Positive = 1
    """1000 for milli-GPUs, 100 for percent of a GPU."""
    cpu: Positive = 1
    """1000 for millicores."""
    memory_gib: Positive = 1
    """1024 for MiB."""


class Mapping(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``mapping.yaml``: how a trace's tenants and classes become queues and priorities."""

    queues: dict[str, str] = {}
    """Tenant (Alibaba: QoS class; Helios/Philly: vc or user; csv: tenant column) -> queue."""
    default_queue: str | None = None
    """Queue of tenants not in ``queues``; absent = a queue named after the tenant."""
    tenant: str = "vc"
    """Helios and Philly: which field is the tenant, ``vc`` or ``user``."""
    parent: str | None = None
    """Helios and Philly: the field (``vc`` or ``user``) naming each tenant's parent queue."""
    priority_classes: dict[str, str] = {}
    """Class key (Alibaba: QoS; csv: priority column; others: tenant) -> priority class."""
    default_priority_class: str = "train"
    deserved_percent: dict[str, Annotated[float, msgspec.Meta(ge=0, le=100)]] = {}
    """Queue -> deserved GPU percent of its parent (fractions allowed); siblings share the rest."""
    quota_from: Literal["equal", "demand"] = "equal"
    """``--queues-out``: siblings not in ``deserved_percent`` share what is left equally, or
    in proportion to the GPU-seconds their jobs submitted (a queue without jobs then gets 0)."""
    cluster_gpus: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """GPUs the written quotas divide when they are not whole percents (default: ``--nodes``)."""
    submit_mode: Literal["absolute", "interval"] = "absolute"
    """csv: the submit column holds times, or gaps since the previous row's submission."""
    cpu_only: Literal["keep", "drop", "error"] = "keep"
    """Jobs with 0 GPUs: kept as CPU-only pods, dropped (counted), or an error."""
    exclude_states: list[str] = []
    """Skip jobs whose final state is one of these (Alibaba pod_phase, Helios state, ...)."""
    columns: Columns = Columns()
    units: Units = Units()
    limit: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Keep only the first ``limit`` jobs by submission time."""
    time_scale: Annotated[float, msgspec.Meta(gt=0, le=MAX_TIME_SCALE)] = 1.0
    """Multiply arrival times and run times by this (0.5 = replay twice as fast)."""


def load_mapping(path: str | Path | None) -> Mapping:
    """The mapping file at ``path`` (validated), or the defaults when ``path`` is None."""
    mapping = Mapping() if path is None else load(path, Mapping)
    where = str(path) if path is not None else "mapping"
    for key, cls in [
        *mapping.priority_classes.items(),
        ("default", mapping.default_priority_class),
    ]:
        if cls not in PRIORITY_CLASSES and not _is_int(cls):
            raise ConfigError(
                f"{where}: priority class {cls!r} (for {key!r}) is not one of "
                f"{', '.join(PRIORITY_CLASSES)} or an integer"
            )
    flat = mapping.parent is None and mapping.columns.parent is None
    # with a hierarchy the percents are per level, checked among siblings by queues_for
    if flat and sum(mapping.deserved_percent.values()) > 100:
        raise ConfigError(f"{where}: deserved_percent adds up to more than 100")
    if mapping.tenant not in ("vc", "user"):
        raise ConfigError(f"{where}: tenant must be vc or user, not {mapping.tenant!r}")
    if mapping.parent is not None and mapping.parent not in ("vc", "user"):
        raise ConfigError(f"{where}: parent must be vc or user, not {mapping.parent!r}")
    if mapping.parent is not None and mapping.parent == mapping.tenant:
        raise ConfigError(f"{where}: parent and tenant are both {mapping.tenant!r}")
    return mapping


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- rows


@dataclass(slots=True)
class TraceJob:
    """One job of a trace in integer units, before the mapping is applied."""

    name: str
    tenant: str
    class_key: str
    state: str
    submit_s: float
    runtime_s: float
    pods: int
    gpu_milli: int
    """Per pod."""
    cpu_milli: int
    """Per pod."""
    memory_mib: int
    """Per pod."""
    where: str
    """``file:line`` (or ``file: job [i]``) for messages."""
    parent: str = ""
    """The tenant's parent (``Mapping.parent``, ``columns.parent``); empty: none."""
    estimate_s: float | None = None
    """The user's run-time estimate, when the trace has one."""


@dataclass(slots=True)
class Skips:
    """Rows left out, by reason, with the first place each reason occurred."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        """Count one skipped row."""
        self.counts[reason] += 1
        self.first.setdefault(reason, where)


class _Row:
    """A CSV row with ``file:line``-naming accessors."""

    __slots__ = ("line", "path", "values")

    def __init__(self, path: str, line: int, values: dict[str, str]) -> None:
        self.path = path
        self.line = line
        self.values = values

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def error(self, column: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.where}: column {column!r}: {problem}")

    def text(self, column: str) -> str:
        return (self.values.get(column) or "").strip()

    def number(self, column: str, *, default: Decimal | None = None) -> Decimal:
        """A finite, non-negative number; a blank cell is ``default`` if one is given."""
        raw = self.text(column)
        if not raw and default is not None:
            return default
        return _decimal(raw, lambda problem: self.error(column, problem))

    def time(self, column: str, unit: float = 1) -> float | None:
        """Seconds: a number divided by ``unit``, or a date-time string; blank -> None."""
        raw = self.text(column)
        if not raw:
            return None
        return _time(raw, unit, lambda problem: self.error(column, problem))


def _decimal(raw: str, error: Any) -> Decimal:
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise error(f"not a number: {raw!r}") from None
    if not value.is_finite() or value < 0:
        raise error(f"not a finite non-negative number: {raw!r}")
    return value


def _time(raw: str, unit: float, error: Any) -> float:
    try:
        return float(Decimal(raw) / Decimal(str(unit)))
    except InvalidOperation:
        pass
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        raise error(f"not a time (seconds or 'YYYY-MM-DD HH:MM:SS'): {raw!r}") from None
    # Only differences matter (time is shifted to start at 0); naive stamps are read as UTC
    # so the result does not depend on this machine's time zone or its DST changes.
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _csv_rows(path: Path, required: list[str]) -> Iterator[_Row]:
    """Rows of a CSV file with a header; a missing required column names the file and line 1."""
    name = str(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror}") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ConfigError(f"{name}: empty file (no header line)") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise ConfigError(
                f"{name}:1: missing column {missing[0]!r} (the header has: {', '.join(header)})"
            )
        try:
            for values in reader:
                if not any(v.strip() for v in values):
                    continue
                if len(values) != len(header):
                    raise ConfigError(
                        f"{name}:{reader.line_num}: {len(values)} fields, the header has "
                        f"{len(header)}"
                    )
                yield _Row(name, reader.line_num, dict(zip(header, values, strict=True)))
        except csv.Error as exc:
            raise ConfigError(f"{name}:{reader.line_num}: not valid CSV: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{name}: not UTF-8 text: {exc}") from exc


def _gang(total_milli: int, pods: int, row: _Row, column: str) -> tuple[int, int]:
    """(pods, GPU milli per pod) for a job's total GPUs and node count.

    An even split keeps the gang; an uneven one (12 GPUs on 2 nodes) cannot be expressed as
    identical pods, so it becomes one pod holding all of them, as the issue specifies.
    """
    pods = max(1, pods)
    if total_milli % pods == 0 and _valid_pod_gpu(total_milli // pods):
        return pods, total_milli // pods
    if not _valid_pod_gpu(total_milli):
        raise row.error(
            column, f"{total_milli / MILLI:g} GPUs: a pod takes a fraction of one GPU or whole GPUs"
        )
    return 1, total_milli


def _valid_pod_gpu(amount: int) -> bool:
    return amount <= MILLI or amount % MILLI == 0


def _int(value: Decimal, row: _Row, column: str) -> int:
    if value != value.to_integral_value():
        raise row.error(column, f"not a whole number: {value}")
    return int(value)


def _milli(value: Decimal) -> int:
    return int((value * MILLI).to_integral_value())


# --------------------------------------------------------------------------- readers


def read_alibaba(path: Path, skips: Skips) -> Iterator[TraceJob]:
    """The Alibaba ``openb_pod_list_*.csv``: one single-pod job per row."""
    del skips  # every well-formed row is a job
    required = [
        "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "pod_phase",
        "creation_time", "deletion_time", "scheduled_time",
    ]  # fmt: skip
    for row in _csv_rows(path, required):
        num_gpu = _int(row.number("num_gpu"), row, "num_gpu")
        if num_gpu == 1:
            # gpu_milli is a share of one device; a blank cell means the whole device
            share = _int(row.number("gpu_milli", default=Decimal(MILLI)), row, "gpu_milli")
            if not 0 < share <= MILLI:
                raise row.error("gpu_milli", f"{share} is outside 1..1000 for a 1-GPU pod")
            gpu = share
        else:
            gpu = num_gpu * MILLI  # gpu_milli is 1000 (or 0 for CPU pods): whole devices
        created = row.time("creation_time")
        deleted = row.time("deletion_time")
        if created is None:
            raise row.error("creation_time", "blank")
        if deleted is None:
            raise row.error("deletion_time", "blank")
        scheduled = row.time("scheduled_time")
        started = scheduled if scheduled is not None else created
        yield TraceJob(
            name=row.text("name") or f"pod-{row.line:06d}",
            tenant=row.text("qos"),
            class_key=row.text("qos"),
            state=row.text("pod_phase"),
            submit_s=created,
            runtime_s=deleted - started,
            pods=1,
            gpu_milli=gpu,
            cpu_milli=_int(row.number("cpu_milli"), row, "cpu_milli"),
            memory_mib=_int(row.number("memory_mib"), row, "memory_mib"),
            where=row.where,
        )


def read_helios(path: Path, skips: Skips, mapping: Mapping) -> Iterator[TraceJob]:
    """Helios ``cluster_log.csv``: ``node_num`` pods sharing ``gpu_num`` GPUs."""
    header = _header(path)
    required = ["job_id", "gpu_num", "node_num", "submit_time", mapping.tenant]
    if mapping.parent is not None:
        required.append(mapping.parent)
    if "duration" not in header:
        required += ["start_time", "end_time"]
    for row in _csv_rows(path, required):
        submit = row.time("submit_time")
        if submit is None:
            raise row.error("submit_time", "blank")
        runtime = _runtime(row, "duration" if "duration" in header else None, "start_time",
                           "end_time", submit, 1)  # fmt: skip
        if runtime is None:
            skips.add("no duration and no start/end time", row.where)
            continue
        nodes = _int(row.number("node_num", default=Decimal(1)), row, "node_num")
        gpus = _int(row.number("gpu_num"), row, "gpu_num")
        pods, per_pod = _gang(gpus * MILLI, nodes, row, "gpu_num")
        cpu = row.number("cpu_num", default=Decimal(0)) if "cpu_num" in header else Decimal(0)
        tenant = row.text(mapping.tenant)
        yield TraceJob(
            name=row.text("job_id") or f"job-{row.line:06d}",
            tenant=tenant,
            parent=row.text(mapping.parent) if mapping.parent is not None else "",
            class_key=tenant,
            state=row.text("state"),
            submit_s=submit,
            runtime_s=runtime,
            pods=pods,
            gpu_milli=per_pod,
            cpu_milli=_milli(cpu) // pods,
            memory_mib=0,
            where=row.where,
        )


def _runtime(
    row: _Row,
    duration: str | None,
    start: str | None,
    end: str | None,
    submit: float,
    unit: float,
) -> float | None:
    """Seconds of run time: the duration column, else end - start (or end - submit)."""
    if duration is not None and row.text(duration):
        return float(row.number(duration) / Decimal(str(unit)))
    if end is None:
        return None
    finished = row.time(end, unit)
    if finished is None:
        return None
    began = row.time(start, unit) if start is not None else None
    return finished - (began if began is not None else submit)


def _header(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return [h.strip() for h in next(csv.reader(handle), [])]
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}:1: unreadable header: {exc}") from exc


class _PhillyDetail(msgspec.Struct, frozen=True):
    ip: str | None = None
    gpus: list[str] = []


class _PhillyAttempt(msgspec.Struct, frozen=True):
    start_time: str | None = None
    end_time: str | None = None
    detail: list[_PhillyDetail] = []


class _PhillyJob(msgspec.Struct, frozen=True):
    jobid: str
    submitted_time: str | None
    user: str = ""
    vc: str = ""
    status: str = ""
    attempts: list[_PhillyAttempt] = []


def read_philly(path: Path, skips: Skips, mapping: Mapping) -> Iterator[TraceJob]:
    """Philly ``cluster_job_log``: GPUs and run time from each job's last attempt."""
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror}") from exc
    try:
        jobs = msgspec.json.decode(raw, type=list[_PhillyJob])
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{name}: {exc}") from exc  # names the path, e.g. `$[3].attempts`
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{name}: not valid JSON: {exc}") from exc
    for index, job in enumerate(jobs):
        where = f"{name}: job [{index}] ({job.jobid})"
        if not job.attempts:
            skips.add("no attempts (never started)", where)
            continue
        last = job.attempts[-1]
        if job.submitted_time is None or last.start_time is None or last.end_time is None:
            skips.add("a time is None (submitted, or last attempt's start or end)", where)
            continue
        submit = _philly_time(job.submitted_time, where, "submitted_time")
        start = _philly_time(last.start_time, where, "attempts[-1].start_time")
        end = _philly_time(last.end_time, where, "attempts[-1].end_time")
        per_pod = [len(d.gpus) for d in last.detail]
        total = sum(per_pod)
        if total == 0:
            skips.add("no GPUs in the last attempt's detail", where)
            continue
        if len(set(per_pod)) == 1:
            pods, gpu = len(per_pod), per_pod[0] * MILLI
        else:  # uneven machines (8 + 4): identical pods cannot express it, keep one pod
            pods, gpu = 1, total * MILLI
        tenant = job.vc if mapping.tenant == "vc" else job.user
        parent = {"vc": job.vc, "user": job.user, None: ""}[mapping.parent]
        yield TraceJob(
            name=job.jobid,
            tenant=tenant,
            parent=parent,
            class_key=tenant,
            state=job.status,
            submit_s=submit,
            runtime_s=end - start,
            pods=pods,
            gpu_milli=gpu,
            cpu_milli=0,
            memory_mib=0,
            where=where,
        )


def _philly_time(text: str, where: str, column: str) -> float:
    def error(problem: str) -> ConfigError:
        return ConfigError(f"{where}: {column}: {problem}")

    return _time(text, 1, error)


def read_csv(path: Path, skips: Skips, mapping: Mapping) -> Iterator[TraceJob]:
    """Any CSV through ``mapping.columns`` and ``mapping.units`` (docs/traces.md)."""
    cols, units = mapping.columns, mapping.units
    if (cols.gpus is None) == (cols.gpus_per_pod is None):
        raise ConfigError("csv: the mapping must name exactly one of columns.gpus, gpus_per_pod")
    if cols.duration is None and cols.end is None:
        raise ConfigError("csv: the mapping must name columns.duration or columns.end")
    named = [cols.submit, cols.gpus, cols.gpus_per_pod, cols.pods, cols.duration, cols.start,
             cols.end, cols.tenant, cols.name, cols.cpu, cols.memory_gib, cols.priority,
             cols.state, cols.parent, cols.runtime_estimate]  # fmt: skip
    required = [c for c in named if c is not None]
    gpu_unit = Decimal(str(units.gpus))
    time_unit = Decimal(str(units.time))
    elapsed = Decimal(0)  # interval mode: the running sum of the gaps, in the trace's unit
    for index, row in enumerate(_csv_rows(path, required)):
        if mapping.submit_mode == "interval":
            if not row.text(cols.submit):
                raise row.error(cols.submit, "blank")
            # gaps add up exactly in decimal; each row's time is the sum of all gaps so far
            elapsed += row.number(cols.submit)
            submit: float | None = float(elapsed / time_unit)
        else:
            submit = row.time(cols.submit, units.time)
        if submit is None:
            raise row.error(cols.submit, "blank")
        runtime = _runtime(row, cols.duration, cols.start, cols.end, submit, units.time)
        if runtime is None:
            skips.add("no duration and no end time", row.where)
            continue
        pods = 1
        if cols.pods is not None:
            pods = max(1, _int(row.number(cols.pods, default=Decimal(1)), row, cols.pods))
        if cols.gpus is not None:
            total = _milli(row.number(cols.gpus) / gpu_unit)
            pods, per_pod = _gang(total, pods, row, cols.gpus)
        else:
            assert cols.gpus_per_pod is not None
            per_pod = _milli(row.number(cols.gpus_per_pod) / gpu_unit)
            if not _valid_pod_gpu(per_pod):
                raise row.error(
                    cols.gpus_per_pod,
                    f"{per_pod / MILLI:g} GPUs: a pod takes a fraction of one GPU or whole GPUs",
                )
        cpu = Decimal(0)
        if cols.cpu is not None:
            cpu = row.number(cols.cpu, default=Decimal(0)) / Decimal(str(units.cpu))
        memory = Decimal(0)
        if cols.memory_gib is not None:
            memory = row.number(cols.memory_gib, default=Decimal(0)) / Decimal(
                str(units.memory_gib)
            )
        tenant = row.text(cols.tenant) if cols.tenant is not None else ""
        estimate = None
        if cols.runtime_estimate is not None and row.text(cols.runtime_estimate):
            estimate = float(row.number(cols.runtime_estimate) / time_unit)
        yield TraceJob(
            name=(row.text(cols.name) if cols.name else "") or f"job-{index + 1:06d}",
            tenant=tenant,
            parent=row.text(cols.parent) if cols.parent is not None else "",
            estimate_s=estimate,
            class_key=row.text(cols.priority) if cols.priority is not None else tenant,
            state=row.text(cols.state) if cols.state is not None else "",
            submit_s=submit,
            runtime_s=runtime,
            pods=pods,
            gpu_milli=per_pod,
            cpu_milli=_milli(cpu) // pods,
            memory_mib=int((memory * 1024).to_integral_value()) // pods,
            where=row.where,
        )


# --------------------------------------------------------------------------- building


SUBMIT_FIELDS = {
    "alibaba-openb": "creation_time",
    "helios": "submit_time",
    "philly": "submitted_time",
}
"""The submit column of each fixed format (csv: ``columns.submit``), for warnings."""


@dataclass(slots=True)
class Summary:
    """What an import produced and what it left out."""

    jobs: int = 0
    pods: int = 0
    gpu_milli: int = 0
    span_s: float = 0.0
    per_queue: Counter[str] = field(default_factory=Counter)
    per_class: Counter[str] = field(default_factory=Counter)
    gpu_shapes: Counter[str] = field(default_factory=Counter)
    """Jobs by GPUs per job: ``"0"``, ``"fractional"``, ``"1"``, ``"8"``, ..."""
    skips: Skips = field(default_factory=Skips)
    renamed: int = 0
    """Jobs renamed ``<name>-2``, ... because the trace repeats their id."""
    limited: int = 0
    """Jobs dropped by ``limit``."""
    cpu_only: int = 0
    """Jobs with 0 GPUs kept as CPU-only pods (``cpu_only: keep``)."""
    warnings: list[str] = field(default_factory=list)
    """Things the import did that the trace may not mean (an out-of-order submit column)."""

    def lines(self) -> list[str]:
        """The summary as printable lines (``warnings`` are printed apart, on stderr)."""
        out = [
            f"{self.jobs:,} jobs, {self.pods:,} pods, {self.gpu_milli / MILLI:,.1f} GPUs requested"
            f", submissions over {self.span_s / 86_400:,.2f} days ({self.span_s:,.0f} s)",
            "GPUs per job: " + ", ".join(f"{k}: {v:,}" for k, v in _shape_order(self.gpu_shapes)),
            "per queue: " + ", ".join(f"{q} {n:,}" for q, n in sorted(self.per_queue.items())),
            "per priority class: "
            + ", ".join(f"{c} {n:,}" for c, n in sorted(self.per_class.items())),
        ]
        if self.cpu_only:
            out.append(f"kept {self.cpu_only:,} jobs with 0 GPUs as CPU-only pods (cpu_only: keep)")
        if self.limited:
            out.append(f"limit: left out the last {self.limited:,} jobs")
        if self.renamed:
            out.append(f"renamed {self.renamed:,} jobs whose id repeats (suffix -2, -3, ...)")
        for reason, count in sorted(self.skips.counts.items()):
            out.append(f"skipped {count:,}: {reason} (first: {self.skips.first[reason]})")
        return out


def _shape_order(shapes: Counter[str]) -> list[tuple[str, int]]:
    def key(item: tuple[str, int]) -> tuple[float, str]:
        name = item[0]
        return (0.5 if name == "fractional" else float(name), name)

    return sorted(shapes.items(), key=key)


@dataclass(slots=True)
class Tenancy:
    """The queue tree the jobs use: each leaf's parent and the work submitted to it."""

    parent: dict[str, str] = field(default_factory=dict)
    """Leaf queue -> parent queue ("" for a top-level leaf)."""
    demand: Counter[str] = field(default_factory=Counter)
    """Leaf queue -> GPU-milli-seconds submitted (breaks ties in rounding quotas)."""
    first: dict[str, str] = field(default_factory=dict)
    """Leaf queue -> where its first job is, for messages."""

    def add(self, queue: str, parent: str, gpu_ms: int, where: str) -> None:
        """Record a job of ``queue`` under ``parent``; a leaf keeps one parent."""
        known = self.parent.get(queue)
        if known is None:
            self._check_new(queue, parent, where)
            self.parent[queue] = known = parent
            self.first[queue] = where
        if known != parent:
            raise ConfigError(
                f"{where}: queue {queue!r} is under {parent or 'no parent'!r} here and under "
                f"{known or 'no parent'!r} at {self.first[queue]}; map the tenant to one queue "
                f"per parent (or leave it out of queues:)"
            )
        self.demand[queue] += gpu_ms

    def _check_new(self, queue: str, parent: str, where: str) -> None:
        """A new leaf's name must not be a parent's, nor its parent a leaf's."""
        parents = set(self.parent.values())
        for clash in (queue if queue in parents else "", parent if parent in self.parent else ""):
            if clash:
                raise ConfigError(
                    f"{where}: {clash!r} names both a parent queue and a tenant's queue"
                )


@dataclass(slots=True)
class TraceImport:
    """The result of an import: the workload, the queue tree it uses, and the summary."""

    workload: WorkloadFile
    tenancy: Tenancy
    mapping: Mapping
    summary: Summary
    cluster_gpus: int | None = None
    """GPUs of the cluster the trace runs on (``--nodes``), unless the mapping gives them."""

    def queues(self) -> QueuesFile:
        """``queues.yaml`` for the jobs: exact quotas (``queues_for``)."""
        total = self.mapping.cluster_gpus or self.cluster_gpus
        return queues_for(self.tenancy, self.mapping, total)


def import_trace(
    fmt: str,
    path: str | Path,
    mapping: Mapping | None = None,
    limit: int | None = None,
    cluster_gpus: int | None = None,
) -> TraceImport:
    """Read a trace of format ``fmt`` (one of ``FORMATS``) into simulator inputs.

    ``cluster_gpus`` is the size of the cluster the quotas divide when they cannot be whole
    percents (a ``cluster_gpus`` in the mapping takes precedence).
    """
    mapping = mapping or Mapping()
    if fmt != "csv" and mapping.submit_mode != "absolute":
        raise ConfigError(f"{fmt}: submit_mode {mapping.submit_mode} is for csv traces only")
    source = Path(path)
    skips = Skips()
    rows: Iterator[TraceJob]
    match fmt:
        case "alibaba-openb":
            if mapping.parent is not None or mapping.columns.parent is not None:
                raise ConfigError("alibaba-openb: the trace has no tenant hierarchy (parent)")
            rows = read_alibaba(source, skips)
        case "helios":
            rows = read_helios(source, skips, mapping)
        case "philly":
            rows = read_philly(source, skips, mapping)
        case "csv":
            rows = read_csv(source, skips, mapping)
        case _:
            raise ConfigError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    column = SUBMIT_FIELDS.get(fmt, mapping.columns.submit)
    # only a csv column can hold gaps instead of times (submit_mode)
    gaps = fmt == "csv" and mapping.submit_mode == "absolute"
    result = build(
        rows, mapping, skips, limit if limit is not None else mapping.limit, column, gaps
    )
    result.cluster_gpus = cluster_gpus
    return result


def build(
    rows: Iterator[TraceJob],
    mapping: Mapping,
    skips: Skips,
    limit: int | None = None,
    submit_column: str = "submit",
    maybe_gaps: bool = False,
) -> TraceImport:
    """Apply the mapping to trace rows: filter, sort, limit, shift time, name queues.

    Rows come in file order; a submission earlier than one above it is counted and warned
    about, naming ``submit_column`` (and ``submit_mode: interval`` when ``maybe_gaps``).
    """
    excluded = set(mapping.exclude_states)
    kept: list[TraceJob] = []
    summary = Summary(skips=skips)
    backwards, first_backwards, latest = 0, "", float("-inf")
    for job in rows:
        if job.submit_s < latest:
            backwards += 1
            first_backwards = first_backwards or job.where
        latest = max(latest, job.submit_s)
        if job.state in excluded:
            skips.add(f"state {job.state} excluded by the mapping", job.where)
            continue
        if job.gpu_milli == 0:
            if mapping.cpu_only == "drop":
                skips.add("0 GPUs (cpu_only: drop)", job.where)
                continue
            if mapping.cpu_only == "error":
                raise ConfigError(f"{job.where}: the job asks for 0 GPUs (cpu_only: error)")
        kept.append(job)
    if backwards:
        hint = ""
        if maybe_gaps:
            hint = "; if it holds gaps between submissions, set submit_mode: interval"
        summary.warnings.append(
            f"column {submit_column!r} is not in order: {backwards:,} rows submit before an "
            f"earlier row (first: {first_backwards}); the jobs are sorted by it{hint}"
        )
    kept.sort(key=lambda j: j.submit_s)  # stable: ties keep file order
    if limit is not None and len(kept) > limit:
        summary.limited = len(kept) - limit
        kept = kept[:limit]
    origin = kept[0].submit_s if kept else 0.0
    scale = mapping.time_scale
    defaults = dict(ALIBABA_CLASSES)
    names: Counter[str] = Counter()
    tenancy = Tenancy()
    specs: list[JobSpec] = []
    for job in kept:
        names[job.name] += 1
        name = job.name
        if names[name] > 1:
            name = f"{job.name}-{names[job.name]}"
            summary.renamed += 1
        queue, parent = _queue(job, mapping)
        cls = mapping.priority_classes.get(job.class_key) or defaults.get(job.class_key)
        cls = cls or mapping.default_priority_class
        # a pod that lived less than a second (or whose clock ran backwards) still ran
        runtime = max(0.001, _seconds(max(1.0, job.runtime_s) * scale))
        estimate = None
        if job.estimate_s is not None:
            estimate = max(0.001, _seconds(job.estimate_s * scale))
        specs.append(
            JobSpec(
                name=name,
                queue=queue,
                at_s=_seconds((job.submit_s - origin) * scale),
                runtime_s=runtime,
                pods=job.pods,
                gpus_per_pod=_human(job.gpu_milli, MILLI),
                cpu_per_pod=_human(job.cpu_milli, MILLI),
                memory_gib_per_pod=_human(job.memory_mib, 1024),
                priority_class=_priority_class(cls),
                expected_runtime_s=estimate,
            )
        )
        total = job.pods * job.gpu_milli
        tenancy.add(queue, parent, total * round(runtime * 1000), job.where)
        summary.jobs += 1
        summary.pods += job.pods
        summary.gpu_milli += total
        summary.per_queue[queue] += 1
        summary.per_class[cls] += 1
        summary.cpu_only += total == 0
        shape = "fractional" if 0 < total < MILLI else f"{total / MILLI:g}"
        summary.gpu_shapes[shape] += 1
    span = specs[-1].at_s if specs else 0.0
    summary.span_s = span
    workload = WorkloadFile(seed=0, horizon_s=max(1, span), jobs=specs)
    return TraceImport(workload, tenancy, mapping, summary)


def _queue(job: TraceJob, mapping: Mapping) -> tuple[str, str]:
    """(queue, parent queue) of a job: the mapping's names, else names from the trace's.

    A tenant named in ``queues:`` gets that queue as it is; any other gets
    ``default_queue`` or its own name, prefixed with its parent's queue when it has one
    (``vc1-alice``), since the same user may work in several parents.
    """
    parent = ""
    if job.parent:
        parent = mapping.queues.get(job.parent) or _queue_name(job.parent)
    if job.tenant in mapping.queues:
        return mapping.queues[job.tenant], parent
    leaf = mapping.default_queue or _queue_name(job.tenant)
    return (f"{parent}-{leaf}" if parent else leaf), parent


def _queue_name(tenant: str) -> str:
    """A queue per tenant: lower case, one dash for any run of other characters."""
    return re.sub(r"[^a-z0-9]+", "-", tenant.lower()).strip("-") or "default"


def queues_for(tenancy: Tenancy, mapping: Mapping, cluster_gpus: int | None) -> QueuesFile:
    """The queue tree of the jobs with exact deserved quotas, parents before their children.

    Each queue's share of its parent is the mapping's ``deserved_percent`` (fractions
    allowed), or a part of what its siblings leave: equal, or by submitted GPU-seconds
    (``quota_from: demand``). When every share is a whole
    percent the file says ``deserved_percent`` (it then scales with the cluster); otherwise
    it says ``deserved_gpus`` of ``cluster_gpus``, exact to the milli-GPU the ledger keeps:
    each queue gets the floor of its share and the milli-GPUs left over go by largest
    remainder, then to the queue with more submitted work, then by name. A queue with jobs
    never deserves 0 unless the mapping gives it 0.
    """
    children: dict[str, list[str]] = {}
    for leaf, parent in tenancy.parent.items():
        children.setdefault(parent, []).append(leaf)
        children.setdefault(leaf, [])
        if parent:
            children.setdefault("", []).append(parent)
    for name in mapping.deserved_percent:
        if name not in children:  # named in the mapping but without jobs: top-level
            children[name] = []
            children.setdefault("", []).append(name)
    for group in children.values():
        group[:] = sorted(set(group))
    demand: Counter[str] = Counter(tenancy.demand)
    for leaf, parent in tenancy.parent.items():
        if parent:
            demand[parent] += tenancy.demand[leaf]
    busy = set(tenancy.parent) | {p for p in tenancy.parent.values() if p}
    share: dict[str, Fraction] = {}
    for parent, group in children.items():
        share.update(_split(parent, group, mapping, busy, demand))
    percent = {q: s * 100 for q, s in share.items()}
    if all(p.denominator == 1 for p in percent.values()):
        amounts = {q: _human(p.numerator, 1) for q, p in percent.items()}
        percent_mode = True
    else:
        if cluster_gpus is None:
            odd = sorted(q for q, p in percent.items() if p.denominator != 1)
            of = (
                f"of {tenancy.parent[odd[0]]!r}" if tenancy.parent.get(odd[0]) else "of the cluster"
            )
            raise ConfigError(
                f"--queues-out: the share of {odd[0]!r} is {_pct(percent[odd[0]])} {of}, "
                f"not a whole percent, and the ledger records whole percents; give "
                f"the cluster's GPUs (--nodes, or cluster_gpus: in the mapping) to write exact "
                f"deserved_gpus, or deserved_percent: in the mapping"
            )
        milli_of: dict[str, int] = {"": cluster_gpus * MILLI}
        for parent in _top_down(children):
            milli_of.update(_divide(milli_of[parent], children[parent], share, demand))
        del milli_of[""]
        for queue in sorted(busy):
            if milli_of[queue] == 0 and queue not in mapping.deserved_percent:
                raise ConfigError(
                    f"--queues-out: queue {queue!r} has jobs but its share of {cluster_gpus} "
                    f"GPUs is below 1/1000 GPU; give it deserved_percent: in the mapping"
                )
        amounts = {q: _human(m, MILLI) for q, m in milli_of.items()}
        percent_mode = False
    ordered = [q for p in _top_down(children) for q in children[p]]
    specs = []
    for queue in ordered:
        parent = tenancy.parent.get(queue, "")
        if percent_mode:
            specs.append(QueueSpec(name=queue, parent=parent, deserved_percent=amounts[queue]))
        else:
            specs.append(QueueSpec(name=queue, parent=parent, deserved_gpus=amounts[queue]))
    return QueuesFile(queues=specs)


def _pct(value: Fraction) -> str:
    return f"{float(value):.4g} %"


def _split(
    parent: str, group: list[str], mapping: Mapping, busy: set[str], demand: Counter[str]
) -> dict[str, Fraction]:
    """Each sibling's share of ``parent``: the mapping's percent, or a part of the rest —
    equal, or by submitted GPU-seconds under ``quota_from: demand``."""
    given = {q: Fraction(Decimal(str(mapping.deserved_percent[q]))) / 100 for q in group
             if q in mapping.deserved_percent}  # fmt: skip
    rest = [q for q in group if q not in given]
    left = 1 - sum(given.values(), Fraction(0))
    if left < 0:
        whose = f"children of {parent!r}" if parent else "top-level queues"
        raise ConfigError(f"mapping: deserved_percent of the {whose} adds up to more than 100")
    starved = [q for q in rest if q in busy]
    if starved and left == 0:
        raise ConfigError(
            f"--queues-out: deserved_percent gives all of {parent or 'the cluster'!r} to "
            f"{', '.join(sorted(given))}, so {starved[0]!r}, which has jobs, would deserve 0; "
            f"give it deserved_percent: 0 in the mapping if that is meant"
        )
    out = dict(given)
    work = sum(demand[q] for q in rest)
    for queue in rest:
        if mapping.quota_from == "demand" and work:
            out[queue] = left * Fraction(demand[queue], work)
            if not demand[queue] and queue in busy:
                raise ConfigError(
                    f"--queues-out: queue {queue!r} has jobs but they ask for no GPUs, so "
                    f"quota_from: demand gives it 0; give it deserved_percent: in the "
                    f"mapping (0 if that is meant)"
                )
        else:
            out[queue] = left / len(rest)
    return out


def _top_down(children: dict[str, list[str]]) -> list[str]:
    """Parents in the order their quotas must be divided: the root, then each level."""
    order, frontier = [], [""]
    while frontier:
        order.extend(frontier)
        frontier = [c for p in frontier for c in children.get(p, []) if children.get(c)]
    return order


def _divide(
    amount: int, group: list[str], share: dict[str, Fraction], demand: Counter[str]
) -> dict[str, int]:
    """``amount`` milli-GPUs among ``group`` by ``share``: floors, then largest remainders."""
    exact = {q: amount * share[q] for q in group}
    out = {q: int(v) for q, v in exact.items()}  # floor: shares are non-negative
    target = int(sum(exact.values(), Fraction(0)))
    ranked = sorted(group, key=lambda q: (-(exact[q] - out[q]), -demand[q], q))
    for queue in ranked[: target - sum(out.values())]:
        out[queue] += 1
    return out


def _seconds(value: float) -> float:
    """Seconds to the millisecond the simulator keeps; whole seconds as ints (``60``)."""
    ms = round(value * 1000)
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def _human(amount: int, per_unit: int) -> float:
    """Integer units as a human number: whole values stay ints (``8`` not ``8.0``)."""
    whole, rest = divmod(amount, per_unit)
    return whole if not rest else amount / per_unit


# --------------------------------------------------------------------------- node list


def import_nodes(path: str | Path) -> ClusterFile:
    """An ``openb_node_list_*.csv`` as a cluster: one node group per identical node shape.

    Groups are keyed by (GPUs, model, cores, memory) in order of first appearance and
    labelled ``gpu-model: <model>``. Nodes without GPUs are kept: CPU-only pods of the trace
    may run there.
    """
    source = Path(path)
    shapes: dict[tuple[int, str, int, int], int] = {}
    for row in _csv_rows(source, ["cpu_milli", "memory_mib", "gpu", "model"]):
        shape = (
            _int(row.number("gpu"), row, "gpu"),
            row.text("model"),
            _int(row.number("cpu_milli"), row, "cpu_milli"),
            _int(row.number("memory_mib"), row, "memory_mib"),
        )
        shapes[shape] = shapes.get(shape, 0) + 1
    groups: list[NodeGroup] = []
    for (gpus, model, cpu, memory), count in shapes.items():
        label = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "cpu"
        groups.append(
            NodeGroup(
                name=f"{label}-{gpus}gpu-{_human(cpu, MILLI):g}c-{_human(memory, 1024):g}gi",
                count=count,
                gpus=gpus,
                gpu_model=model,
                cpu=_human(cpu, MILLI),
                memory_gib=_human(memory, 1024),
                labels={"gpu-model": model} if model else {},
            )
        )
    if not groups:
        raise ConfigError(f"{source}: no nodes")
    return ClusterFile(nodes=groups)


def node_fraction(cluster: ClusterFile, fraction: float) -> ClusterFile:
    """The cluster cut to ``round(nodes x fraction)`` nodes, each node group keeping its
    share: whole nodes first, the rest to the largest remainders (then the earlier group);
    groups left with no node are dropped. To study contention on a trace recorded on a
    cluster that never ran short (``--node-fraction``)."""
    total = sum(g.count for g in cluster.nodes)
    if not 0 < fraction <= 1:
        raise ConfigError(f"node fraction {fraction:g}: expected a share above 0 and at most 1")
    share = Fraction(repr(fraction))  # the decimal as written: 0.004 is 4/1000
    want = [g.count * share for g in cluster.nodes]
    counts = [int(w) for w in want]
    keep = round(total * share)
    if keep < 1:
        raise ConfigError(
            f"node fraction {fraction:g} keeps none of the {total:,} nodes "
            f"({total:,} x {fraction:g} rounds to 0)"
        )
    order = sorted(range(len(want)), key=lambda i: (counts[i] - want[i], i))
    for i in order[: max(keep - sum(counts), 0)]:
        counts[i] += 1
    groups = [
        msgspec.structs.replace(g, count=c)
        for g, c in zip(cluster.nodes, counts, strict=True)
        if c > 0
    ]
    return msgspec.structs.replace(cluster, nodes=groups)


# --------------------------------------------------------------------------- output


def encode(value: WorkloadFile | QueuesFile | ClusterFile) -> bytes:
    """YAML for an input file, leaving out fields equal to their defaults.

    Built from the validated Struct and encoded with ``msgspec.yaml.encode``; dropping
    defaults halves the size and the load time of a large workload without changing what
    it decodes to.
    """
    return msgspec.yaml.encode(_compact(value))


def _compact(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        for name, key, default in _defaults(type(value)):
            item = getattr(value, name)
            if default is not msgspec.NODEFAULT and item == default:
                continue
            out[key] = _compact(item)
        return out
    if isinstance(value, list):
        return [_compact(v) for v in value]
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    return value


@functools.cache
def _defaults(kind: type[msgspec.Struct]) -> tuple[tuple[str, str, Any], ...]:
    """(attribute, encoded name, default) per field; introspection is slow, so once a type."""
    out: list[tuple[str, str, Any]] = []
    for info in msgspec.structs.fields(kind):
        default = info.default
        if info.default_factory is not msgspec.NODEFAULT:
            default = info.default_factory()
        out.append((info.name, info.encode_name, default))
    return tuple(out)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place.

    A crash or a full disk leaves either the old file or the new one, never half of one.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with temp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        temp.replace(target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _priority_class(name: str) -> PriorityClass:
    """A mapping's priority class, checked against the ones a workload may name."""
    if name not in get_args(PriorityClass):
        accepted = ", ".join(get_args(PriorityClass))
        raise ConfigError(f"priority class {name!r} is not one of {accepted}")
    return cast(PriorityClass, name)


def shared_alibaba_dir() -> Path:
    """Where the shared Alibaba 2023 trace is: ``GPULEDGER_ALIBABA_TRACE``, else ``shared/``
    beside the checkout (as in the workplace), else the workplace's own copy (so a clone
    made elsewhere, such as CI's, finds it); the first candidate when none exists."""
    given = os.environ.get("GPULEDGER_ALIBABA_TRACE")
    if given:
        return Path(given)
    candidates = [
        Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba_openb_v2023",
        Path("/work/shared/traces/alibaba_openb_v2023"),
    ]
    return next((c for c in candidates if c.is_dir()), candidates[0])

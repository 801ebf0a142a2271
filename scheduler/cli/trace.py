"""``gpuledger trace import``: a public trace into ``workload.yaml`` (and cluster, queues).

A thin shell over ``replay.traces``; see docs/traces.md. Every output is encoded in full
before the first one is written, and each is written to a temporary file and renamed, so a
bad row leaves no file behind and a crash leaves no half-written one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from events.ledgertime import format_duration
from replay.config import ClusterFile, ConfigError, QueuesFile, WorkloadFile, parse
from replay.traces import (
    FORMATS,
    MAX_TIME_SCALE,
    Columns,
    Mapping,
    encode,
    import_nodes,
    import_trace,
    load_mapping,
    node_fraction,
    write_atomic,
)
from scheduler.cli import simulate
from scheduler.cli.errors import CliError
from scheduler.core.state import preemptible_of


def register(sub: Any) -> None:
    """Add ``trace import`` to the ``gpuledger`` parser."""
    trace = sub.add_parser("trace", help="import public GPU-cluster traces")
    verbs = trace.add_subparsers(dest="trace_command", required=True, metavar="VERB")
    p = verbs.add_parser(
        "import",
        help="turn a trace into workload.yaml (and cluster.yaml, queues.yaml)",
        description="Formats and the mapping file: docs/traces.md.",
    )
    p.add_argument("--format", required=True, choices=FORMATS, help="the trace's format")
    p.add_argument("file", help="the trace file")
    p.add_argument("--mapping", help="mapping.yaml: tenants to queues, classes, csv columns")
    p.add_argument("--out", required=True, help="workload.yaml to write")
    p.add_argument("--nodes", help="node list CSV (sn, cpu_milli, memory_mib, gpu, model)")
    p.add_argument("--cluster-out", help="cluster.yaml to write from --nodes")
    p.add_argument(
        "--node-fraction",
        type=float,
        metavar="SHARE",
        help="keep this share of --nodes' nodes, each node shape its share by largest "
        "remainder (0.004: 5 of the Alibaba 2023 trace's 1,213 nodes), to study contention",
    )
    p.add_argument(
        "--queues-out",
        help="queues.yaml to write: one queue per mapped queue (and parent), exact quotas",
    )
    p.add_argument(
        "--quota-from",
        choices=("equal", "demand"),
        help="--queues-out: queues share their parent equally, or by the GPU-seconds their "
        "jobs submitted (the mapping's quota_from)",
    )
    p.add_argument("--limit", type=int, help="keep the first N jobs by submission time")
    p.add_argument("--time-scale", type=float, help="multiply times by this (0.5 = 2x faster)")
    p.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="FIELD=NAME",
        help="csv: a column of the mapping, e.g. --column submit=submit_time (repeatable)",
    )
    p.add_argument(
        "--simulate",
        metavar="LEDGER",
        help="then simulate the imported workload straight into this new ledger directory "
        "(needs --nodes/--cluster-out and --queues-out)",
    )
    p.add_argument("--policy", default="gpuledger", help="policy for --simulate")
    p.set_defaults(func=_import)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")


def _import(args: argparse.Namespace) -> int:
    if (args.nodes is None) != (args.cluster_out is None):
        raise CliError("--nodes and --cluster-out go together")
    if args.simulate and not (args.nodes and args.queues_out):
        raise CliError("--simulate needs the cluster and the queues: give --nodes, --cluster-out "
                       "and --queues-out")  # fmt: skip
    if args.node_fraction is not None and args.nodes is None:
        raise CliError("--node-fraction needs --nodes")
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1")
    if args.time_scale is not None and not 0 < args.time_scale <= MAX_TIME_SCALE:
        raise CliError(
            f"--time-scale {args.time_scale:g}: must be above 0 and at most {MAX_TIME_SCALE:g}"
        )
    started = time.perf_counter()
    try:
        mapping = load_mapping(args.mapping)
        mapping = _with_flags(mapping, args)
        cluster = import_nodes(args.nodes) if args.nodes else None
        listed = sum(g.count for g in cluster.nodes) if cluster is not None else 0
        if cluster is not None and args.node_fraction is not None:
            cluster = node_fraction(cluster, args.node_fraction)
        gpus = sum(g.count * g.gpus for g in cluster.nodes) if cluster is not None else None
        result = import_trace(args.format, args.file, mapping, args.limit, gpus or None)
        queues = result.queues() if args.queues_out else None
        outputs: list[tuple[Path, bytes, type[Any]]] = [
            (Path(args.out), encode(result.workload), WorkloadFile)
        ]
        if queues is not None:
            outputs.append((Path(args.queues_out), encode(queues), QueuesFile))
        if cluster is not None:
            outputs.append((Path(args.cluster_out), encode(cluster), ClusterFile))
        for path, data, kind in outputs:
            # What simulate would refuse is never written (a time scale can push a
            # workload's times past the format's bounds).
            parse(data, kind, f"{path} (as imported)")
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    for path, data, _ in outputs:
        write_atomic(path, data)
    elapsed = time.perf_counter() - started
    summary = result.summary
    for line in summary.lines():
        _say(line)
    warnings = list(summary.warnings)
    if queues is not None:
        warnings += _held_for_good(result.workload, queues, gpus)
    for warning in warnings:
        sys.stderr.write(f"gpuledger: warning: {warning}\n")
    if cluster is not None:
        nodes = sum(g.count for g in cluster.nodes)
        gpus = sum(g.count * g.gpus for g in cluster.nodes)
        kept = f" ({args.node_fraction:g} of {listed:,})" if args.node_fraction is not None else ""
        _say(f"cluster: {nodes:,} nodes{kept} in {len(cluster.nodes)} groups, {gpus:,} GPUs")
    _say(f"wrote {', '.join(str(p) for p, _, _ in outputs)} in {format_duration(elapsed)}")
    if args.simulate:
        return _simulate_imported(args)
    return 0


def _held_for_good(workload: WorkloadFile, queues: QueuesFile, gpus: int | None) -> list[str]:
    """A warning per queue whose deserved quota is below what some of its non-preemptible
    jobs ask for: the policy rejects each of them as never fitting, since non-preemptible
    work runs only within its queue's deserved quota (docs/policy.md). Quotas in percent
    are judged against ``gpus`` (none without it)."""
    deserved: dict[str, float] = {}
    for spec in queues.queues:  # parents first
        if spec.deserved_gpus is not None:
            deserved[spec.name] = spec.deserved_gpus
        elif spec.deserved_percent is not None and gpus is not None:
            whole = deserved[spec.parent] if spec.parent else gpus
            deserved[spec.name] = whole * spec.deserved_percent / 100
    held: dict[str, list[float]] = {}
    for job in workload.jobs:
        asks = job.pods * job.gpus_per_pod
        preemptible = preemptible_of(job.priority_class, job.preemptible)
        if not preemptible and job.queue in deserved and asks > deserved[job.queue]:
            held.setdefault(job.queue, []).append(asks)
    return [
        f"queue {queue!r} deserves {deserved[queue]:g} GPUs, but {len(asks):,} of its "
        f"non-preemptible jobs ask for more (up to {max(asks):g}): the policy rejects each "
        f"as never fitting, as non-preemptible work runs only within its queue's deserved "
        f"quota; give the queue more (deserved_percent: in the mapping)"
        for queue, asks in sorted(held.items())
    ]


def _simulate_imported(args: argparse.Namespace) -> int:
    """Straight to a simulation: the same command as ``gpuledger simulate`` on the files."""
    argv = [
        "simulate",
        "--cluster", str(args.cluster_out),
        "--queues", str(args.queues_out),
        "--workload", str(args.out),
        "--policy", args.policy,
        "--ledger", str(args.simulate),
        "--no-fairness",
    ]  # fmt: skip
    parser = argparse.ArgumentParser(prog="gpuledger")
    simulate.register(parser.add_subparsers(dest="command", required=True))
    sim = parser.parse_args(argv)
    code: int = sim.func(sim)
    return code


def _with_flags(mapping: Mapping, args: argparse.Namespace) -> Mapping:
    """The mapping with --column and --time-scale applied on top of the file's values."""
    changes: dict[str, Any] = {}
    if args.column:
        fields = msgspec.structs.asdict(mapping.columns)
        for item in args.column:
            key, sep, value = item.partition("=")
            if not sep or key not in fields:
                raise ConfigError(
                    f"--column {item!r}: expected FIELD=NAME with FIELD one of {', '.join(fields)}"
                )
            fields[key] = value or None
        changes["columns"] = Columns(**fields)
    if args.time_scale is not None:
        changes["time_scale"] = args.time_scale
    if args.quota_from is not None:
        changes["quota_from"] = args.quota_from
    return msgspec.structs.replace(mapping, **changes) if changes else mapping

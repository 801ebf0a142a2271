"""``gpuledger forecast``: when each pending job will start, or one not yet submitted."""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from events.ledgertime import format_at, format_duration, is_wall_clock, parse_duration_ms
from scheduler.cli.errors import (
    CliError,
    add_damage_options,
    check_ledger,
    ledger_errors,
    open_ledger,
)
from scheduler.cli.replay import _clock, _refuse_past_the_end, parse_bound

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``forecast`` to the ``gpuledger`` parser."""
    p = sub.add_parser(
        "forecast",
        help="when each pending job will start (or a job not yet submitted)",
        description="Run the policy forward from the ledger's state at a moment: running "
        "jobs end by their runtime estimates (the job's own, else the median and 90th "
        "percentile of completed jobs like it), and no new work arrives (or, with "
        "--arrivals recent, the last day's submissions come again). Each pending job's "
        "forecast start is a range: with median runtimes, and with p90 ones. A read-side "
        "computation: nothing is written. See docs/cli.md.",
    )
    p.add_argument(
        "--ledger", required=True, help="ledger directory, JSON Lines export or kafka://…"
    )
    p.add_argument(
        "--at",
        help="the moment to forecast from: an offset, a time (90m, 6h, 2d) or, on a live "
        "ledger, an ISO-8601 time (default: the ledger's end)",
    )
    p.add_argument(
        "--job",
        metavar="JOB.yaml",
        help="forecast a job not in the ledger: a workload YAML file with one job",
    )
    p.add_argument("--horizon", default="7d", help="how far to run forward (default 7d)")
    p.add_argument(
        "--arrivals",
        choices=("none", "recent"),
        default="none",
        help="new work assumed: none (default), or the last day's submissions again",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_damage_options(p)
    p.set_defaults(func=_forecast)


def _forecast(args: argparse.Namespace) -> int:
    from replay.forecast import forecast, moment_of  # noqa: PLC0415  # heavy: only when run

    try:
        horizon_ms = parse_duration_ms(args.horizon)
    except ValueError as exc:
        raise CliError(f"--horizon: {exc}") from exc
    check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    try:
        origin, wall = _clock(reader)
        kind, value = "end", 0
        if args.at is not None:
            kind, value = parse_bound(args.at, origin, wall)
            _refuse_past_the_end(reader, args.at, (kind, value), wall)
        with ledger_errors():
            moment = moment_of(
                reader.read(0),
                value if kind == "time" else None,
                before_offset=value if kind == "offset" else None,
            )
    finally:
        reader.close()
    if moment.last_offset < 0:
        raise CliError(f"{args.ledger}: the ledger holds no records before that moment")
    name = None
    if args.job:
        moment, name, variants = _with_job(args.job, moment, horizon_ms, args.arrivals)
    else:
        variants = []
    jobs = None if name is None else [name]
    result = forecast(moment, horizon_ms=horizon_ms, jobs=jobs, arrivals=args.arrivals)
    now = moment.fold.state.now
    rows = [_row(f, now, wall) for f in result]
    if args.json:
        print(json.dumps({"at_ms": now, "jobs": rows, "sooner": variants}, indent=2))
        return 0
    from projections.report import Column, render_table  # noqa: PLC0415

    print(
        f"forecast from {format_at(now, wall)} (through offset {moment.last_offset}); "
        f"horizon {format_duration(horizon_ms / 1000)}; arrivals: {args.arrivals}"
    )
    columns = [
        Column("job", unit="text"),
        Column("queue", unit="text"),
        Column("position", "pos", "count"),
        Column("start", unit="text"),
        Column("wait", "waits", "text"),
        Column("estimate", unit="text"),
        Column("reason", "why it waits now", "text"),
    ]
    print(render_table(rows, columns) if rows else "no pending jobs")
    for line in variants:
        print(f"  sooner: {line['change']}: {line['start']}")
    return 0


def _row(f: Any, now: int, wall: bool) -> dict[str, Any]:
    """One forecast as a row: its range in ledger time and as waits from the moment."""

    def when(ms: int | None) -> str:
        if ms is None:
            return f"later than {format_at(f.horizon_end_ms, wall)}"
        return "now" if ms - now < 1000 else format_at(ms, wall)

    def wait(ms: int | None) -> str:
        return "-" if ms is None else format_duration(max(0, ms - now) / 1000)

    start = when(f.earliest_ms)
    if f.latest_ms != f.earliest_ms:
        start += f" – {when(f.latest_ms)}"
    waits = wait(f.earliest_ms) + (
        "" if f.latest_ms == f.earliest_ms else f" – {wait(f.latest_ms)}"
    )
    return {
        "job": f.job,
        "queue": f.queue,
        "position": f.position,
        "start": start,
        "wait": waits,
        "earliest_ms": f.earliest_ms,
        "latest_ms": f.latest_ms,
        "horizon_end_ms": f.horizon_end_ms,
        "estimate": f.estimate.source,
        "reason": f.reason,
    }


def _with_job(
    path: str, moment: Any, horizon_ms: int, arrivals: str
) -> tuple[Any, str, list[dict[str, Any]]]:
    """The moment with the job of ``path`` submitted, its name, and what would make it
    start sooner: half the gang, another leaf queue, the free GPUs that would let it start
    now. Refused as the scheduler's intake refuses it."""
    from replay.config import ConfigError, WorkloadFile, load  # noqa: PLC0415
    from replay.forecast import forecast, submit  # noqa: PLC0415
    from replay.sim import expand  # noqa: PLC0415

    try:
        workload = load(path, WorkloadFile)
        if len(workload.jobs) != 1 or workload.generators:
            raise CliError(f"{path}: expected exactly one job under jobs: and no generators")
        spec = workload.jobs[0]
        (sim_job,) = expand(
            msgspec.structs.replace(workload, jobs=[msgspec.structs.replace(spec, at_s=0)])
        )
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    event = sim_job.submitted
    submitted = submit(moment, event)
    if isinstance(submitted, str):
        raise CliError(f"{path}: {submitted}")
    state = moment.fold.state
    wall = is_wall_clock(state.now)
    variants: list[dict[str, Any]] = []

    def start_of(changed: Any) -> str:
        with_it = submit(moment, changed)
        if isinstance(with_it, str):
            return f"refused: {with_it}"
        (f,) = forecast(with_it, horizon_ms=horizon_ms, jobs=[changed.job], arrivals=arrivals)
        return str(_row(f, state.now, wall)["start"])

    if len(event.pods) > 1:
        half = event.pods[: len(event.pods) // 2]
        smaller = msgspec.structs.replace(
            event, pods=half, min_members=min(event.min_members, len(half))
        )
        variants.append({"change": f"a gang of {len(half)} pods", "start": start_of(smaller)})
    leaves = [q for q in sorted(state.queues) if not state.queues[q].children and q != event.queue]
    for queue in leaves[:6]:
        moved = msgspec.structs.replace(event, queue=queue)
        variants.append({"change": f"queue {queue}", "start": start_of(moved)})
    wanted = sum(p.gpu_milli for p in event.pods)
    free = sum(n.free_gpu_milli for n in state.nodes.values() if not n.cordoned)
    if wanted > free:
        variants.append(
            {
                "change": f"{(wanted - free) / 1000:g} more free GPUs (it asks for "
                f"{wanted / 1000:g}, {free / 1000:g} are free)",
                "start": "now, if its gang fits on them",
            }
        )
    return submitted, event.job, variants

"""``gpuledger forecast``: when each pending job will start, or one not yet submitted."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from events.ledgertime import format_at, format_duration, parse_duration_ms
from scheduler.cli.common import ledger_clock, parse_bound, refuse_past_the_end
from scheduler.cli.errors import (
    CliError,
    add_damage_options,
    check_ledger,
    ledger_errors,
    open_ledger,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``forecast`` to the ``gpuledger`` parser."""
    p = sub.add_parser(
        "forecast",
        help="when each pending job will start (or a job not yet submitted)",
        description="Run the policy forward from the ledger's state at a moment: running "
        "jobs end by their runtime estimates (the job's own, else the median and 90th "
        "percentile of completed jobs like it), and no new work arrives (or, with "
        "--arrivals recent, the last day's submissions come again). Learned runtimes are "
        "drawn afresh in each of --samples runs: each pending job's forecast start is the "
        "middle run's, with the earliest to the latest as its range. A read-side "
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
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        metavar="N",
        help="forward runs, each drawing the learned runtimes afresh (default 7; 1 is "
        "fastest, with no range where runtimes are learned)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="every job ends at its own estimated time (slower); by default ends are "
        "rounded up to about 1/32 of their distance from the moment",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_damage_options(p)
    p.set_defaults(func=_forecast)


def _forecast(args: argparse.Namespace) -> int:
    from replay.config import ConfigError  # noqa: PLC0415  # heavy: only when run
    from replay.forecast import (  # noqa: PLC0415
        COARSE,
        SAMPLES,
        forecast,
        job_from_yaml,
        moment_of,
        sooner,
        submit,
    )

    try:
        horizon_ms = parse_duration_ms(args.horizon)
    except ValueError as exc:
        raise CliError(f"--horizon: {exc}") from exc
    samples = SAMPLES if args.samples is None else args.samples
    if samples < 1:
        raise CliError(f"--samples: {samples}: expected at least 1")
    check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    try:
        origin, wall = ledger_clock(reader)
        kind, value = "end", 0
        if args.at is not None:
            kind, value = parse_bound(args.at, origin, wall)
            refuse_past_the_end(reader, args.at, (kind, value), wall)
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
    jobs, variants = None, []
    if args.job:
        try:
            raw = Path(args.job).read_bytes()
            job = job_from_yaml(raw, args.job)
        except OSError as exc:
            raise CliError(f"{args.job}: cannot read: {exc.strerror}") from exc
        except ConfigError as exc:
            raise CliError(str(exc)) from exc
        submitted = submit(moment, job)
        if isinstance(submitted, str):
            raise CliError(f"{args.job}: {submitted}")
        variants = sooner(
            moment, job, horizon_ms=horizon_ms, arrivals=args.arrivals, samples=samples
        )
        moment, jobs = submitted, [job.job]
    coarse = 0 if args.exact else COARSE
    result = forecast(
        moment,
        horizon_ms=horizon_ms,
        jobs=jobs,
        arrivals=args.arrivals,
        coarse=coarse,
        samples=samples,
    )
    now = moment.fold.state.now
    rows = [f.row(now) for f in result]
    if args.json:
        print(json.dumps({"at_ms": now, "jobs": rows, "sooner": variants}, indent=2))
        return 0
    from scheduler.render.table import Column, render_table  # noqa: PLC0415

    print(
        f"forecast from {format_at(now, wall)} (through offset {moment.last_offset}); "
        f"horizon {format_duration(horizon_ms / 1000)}; arrivals: {args.arrivals}; "
        f"{samples} runs"
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

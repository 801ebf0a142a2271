"""``gpuledger replay``: re-run a ledger. ``--verify`` checks every decision is reproduced
(``scheduler.fold.verify``); ``--policy``, ``--policy-name``, ``--queues`` with ``--out``
make it a what-if (``replay.whatif``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from events.ledgertime import format_duration
from replay.config import ConfigError, PolicyFile, QueuesFile, load, queue_events
from scheduler import native
from scheduler.cli.common import fresh_dir, ledger_clock, parse_bound, print_refusals, refused_error
from scheduler.cli.errors import (
    CliError,
    add_damage_options,
    check_ledger,
    ledger_errors,
    open_ledger,
    refuse_kafka_url,
)
from scheduler.core.policy import POLICIES

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger replay`` to the ``gpuledger`` parser."""
    p = sub.add_parser(
        "replay",
        help="re-run a ledger: verify its decisions, or what-if under another policy",
    )
    p.add_argument(
        "--ledger", required=True, help="ledger directory, JSON Lines export or kafka://…"
    )
    p.add_argument("--verify", action="store_true", help="check every decision is reproduced")
    p.add_argument(
        "--from",
        dest="start",
        default="0",
        help="an offset (1200), a time (90m, 6h, 2d; from the first record on a live ledger) "
        "or, on a live ledger, an ISO-8601 time (2026-12-03T06:00:00Z)",
    )
    p.add_argument("--until", dest="end", help="an offset or a time; stop before it")
    p.add_argument("--policy", help="what-if: policy.yaml with other knobs")
    p.add_argument("--policy-name", choices=POLICIES, help="what-if: another policy")
    p.add_argument("--queues", help="what-if: queues.yaml replacing the queue configuration")
    p.add_argument("--out", help="what-if: directory for the new ledger and the report")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="what-if: leave out a recorded input the new configuration refuses (a job "
        "whose queue is gone), with a warning and a count, instead of stopping",
    )
    add_damage_options(p)
    p.set_defaults(func=_replay)


def _offset_of(reader: Any, bound: tuple[str, int] | None, default: int | None) -> int | None:
    """The first offset at or after a bound (a time is looked up in the ledger)."""
    if bound is None:
        return default
    from events.ledgertime import offset_at  # noqa: PLC0415

    kind, value = bound
    return value if kind == "offset" else offset_at(reader, value)


def _time_of(reader: Any, bound: tuple[str, int] | None) -> int | None:
    """The ledger time of a bound (an offset is looked up in the ledger)."""
    if bound is None:
        return None
    kind, value = bound
    if kind == "time":
        return value
    for _, env in reader.read(value, value + 1):
        return int(env.at)
    return None


def _replay(args: argparse.Namespace) -> int:
    if args.policy or args.policy_name or args.queues or args.out:
        return _whatif(args)
    from scheduler.fold.verify import run  # noqa: PLC0415

    torn = check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    started = time.perf_counter()
    with ledger_errors():
        clock = ledger_clock(reader)
        start = _offset_of(reader, parse_bound(args.start, *clock), 0) or 0
        end = _offset_of(reader, parse_bound(args.end, *clock) if args.end else None, None)
        result = run(reader, start=start, end=end)
    elapsed = time.perf_counter() - started
    rate = result.records / elapsed if elapsed > 0 else 0.0
    print(
        f"replayed {result.records} records ({result.inputs} inputs, {result.decisions} "
        f"decisions in {result.cycles} cycles) in {format_duration(elapsed)}, {rate:,.0f} records/s"
        f" ({'compiled core' if native.mode() == 'native' else 'core as Python'})"
    )
    if result.skipped:
        print(
            f"skipped {len(result.skipped)} records of unknown types, first at offset "
            f"{result.skipped[0]}"
        )
    if result.revision_note:
        print(result.revision_note)
    if not args.verify:
        return 0
    if result.records == 0:
        print("verify: NOTHING TO VERIFY — the ledger holds no records")
        return 1
    if result.mismatch is None:
        scope = f" from offset {start}" if start else ""
        if torn is not None and end is None:
            scope += " up to its torn tail (--accept-torn-tail)"
        print(f"verify: 0 mismatches{scope} — every decision reproduced byte for byte")
        return 0
    m = result.mismatch
    where = f"offset {m.offset}" if m.offset >= 0 else "the end of the ledger"
    print(f"verify: MISMATCH at {where}")
    print(m.diff())
    return 1


def _whatif(args: argparse.Namespace) -> int:
    from replay.whatif import report_of, what_if, whatif_table  # noqa: PLC0415
    from scheduler.render.table import render_table  # noqa: PLC0415

    if not args.out:
        raise CliError("a what-if needs --out DIR for its ledger and report")
    refuse_kafka_url(args.out, "--out", "replay", "a directory for the what-if's ledger and report")
    check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    clock = ledger_clock(reader)
    start_ms = _time_of(reader, parse_bound(args.start, *clock)) if args.start != "0" else None
    end_ms = _time_of(reader, parse_bound(args.end, *clock)) if args.end else None
    try:
        knobs = load(args.policy, PolicyFile) if args.policy else None
        queues = queue_events(load(args.queues, QueuesFile)) if args.queues else None
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    out = Path(args.out)
    fresh_dir(out, force=False)
    files = {"event": f"ledger {args.ledger}", "job": f"ledger {args.ledger}"}
    if args.queues:
        files["queue"] = args.queues
    try:
        result = what_if(
            reader,
            out / "ledger",
            start_ms=start_ms,
            end_ms=end_ms,
            knobs=knobs,
            policy_name=args.policy_name,
            queues=queues,
            skip_invalid=args.skip_invalid,
        )
    except ConfigError as exc:
        raise refused_error(exc, files) from exc
    history, fates = result.history, result.fates
    report = report_of(result, args.queues or None)
    changes = report["changes"]
    assert isinstance(changes, list)
    print(
        f"what-if over {len(history.jobs)} jobs ({', '.join(changes) or 'same policy'}); "
        f"world timing: bind {history.bind_ms} ms, startup {history.startup_ms} ms"
        + (f"; {history.unfinished} jobs had not ended" if history.unfinished else "")
    )
    table = whatif_table(result.rows)
    print(table)
    print_refusals(result.refused, files)
    if fates:
        print("\njobs whose fate changed most:")
        print(render_table(fates, list(fates[0])))
    (out / "whatif.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "whatif.txt").write_text(table + "\n")
    print(f"\nnew ledger: {out / 'ledger'}; report: {out / 'whatif.json'}")
    return 0

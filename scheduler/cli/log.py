"""``gpuledger log``: look into, check, export and import a ledger (a directory, a JSON Lines
export or a Kafka ledger topic; ``verify`` and ``import`` work on directories only)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from events.codec import Envelope, to_json_line
from events.filelog import verify
from events.jsonl import export_jsonl, import_jsonl_into
from events.ledgertime import clock_of, offset_at, parse_at
from events.model import TAGS
from events.port import LedgerReader
from scheduler.cli.errors import CliError, ledger_errors, open_ledger, refuse_kafka_url


def _add_range(parser: argparse.ArgumentParser, verb: str) -> None:
    """``--from B`` / ``--until B``: the half-open range a command works on. A bound is an
    offset, or a moment: a ledger time (``6h`` into the ledger) or, on a live ledger, an
    ISO-8601 time — the first record at or after it (``_resolve``)."""
    parser.add_argument(
        "--from",
        dest="start",
        type=_bound,
        default=0,
        metavar="B",
        help=f"first offset to {verb}, or a moment: 6h, or on a live ledger an ISO-8601 "
        "time (default 0)",
    )
    parser.add_argument(
        "--until",
        dest="end",
        type=_bound,
        default=None,
        metavar="B",
        help="stop before this offset or moment (default: the current end)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``log`` command and its sub-commands to the ``gpuledger`` parser."""
    log = sub.add_parser(
        "log",
        help="inspect, verify, export and import a ledger",
        description="Inspect, verify, export and import a ledger directory.",
    )
    cmds = log.add_subparsers(dest="log_command", required=True, metavar="SUBCOMMAND")
    source = "ledger directory, JSON Lines export (.jsonl) or kafka://HOST:PORT/PREFIX"

    cat = cmds.add_parser("cat", help="print records as JSON Lines, optionally following")
    cat.add_argument("ledger", metavar="LEDGER", help=source)
    _add_range(cat, "print")
    cat.add_argument(
        "--type",
        dest="types",
        action="extend",
        nargs="+",
        metavar="TAG",
        help="only records of these event types (repeatable)",
    )
    _add_follow(cat)
    cat.set_defaults(func=_cat)

    tail = cmds.add_parser("tail", help="print the last records, optionally following")
    tail.add_argument("ledger", metavar="LEDGER", help=source)
    tail.add_argument(
        "-n",
        dest="count",
        type=_count,
        default=10,
        metavar="N",
        help="how many records (default 10)",
    )
    _add_follow(tail)
    tail.set_defaults(func=_tail)

    ver = cmds.add_parser("verify", help="check every segment; exit 1 on any problem")
    ver.add_argument("ledger", metavar="LEDGER", help="ledger directory (not kafka://)")
    ver.set_defaults(func=_verify)

    exp = cmds.add_parser("export", help="write the ledger as JSON Lines")
    exp.add_argument("ledger", metavar="LEDGER", help="ledger directory or kafka://HOST:PORT/TOPIC")
    exp.add_argument("--out", required=True, metavar="FILE.jsonl", help="output file, - for stdout")
    _add_range(exp, "export")
    exp.set_defaults(func=_export)

    imp = cmds.add_parser("import", help="append a JSON Lines export to a ledger")
    imp.add_argument("source", metavar="FILE.jsonl", help="JSON Lines file, - for stdin")
    imp.add_argument(
        "--ledger",
        required=True,
        metavar="DIR",
        help="ledger directory (created if missing; not kafka://)",
    )
    imp.set_defaults(func=_import)


def _add_follow(parser: argparse.ArgumentParser) -> None:
    """``-f/--follow`` and ``--idle-timeout``: keep printing records as they are appended."""
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing records as they are appended (or committed, on Kafka)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --follow, stop after this long without a new record",
    )


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def _bound(text: str) -> int | str:
    """An offset (an int), or a moment to look up in the ledger (the text)."""
    try:
        value = int(text)
    except ValueError:
        if not text.strip():
            raise argparse.ArgumentTypeError("not an offset or a time: ''") from None
        return text
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def _resolve(reader: LedgerReader, bound: int | str | None) -> int | None:
    """The offset of a bound: itself, or the first record at or after the moment."""
    if bound is None or isinstance(bound, int):
        return bound
    origin, wall = clock_of(reader)
    try:
        moment = parse_at(bound, wall, origin)
    except ValueError as exc:
        raise CliError(f"--from/--until: {exc}") from None
    return offset_at(reader, moment)


def _stdout() -> IO[bytes]:
    sys.stdout.flush()
    return sys.stdout.buffer


@contextlib.contextmanager
def _reading(ledger: str) -> Iterator[LedgerReader]:
    """The reader of ``ledger`` (directory or ``kafka://``), closed when the command ends:
    a Kafka reader holds a consumer whose connections would otherwise be left to the
    garbage collector (and its "Unclosed AIOKafkaConsumer" warning)."""
    reader = open_ledger(ledger)
    try:
        yield reader
    finally:
        reader.close()


def _last_records(reader: LedgerReader, count: int, end: int) -> list[tuple[int, Envelope]]:
    """The last ``count`` records before offset ``end``.

    Offsets need not be consecutive (Kafka's transaction markers take some), so the window
    read back from ``end`` doubles until it holds ``count`` records or reaches offset 0.
    """
    if count == 0:
        return []
    span = count
    while True:
        start = max(end - span, 0)
        got = list(reader.read(start, end))
        if len(got) >= count or start == 0:
            return got[-count:]
        span *= 2


def _print_followed(
    records: Iterator[tuple[int, Envelope]], out: IO[bytes], types: set[str] | None = None
) -> None:
    """Print followed records as they come, until the follow ends or Ctrl-C."""
    try:
        for off, env in records:
            if types is None or env.type in types:
                out.write(to_json_line(off, env, iso=True) + b"\n")
                out.flush()
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a follow normally ends


def _cat(args: argparse.Namespace) -> int:
    types: set[str] | None = set(args.types) if args.types else None
    if types is not None and not types <= TAGS.keys():
        unknown = ", ".join(sorted(types - TAGS.keys()))
        raise CliError(f"unknown event type {unknown}; known: {', '.join(sorted(TAGS))}")
    if args.follow and args.end is not None:
        raise CliError("--until and --follow cannot be combined: a followed ledger has no end")
    out = _stdout()
    with ledger_errors(), _reading(args.ledger) as reader:
        start = _resolve(reader, args.start) or 0
        if args.follow:
            _print_followed(reader.follow(start, idle_timeout_s=args.idle_timeout), out, types)
            return 0
        for off, env in reader.read(start, _resolve(reader, args.end)):
            if types is None or env.type in types:
                out.write(to_json_line(off, env, iso=True) + b"\n")
    out.flush()
    return 0


def _tail(args: argparse.Namespace) -> int:
    out = _stdout()
    with ledger_errors(), _reading(args.ledger) as reader:
        end = reader.end_offset()
        for off, env in _last_records(reader, args.count, end):
            out.write(to_json_line(off, env, iso=True) + b"\n")
        out.flush()
        if args.follow:
            _print_followed(reader.follow(end, idle_timeout_s=args.idle_timeout), out)
    return 0


def _verify(args: argparse.Namespace) -> int:
    refuse_kafka_url(
        args.ledger,
        "LEDGER",
        "log verify",
        "a ledger directory, whose segment files it checks (to check a Kafka ledger's "
        "decisions, run `gpuledger replay --ledger URL --verify`)",
    )
    with ledger_errors():
        if not Path(args.ledger).is_dir():
            raise CliError(f"{args.ledger}: not a ledger directory")
        report = verify(args.ledger)
    span = (
        f"offsets {report.first_offset}..{report.last_offset}"
        if report.first_offset is not None
        else "no records"
    )
    sys.stdout.write(
        f"{report.path}: {report.segments} segments, {report.records} records ({span}), "
        f"{report.bytes} bytes\n"
    )
    for problem in report.problems:
        sys.stdout.write(f"problem: {problem}\n")
    if report.problems:
        sys.stdout.write(f"{len(report.problems)} problem(s)\n")
        return 1
    sys.stdout.write("ok\n")
    return 0


def _export(args: argparse.Namespace) -> int:
    # A Kafka ledger topic (kafka://…) exports like a directory does.
    with ledger_errors(), _reading(args.ledger) as reader:
        start, end = _resolve(reader, args.start) or 0, _resolve(reader, args.end)
        if args.out == "-":
            out = _stdout()
            count = export_jsonl(reader, out, start, end)
            out.flush()
        else:
            count = _export_file(reader, Path(args.out), start, end)
    sys.stderr.write(f"exported {count} records to {args.out}\n")
    return 0


def _export_file(reader: LedgerReader, target: Path, start: int, end: int | None) -> int:
    # Written aside and renamed, so a failed export never leaves a plausible-looking
    # half file under the requested name.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            count = export_jsonl(reader, f, start, end)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _import(args: argparse.Namespace) -> int:
    refuse_kafka_url(args.ledger, "--ledger", "log import", "a ledger directory")
    with ledger_errors():
        if args.source == "-":
            count, first = import_jsonl_into(sys.stdin.buffer, args.ledger, source_name="<stdin>")
        else:
            with open(args.source, "rb") as f:
                count, first = import_jsonl_into(f, args.ledger, source_name=args.source)
    span = f" (offsets {first}..{first + count - 1})" if count else ""
    sys.stderr.write(f"imported {count} records into {args.ledger}{span}\n")
    return 0

"""``gpuledger dlq``: list a domain's dead letters, or send them back to intake."""

from __future__ import annotations

import argparse
import json
import sys

import msgspec

from scheduler.cli.common import add_kafka_arguments, settings_of
from scheduler.cli.errors import kafka_errors

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger dlq`` to the ``gpuledger`` parser."""
    dlq = sub.add_parser("dlq", help="list or re-submit dead letters")
    dc = dlq.add_subparsers(dest="dlq_command", required=True, metavar="SUBCOMMAND")
    ls = dc.add_parser("list", help="print dead letters as JSON Lines")
    add_kafka_arguments(ls)
    ls.set_defaults(func=kafka_errors(_dlq_list))
    rp = dc.add_parser("replay", help="send dead letters back to intake")
    add_kafka_arguments(rp)
    rp.add_argument("--offset", type=int, action="append", help="only these dead-letter offsets")
    rp.set_defaults(func=kafka_errors(_dlq_replay))


def _dlq_list(args: argparse.Namespace) -> int:
    # intake loads the Kafka service's modules: imported when the command runs
    from scheduler.runtime.intake import read_dead_letters  # noqa: PLC0415

    for off, dl in read_dead_letters(settings_of(args), args.domain):
        row = msgspec.to_builtins(dl)
        row["value"] = dl.value.hex()
        sys.stdout.write(json.dumps({"offset": off, **row}) + "\n")
    return 0


def _dlq_replay(args: argparse.Namespace) -> int:
    # intake loads the Kafka service's modules: imported when the command runs
    from scheduler.runtime.intake import read_dead_letters, send_intake  # noqa: PLC0415

    settings = settings_of(args)
    chosen = [
        (off, dl)
        for off, dl in read_dead_letters(settings, args.domain)
        if args.offset is None or off in args.offset
    ]
    send_intake(settings, args.domain, [dl.value for _, dl in chosen])
    sys.stderr.write(f"re-submitted {len(chosen)} dead letters to intake\n")
    return 0

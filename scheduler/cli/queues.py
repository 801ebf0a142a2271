"""``gpuledger queues apply``: a queues.yaml as ``queue_configured`` events to a domain's
intake topic (``gpuledger nodes apply`` is its twin for cluster.yaml, ``scheduler.cli.nodes``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from events.model import Event
from scheduler.cli.common import add_kafka_arguments, settings_of
from scheduler.cli.errors import CliError, kafka_errors

__all__ = ["register", "send_file"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger queues`` to the ``gpuledger`` parser."""
    add_apply(sub, "queues", "queues.yaml", _apply)


def add_apply(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    noun: str,
    helptext: str,
    func: Callable[[argparse.Namespace], int],
) -> None:
    """``gpuledger NOUN apply -f FILE`` with the Kafka flags (``queues``, ``nodes``)."""
    p = sub.add_parser(noun, help=f"send {noun} from {helptext} to intake")
    c = p.add_subparsers(dest=f"{noun}_command", required=True, metavar="SUBCOMMAND")
    a = c.add_parser("apply", help=f"send the {noun} of {helptext} to intake")
    add_kafka_arguments(a)
    a.add_argument("-f", "--file", required=True, help=helptext)
    a.set_defaults(func=func, noun=noun)


def send_file(args: argparse.Namespace, events: Sequence[Event]) -> int:
    """Send the events read from ``args.file`` to intake and say how many."""
    # intake loads the Kafka service's modules: imported when the command runs
    from scheduler.runtime.intake import send_events  # noqa: PLC0415

    send_events(settings_of(args), args.domain, events)
    sys.stdout.write(f"sent {len(events)} {args.noun} events to intake\n")
    return 0


@kafka_errors
def _apply(args: argparse.Namespace) -> int:
    from replay.config import ConfigError, QueuesFile, load, queue_events  # noqa: PLC0415

    try:
        events = queue_events(load(args.file, QueuesFile))
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    return send_file(args, events)

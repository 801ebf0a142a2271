"""``gpuledger clock``: tick events to a domain's intake topic at a fixed period."""

from __future__ import annotations

import argparse
import time

from events.model import Tick
from scheduler.cli.common import add_kafka_arguments, settings_of
from scheduler.cli.errors import CliError, kafka_errors

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger clock`` to the ``gpuledger`` parser."""
    clock = sub.add_parser("clock", help="emit tick events to intake at a fixed period")
    add_kafka_arguments(clock)
    clock.add_argument("--every", default="10s", help="period, e.g. 500ms, 10s, 1m")
    clock.add_argument("--count", type=int, help="stop after this many ticks")
    clock.set_defaults(func=kafka_errors(_clock))


def _period_s(text: str) -> float:
    from events.ledgertime import parse_duration_ms  # noqa: PLC0415

    try:
        ms = parse_duration_ms(text)
    except ValueError as exc:
        raise CliError(f"--every {exc}") from None
    if ms <= 0:
        raise CliError(f"--every {text!r}: expected a positive period, e.g. 500ms, 10s, 1m")
    return ms / 1000


def _clock(args: argparse.Namespace) -> int:
    # intake loads the Kafka service's modules: imported when the command runs
    from scheduler.runtime.intake import send_events  # noqa: PLC0415

    period = _period_s(args.every)
    settings = settings_of(args)
    sent = 0
    try:
        while args.count is None or sent < args.count:
            send_events(settings, args.domain, [Tick()])
            sent += 1
            time.sleep(period)
    except KeyboardInterrupt:
        pass
    return 0

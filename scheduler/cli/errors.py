"""The one error every ``gpuledger`` sub-command raises for a user's mistake, and the helpers
that turn the library's errors into it.

Library code raises its own exceptions (``LedgerError``, ``DecodeError``, ``ConfigError``,
``KafkaLogError`` ...) and knows nothing of the command line; the command modules of this
package turn the ones a user can cause into ``CliError``, which ``scheduler.cli.main``
prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from events.port import LedgerReader


class CliError(Exception):
    """A user-facing error: printed as ``gpuledger: <message>`` with exit status 2."""


KAFKA_SCHEME = "kafka://"


def refuse_kafka_url(value: str | None, option: str, command: str, wants: str) -> None:
    """Fail (``CliError`` naming ``option``) when ``value`` is a ``kafka://`` URL.

    For options that take a directory only: taken as a path, a URL would be reported as a
    missing directory, or be created as one (``kafka:/HOST:PORT/PREFIX``).
    """
    if value is not None and value[: len(KAFKA_SCHEME)].lower() == KAFKA_SCHEME:
        raise CliError(
            f"{option} {value}: `gpuledger {command}` cannot use a Kafka ledger; "
            f"{option} takes {wants}"
        )


@contextlib.contextmanager
def ledger_errors(prefix: str = "") -> Iterator[None]:
    """Turn the errors of reading a ledger a user named — not a ledger (``LedgerError``), a
    record that does not decode (``DecodeError``), the file system's refusal (``OSError``) —
    into one-line ``CliError``s, after ``prefix``."""
    from events.codec import DecodeError  # noqa: PLC0415  # only when a command reads
    from events.filelog import LedgerError  # noqa: PLC0415

    try:
        yield
    except (LedgerError, DecodeError) as exc:
        raise CliError(f"{prefix}{exc}") from exc
    except BrokenPipeError:
        raise  # the reader of our output went away (`log cat | head`): not the ledger's fault
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise CliError(f"{prefix}{where}{exc.strerror or exc}") from exc


def open_ledger(source: str) -> LedgerReader:
    """The reader of a ledger directory, JSON Lines export or ``kafka://`` URL
    (``events.sources.open_reader``); ``CliError`` if it is none of these."""
    from events.filelog import LedgerError  # noqa: PLC0415
    from events.sources import open_reader  # noqa: PLC0415  # the file log, Kafka on demand

    if source[: len(KAFKA_SCHEME)].lower() == KAFKA_SCHEME:
        try:
            return open_reader(source)
        except LedgerError as exc:  # it names the broker, the identity and the refusal
            raise CliError(str(exc)) from exc
    with ledger_errors("cannot open ledger: "):
        return open_reader(source)


def add_damage_options(parser: argparse.ArgumentParser) -> None:
    """``--accept-torn-tail`` and ``--repair``: what a command that reads a ledger whole does
    with a torn last append instead of refusing the ledger (``check_ledger``)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--accept-torn-tail",
        action="store_true",
        help="read a ledger whose last append is torn: every record before the tear, "
        "with a warning saying what is missing",
    )
    group.add_argument(
        "--repair",
        action="store_true",
        help="truncate a torn last append (as the next writer would), say how many "
        "records were lost, and go on",
    )


def check_ledger(source: str, args: argparse.Namespace) -> str | None:
    """Before a command reads the ledger directory ``source`` whole: refuse it
    (``CliError``) when its last append is torn (``events.filelog.torn_tail``), unless the
    command was given ``--accept-torn-tail`` (returns the problem's line, after a warning on
    stderr) or ``--repair`` (truncates the tail, says what was lost, returns None).

    A ledger a writer holds right now is not checked: its tail may be an append in flight,
    which readers pass over. Kafka topics and JSON Lines exports have no torn tail; damage
    anywhere else in a ledger is refused by the read itself (``ledger_errors``)."""
    from events.filelog import (  # noqa: PLC0415  # only for a ledger directory
        FileLedger,
        LedgerError,
        torn_tail,
        writer_active,
    )

    path = Path(source)
    if source[: len(KAFKA_SCHEME)].lower() == KAFKA_SCHEME or not path.is_dir():
        return None
    try:
        if writer_active(path):
            return None
        problem = torn_tail(path)
    except (LedgerError, OSError):
        return None  # the read itself says what is wrong with the ledger
    if problem is None:
        return None
    before = f"the {problem.offset:,} records before it"
    if getattr(args, "accept_torn_tail", False):
        sys.stderr.write(
            f"gpuledger: warning: {source}: reading {before} (--accept-torn-tail); "
            f"damaged: {problem}\n"
        )
        return str(problem)
    if getattr(args, "repair", False):
        with ledger_errors(f"cannot repair {source}: "):
            writer = FileLedger.open(path, create=False)
            cut = writer.recovery
            writer.close()
        if cut is not None:
            sys.stderr.write(
                f"gpuledger: repaired {source}: truncated {cut.bytes} bytes of "
                f"{Path(cut.segment).name} at byte {cut.position}; the append from offset "
                f"{problem.offset} was lost ({cut.records} whole records of it were "
                f"written); {problem.offset:,} records remain\n"
            )
        return None
    raise CliError(
        f"{source}: the ledger is damaged: {problem}. --accept-torn-tail reads {before}; "
        f"--repair truncates the tail and goes on (`gpuledger log verify {source}` lists "
        "every problem)"
    )


def kafka_errors(
    func: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Report the broker's refusals and bad security settings (``KafkaLogError``: credentials,
    protocol, topics) as one-line CLI errors."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        from events.kafka_security import KafkaLogError  # noqa: PLC0415  # no aiokafka import

        try:
            return func(args)
        except KafkaLogError as exc:
            raise CliError(str(exc)) from None

    return run


__all__ = [
    "CliError",
    "add_damage_options",
    "check_ledger",
    "kafka_errors",
    "ledger_errors",
    "open_ledger",
    "refuse_kafka_url",
]

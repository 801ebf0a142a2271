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


def missing_tail(source: str) -> str | None:
    """For a ledger directory read whole and offline: a line saying its last append is
    torn and its records are missing (``events.filelog.torn_tail``), or None. Kafka topics
    and JSON Lines exports have no torn tail to find."""
    from events.filelog import LedgerError, torn_tail  # noqa: PLC0415

    path = Path(source)
    if source[: len(KAFKA_SCHEME)].lower() == KAFKA_SCHEME or not path.is_dir():
        return None
    try:
        problem = torn_tail(path)
    except (LedgerError, OSError):
        return None  # the read itself reported what is wrong with the ledger
    return None if problem is None else str(problem)


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
    "kafka_errors",
    "ledger_errors",
    "missing_tail",
    "open_ledger",
    "refuse_kafka_url",
]

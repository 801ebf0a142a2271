"""Ledger time as people read it.

A ledger's envelope times (``at``, milliseconds) are either wall-clock time (a live
ledger: milliseconds since 1970) or simulated time starting at 0 (a ledger written by the
simulator or a trace import). Nothing in the envelope says which, but the two never
overlap in practice: a simulation would have to run for 31 years of simulated time to
reach 2001. So a ledger whose first record is stamped at or after ``WALL_CLOCK_FROM_MS``
is read as wall time — shown and accepted as ISO-8601 UTC timestamps — and any other
ledger as simulated time — shown and accepted as offsets from 0 such as ``6h`` or
``1d 2h``.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # events.port imports events.codec, which imports this module
    from events.port import LedgerReader

__all__ = [
    "WALL_CLOCK_FROM_MS",
    "clock_of",
    "duration_unit",
    "format_at",
    "format_duration",
    "is_wall_clock",
    "offset_at",
    "parse_at",
    "parse_duration_ms",
]

WALL_CLOCK_FROM_MS = 1_000_000_000_000
"""2001-09-09T01:46:40Z: a first record at or after this is wall time."""

_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|min|s|m|h|d|w)")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def parse_duration_ms(text: str) -> int:
    """A duration typed by a person, in whole milliseconds: ``500ms``, ``90s``, ``30m``
    (or ``30min``), ``6h``, ``2d``, ``1w``, decimals (``1.5h``), Go-style sums (``1h30m``)
    and what ``format_duration`` prints (``12.5 min``); a bare number is seconds. Exact:
    decimal arithmetic, rounded to the millisecond. The one parser
    behind every duration the tools accept (``--at``, ``--window``, ``clock --every``, a
    Queue resource's durations). ``ValueError`` naming the text otherwise."""
    body = re.sub(r"\s+", "", text)
    if _NUMBER.match(body):
        return round(Decimal(body) * _UNITS_MS["s"])
    parts = _PART.findall(body)
    if not parts or "".join(a + b for a, b in parts) != body:
        raise ValueError(f"{text!r}: expected a duration such as 500ms, 90s, 30m, 6h, 2d or 1h30m")
    return round(sum(Decimal(amount) * _UNITS_MS[unit] for amount, unit in parts))


def is_wall_clock(first_ms: int | None) -> bool:
    """True when a ledger whose first record is stamped ``first_ms`` runs on wall time."""
    return first_ms is not None and first_ms >= WALL_CLOCK_FROM_MS


def format_at(at_ms: int | float | None, wall: bool) -> str:
    """``2026-12-03T16:25:00.000Z`` for wall time, ``+1d 06:12:05`` for simulated time."""
    if at_ms is None:
        return ""
    if wall:
        moment = dt.datetime.fromtimestamp(at_ms / 1000, tz=dt.UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    total_s = int(at_ms // 1000)
    days, rest = divmod(total_s, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    return f"+{days}d {clock}" if days else f"+{clock}"


_UNITS = ((1, "s", 60), (60, "min", 60), (3600, "h", 24), (86400, "d", None))


def duration_unit(seconds: float) -> tuple[int, str]:
    """The unit ``format_duration`` writes ``seconds`` in, as (seconds per unit, name):
    ``(60, "min")`` for 246 s. A chart's axis takes the unit of its largest value, so that
    its ticks read as the tables' durations do."""
    s = abs(seconds)
    for divisor, name, limit in _UNITS:
        # Compare the ROUNDED value with each limit, so 59.97 s shows as 1.0 min.
        if limit is None or round(s / divisor, 1) < limit:
            return divisor, name
    raise AssertionError("unreachable: the last unit has no limit")


def format_duration(seconds: float | None) -> str:
    """Seconds in the largest unit that keeps them readable, one decimal and the unit after
    a space: ``850 ms``, ``12.3 s``, ``4.1 min``, ``2.0 h``, ``3.5 d`` (``parse_duration_ms``
    reads each back)."""
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if round(s * 1000) < 1000:
        return f"{sign}{s * 1000:.0f} ms"
    divisor, name = duration_unit(s)
    return f"{sign}{s / divisor:.1f} {name}"


def parse_at(text: str, wall: bool, origin_ms: int = 0) -> int:
    """A moment typed by a person, in ledger milliseconds.

    Accepted on any ledger: a relative time ``90m``, ``6h``, ``2d`` after ``origin_ms`` —
    for a simulated ledger pass 0 (its clock's start); for a live one, its first record's
    time, so that ``6h`` means six hours into the ledger rather than 1970. On a wall-clock
    ledger also an ISO-8601 timestamp, ``2026-12-03T16:25:00Z`` (a timestamp without a
    zone is UTC). Raises ``ValueError`` naming the text otherwise.
    """
    if _PART.match(text.strip()):
        return origin_ms + parse_duration_ms(text)
    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        hint = "an ISO-8601 time such as 2026-12-03T16:25:00Z or " if wall else ""
        raise ValueError(f"{text!r}: expected {hint}a ledger time such as 90m, 6h, 2d") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    if not wall:
        raise ValueError(
            f"{text!r}: this ledger runs on simulated time from 0; give a time such as 6h"
        )
    return round(moment.timestamp() * 1000)


def clock_of(reader: LedgerReader) -> tuple[int, bool]:
    """Where relative times count from on this ledger, and whether it runs on wall time:
    ``(first record's time, True)`` on a live ledger, so that ``6h`` is six hours after its
    first record; ``(0, False)`` on a simulated (or empty) one."""
    for _, env in reader.read(0, 1):
        first = int(env.at)
        return (first, True) if is_wall_clock(first) else (0, False)
    return (0, False)


def offset_at(reader: LedgerReader, moment_ms: int) -> int:
    """The offset of the first record stamped at or after ``moment_ms``; the ledger's end
    offset if there is none."""
    for offset, env in reader.read(0):
        if env.at >= moment_ms:
            return int(offset)
    return int(reader.end_offset())

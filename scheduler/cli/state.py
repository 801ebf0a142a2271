"""``gpuledger state``: the cluster as it was at a moment of a ledger
(``scheduler.fold.state_at``)."""

from __future__ import annotations

import argparse

from scheduler.cli.common import ledger_clock, parse_bound, refuse_past_the_end
from scheduler.cli.errors import (
    add_damage_options,
    check_ledger,
    open_ledger,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger state`` to the ``gpuledger`` parser."""
    p = sub.add_parser("state", help="the cluster as it was at a moment of a ledger")
    p.add_argument(
        "--ledger", required=True, help="ledger directory, JSON Lines export or kafka://…"
    )
    p.add_argument(
        "--at",
        required=True,
        help="an offset (1200), a time (90m, 6h, 2d; from the first record on a live ledger) "
        "or, on a live ledger, an ISO-8601 time (2026-12-03T06:00:00Z)",
    )
    add_damage_options(p)
    p.set_defaults(func=_state)


def _state(args: argparse.Namespace) -> int:
    from scheduler.fold.state_at import state_at  # noqa: PLC0415
    from scheduler.render.table import render_table  # noqa: PLC0415

    check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)
    clock = ledger_clock(reader)
    bound = parse_bound(args.at, *clock)
    refuse_past_the_end(reader, args.at, bound, clock[1])
    snapshot = state_at(reader, bound)
    if clock[1]:
        from events.ledgertime import format_at  # noqa: PLC0415

        print(f"{format_at(snapshot.state.now, wall=True)}")
    print(snapshot.headline)
    print(f"ended: {snapshot.ended}")
    for title, rows in (
        ("queues", snapshot.queues),
        ("running", snapshot.running),
        ("pending", snapshot.pending),
    ):
        print(f"\n{title}:")
        print(render_table(rows, list(rows[0])) if rows else "  (none)")
    return 0

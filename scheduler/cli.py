"""The ``gpuledger`` command line: a thin shell over the library calls of each package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from events.clierror import CliError

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each package registers its own sub-commands."""
    from events import cli as events_cli  # noqa: PLC0415  # keep `gpuledger --help` fast
    from projections import cli as projections_cli  # noqa: PLC0415
    from replay import cli as replay_cli  # noqa: PLC0415
    from replay import trace_cli  # noqa: PLC0415
    from scheduler import live_cli  # noqa: PLC0415
    from scheduler.kube import cli as kube_cli  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="gpuledger", description="An event-sourced GPU batch scheduler with a replayable log."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    events_cli.register(sub)
    projections_cli.register(sub)
    replay_cli.register(sub)
    trace_cli.register(sub)
    live_cli.register(sub)
    kube_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script. Each sub-command sets ``func(args) -> int``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except CliError as exc:
        print(f"gpuledger: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gpuledger log cat | head` is normal use
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The ``gpuledger`` command line: a thin shell over the library calls of each package.

Every command-line module lives in this package, one per command and named after it
(``gpuledger report`` is ``scheduler.cli.report``, ``gpuledger queues``/``nodes`` are
``scheduler.cli.queues``); helpers they share are in ``scheduler.cli.common``. It is the
top layer, which nothing else imports. A user's mistake is a ``CliError``
(``scheduler.cli.errors``).

Imports inside functions: a command module imports what only its handler needs (the
simulator, the console, the Kafka service, Parquet) inside that handler, so that
``gpuledger --help`` and every other command start without loading it. They are for
start-up time only. Below the CLI only ``events.sources`` does so, to load the Kafka
backend when a ``kafka://`` ledger is opened; none dodges an import cycle.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from scheduler.cli.errors import CliError

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each command module registers its own sub-commands."""
    # Imported here, so that importing this package (for ``main`` or ``CliError``) loads
    # no command's dependencies.
    from scheduler.cli import (  # noqa: PLC0415
        clock,
        compare,
        demo,
        dlq,
        example,
        export,
        forecast,
        kube,
        log,
        metrics,
        nodes,
        project,
        queues,
        replay,
        report,
        schema,
        serve,
        simulate,
        sql,
        state,
        submit,
        trace,
    )
    from scheduler.cli import scheduler as scheduler_run  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="gpuledger", description="An event-sourced GPU batch scheduler with a replayable log."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order ``gpuledger --help`` lists them.
    for command in (
        log,
        project,
        report,
        sql,
        export,
        metrics,
        serve,
        simulate,
        replay,
        state,
        forecast,
        demo,
        compare,
        example,
        schema,
        trace,
        scheduler_run,
        clock,
        submit,
        queues,
        nodes,
        dlq,
        kube,
    ):
        command.register(sub)
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
        # Python would report the pipe again when it flushes stdout at exit: point stdout
        # at /dev/null first, as the Python documentation advises for SIGPIPE.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code

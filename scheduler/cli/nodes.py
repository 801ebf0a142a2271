"""``gpuledger nodes apply``: a cluster.yaml as ``node_registered`` events to a domain's
intake topic (the twin of ``gpuledger queues apply``, ``scheduler.cli.queues``).
"""

from __future__ import annotations

import argparse

from scheduler.cli.errors import CliError, kafka_errors
from scheduler.cli.queues import add_apply, send_file

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger nodes`` to the ``gpuledger`` parser."""
    add_apply(sub, "nodes", "cluster.yaml", _apply)


@kafka_errors
def _apply(args: argparse.Namespace) -> int:
    from replay.config import ClusterFile, ConfigError, load, node_events  # noqa: PLC0415

    try:
        events = node_events(load(args.file, ClusterFile))
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    return send_file(args, events)

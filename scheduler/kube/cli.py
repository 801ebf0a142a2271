"""``gpuledger kube ingest|bind|schedule``: the Kubernetes adapters and the embedded loop."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable

from scheduler.cli import CliError


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM/SIGINT, so a Deployment's shutdown ends the loop cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _ingest(args: argparse.Namespace) -> int:
    from scheduler.kube.client import api_client  # noqa: PLC0415  # keep --help fast
    from scheduler.kube.ingest import Ingestor  # noqa: PLC0415

    stop = _stop_on_signals()
    Ingestor(api_client(args.kubeconfig), args.intake).run(stop.is_set)
    return 0


def _bind(args: argparse.Namespace) -> int:
    from scheduler.kube.bind import Binder  # noqa: PLC0415
    from scheduler.kube.client import api_client  # noqa: PLC0415

    stop = _stop_on_signals()
    binder = Binder(api_client(args.kubeconfig), args.ledger, args.intake, workers=args.workers)
    try:
        binder.run(stop.is_set)
    finally:
        binder.close()
    print(
        f"bound {binder.bound}, failed {binder.failed}, evicted {binder.evicted}, "
        f"eviction failed {binder.evict_failed}"
    )
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from events.filelog import LedgerError  # noqa: PLC0415
    from scheduler.embedded import EmbeddedRunner  # noqa: PLC0415

    stop = _stop_on_signals()
    try:
        runner = EmbeddedRunner(args.intake, args.ledger)
    except LedgerError as exc:
        raise CliError(str(exc)) from exc
    try:
        stats = runner.run(stop.is_set)
    finally:
        runner.close()
    print(f"inputs {stats.inputs}, cycles {stats.cycles}, decisions {stats.decisions}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger kube ...`` to the command tree."""
    kube = sub.add_parser("kube", help="Kubernetes adapters: ingest, bind, schedule")
    kube.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    cmds = kube.add_subparsers(dest="kube_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("ingest", help="watch pods, nodes and Queues; append intake events")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument("--intake", required=True, help="intake directory (writes INTAKE/ingest/)")
    p.set_defaults(func=_with_logging(_ingest))

    p = cmds.add_parser("bind", help="follow the ledger; bind, evict and emit Events")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument("--ledger", required=True, help="ledger directory to follow")
    p.add_argument("--intake", required=True, help="intake directory (writes INTAKE/binder/)")
    p.add_argument("--workers", type=int, default=8, help="parallel bind calls (default 8)")
    p.set_defaults(func=_with_logging(_bind))

    p = cmds.add_parser(
        "schedule", help="embedded scheduler loop: follow intake, run cycles, append the ledger"
    )
    p.add_argument("--intake", required=True, help="intake directory to follow")
    p.add_argument("--ledger", required=True, help="ledger directory to append to")
    p.set_defaults(func=_with_logging(_schedule))


def _with_logging(
    func: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
        return func(args)

    return run

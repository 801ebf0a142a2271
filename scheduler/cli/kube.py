"""``gpuledger kube ingest|bind|schedule``: the Kubernetes adapters and the embedded loop.

``ingest`` and ``bind`` write to an intake directory (for ``kube schedule``, the embedded
loop) or to a ``kafka://HOST:PORT/PREFIX`` deployment (for ``gpuledger scheduler run``);
see ``scheduler.kube.transport``. ``schedule`` works on directories only.
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from scheduler.cli.common import add_policy_flag, add_security_arguments, security_of
from scheduler.cli.errors import (
    CliError,
    kafka_errors,
    ledger_errors,
    open_ledger,
    refuse_kafka_url,
)

if TYPE_CHECKING:
    from events.port import LedgerReader
    from scheduler.kube.transport import Deployment

log = logging.getLogger(__name__)


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM/SIGINT, so a Deployment's shutdown ends the loop cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _is_kafka(where: str) -> bool:
    return where.startswith("kafka://")


def _deployment(args: argparse.Namespace, flag: str, topic: str) -> Deployment:
    """The ``kafka://`` deployment of ``--<flag>``, with the security flags and environment."""
    from events.kafka_security import KafkaLogError  # noqa: PLC0415
    from scheduler.kube.transport import parse_deployment  # noqa: PLC0415

    try:
        return parse_deployment(getattr(args, flag), topic=topic, security=security_of(args))
    except KafkaLogError as exc:
        raise CliError(f"--{flag}: {exc}") from None


def _fenced_exits(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Broker refusals as one-line CLI errors; an instance fenced by a newer one exits with
    ``scheduler run``'s status for the same case (``FENCED_EXIT``, 3)."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        from scheduler.kube.transport import SinkFenced  # noqa: PLC0415

        try:
            return func(args)
        except SinkFenced as exc:
            from scheduler.runtime.service import FENCED_EXIT  # noqa: PLC0415  # only when fenced

            log.error("%s; exiting", exc)  # the traceback adds nothing
            return FENCED_EXIT

    return kafka_errors(run)


def _ingest(args: argparse.Namespace) -> int:
    from scheduler.kube.client import api_client  # noqa: PLC0415  # keep --help fast
    from scheduler.kube.ingest import SOURCE, Ingestor  # noqa: PLC0415
    from scheduler.kube.transport import IntakeSink, KafkaIntakeSink  # noqa: PLC0415

    intake: str | IntakeSink = args.intake
    if _is_kafka(args.intake):
        d = _deployment(args, "intake", "intake")
        intake = KafkaIntakeSink(d.settings, SOURCE, d.domain)
    try:
        api = api_client(args.kubeconfig)
    except BaseException:
        if isinstance(intake, IntakeSink):
            intake.close()
        raise
    # The ledger to reconcile against: given, or on Kafka the deployment's own.
    source = args.ledger or (args.intake if _is_kafka(args.intake) else None)
    try:
        ledger = None if source is None else _reconciled_ledger(source)
    except CliError:
        if isinstance(intake, IntakeSink):
            intake.close()
        raise
    stop = _stop_on_signals()
    Ingestor(api, intake, ledger=ledger, resync_s=args.resync_s).run(stop.is_set)
    return 0


def _reconciled_ledger(source: str) -> LedgerReader:
    """The ledger the ingestor compares the cluster with. A ledger directory that does not
    exist yet is awaited (the scheduler, started after the ingestor, creates it)."""
    from events.filelog import AwaitedLedgerDir, holds_segments  # noqa: PLC0415

    path = Path(source)
    if (
        _is_kafka(source)
        or path.suffix in (".jsonl", ".json")
        or holds_segments(path)
        or (path.exists() and not path.is_dir())  # refused by open_ledger, with its reason
    ):
        return open_ledger(source)
    log.warning("ledger %s does not exist yet: drift is compared with it once it does", source)
    return AwaitedLedgerDir(source)


def _bind(args: argparse.Namespace) -> int:
    from scheduler.kube.bind import EVENT_THREADS, SOURCE, Binder  # noqa: PLC0415
    from scheduler.kube.client import api_client  # noqa: PLC0415
    from scheduler.kube.transport import (  # noqa: PLC0415
        IntakeSink,
        KafkaIntakeSink,
        KafkaLedgerFeed,
        LedgerFeed,
    )

    ledger: str | LedgerFeed = args.ledger
    intake: str | IntakeSink = args.intake
    # One connection per bind worker and per Event thread, and two for the binder's own
    # reads, so no call waits for a connection or opens a spare one.
    connections = args.workers + EVENT_THREADS + 2
    if _is_kafka(args.ledger) != _is_kafka(args.intake):
        raise CliError(
            f"kube bind --ledger {args.ledger} --intake {args.intake}: give both as kafka:// "
            "URLs of one deployment (the scheduler service) or both as directories (the "
            "embedded scheduler); the binder's outcomes must reach the scheduler that wrote "
            "the ledger"
        )
    if _is_kafka(args.ledger):
        on_ledger = _deployment(args, "ledger", "ledger")
        on_intake = _deployment(args, "intake", "intake")
        if not on_ledger.same_as(on_intake):
            raise CliError(
                f"kube bind --ledger {args.ledger} --intake {args.intake}: the two URLs name "
                "different deployments (bootstrap, prefix or domain); the binder writes its "
                "outcomes to the intake of the scheduler whose ledger it follows"
            )
        api = api_client(args.kubeconfig, pool=connections)
        ledger = KafkaLedgerFeed(on_ledger.settings, on_ledger.domain)
        try:
            intake = KafkaIntakeSink(on_intake.settings, SOURCE, on_intake.domain)
        except BaseException:
            ledger.close()
            raise
    else:
        api = api_client(args.kubeconfig, pool=connections)
    stop = _stop_on_signals()
    binder = Binder(api, ledger, intake, workers=args.workers)
    try:
        binder.run(stop.is_set)
    finally:
        binder.close()
    print(
        f"bound {binder.bound}, failed {binder.failed}, evicted {binder.evicted}, "
        f"eviction failed {binder.evict_failed}"
    )
    return 0


def _forecast(args: argparse.Namespace) -> int:
    """Every ``--every``: forecast the ledger's pending jobs and annotate their pods."""
    from kubernetes.client import CoreV1Api  # noqa: PLC0415

    from events.ledgertime import format_at, parse_duration_ms  # noqa: PLC0415
    from replay.forecast import forecast, moment_of  # noqa: PLC0415
    from scheduler.kube.annotate import ForecastAnnotator, PodForecast  # noqa: PLC0415
    from scheduler.kube.client import api_client  # noqa: PLC0415

    try:
        every_s = parse_duration_ms(args.every) / 1000
        threshold_ms = parse_duration_ms(args.threshold)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    annotator = ForecastAnnotator(CoreV1Api(api_client(args.kubeconfig)), threshold_ms=threshold_ms)
    stop = _stop_on_signals()
    reader = open_ledger(args.ledger)
    try:
        while True:
            with ledger_errors():
                moment = moment_of(reader.read(0))
            state = moment.fold.state
            due: dict[str, PodForecast] = {}
            for f in forecast(moment):
                text = (
                    format_at(f.median_ms, True)
                    if f.median_ms is not None
                    else f"later than {format_at(f.horizon_end_ms, True)}"
                )
                pods = tuple(p.name for p in state.jobs[f.job].pods)
                due[f.job] = PodForecast(f.median_ms, text, pods)
            written = annotator.update(due)
            log.info("forecasts: %d pending jobs, %d written", len(due), written)
            if args.once or stop.wait(every_s):
                break
    finally:
        reader.close()
    print(f"annotated {annotator.patches} pods")
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from scheduler.runtime.embedded import EmbeddedRunner  # noqa: PLC0415

    for flag, value in (("--intake", args.intake), ("--ledger", args.ledger)):
        refuse_kafka_url(
            value,
            flag,
            "kube schedule",
            "a directory: the embedded scheduler works on directories only; on Kafka run the "
            "scheduler service (gpuledger scheduler run --bootstrap HOST:PORT --prefix PREFIX) "
            "with kube ingest/bind on the same kafka:// URL",
        )
    stop = _stop_on_signals()
    with ledger_errors():
        runner = EmbeddedRunner(args.intake, args.ledger, policy=args.policy)
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
    p.add_argument(
        "--intake",
        required=True,
        help="intake directory (writes INTAKE/ingest/), or kafka://HOST:PORT/PREFIX (the "
        "domain's partition of PREFIX.intake; ?domain=NAME&domains=a,b for other domains)",
    )
    p.add_argument(
        "--ledger",
        help="the scheduler's ledger to reconcile the API server's pods against (default on "
        "Kafka: the deployment's ledger; with a directory intake: none)",
    )
    p.add_argument(
        "--resync-s",
        type=float,
        default=300.0,
        help="list every pod and compare with intake and the ledger this often (default 300)",
    )
    add_security_arguments(p)
    p.set_defaults(func=_with_logging(_fenced_exits(_ingest)))

    p = cmds.add_parser("bind", help="follow the ledger; bind, evict and emit Events")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument(
        "--ledger",
        required=True,
        help="ledger directory to follow, or kafka://HOST:PORT/PREFIX (PREFIX.ledger, "
        "committed records)",
    )
    p.add_argument(
        "--intake",
        required=True,
        help="intake directory (writes INTAKE/binder/), or kafka://HOST:PORT/PREFIX (the same "
        "deployment as --ledger)",
    )
    p.add_argument("--workers", type=int, default=32, help="parallel bind calls (default 32)")
    add_security_arguments(p)
    p.set_defaults(func=_with_logging(_fenced_exits(_bind)))

    p = cmds.add_parser(
        "forecast",
        help="annotate pending pods with their job's forecast start (gpuledger.io/forecast-start)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument(
        "--ledger",
        required=True,
        help="the scheduler's ledger: directory or kafka://HOST:PORT/PREFIX",
    )
    p.add_argument("--every", default="60s", help="forecast this often (default 60s)")
    p.add_argument(
        "--threshold", default="5m", help="write a forecast again when it moved more (default 5m)"
    )
    p.add_argument("--once", action="store_true", help="forecast and annotate once, then exit")
    p.set_defaults(func=_with_logging(_forecast))

    p = cmds.add_parser(
        "schedule", help="embedded scheduler loop: follow intake, run cycles, append the ledger"
    )
    p.add_argument("--intake", required=True, help="intake directory to follow (not kafka://)")
    p.add_argument("--ledger", required=True, help="ledger directory to append to (not kafka://)")
    add_policy_flag(p)
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

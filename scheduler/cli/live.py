"""CLI of the live path: ``scheduler run``, ``clock``, ``submit``, ``queues|nodes apply``, ``dlq``.

Producers write envelopes to the intake topic, keyed and partitioned by scheduling domain;
the scheduler service decides what enters the ledger.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

import msgspec

from events.kafka_admin import DEFAULT_BOOTSTRAP, DEFAULT_DOMAIN, DEFAULT_PREFIX, KafkaSettings
from events.kafka_security import SASL_MECHANISMS, SECURITY_PROTOCOLS, KafkaLogError, KafkaSecurity
from events.model import Event, Tick
from scheduler.cli.errors import CliError, kafka_errors
from scheduler.core.policy import POLICIES
from scheduler.fold.snapshot import PART_BYTES
from scheduler.runtime.intake import read_dead_letters, send_events, send_intake


def _common(p: argparse.ArgumentParser, *, domain: bool = True) -> None:
    p.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP, help="Kafka bootstrap servers")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="topic prefix (default gpuledger)")
    p.add_argument(
        "--domains",
        default=DEFAULT_DOMAIN,
        help="comma-separated scheduling domains, in partition order (same list everywhere)",
    )
    if domain:
        p.add_argument("--domain", default=DEFAULT_DOMAIN, help="scheduling domain")
    add_security_arguments(p)


class _RefusePassword(argparse.Action):
    """``--sasl-password``: refused without echoing the value (argparse would otherwise take
    it as an abbreviation of ``--sasl-password-file`` and name the password as a path)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> NoReturn:
        del namespace, values, option_string  # the value is never looked at, nor echoed
        parser.error(
            "--sasl-password is not accepted: a password on the command line is visible to "
            "other users of the machine; use --sasl-password-file FILE or "
            "GPULEDGER_KAFKA_SASL_PASSWORD_FILE / GPULEDGER_KAFKA_SASL_PASSWORD"
        )


def add_policy_flag(p: argparse.ArgumentParser) -> None:
    """``--policy`` of the live schedulers (``scheduler run``, ``kube schedule``)."""
    p.add_argument(
        "--policy",
        default="gpuledger",
        choices=POLICIES,
        help="policy to schedule with (default gpuledger); recorded on a new ledger, and "
        "recorded as a switch on a ledger kept under another",
    )


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    """The Kafka client's TLS and SASL flags; each defaults to its ``GPULEDGER_KAFKA_*``
    environment variable (docs/operations.md, "Security")."""
    g = p.add_argument_group(
        "Kafka security", "each flag overrides its GPULEDGER_KAFKA_* environment variable"
    )
    g.add_argument(
        "--security-protocol",
        metavar="PROTOCOL",
        help=f"{', '.join(SECURITY_PROTOCOLS)} (default PLAINTEXT; env "
        "GPULEDGER_KAFKA_SECURITY_PROTOCOL)",
    )
    g.add_argument(
        "--sasl-mechanism",
        metavar="MECHANISM",
        help=f"{', '.join(SASL_MECHANISMS)} (default PLAIN; env GPULEDGER_KAFKA_SASL_MECHANISM)",
    )
    g.add_argument(
        "--sasl-username", metavar="USER", help="SASL user (env GPULEDGER_KAFKA_SASL_USERNAME)"
    )
    g.add_argument(
        "--sasl-password-file",
        metavar="FILE",
        help="file holding the SASL password (env GPULEDGER_KAFKA_SASL_PASSWORD_FILE, or the "
        "password itself in GPULEDGER_KAFKA_SASL_PASSWORD); there is no flag for the password",
    )
    g.add_argument("--sasl-password", nargs="?", action=_RefusePassword, help=argparse.SUPPRESS)
    g.add_argument(
        "--ssl-cafile",
        metavar="FILE",
        help="PEM CA bundle for the broker's certificate (env GPULEDGER_KAFKA_SSL_CAFILE)",
    )
    g.add_argument(
        "--ssl-certfile",
        metavar="FILE",
        help="PEM client certificate for mutual TLS (env GPULEDGER_KAFKA_SSL_CERTFILE)",
    )
    g.add_argument(
        "--ssl-keyfile",
        metavar="FILE",
        help="unencrypted PEM key of --ssl-certfile (env GPULEDGER_KAFKA_SSL_KEYFILE)",
    )


def security_of(args: argparse.Namespace) -> KafkaSecurity:
    """The security flags over the environment; ``CliError`` naming the option if wrong."""
    try:
        return KafkaSecurity.from_env(
            security_protocol=args.security_protocol,
            sasl_mechanism=args.sasl_mechanism,
            sasl_username=args.sasl_username,
            sasl_password_file=args.sasl_password_file,
            ssl_cafile=args.ssl_cafile,
            ssl_certfile=args.ssl_certfile,
            ssl_keyfile=args.ssl_keyfile,
        )
    except KafkaLogError as exc:
        raise CliError(str(exc)) from None


def settings_of(args: argparse.Namespace) -> KafkaSettings:
    """The deployment the common arguments name."""
    return KafkaSettings(
        bootstrap=args.bootstrap,
        prefix=args.prefix,
        domains=tuple(d for d in args.domains.split(",") if d),
        security=security_of(args),
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the live-path commands to the ``gpuledger`` parser."""
    sched = sub.add_parser("scheduler", help="the live scheduler service on Kafka")
    cmds = sched.add_subparsers(dest="scheduler_command", required=True, metavar="SUBCOMMAND")
    run = cmds.add_parser("run", help="consume intake, schedule, append to the ledger")
    _common(run)
    run.add_argument("--max-batch", type=int, default=1000, help="intake records per cycle")
    run.add_argument(
        "--snapshot-every", type=int, default=50_000, help="ledger records per snapshot"
    )
    run.add_argument(
        "--snapshot-part-bytes",
        type=int,
        default=PART_BYTES,
        help="write a larger snapshot as records of at most this many bytes",
    )
    run.add_argument("--session-timeout-ms", type=int, default=3000, help="failover detection time")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")
    run.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on this address (e.g. 0.0.0.0:9100 in a container)",
    )
    run.add_argument(
        "--max-skew-s",
        type=float,
        default=60.0,
        help="dead-letter intake stamped more than this ahead of the scheduler's clock",
    )
    add_policy_flag(run)
    run.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    run.set_defaults(func=kafka_errors(_run))

    clock = sub.add_parser("clock", help="emit tick events to intake at a fixed period")
    _common(clock)
    clock.add_argument("--every", default="10s", help="period, e.g. 500ms, 10s, 1m")
    clock.add_argument("--count", type=int, help="stop after this many ticks")
    clock.set_defaults(func=kafka_errors(_clock))

    submit = sub.add_parser("submit", help="submit jobs (job_submitted events in YAML) to intake")
    _common(submit)
    submit.add_argument("-f", "--file", required=True, help="job.yaml: one job or {jobs: [...]}")
    submit.set_defaults(func=kafka_errors(_submit))

    for noun, helptext in (("queues", "queues.yaml"), ("nodes", "cluster.yaml")):
        p = sub.add_parser(noun, help=f"send {noun} from {helptext} to intake")
        c = p.add_subparsers(dest=f"{noun}_command", required=True, metavar="SUBCOMMAND")
        a = c.add_parser("apply", help=f"send the {noun} of {helptext} to intake")
        _common(a)
        a.add_argument("-f", "--file", required=True, help=helptext)
        a.set_defaults(func=kafka_errors(_apply), noun=noun)

    dlq = sub.add_parser("dlq", help="list or re-submit dead letters")
    dc = dlq.add_subparsers(dest="dlq_command", required=True, metavar="SUBCOMMAND")
    ls = dc.add_parser("list", help="print dead letters as JSON Lines")
    _common(ls)
    ls.set_defaults(func=kafka_errors(_dlq_list))
    rp = dc.add_parser("replay", help="send dead letters back to intake")
    _common(rp)
    rp.add_argument("--offset", type=int, action="append", help="only these dead-letter offsets")
    rp.set_defaults(func=kafka_errors(_dlq_replay))


def _run(args: argparse.Namespace) -> int:
    from scheduler.runtime.service import ServiceConfig, run_service  # noqa: PLC0415

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    metrics_host, metrics_port = "127.0.0.1", args.metrics_port
    if args.metrics_addr:
        host, sep, port = args.metrics_addr.rpartition(":")
        if not sep or not port.isdigit():
            raise CliError(f"--metrics-addr {args.metrics_addr!r}: expected HOST:PORT")
        metrics_host, metrics_port = host or "0.0.0.0", int(port)  # noqa: S104  # asked for
    return run_service(
        ServiceConfig(
            settings=settings_of(args),
            domain=args.domain,
            max_batch=args.max_batch,
            snapshot_every=args.snapshot_every,
            snapshot_part_bytes=args.snapshot_part_bytes,
            session_timeout_ms=args.session_timeout_ms,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            max_skew_ms=round(args.max_skew_s * 1000),
            policy=args.policy,
        )
    )


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


def _submit(args: argparse.Namespace) -> int:
    from replay.config import ConfigError, parse_jobs  # noqa: PLC0415

    try:
        with open(args.file, "rb") as f:
            jobs = parse_jobs(f.read(), args.file)
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    offsets = send_events(settings_of(args), args.domain, jobs)
    for job, off in zip(jobs, offsets, strict=True):
        sys.stdout.write(f"submitted {job.job} to intake offset {off}\n")
    return 0


def _apply(args: argparse.Namespace) -> int:
    from replay.config import (  # noqa: PLC0415
        ClusterFile,
        ConfigError,
        QueuesFile,
        load,
        node_events,
        queue_events,
    )

    events: Sequence[Event]
    try:
        if args.noun == "queues":
            events = queue_events(load(args.file, QueuesFile))
        else:
            events = node_events(load(args.file, ClusterFile))
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    send_events(settings_of(args), args.domain, events)
    sys.stdout.write(f"sent {len(events)} {args.noun} events to intake\n")
    return 0


def _dlq_list(args: argparse.Namespace) -> int:
    for off, dl in read_dead_letters(settings_of(args), args.domain):
        row = msgspec.to_builtins(dl)
        row["value"] = dl.value.hex()
        sys.stdout.write(json.dumps({"offset": off, **row}) + "\n")
    return 0


def _dlq_replay(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    chosen = [
        (off, dl)
        for off, dl in read_dead_letters(settings, args.domain)
        if args.offset is None or off in args.offset
    ]
    send_intake(settings, args.domain, [dl.value for _, dl in chosen])
    sys.stderr.write(f"re-submitted {len(chosen)} dead letters to intake\n")
    return 0

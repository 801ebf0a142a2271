"""Helpers the command modules share: Kafka connection and security flags, where a
projection is read from (a file, a Parquet export, a running console), and the
simulation runs behind ``simulate``, ``demo``, ``compare`` and ``example``.

A user's mistake is a ``CliError`` (``scheduler.cli.errors``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

import duckdb

from events.kafka_admin import DEFAULT_BOOTSTRAP, DEFAULT_DOMAIN, DEFAULT_PREFIX, KafkaSettings
from events.kafka_security import SASL_MECHANISMS, SECURITY_PROTOCOLS, KafkaLogError, KafkaSecurity
from events.ledgertime import format_at, format_duration
from events.model import PolicyConfigured
from projections.projector import SchemaError, connect
from replay.config import ClusterFile, ConfigError, PolicyFile, QueuesFile, WorkloadFile, load
from scheduler.cli.errors import CliError, ledger_errors
from scheduler.core.policy import POLICIES

__all__ = [
    "LOCK_WAIT_S",
    "Progress",
    "add_kafka_arguments",
    "add_policy_flag",
    "add_security_arguments",
    "add_source",
    "ask_server",
    "fresh_dir",
    "is_lock_error",
    "json_default",
    "ledger_clock",
    "load_inputs",
    "open_source",
    "output_to",
    "parse_bound",
    "print_refusals",
    "refuse_past_the_end",
    "refused_error",
    "run_compare",
    "security_of",
    "server_of",
    "settings_of",
    "simulate_into",
]


def add_source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--db",
        metavar="FILE",
        help="projection database (asked through its `gpuledger serve` when one runs)",
    )
    source.add_argument("--parquet", metavar="DIR", help="a `gpuledger export --parquet` dir")
    source.add_argument(
        "--server", metavar="URL", help="a running `gpuledger serve`, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("GPULEDGER_TOKEN") or None,
        metavar="T",
        help="--server: the console's token (default: $GPULEDGER_TOKEN)",
    )


def server_of(args: argparse.Namespace) -> str | None:
    """The console to ask: ``--server``, or the ``serve`` that owns ``--db`` right now.

    Readers go through the server that owns a file rather than open it beside the
    writer, which would fail on DuckDB's file lock while the follower projects.
    """
    from projections.console.client import find_server  # noqa: PLC0415

    if args.server is not None:
        return str(args.server)
    if args.db is not None:
        return find_server(args.db, args.token)
    return None


def open_source(args: argparse.Namespace) -> duckdb.DuckDBPyConnection:
    from projections.parquet import open_parquet  # noqa: PLC0415  # only for --parquet

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            if args.parquet is not None:
                return open_parquet(args.parquet)
            return connect(args.db, read_only=True)
        except duckdb.IOException as exc:
            # `project --follow` holds the file's lock while a run writes and lets go
            # between runs: wait for a gap rather than fail.
            if not is_lock_error(exc):
                raise CliError(str(exc)) from exc
            if time.monotonic() > deadline:
                raise CliError(f"{exc}; read it through `gpuledger serve`") from exc
            time.sleep(0.1)
        except (FileNotFoundError, SchemaError, duckdb.Error) as exc:
            raise CliError(str(exc)) from exc


LOCK_WAIT_S = 10.0
"""How long ``sql``/``report`` wait for a projecting process to let go of the file."""


def is_lock_error(exc: BaseException) -> bool:
    """DuckDB's "Could not set lock on file": another process has the file open to write."""
    return isinstance(exc, duckdb.IOException) and "Could not set lock" in str(exc)


@contextlib.contextmanager
def output_to(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            yield f
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc}") from exc


def json_default(value: Any) -> Any:
    return str(value)  # DuckDB types msgspec does not know (intervals, blobs…) as text


def ask_server(server: str, args: argparse.Namespace, path: str, **params: Any) -> Any:
    from projections.console.client import ServerError, get_json  # noqa: PLC0415

    try:
        return get_json(server, path, args.token, **params)
    except ServerError as exc:
        raise CliError(str(exc)) from exc


def load_inputs(
    cluster: str, queues: str, workload: str
) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    from replay.sim import check_inputs  # noqa: PLC0415  # heavy imports only when used

    try:
        inputs = (
            load(cluster, ClusterFile),
            load(queues, QueuesFile),
            load(workload, WorkloadFile),
        )
        # Before any ledger directory is made: a job the run would refuse is an error in
        # the files, not a job silently left out of the run.
        check_inputs(inputs[1], inputs[2])
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    return inputs


def fresh_dir(path: Path, force: bool, *, create: bool = True) -> None:
    """Make way for a command's output at ``path``: refuse a non-empty directory, or remove
    it with ``force``; then create it (unless ``create``: a new ledger is created whole by
    ``events.filelog.new_ledger``)."""
    if path.exists() and any(path.iterdir()):
        if not force:
            raise CliError(f"{path} exists and is not empty (use --force to replace it)")
        shutil.rmtree(path)
    if create:
        path.mkdir(parents=True, exist_ok=True)


def print_refusals(refused: list[Any], files: dict[str, str]) -> None:
    """Under ``--skip-invalid``: each refused input as a warning naming its file, then a
    count; a run never leaves an input out in silence."""
    for refusal in refused:
        where = files.get(refusal.kind, files.get("event", "input"))
        sys.stderr.write(f"gpuledger: warning: {where}: {refusal} (skipped: --skip-invalid)\n")
    if refused:
        print(f"refused inputs: {len(refused)} (left out of the run by --skip-invalid)")


def refused_error(exc: ConfigError, files: dict[str, str]) -> CliError:
    """A ``ConfigError`` as a CLI error; an input the scheduler refused names its file and
    says how to go on without it."""
    from replay.sim import InputRefusedError  # noqa: PLC0415

    if isinstance(exc, InputRefusedError):
        where = files.get(exc.kind, files.get("event", "input"))
        return CliError(f"{where}: {exc} (--skip-invalid leaves it out and goes on)")
    return CliError(str(exc))


class Progress:
    """The simulation's progress line on stderr, redrawn in place; ``end`` finishes it (a
    newline), if one was drawn."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.drawn = False

    def __call__(self, now_ms: int, submitted: int, total: int) -> None:
        self.drawn = True
        print(
            f"\r  simulated {format_duration(now_ms / 1000):>8}  "
            f"jobs submitted {submitted:>7}/{total}"
            f"  ({format_duration(time.perf_counter() - self.start):>8})",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def end(self) -> None:
        if self.drawn:
            print(file=sys.stderr)
            self.drawn = False


def simulate_into(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policy: str | PolicyConfigured,
    ledger: Path,
    *,
    show_progress: bool = False,
    observe: Any = None,
    files: dict[str, str] | None = None,
    skip_invalid: bool = False,
) -> Any:
    """``replay.sim.simulate_into`` with a progress line on stderr; returns the SimResult.
    ``files``: the input file of each kind of input (``job``, ``queue``, ``node``), named
    in the error when the scheduler refuses one."""
    from replay.sim import simulate_into  # noqa: PLC0415  # heavy imports only when used

    progress = Progress() if show_progress else None
    try:
        result = simulate_into(
            cluster,
            queues,
            workload,
            policy,
            ledger,
            progress=progress,
            observe=observe,
            skip_invalid=skip_invalid,
        )
    except ConfigError as exc:
        raise refused_error(exc, files or {}) from exc
    finally:
        if progress is not None:
            progress.end()
    return result


def parse_bound(text: str, origin_ms: int = 0, wall: bool = False) -> tuple[str, int]:
    """``1200`` is an offset; ``90m``, ``6h``, ``3600s``, ``2d`` are ledger times after
    ``origin_ms``; on a wall-clock ledger (``wall``) an ISO-8601 time such as
    ``2026-12-03T06:00:00Z`` is one too (``events.ledgertime.parse_at``)."""
    from events.ledgertime import parse_at  # noqa: PLC0415

    text = text.strip()
    if text.isdigit():
        return ("offset", int(text))
    try:
        return ("time", parse_at(text, wall, origin_ms))
    except ValueError:
        iso = " or an ISO-8601 time such as 2026-12-03T06:00:00Z" if wall else ""
        raise CliError(
            f"{text!r}: expected an offset (1200), a time such as 90m, 6h, 2d{iso}"
        ) from None


def ledger_clock(reader: Any) -> tuple[int, bool]:
    """Where relative times count from, and whether the ledger runs on wall time: a live
    ledger's ``6h`` is six hours after its first record, a simulated one's after 0."""
    from events.ledgertime import clock_of  # noqa: PLC0415

    with ledger_errors():
        return clock_of(reader)


def refuse_past_the_end(reader: Any, text: str, bound: tuple[str, int], wall: bool) -> None:
    """A moment after the ledger's last record (or an offset past its end) is an error
    naming where the ledger ends, not the end's state passed off as that moment's."""
    kind, value = bound
    with ledger_errors():
        end = reader.end_offset()
        last = None
        for _, env in reader.read(max(0, end - 1), end):
            last = int(env.at)
    if last is None:
        if end == 0:
            raise CliError(f"--at {text}: the ledger holds no records")
        return  # a Kafka topic's last offset may be a transaction marker: nothing to compare
    if (kind == "offset" and value > end) or (kind == "time" and value > last):
        raise CliError(
            f"--at {text}: past the ledger's end (its last record, offset {end - 1}, is at "
            f"{format_at(last, wall)}); give a moment or offset up to then"
        )


def run_compare(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policies: list[str],
    out: Path,
    knobs: PolicyFile | None,
    workers: int,
    title: str,
    files: dict[str, str] | None = None,
    skip_invalid: bool = False,
) -> list[Any]:
    from replay.compare import compare, table, write  # noqa: PLC0415

    for policy in policies:
        if policy not in POLICIES:
            raise CliError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        fresh_dir(out / policy, force=True)
    try:
        runs = compare(
            cluster,
            queues,
            workload,
            policies,
            out,
            knobs=knobs,
            workers=workers,
            skip_invalid=skip_invalid,
        )
    except ConfigError as exc:
        raise refused_error(exc, files or {}) from exc
    print(table(runs))
    refused = {str(r): r for run in runs for r in run.refused}  # once, whichever policy
    print_refusals(list(refused.values()), files or {})
    json_path, html_path = write(runs, out, title)
    print(f"\nwrote {json_path} and {html_path}")
    return runs


def add_kafka_arguments(p: argparse.ArgumentParser, *, domain: bool = True) -> None:
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

"""The Kafka backend of the log port (aiokafka), and the topics of the live path.

Topics (``<prefix>.<name>``), each with one partition per scheduling domain:

``intake``       what producers (CLI, clock, binder, Kubernetes watch) submit, keyed by domain
``ledger``       the total order per domain: accepted inputs and decisions, written only in
                 transactions, read with ``read_committed``
``deadletters``  intake records the scheduler refused, with the reason and source offset
``snapshots``    compacted: the latest scheduler state per domain and its ledger offset

Values are the msgpack envelope bytes of ``events.codec`` (the same bytes the file log
stores); keys are the scheduling domain. ``KafkaLedger`` implements ``LedgerWriter`` and
``LedgerReader`` over one partition. The ports are synchronous, so the aiokafka clients
run on one background event loop (``loop()``) and the sync methods submit coroutines to it.

Offsets are Kafka offsets. They increase but, unlike the file log's, are not consecutive:
every committed transaction leaves a control marker that takes an offset and is never
delivered. Code that needs "one past the last record" uses ``end_offset()``, never a count.

Security: ``KafkaSecurity`` holds the client's TLS and SASL options (from the CLI flags or
the ``GPULEDGER_KAFKA_*`` environment variables, ``KafkaSecurity.from_env``) and is the one
place that turns them into aiokafka arguments (``client_kwargs``). Every client this
project creates takes one; where none is given (``security=None``) the environment's is
used, so ``kafka://`` URLs, which carry no credentials, are read with it. The SASL password
is never part of a repr, an error message or a log record: aiokafka logs the SASL
authentication request (credentials included) at DEBUG, so its loggers get a redacting
filter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import ConsumerRecord

from events.codec import Envelope, decode_envelope, encode_envelope

T = TypeVar("T")

DEFAULT_BOOTSTRAP = os.environ.get("GPULEDGER_KAFKA", "127.0.0.1:19092")
"""The broker ``make kafka-up`` starts; override with ``GPULEDGER_KAFKA``."""

DEFAULT_PREFIX = "gpuledger"
DEFAULT_DOMAIN = "default"
COMPRESSION = "gzip"
"""gzip is in the standard library; lz4/zstd would add a native dependency for little gain
at the ledger's record sizes."""
SNAPSHOT_MAX_BYTES = 256 * 1024 * 1024
"""Largest snapshot record (before compression): the state of a million-event ledger
with every finished job kept is ~70 MB of msgpack."""
READ_TIMEOUT_S = 30.0
"""How long a bounded read may make no progress before it is treated as a broker fault."""


class KafkaLogError(RuntimeError):
    """The broker did not answer as a log must (missing topic, no progress, bad URL)."""


class KafkaConfigError(KafkaLogError):
    """The client's security settings are wrong; the message names the option."""


class KafkaAuthError(KafkaLogError):
    """The broker refused the client's credentials (or its SASL mechanism)."""


# --------------------------------------------------------------------------- security


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ENV_PREFIX = "GPULEDGER_KAFKA_"
"""``GPULEDGER_KAFKA_SECURITY_PROTOCOL``, ``…_SASL_MECHANISM``, ``…_SASL_USERNAME``,
``…_SASL_PASSWORD`` or ``…_SASL_PASSWORD_FILE``, ``…_SSL_CAFILE``, ``…_SSL_CERTFILE``,
``…_SSL_KEYFILE``."""

_FLAGS = {
    "security_protocol": "--security-protocol",
    "sasl_mechanism": "--sasl-mechanism",
    "sasl_username": "--sasl-username",
    "sasl_password": "--sasl-password-file",
    "ssl_cafile": "--ssl-cafile",
    "ssl_certfile": "--ssl-certfile",
    "ssl_keyfile": "--ssl-keyfile",
}


def _option(name: str) -> str:
    """How a user sets option ``name``: its flag and environment variable(s)."""
    env = f"{ENV_PREFIX}{name.upper()}"
    if name == "sasl_password":
        env = f"{env} or {env}_FILE"
    return f"{_FLAGS[name]} or {env}"


def _bad(name: str, problem: str) -> KafkaConfigError:
    return KafkaConfigError(f"Kafka {name}: {problem} (set with {_option(name)})")


_SECRETS: set[str] = set()
"""Every SASL password this process was given, for the log filter's last line of defence."""
_MIN_SECRET_LEN = 4
"""Shorter passwords are not searched for in log messages (they would match anywhere)."""
REDACTED = "***"


class _EncryptedKey(Exception):  # noqa: N818  # internal signal, never escapes
    pass


def _no_key_password() -> str:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
    raise _EncryptedKey


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How a client authenticates to the broker and protects the connection.

    Validated on construction (``KafkaConfigError`` naming the option); TLS files are read
    then, so a bad CA file fails before any connection is tried. ``repr``/``str`` never
    show the password (``dataclasses.asdict`` would: do not log it).
    """

    security_protocol: str = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (case-insensitive)."""
    sasl_mechanism: str = "PLAIN"
    """PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; used with the SASL protocols only."""
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    """PEM CA bundle that signs the broker's certificate (default: the system's CAs)."""
    ssl_certfile: str | None = None
    """PEM client certificate for mutual TLS (may hold the key too)."""
    ssl_keyfile: str | None = None
    """PEM private key of ``ssl_certfile`` (unencrypted)."""
    _ssl_context: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Normalise and validate; build the TLS context."""
        protocol = str(self.security_protocol).upper()
        mechanism = str(self.sasl_mechanism).upper()
        object.__setattr__(self, "security_protocol", protocol)
        object.__setattr__(self, "sasl_mechanism", mechanism)
        if protocol not in SECURITY_PROTOCOLS:
            raise _bad(
                "security_protocol",
                f"unknown protocol {self.security_protocol!r}; "
                f"expected one of {', '.join(SECURITY_PROTOCOLS)}",
            )
        if mechanism not in SASL_MECHANISMS:
            raise _bad(
                "sasl_mechanism",
                f"unknown mechanism {self.sasl_mechanism!r}; "
                f"expected one of {', '.join(SASL_MECHANISMS)}",
            )
        if self.sasl:
            if not self.sasl_username:
                raise _bad("sasl_username", f"required with security protocol {protocol}")
            if not self.sasl_password:
                raise _bad("sasl_password", f"required with security protocol {protocol}")
        else:
            for name in ("sasl_username", "sasl_password"):
                if getattr(self, name) is not None:
                    raise _bad(
                        name,
                        f"set, but security protocol {protocol} has no SASL "
                        "(use SASL_PLAINTEXT or SASL_SSL)",
                    )
        if self.sasl_password and len(self.sasl_password) >= _MIN_SECRET_LEN:
            _SECRETS.add(self.sasl_password)
        if self.tls:
            object.__setattr__(self, "_ssl_context", self._build_ssl_context())
        else:
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, name) is not None:
                    raise _bad(
                        name,
                        f"set, but security protocol {protocol} does not use TLS "
                        "(use SSL or SASL_SSL)",
                    )

    @property
    def sasl(self) -> bool:
        """The protocol authenticates with SASL."""
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        """The protocol encrypts with TLS."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    def _build_ssl_context(self) -> ssl.SSLContext:
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is None:
                continue
            if not os.path.isfile(path):
                raise _bad(name, f"{path}: no such file")
            if not os.access(path, os.R_OK):
                raise _bad(name, f"{path}: not readable")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise _bad("ssl_certfile", "required with ssl_keyfile")
        try:
            context: ssl.SSLContext = create_ssl_context(cafile=self.ssl_cafile)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise _bad("ssl_cafile", f"{self.ssl_cafile}: not a PEM CA bundle ({exc})") from None
        if self.ssl_certfile is not None:
            try:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, _no_key_password)
            except _EncryptedKey:
                raise _bad(
                    "ssl_keyfile",
                    f"{self.ssl_keyfile or self.ssl_certfile}: the private key is encrypted; "
                    "give an unencrypted PEM key",
                ) from None
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise _bad(
                    "ssl_certfile",
                    f"{self.ssl_certfile}: cannot load the client certificate and key ({exc})",
                ) from None
        return context

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of every aiokafka client (and connection) for these options."""
        _install_log_redaction()
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.tls:
            kwargs["ssl_context"] = self._ssl_context
        if self.sasl:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password
        return kwargs

    def describe(self) -> str:
        """The options in words, for messages (never the password)."""
        out = self.security_protocol
        if self.sasl:
            out += f", {self.sasl_mechanism} as {self.sasl_username!r}"
        return out

    def __repr__(self) -> str:
        """Like the dataclass repr, with the password shown as ``***``."""
        password = None if self.sasl_password is None else REDACTED
        return (
            f"KafkaSecurity(security_protocol={self.security_protocol!r}, "
            f"sasl_mechanism={self.sasl_mechanism!r}, sasl_username={self.sasl_username!r}, "
            f"sasl_password={password!r}, ssl_cafile={self.ssl_cafile!r}, "
            f"ssl_certfile={self.ssl_certfile!r}, ssl_keyfile={self.ssl_keyfile!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password_file: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> KafkaSecurity:
        """The options of the ``GPULEDGER_KAFKA_*`` environment, each overridden by the
        keyword of the same name when that is not None (the CLI's flags).

        The password comes from ``sasl_password_file``, else ``…_SASL_PASSWORD_FILE``,
        else ``…_SASL_PASSWORD``; a password file's trailing newline is dropped.
        """
        env = os.environ if environ is None else environ

        def pick(name: str, given: str | None) -> str | None:
            if given is not None:
                return given
            return env.get(f"{ENV_PREFIX}{name.upper()}") or None

        password_file = sasl_password_file
        password: str | None = None
        if password_file is None:
            password_file = env.get(f"{ENV_PREFIX}SASL_PASSWORD_FILE") or None
            password = env.get(f"{ENV_PREFIX}SASL_PASSWORD") or None
            if password_file is not None and password is not None:
                raise _bad("sasl_password", "both the password and a password file are set")
        if password_file is not None:
            password = read_password_file(password_file)
        return cls(
            security_protocol=pick("security_protocol", security_protocol) or "PLAINTEXT",
            sasl_mechanism=pick("sasl_mechanism", sasl_mechanism) or "PLAIN",
            sasl_username=pick("sasl_username", sasl_username),
            sasl_password=password,
            ssl_cafile=pick("ssl_cafile", ssl_cafile),
            ssl_certfile=pick("ssl_certfile", ssl_certfile),
            ssl_keyfile=pick("ssl_keyfile", ssl_keyfile),
        )


def read_password_file(path: str) -> str:
    """The password in ``path`` without its trailing line break."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise _bad("sasl_password", f"password file {path}: no such file") from None
    except IsADirectoryError:
        raise _bad("sasl_password", f"password file {path}: is a directory") from None
    except PermissionError:
        raise _bad("sasl_password", f"password file {path}: not readable") from None
    except (OSError, UnicodeDecodeError) as exc:
        # The message names the file only: the content must not reach an error message.
        raise _bad("sasl_password", f"password file {path}: {type(exc).__name__}") from None
    password = text.rstrip("\r\n")
    if not password:
        raise _bad("sasl_password", f"password file {path}: empty")
    return password


def _security(security: KafkaSecurity | None) -> KafkaSecurity:
    return KafkaSecurity.from_env() if security is None else security


# --------------------------------------------------------------------------- log redaction


_AUTH_REQUEST = "SaslAuthenticate"
"""aiokafka's DEBUG log of every request it sends includes this one's bytes, which carry the
credentials (``\\0user\\0password`` for PLAIN)."""


class _RedactSecrets(logging.Filter):
    """Removes SASL credentials from records before any handler sees them."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(
            type(a).__name__.startswith(_AUTH_REQUEST) for a in args
        ):
            record.args = tuple(
                f"{type(a).__name__}(<credentials {REDACTED}>)"
                if type(a).__name__.startswith(_AUTH_REQUEST)
                else a
                for a in args
            )
        if _SECRETS:
            try:
                message = record.getMessage()
            except Exception:  # a malformed record is the handler's problem
                return True
            found = [s for s in tuple(_SECRETS) if s in message]
            if found:
                for secret in found:
                    message = message.replace(secret, REDACTED)
                record.msg, record.args = message, ()
        return True


_REDACT = _RedactSecrets()
_REDACTED_LOGGERS = ("aiokafka", "events.kafkalog", "scheduler.service", "scheduler.live_cli")


def _install_log_redaction() -> None:
    """Give every aiokafka logger (and ours that talk to Kafka) the redacting filter.

    A logger's filters see only records logged through that logger, not its children's, so
    each module logger gets it; modules imported later are covered by the next call (every
    client's ``client_kwargs``)."""
    names = [n for n in list(logging.Logger.manager.loggerDict) if n.startswith("aiokafka")]
    for name in ("aiokafka.conn", *names, *_REDACTED_LOGGERS):
        logger = logging.getLogger(name)
        if _REDACT not in logger.filters:
            logger.addFilter(_REDACT)


_install_log_redaction()


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Where the live path's topics are, which domains they hold, and how to connect.

    ``domains`` fixes the partition of each scheduling domain in every topic (its index),
    so every producer and every scheduler must be given the same list. ``security``
    defaults to the ``GPULEDGER_KAFKA_*`` environment (``KafkaSecurity.from_env``).
    """

    bootstrap: str = DEFAULT_BOOTSTRAP
    prefix: str = DEFAULT_PREFIX
    domains: tuple[str, ...] = (DEFAULT_DOMAIN,)
    security: KafkaSecurity = field(default_factory=KafkaSecurity.from_env)

    @property
    def intake(self) -> str:
        """The intake topic."""
        return f"{self.prefix}.intake"

    @property
    def ledger(self) -> str:
        """The ledger topic."""
        return f"{self.prefix}.ledger"

    @property
    def deadletters(self) -> str:
        """The dead-letter topic."""
        return f"{self.prefix}.deadletters"

    @property
    def snapshots(self) -> str:
        """The compacted snapshot topic."""
        return f"{self.prefix}.snapshots"

    def partition(self, domain: str) -> int:
        """The partition of ``domain`` in every topic."""
        try:
            return self.domains.index(domain)
        except ValueError:
            known = ", ".join(self.domains)
            raise KafkaLogError(f"unknown scheduling domain {domain!r}; known: {known}") from None

    def group(self) -> str:
        """The consumer group of the schedulers."""
        return f"{self.prefix}.scheduler"

    def transactional_id(self, domain: str) -> str:
        """One transactional id per domain: a new owner fences the previous one."""
        return f"{self.prefix}.scheduler.{domain}"

    def snapshot_transactional_id(self, domain: str) -> str:
        """The transactional id of the domain's snapshot writer, fenced like the ledger's."""
        return f"{self.transactional_id(domain)}.snapshots"


# --------------------------------------------------------------------------- the event loop


class _LoopThread:
    """One asyncio loop on a daemon thread, shared by every sync wrapper of this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="gpuledger-kafka", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


_loop: _LoopThread | None = None
_loop_lock = threading.Lock()


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the shared background loop and wait for its result."""
    global _loop  # noqa: PLW0603  # one loop per process, created on first use
    with _loop_lock:
        if _loop is None:
            _loop = _LoopThread()
        runner = _loop
    return runner.run(coro, timeout)


def shutdown() -> None:
    """Stop the shared loop (clients still open on it are abandoned); the next call to
    ``run_sync`` starts a new one. For test sessions and orderly exits."""
    global _loop
    with _loop_lock:
        runner, _loop = _loop, None
    if runner is not None:
        runner.loop.call_soon_threadsafe(runner.loop.stop)
        runner.thread.join(5)


# --------------------------------------------------------------------------- topics


async def create_topics(
    bootstrap: str,
    topics: Sequence[tuple[str, int, dict[str, str]]],
    *,
    security: KafkaSecurity | None = None,
) -> None:
    """Create ``(name, partitions, configs)`` topics; existing ones are left as they are."""
    security = _security(security)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await start_client(admin, bootstrap, security)
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(name, partitions, 1, topic_configs=configs)
            for name, partitions, configs in topics
            if name not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):  # a racing creator won
                await admin.create_topics(new)
        # Metadata reaches the broker's cache a moment after creation; wait so the first
        # produce does not fail with an unknown partition.
        deadline = time.monotonic() + READ_TIMEOUT_S
        wanted = {name for name, _, _ in topics}
        while not wanted <= set(await admin.list_topics()):
            if time.monotonic() > deadline:
                raise KafkaLogError(f"topics {sorted(wanted)} did not appear")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def ensure_topics(settings: KafkaSettings) -> None:
    """Create the four topics of the live path with one partition per domain."""
    n = len(settings.domains)
    await create_topics(
        settings.bootstrap,
        security=settings.security,
        topics=[
            (settings.intake, n, {}),
            (settings.ledger, n, {}),
            (settings.deadletters, n, {}),
            # Only the newest snapshot per domain (the key) matters; compaction keeps it
            # and the short segments let the cleaner run on a small topic too.
            (
                settings.snapshots,
                n,
                {
                    "cleanup.policy": "compact",
                    "segment.ms": "60000",
                    "min.cleanable.dirty.ratio": "0.1",
                    "max.message.bytes": str(SNAPSHOT_MAX_BYTES),
                },
            ),
        ],
    )


# --------------------------------------------------------------------------- clients


def new_consumer(
    bootstrap: str, *, security: KafkaSecurity | None = None, **kwargs: Any
) -> AIOKafkaConsumer:
    """A consumer that reads only committed transactions, with large fetches for replay.

    Start it with ``start_client`` for a clear error when the broker refuses it."""
    kwargs.setdefault("enable_auto_commit", False)
    kwargs.setdefault("auto_offset_reset", "earliest")
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
        **_security(security).client_kwargs(),
        **kwargs,
    )


def new_producer(
    bootstrap: str,
    transactional_id: str | None = None,
    *,
    security: KafkaSecurity | None = None,
    compression: str | None = COMPRESSION,
) -> AIOKafkaProducer:
    """An idempotent producer (transactional when given an id) that batches and compresses
    (``compression=None``: it does not, for large records that must not hold up the event
    loop while they are compressed).

    Start it with ``start_client`` for a clear error when the broker refuses it."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **_security(security).client_kwargs(),
        enable_idempotence=True,
        transactional_id=transactional_id,
        compression_type=compression,
        linger_ms=2,
        max_batch_size=1024 * 1024,
        # Short, so that a killed scheduler's open transaction is aborted by the broker
        # quickly if no successor fences it first.
        transaction_timeout_ms=10_000,
        request_timeout_ms=15_000,
    )


async def start_client(client: Any, bootstrap: str, security: KafkaSecurity | None = None) -> None:
    """``await client.start()`` for any aiokafka client; when it cannot connect, stop it and
    raise ``KafkaAuthError`` or ``KafkaLogError`` saying why.

    aiokafka's own error is only "Unable to bootstrap" (the reason goes to its log), so on
    failure one connection is made directly to find it: refused credentials, a SASL or TLS
    handshake the listener does not speak, or nothing listening."""
    try:
        await client.start()
    except KafkaConnectionError as exc:
        with contextlib.suppress(Exception):
            await (client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop())
        raise await diagnose_connection(bootstrap, _security(security), exc) from exc


async def diagnose_connection(
    bootstrap: str, security: KafkaSecurity, original: BaseException | None = None
) -> KafkaLogError:
    """Connect to each bootstrap server once and return the error that says what is wrong."""
    where = f"Kafka at {bootstrap} ({security.describe()})"
    reason = str(original) if original is not None else "no bootstrap server answered"
    for host, port, _ in collect_hosts(bootstrap, randomize=False):
        try:
            conn = await create_conn(
                host, port, request_timeout_ms=10_000, **security.client_kwargs()
            )
        except SaslAuthenticationFailed as exc:
            return KafkaAuthError(
                f"{where}: SASL authentication refused by the broker: {_broker_message(exc)}"
            )
        except (UnsupportedSaslMechanismError, IllegalSaslStateError) as exc:
            return KafkaAuthError(
                f"{where}: the listener at {host}:{port} refused the SASL handshake "
                f"({_broker_message(exc)}); does it use {security.security_protocol}?"
            )
        except ssl.SSLCertVerificationError as exc:
            return KafkaLogError(
                f"{where}: TLS certificate of {host}:{port} not trusted ({exc.verify_message}); "
                f"check {_option('ssl_cafile')}"
            )
        except ssl.SSLError as exc:
            return KafkaLogError(
                f"{where}: TLS handshake with {host}:{port} failed ({exc.reason or exc}); "
                "does the listener use TLS, and does it require a client certificate?"
            )
        except (KafkaConnectionError, ConnectionResetError, asyncio.IncompleteReadError) as exc:
            hint = f"the listener probably does not use {security.security_protocol}"
            if security.tls:
                hint += f", or it requires a client certificate ({_FLAGS['ssl_certfile']})"
            reason = (
                f"{host}:{port} closed the connection during the handshake "
                f"({_exc_text(exc)}); {hint}"
            )
            continue
        except (OSError, KafkaError, TimeoutError) as exc:
            why = getattr(exc, "strerror", None) or _exc_text(exc)
            reason = f"cannot connect to {host}:{port}: {why}"
            continue
        try:
            await conn.send(MetadataRequest([]))
        except (KafkaError, TimeoutError, OSError) as exc:
            # A SASL listener answers ApiVersions unauthenticated, then drops a client that
            # sends anything but a SASL handshake.
            reason = (
                f"{host}:{port} closed the connection on the first request ({_exc_text(exc)}); the "
                f"listener probably expects SASL or TLS, not {security.security_protocol}"
            )
        else:
            reason = f"{host}:{port} answers now; the first attempt failed: {reason}"
        finally:
            conn.close()
    return KafkaLogError(f"{where}: {reason}")


def _broker_message(exc: BaseException) -> str:
    """The broker's text of a refused handshake, else the error's description."""
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    return text or getattr(exc, "description", "") or type(exc).__name__


def _exc_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def end_offset_of(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
    """One past the last committed record (the last stable offset, under read_committed)."""
    ends = await consumer.end_offsets([tp])
    return int(ends[tp])


async def read_records(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    start: int,
    end: int,
    *,
    max_records: int = 20_000,
) -> AsyncIterator[list[ConsumerRecord[bytes, bytes]]]:
    """Batches of committed records with ``start <= offset < end`` from an assigned ``tp``.

    Stops on the consumer's position, not on a record count: transaction markers and
    aborted records take offsets that are never delivered.
    """
    if end <= start:
        return
    consumer.seek(tp, start)
    idle_since = time.monotonic()
    while await consumer.position(tp) < end:
        got = await consumer.getmany(tp, timeout_ms=200, max_records=max_records)
        batch = [m for m in got.get(tp, ()) if m.offset < end]
        if batch:
            idle_since = time.monotonic()
            yield batch
            if batch[-1].offset >= end - 1:
                return
        elif time.monotonic() - idle_since > READ_TIMEOUT_S:
            raise KafkaLogError(
                f"{tp.topic}[{tp.partition}]: no progress at offset "
                f"{await consumer.position(tp)} reading up to {end}"
            )


async def wait_stable(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> int:
    """Wait until the last stable offset of ``tp`` passes ``offset``; return it."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    while (end := await end_offset_of(consumer, tp)) < offset:
        if time.monotonic() > deadline:
            raise KafkaLogError(f"{tp.topic}[{tp.partition}]: offset {offset} never became stable")
        await asyncio.sleep(0.002)
    return end


def envelope_bytes(envelopes: Sequence[Envelope]) -> list[bytes]:
    """The stored bytes of each envelope (TypeError for anything else)."""
    out = []
    for env in envelopes:
        if not isinstance(env, Envelope):
            raise TypeError(f"append expects Envelopes, got {type(env).__name__}")
        out.append(encode_envelope(env))
    return out


# --------------------------------------------------------------------------- the port


async def _next(it: AsyncIterator[T]) -> T:
    return await anext(it)


class KafkaReader:
    """Reads one partition of a topic (implements ``LedgerReader``), committed records only."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partition: int = 0,
        *,
        security: KafkaSecurity | None = None,
    ) -> None:
        """Connect; raises ``KafkaLogError`` if the topic or partition does not exist
        (``KafkaAuthError`` if the broker refuses the credentials)."""
        self.bootstrap = bootstrap
        self.topic = topic
        self.partition = partition
        self.security = _security(security)
        self.name = f"kafka://{bootstrap}/{topic}?partition={partition}"
        self._tp = TopicPartition(topic, partition)
        self._consumer = run_sync(self._start_consumer())

    async def _start_consumer(self) -> AIOKafkaConsumer:
        consumer = new_consumer(self.bootstrap, security=self.security)
        await start_client(consumer, self.bootstrap, self.security)
        # The consumer's public metadata is only the topics it subscribed to; ask the
        # cluster for all of them to tell a missing partition from an empty one.
        cluster = await consumer._client.fetch_all_metadata()
        partitions = cluster.partitions_for_topic(self.topic) or set()
        if self.partition not in partitions:
            await consumer.stop()
            raise KafkaLogError(f"{self.name}: no such topic or partition")
        consumer.assign([self._tp])
        return consumer

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Committed records with ``start <= offset < end`` (to the current end if None)."""
        for off, value in self.read_raw(start, end):
            yield off, decode_envelope(value, off)

    def read_raw(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """``(offset, stored envelope bytes)`` with ``start <= offset < end``."""
        stop = self.end_offset() if end is None else end
        records = read_records(self._consumer, self._tp, start, stop)
        while True:
            try:
                batch: list[ConsumerRecord[bytes, bytes]] = run_sync(_next(records))
            except StopAsyncIteration:
                return
            for m in batch:
                yield m.offset, m.value or b""

    def end_offset(self) -> int:
        """One past the last committed record."""
        return run_sync(end_offset_of(self._consumer, self._tp))

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.2,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        """Yield records from ``start`` on as they are committed.

        The consumer keeps its position between polls and each poll is a fetch that the
        broker holds open for up to ``poll_s`` until a transaction commits, so a record
        arrives one fetch after its commit (no end-offset request or seek per poll).
        Returns when ``stop()`` is true (checked between polls) or after ``idle_timeout_s``
        seconds without a new record; otherwise follows forever.
        """
        position = start
        idle_since = time.monotonic()
        while True:
            if stop is not None and stop():
                return
            batch, position = run_sync(self._fetch_from(position, poll_s))
            if batch:
                for m in batch:
                    yield m.offset, decode_envelope(m.value or b"", m.offset)
                idle_since = time.monotonic()
                continue
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                return

    async def _fetch_from(
        self, position: int, wait_s: float
    ) -> tuple[list[ConsumerRecord[bytes, bytes]], int]:
        """Committed records from ``position`` (waiting up to ``wait_s`` for one) and the
        position after them, past any transaction marker."""
        consumer = self._consumer
        assert consumer is not None
        if await consumer.position(self._tp) != position:
            consumer.seek(self._tp, position)  # a read() in between moved the consumer
        got = await consumer.getmany(
            self._tp, timeout_ms=max(round(wait_s * 1000), 1), max_records=20_000
        )
        batch = [m for m in got.get(self._tp, ()) if m.offset >= position]
        return batch, int(await consumer.position(self._tp))

    def close(self) -> None:
        """Stop the consumer (idempotent)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            run_sync(consumer.stop())

    def __enter__(self) -> KafkaReader:
        """The reader itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the reader."""
        self.close()


class KafkaLedger(KafkaReader):
    """The writer of one ledger partition (implements ``LedgerWriter`` and ``LedgerReader``).

    Each ``append`` is one Kafka transaction, so readers (``read_committed``) see a batch
    whole or not at all, like the file log's appends. The transactional id plays the file
    log's lock: opening a second writer with the same id fences the first, whose next
    append fails.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partition: int = 0,
        *,
        key: str = DEFAULT_DOMAIN,
        transactional_id: str | None = None,
        security: KafkaSecurity | None = None,
    ) -> None:
        """Connect as the writer of ``topic[partition]``; records are keyed ``key``."""
        super().__init__(bootstrap, topic, partition, security=security)
        self.key = key.encode()
        self.transactional_id = transactional_id or f"gpuledger.writer.{topic}.{partition}"
        self._producer = run_sync(self._start_producer())

    async def _start_producer(self) -> AIOKafkaProducer:
        producer = new_producer(self.bootstrap, self.transactional_id, security=self.security)
        await start_client(producer, self.bootstrap, self.security)
        return producer

    def append(self, envelopes: Sequence[Envelope]) -> int:
        """Append a batch in one transaction; return the offset of its first record."""
        values = envelope_bytes(envelopes)
        if not values:
            return self.end_offset()
        return run_sync(self._append(values))

    async def _append(self, values: list[bytes]) -> int:
        producer = self._producer
        async with producer.transaction():
            futures = [
                await producer.send(self.topic, v, key=self.key, partition=self.partition)
                for v in values
            ]
            first = await futures[0]
            last = (await asyncio.gather(*futures[1:]))[-1] if len(futures) > 1 else first
        # The commit returns before the broker has written the transaction's markers, so
        # the last stable offset trails it briefly; wait, so that a read after append
        # sees the batch as it would on the file log.
        await wait_stable(self._consumer, self._tp, int(last.offset) + 1)
        return int(first.offset)

    def close(self) -> None:
        """Stop the producer and the consumer (idempotent)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            run_sync(producer.stop())
        super().close()

    def __enter__(self) -> KafkaLedger:
        """The ledger itself."""
        return self


# --------------------------------------------------------------------------- URLs


@dataclass(frozen=True, slots=True)
class KafkaUrl:
    """``kafka://host:port/topic?partition=N`` (or ``?domain=NAME&domains=a,b``)."""

    bootstrap: str
    topic: str
    partition: int


def parse_url(url: str) -> KafkaUrl:
    """Parse a ``kafka://`` ledger URL; a bare prefix (``kafka://h:p/gpuledger``) means
    that deployment's ledger topic."""
    parts = urlparse(url)
    if parts.scheme != "kafka" or not parts.netloc or not parts.path.strip("/"):
        raise KafkaLogError(f"{url}: expected kafka://HOST:PORT/TOPIC[?partition=N]")
    topic = parts.path.strip("/")
    query = parse_qs(parts.query)
    partition = int(query.get("partition", ["0"])[0])
    if "domain" in query:
        domains = tuple(query.get("domains", [DEFAULT_DOMAIN])[0].split(","))
        partition = KafkaSettings(domains=domains, security=KafkaSecurity()).partition(
            query["domain"][0]
        )
    if "." not in topic:
        topic = f"{topic}.ledger"
    return KafkaUrl(bootstrap=parts.netloc, topic=topic, partition=partition)


def is_kafka_url(src: object) -> bool:
    """True for ``kafka://`` sources."""
    return isinstance(src, str) and src.startswith("kafka://")


def open_kafka_reader(url: str, *, security: KafkaSecurity | None = None) -> KafkaReader:
    """A reader over the topic partition a ``kafka://`` URL names.

    The URL carries no credentials: ``security`` defaults to the ``GPULEDGER_KAFKA_*``
    environment."""
    where = parse_url(url)
    return KafkaReader(where.bootstrap, where.topic, where.partition, security=security)


__all__ = [
    "COMPRESSION",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_DOMAIN",
    "DEFAULT_PREFIX",
    "ENV_PREFIX",
    "REDACTED",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "SNAPSHOT_MAX_BYTES",
    "KafkaAuthError",
    "KafkaConfigError",
    "KafkaLedger",
    "KafkaLogError",
    "KafkaReader",
    "KafkaSecurity",
    "KafkaSettings",
    "KafkaUrl",
    "create_topics",
    "diagnose_connection",
    "end_offset_of",
    "ensure_topics",
    "envelope_bytes",
    "is_kafka_url",
    "new_consumer",
    "new_producer",
    "open_kafka_reader",
    "parse_url",
    "read_password_file",
    "read_records",
    "run_sync",
    "shutdown",
    "start_client",
    "wait_stable",
]

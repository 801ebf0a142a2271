"""The Kafka clients' security settings (TLS, SASL) and the redaction of their secrets.

``KafkaSecurity`` holds the client's TLS and SASL options (from the CLI flags or the
``GPULEDGER_KAFKA_*`` environment variables, ``KafkaSecurity.from_env``) and is the one
place that turns them into aiokafka arguments (``client_kwargs``). Every client this
project creates takes one; where none is given (``security=None``) the environment's is
used (``resolve_security``), so ``kafka://`` URLs, which carry no credentials, are read
with it. The SASL password is never part of a repr, an error message or a log record:
aiokafka logs the SASL authentication request (credentials included) at DEBUG, so its
loggers get a redacting filter.

The errors of every Kafka module are defined here, at the bottom of the three
(``kafka_security`` <- ``kafka_admin`` <- ``kafkalog``), because a bad setting is one of them.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.helpers import create_ssl_context


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

FLAGS = {
    "security_protocol": "--security-protocol",
    "sasl_mechanism": "--sasl-mechanism",
    "sasl_username": "--sasl-username",
    "sasl_password": "--sasl-password-file",
    "ssl_cafile": "--ssl-cafile",
    "ssl_certfile": "--ssl-certfile",
    "ssl_keyfile": "--ssl-keyfile",
}
"""The CLI flag of each option (the commands' flags are defined in ``scheduler.cli.common``)."""


def option_hint(name: str) -> str:
    """How a user sets option ``name``: its flag and environment variable(s)."""
    env = f"{ENV_PREFIX}{name.upper()}"
    if name == "sasl_password":
        env = f"{env} or {env}_FILE"
    return f"{FLAGS[name]} or {env}"


def _bad(name: str, problem: str) -> KafkaConfigError:
    return KafkaConfigError(f"Kafka {name}: {problem} (set with {option_hint(name)})")


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


def resolve_security(security: KafkaSecurity | None) -> KafkaSecurity:
    """``security``, or the ``GPULEDGER_KAFKA_*`` environment's settings when it is None."""
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
_REDACTED_LOGGERS = (
    "aiokafka",
    "events.kafkalog",
    "events.kafka_admin",
    "scheduler.runtime.service",
    "scheduler.cli.scheduler",
)


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


__all__ = [
    "ENV_PREFIX",
    "FLAGS",
    "REDACTED",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaAuthError",
    "KafkaConfigError",
    "KafkaLogError",
    "KafkaSecurity",
    "option_hint",
    "read_password_file",
    "resolve_security",
]

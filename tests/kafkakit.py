"""Fixtures for tests against the real broker that ``make kafka-up`` starts.

Import the fixtures into a test module (``from tests.kafkakit import kafka, settings``).
Each test gets its own topic prefix, so tests never see each other's records.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import hypothesis  # noqa: F401  # imported before the clients' thread starts: see kafka()
import pytest

from events.kafka_admin import DEFAULT_BOOTSTRAP, KafkaSettings, ensure_topics, run_sync, shutdown
from events.kafka_security import KafkaSecurity

ROOT = Path(__file__).resolve().parent.parent
SASL_USER = "gpuledger"
SASL_PASSWORD = "gpuledger-secret"
"""The test broker's SASL user (PLAIN and SCRAM), as scripts/kafka.sh configures it."""


@pytest.fixture(scope="session")
def kafka() -> Iterator[str]:
    """The broker's bootstrap address; starts it (scripts/kafka.sh up) if it is not up."""
    script = ROOT / "scripts" / "kafka.sh"
    if subprocess.run(["bash", str(script), "status"], check=False).returncode != 0:
        subprocess.run(["bash", str(script), "up"], check=True)
    yield DEFAULT_BOOTSTRAP
    # CPython 3.11's AST builder keeps a process-wide depth counter: compiling a module
    # (pytest rewrites hypothesis when its plugin imports it at session end) while the
    # clients' thread runs can trip it. So hypothesis is imported up front, and the
    # thread stops with the session.
    shutdown()


def fresh_settings(
    bootstrap: str,
    domains: tuple[str, ...] = ("default",),
    security: KafkaSecurity | None = None,
) -> KafkaSettings:
    """Settings with a new topic prefix, topics created (over ``security`` if given)."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if security is None:
        s = KafkaSettings(bootstrap=bootstrap, prefix=prefix, domains=domains)
    else:
        s = KafkaSettings(bootstrap=bootstrap, prefix=prefix, domains=domains, security=security)
    run_sync(ensure_topics(s))
    return s


@dataclass(frozen=True)
class Listeners:
    """The test broker's client listeners (``scripts/kafka.sh listeners``)."""

    plaintext: str
    sasl_plaintext: str
    sasl_ssl: str
    ssl: str
    """TLS with a required client certificate."""
    pki: Path
    """``ca.pem`` (signs the broker's certificate), ``client.pem`` and ``client.key``."""

    @property
    def cafile(self) -> str:
        return str(self.pki / "ca.pem")

    def sasl(self, password: str = SASL_PASSWORD, mechanism: str = "PLAIN") -> KafkaSecurity:
        """SASL_PLAINTEXT as the test user."""
        return KafkaSecurity(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_username=SASL_USER,
            sasl_password=password,
        )


@pytest.fixture(scope="session")
def listeners(kafka: str) -> Listeners:
    """Where the broker's SASL and TLS listeners are (it is up: ``kafka`` started it)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kafka.sh"), "listeners"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    return Listeners(
        plaintext=found["plaintext"],
        sasl_plaintext=found["sasl_plaintext"],
        sasl_ssl=found["sasl_ssl"],
        ssl=found["ssl"],
        pki=Path(found["pki"]),
    )


@pytest.fixture
def settings(kafka: str) -> KafkaSettings:
    """A fresh deployment (its own four topics) on the test broker."""
    return fresh_settings(kafka)

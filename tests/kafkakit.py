"""Fixtures for tests against the real broker that ``make kafka-up`` starts.

Import the fixtures into a test module (``from tests.kafkakit import kafka, settings``).
Each test gets its own topic prefix, so tests never see each other's records.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import hypothesis  # noqa: F401  # imported before the clients' thread starts: see kafka()
import pytest

from events.kafkalog import DEFAULT_BOOTSTRAP, KafkaSettings, ensure_topics, run_sync, shutdown

ROOT = Path(__file__).resolve().parent.parent


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


def fresh_settings(bootstrap: str, domains: tuple[str, ...] = ("default",)) -> KafkaSettings:
    """Settings with a new topic prefix, topics created."""
    s = KafkaSettings(bootstrap=bootstrap, prefix=f"t{uuid.uuid4().hex[:10]}", domains=domains)
    run_sync(ensure_topics(s))
    return s


@pytest.fixture
def settings(kafka: str) -> KafkaSettings:
    """A fresh deployment (its own four topics) on the test broker."""
    return fresh_settings(kafka)

"""Test-wide settings.

Hypothesis explores new random examples on every developer run; CI (``CI=true``) runs a
fixed, derandomized set so that a landing never hinges on the luck of the draw. A failure
found while developing is kept by Hypothesis's example database and turned into a
regression test.

Tests that need the broker, the API server or a browser are marked ``kafka``, ``kube`` or
``browser`` here, from the fixtures they use (a test reaching the service another way
carries the marker itself); ``make unit`` runs the rest.

The suite runs the policy core as Python (``GPULEDGER_CORE=pure``, unless the caller chose):
its tests patch functions of the core, which a compiled module does not see.
``tests/test_native.py`` runs the compiled core (``scheduler.native``) against the same
pinned ledgers and spec tables.
"""

from __future__ import annotations

import os

os.environ.setdefault("GPULEDGER_CORE", "pure")  # before anything imports ``scheduler``

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from tests.prereq import require, under_ci

if TYPE_CHECKING:
    from tests.kubeharness import Cluster

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if under_ci() else "dev")

# The fixture that brings up a piece of infrastructure, and the marker of every test using
# it (directly or through another fixture): kafkakit.kafka starts the broker, cluster_session
# the control plane, test_console's browser launches Chromium.
INFRA_FIXTURES = {"kafka": "kafka", "cluster_session": "kube", "browser": "browser"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in INFRA_FIXTURES.items():
            if fixture in used:
                item.add_marker(marker)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.prereq(condition, what)``: skip, or under CI fail, before any fixture."""
    for mark in item.iter_markers("prereq"):
        require(*mark.args)


@pytest.fixture(scope="session")
def cluster_session(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    """The test control plane (scripts/k8s.sh), its CRD and RBAC applied, and
    ServiceAccount kubeconfigs for the ingestor and the binder."""
    from tests.kubeharness import make_cluster

    return make_cluster(tmp_path_factory.mktemp("k8s"))


@pytest.fixture
def cluster(cluster_session: Cluster) -> Iterator[Cluster]:
    """The control plane with no gpuledger pods, Queues or kwok nodes before and after."""
    cluster_session.reset()
    yield cluster_session
    cluster_session.reset()

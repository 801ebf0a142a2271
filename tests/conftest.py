"""Test-wide settings.

Hypothesis explores new random examples on every developer run; CI (``CI=true``) runs a
fixed, derandomized set so that a landing never hinges on the luck of the draw. A failure
found while developing is kept by Hypothesis's example database and turned into a
regression test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from tests.kubeharness import Cluster

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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

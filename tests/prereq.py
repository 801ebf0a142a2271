"""Prerequisites that skip a test on a developer's machine but fail it under CI.

A test that skips because its browser or its data is missing passes silently; in CI, where
``make test`` provisions everything, such a skip hides a broken setup. ``require`` skips
locally and fails when the ``CI`` environment variable is true (``make test`` sets
``CI=true`` for its pytest run unless the caller set ``CI`` already; docs/operations.md).

Call ``require`` in a test or fixture, or mark a test ``@pytest.mark.prereq(condition,
what)``: tests/conftest.py calls ``require`` for the marker before the test's fixtures are
set up (so a fixture that reads the missing file never runs).
"""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    """Whether the ``CI`` environment variable is set to a true value (``true``, ``1``, ...)."""
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no", "off"}


def require(condition: object, what: str) -> None:
    """Skip the calling test unless ``condition`` holds; under CI, fail it instead.
    ``what`` says what is missing and how to provide it."""
    if condition:
        return
    if under_ci():
        pytest.fail(f"CI is set, so a missing prerequisite fails the run: {what}", pytrace=False)
    pytest.skip(what)

"""Waiting for a condition instead of sleeping for a guessed time.

A test that sleeps "long enough" for something to happen is slow when the guess is generous
and flaky when it is not, and when it fails it says nothing about what it was waiting for.
``wait_until`` polls the condition, returns as soon as it holds and, at the deadline, fails
with a message that names the condition (and, given ``detail``, what was seen instead).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    message: str = "condition",
    *,
    poll: float = POLL_S,
    detail: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns a truthy value and return that value; after
    ``timeout`` seconds raise AssertionError naming ``message`` (what was waited for) and,
    when given, ``detail()`` (the state seen at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = f"; last seen: {detail()!r}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {message}{seen}")
        time.sleep(poll)  # intentional: the poll interval of the wait itself

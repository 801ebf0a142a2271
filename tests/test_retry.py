"""The Kubernetes adapters' one retry helper (``scheduler.kube.retry``), without a cluster."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.kube.retry import Backoff, retry


class TransientError(Exception):
    pass


class FatalError(Exception):
    pass


@given(
    attempts=st.integers(1, 8),
    failures=st.integers(0, 10),
    first=st.floats(0.01, 2.0),
    cap=st.floats(0.01, 5.0),
)
def test_retries_transient_errors_with_doubling_capped_delays(
    attempts: int, failures: int, first: float, cap: float
) -> None:
    calls: list[int] = []
    slept: list[float] = []

    def call() -> str:
        calls.append(len(calls))
        if len(calls) <= failures:
            raise TransientError(f"try {len(calls)}")
        return "ok"

    def run() -> str:
        return retry(
            call,
            what="t",
            attempts=attempts,
            transient=lambda e: isinstance(e, TransientError),
            backoff=Backoff(first, cap),
            sleep=slept.append,
        )

    if failures < attempts:
        assert run() == "ok"
        assert len(calls) == failures + 1
    else:
        with pytest.raises(TransientError, match=f"try {attempts}$"):  # the last error
            run()
        assert len(calls) == attempts
    # One sleep between two tries, never after the last; each the double of the one
    # before, up to the cap.
    assert len(slept) == len(calls) - 1
    expected, delay = [], first
    for _ in slept:
        expected.append(delay)
        delay = min(delay * 2, cap)
    assert slept == expected


def test_a_non_transient_error_is_raised_at_once() -> None:
    slept: list[float] = []
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise FatalError("no")

    with pytest.raises(FatalError):
        retry(call, what="t", attempts=5, transient=lambda e: False, sleep=slept.append)
    assert calls == 1 and slept == []


def test_attempts_below_one_is_an_error_naming_the_call() -> None:
    with pytest.raises(ValueError, match="retry of bind ns/p: attempts must be at least 1, got 0"):
        retry(lambda: 1, what="bind ns/p", attempts=0, transient=lambda e: True)

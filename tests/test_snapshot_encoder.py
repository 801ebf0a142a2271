"""The service encodes snapshots in a forked child (``EncodedElsewhere``): the bytes are
those of the state at the fork, whatever the loop does to the state afterwards."""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest

from events.model import JobSubmitted, NodeRegistered, PodSpec, QueueConfigured
from scheduler.core import State, apply, cycle
from scheduler.fold.snapshot import (
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    state_bytes,
    state_from_bytes,
    state_from_dict,
)
from scheduler.runtime.service import EncodedElsewhere


def _state(jobs: int) -> State:
    state = State()
    apply(state, QueueConfigured(queue="q"), 1000)
    apply(state, NodeRegistered(node="n0", gpus=8), 1000)
    for k in range(jobs):
        apply(state, JobSubmitted(job=f"j{k}", queue="q", pods=(PodSpec(name="p"),)), 1000)
    cycle(state, 1000)
    return state


def test_the_bytes_are_the_state_at_the_fork() -> None:
    state = _state(50)
    expected = encode_snapshot("d", state, 7, 3, 9)

    async def run() -> bytes:
        encoding = EncodedElsewhere(lambda: encode_snapshot("d", state, 7, 3, 9))
        # the loop goes on changing the state while the child encodes
        for k in range(50, 80):
            apply(state, JobSubmitted(job=f"j{k}", queue="q", pods=(PodSpec(name="p"),)), 2000)
        cycle(state, 2000)
        return await encoding.result()

    got = asyncio.run(run())
    assert got == expected
    _, restored = decode_snapshot(got)
    assert len(restored.jobs) == 50 and len(state.jobs) == 80


def test_a_failing_encoder_is_an_error_not_a_hang() -> None:
    def broken() -> bytes:
        raise ValueError("no")

    with pytest.raises(OSError, match="wait status"):
        asyncio.run(EncodedElsewhere(broken).result())


def test_an_abandoned_encoder_is_stopped_and_reaped() -> None:
    def slow() -> bytes:
        return b"x" * (64 << 20)  # more than a pipe holds: the child blocks on writing

    encoding = EncodedElsewhere(slow)
    pid = encoding.pid
    assert pid > 0
    encoding.abandon()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped


def test_a_state_decoded_straight_from_its_bytes_is_the_state() -> None:
    """``state_from_bytes`` (the forecast's copy) gives what ``state_from_dict`` gives."""
    state = _state(30)
    data = state_bytes(state)
    direct = state_from_bytes(data)
    assert state_bytes(direct) == data
    assert state_bytes(state_from_dict(msgspec.msgpack.decode(data))) == data
    assert direct.jobs is not state.jobs  # a copy
    with pytest.raises(SnapshotError, match="does not match"):
        state_from_bytes(msgspec.msgpack.encode({"jobs": 3}))

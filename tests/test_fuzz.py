"""Bad input everywhere: decoders, loaders and the CLI fail with a named error, never a crash.

Bounded Hypothesis runs (they are part of `make test`); anything they find is kept as an
explicit example.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.codec import (
    DecodeError,
    Envelope,
    decode,
    decode_event,
    from_json_line,
)
from events.model import TAGS
from replay.config import ClusterFile, ConfigError, QueuesFile, WorkloadFile, parse, queue_events
from scheduler.cli import main
from scheduler.core import State, apply
from scheduler.validate import validate

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.binary(max_size=256))
def test_random_bytes_never_decode_into_garbage(data: bytes) -> None:
    try:
        record = decode(data, offset=7)
    except DecodeError as exc:
        assert "offset 7" in str(exc)
    else:  # the rare valid record must be a known, complete event
        assert record.event is not None


@FAST
@given(
    st.sampled_from(sorted(TAGS)),
    st.dictionaries(
        st.text(max_size=12),
        st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8) | st.none(),
        max_size=6,
    ),
)
def test_a_known_tag_with_a_wrong_payload_is_a_decode_error(
    tag: str, payload: dict[str, object]
) -> None:
    env = Envelope(
        type=tag,
        key="k",
        at=0,
        payload=msgspec.Raw(msgspec.msgpack.encode({"type": tag, **payload})),
    )
    try:
        decode_event(env, 3)
    except DecodeError as exc:
        assert "offset 3" in str(exc) and tag in str(exc)


@FAST
@given(st.binary(max_size=200))
def test_random_json_lines_fail_with_the_line_named(line: bytes) -> None:
    try:
        from_json_line(line, where="export.jsonl:12")
    except DecodeError as exc:
        assert "export.jsonl:12" in str(exc)


@FAST
@given(st.text(max_size=300), st.sampled_from([ClusterFile, QueuesFile, WorkloadFile]))
def test_random_yaml_is_a_config_error_naming_the_file(text: str, kind: type) -> None:
    try:
        parse(text, kind, "input.yaml")
    except ConfigError as exc:
        assert "input.yaml" in str(exc)


@FAST
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "name": st.sampled_from(["a", "b", "c", "d"]),
                "parent": st.sampled_from(["", "a", "b", "c", "d", "ghost"]),
                "deserved_gpus": st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
                "deserved_percent": st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
            }
        ),
        max_size=6,
    )
)
def test_random_queue_trees_are_either_valid_or_rejected_with_a_reason(
    rows: list[dict[str, object]],
) -> None:
    text = msgspec.yaml.encode({"queues": rows}).decode()
    try:
        events = queue_events(parse(text, QueuesFile))
    except ConfigError as exc:
        assert str(exc)
        return
    names = [e.queue for e in events]
    assert len(names) == len(set(names))
    for event in events:  # parents come before children
        assert not event.parent or event.parent in names[: names.index(event.queue)]


@FAST
@given(st.sampled_from(sorted(TAGS)), st.integers(-(10**6), 10**6))
def test_validation_and_the_fold_survive_odd_numbers(tag: str, number: int) -> None:
    """Semantically odd but decodable inputs: validation names them, apply never raises."""
    event_type = TAGS[tag]
    try:
        event = msgspec.convert(
            {
                "job": "j",
                "queue": "q",
                "node": "n",
                "pod": "p",
                "pods": [{"name": "p", "gpu_milli": number}],
                "gpus": number,
                "placements": [],
                "preemptor": "x",
                "preemptor_queue": "y",
                "rule": "reclaim",
                "lost_gpu_ms": number,
                "reason": "r",
                "decisions": number,
            },
            event_type,
        )
    except msgspec.ValidationError:
        return
    state = State()
    reason = validate(state, event)
    assert reason is None or isinstance(reason, str)
    apply(state, event, 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--ledger", "/nonexistent/ledger", "--verify"],
        ["log", "verify", "/nonexistent/ledger"],
        ["report", "--db", "/nonexistent/history.duckdb"],
        [
            "simulate",
            "--cluster",
            "/nonexistent.yaml",
            "--queues",
            "q",
            "--workload",
            "w",
            "--ledger",
            "/tmp/x",
        ],
        ["state", "--ledger", "/nonexistent/ledger", "--at", "soon"],
        ["example", "no-such-example"],
    ],
)
def test_cli_errors_are_named_and_exit_non_zero(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith("gpuledger: ") and "Traceback" not in err


def test_a_corrupted_segment_is_reported_by_log_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 0
    ledger = tmp_path / "demo" / "fifo" / "ledger"
    segment = sorted(ledger.glob("*.seg"))[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["log", "verify", str(ledger)]) == 1
    out = capsys.readouterr().out
    assert segment.name in out
    assert main(["replay", "--ledger", str(ledger), "--verify"]) == 2

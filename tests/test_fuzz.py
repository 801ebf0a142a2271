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
    encode,
    from_json_line,
    to_json_line,
    wrap,
)
from events.filelog import (
    FileLedger,
    LedgerCorrupt,
    LedgerDirReader,
    LedgerError,
    segment_name,
)
from events.jsonl import import_jsonl
from events.model import TAGS, Tick
from replay.config import (
    MAX_QUANTITY,
    ClusterFile,
    ConfigError,
    QueuesFile,
    WorkloadFile,
    parse,
    queue_events,
)
from replay.sim import expand
from scheduler.cli import main
from scheduler.core import State, apply
from scheduler.fold.validate import validate
from tests.fuzz.targets import frame as fuzz_frame
from tests.fuzz.targets import segment as fuzz_segment

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


# ----------------------------------------------------------------------- fuzzing regressions
# Inputs from coverage-guided fuzzing (tests/fuzz, `make fuzz`), written as scenarios; each is
# also kept in tests/data/fuzz-regressions/ and replayed by tests/test_atheris.py.


def _raw_envelope(**fields: object) -> bytes:
    return msgspec.msgpack.encode({"type": "tick", "key": "", "at": 0, "version": 2, **fields})


def test_strings_that_are_not_utf8_are_decode_errors() -> None:
    bad_key = _raw_envelope(payload={"type": "tick"}).replace(b"\xa3key\xa0", b"\xa3key\xa1\xff")
    with pytest.raises(DecodeError, match="offset 3: bad envelope"):
        decode(bad_key, offset=3)
    payload = msgspec.msgpack.encode({"type": "job_cancelled", "job": "x"})
    env = Envelope(
        type="job_cancelled",
        key="j",
        at=0,
        payload=msgspec.Raw(payload.replace(b"\xa1x", b"\xa1\xff")),
    )
    with pytest.raises(DecodeError, match="offset 4: bad job_cancelled payload"):
        decode_event(env, 4)
    with pytest.raises(DecodeError, match=r"in\.jsonl:2"):
        from_json_line(
            b'{"type":"tick","at":0,"payload":{"type":"tick"},"key":"\xff"}', "in.jsonl:2"
        )


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"tick","at":18446744073709551616,"payload":{"type":"tick"}}',
        b'{"type":"tick","at":0,"version":-9223372036854775809,"payload":{"type":"tick"}}',
        b'{"type":"node_registered","at":0,"payload":{"type":"node_registered","node":"n","gpus":1e400}}',
        b'{"type":"node_registered","at":0,"payload":{"type":"node_registered","node":"n","gpus":99999999999999999999}}',
        b'{"type":"job_teleported","at":0,"payload":{"x":-99999999999999999999}}',
        b'{"type":"job_teleported","at":0,"payload":1e999}',
    ],
)
def test_json_numbers_msgpack_cannot_store_are_decode_errors(line: bytes, tmp_path: Path) -> None:
    with pytest.raises(DecodeError, match=r"in\.jsonl:1"):
        from_json_line(line, "in.jsonl:1")
    # After good rows the import still appends nothing: the bad row fails validation, not
    # the writer.
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"type":"tick","at":0,"payload":{"type":"tick"}}\n' * 5000 + line + b"\n")
    with FileLedger.open(tmp_path / "ledger") as writer, pytest.raises(DecodeError, match=":5001"):
        import_jsonl(source.open("rb"), writer, source_name=str(source), batch_size=100)
    assert LedgerDirReader(tmp_path / "ledger").end_offset() == 0


def test_a_payload_with_no_json_form_is_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ext = msgspec.msgpack.encode(msgspec.msgpack.Ext(1, b"x"))
    env = Envelope(type="job_teleported", key="j", at=0, payload=msgspec.Raw(ext))
    with pytest.raises(DecodeError, match="offset 4: job_teleported payload has no JSON form"):
        to_json_line(4, env)
    with FileLedger.open(tmp_path / "ledger") as writer:
        writer.append([env])
    assert main(["log", "cat", str(tmp_path / "ledger")]) == 2
    assert capsys.readouterr().err.startswith("gpuledger: offset 0: job_teleported payload")


def _segment_dir(tmp_path: Path, base: int, data: bytes) -> Path:
    root = tmp_path / "ledger"
    root.mkdir()
    (root / segment_name(base)).write_bytes(data)
    return root


def test_a_bad_header_fails_every_end_offset_call(tmp_path: Path) -> None:
    root = _segment_dir(tmp_path, 0, b"GPULEDG1\x01")
    reader = LedgerDirReader(root)
    for _ in range(2):  # every call checks the header, not only the first
        with pytest.raises(LedgerCorrupt, match="shorter than its 24-byte header"):
            reader.end_offset()


def test_following_from_before_the_first_segment_reports_the_gap(tmp_path: Path) -> None:
    payload = encode(Tick(), 0)
    root = _segment_dir(tmp_path, 7, fuzz_segment(7, [[payload]]))
    reader = LedgerDirReader(root)
    with pytest.raises(LedgerCorrupt, match="segment starts at offset 7, records are missing"):
        list(reader.read())
    with pytest.raises(LedgerCorrupt, match="segment starts at offset 7, records are missing"):
        list(reader.follow(0, idle_timeout_s=0))  # not offset 7 as if 0..6 were there
    assert [off for off, _ in reader.follow(7, idle_timeout_s=0)] == [7]


def test_an_intact_batch_end_after_a_broken_chain_is_corruption(tmp_path: Path) -> None:
    """A damaged record, records 1-2 intact (a batch that goes on), 3 damaged where the
    chain expects it, and an intact batch-ending 3 after that: an acknowledged append."""
    p = encode(Tick(), 0)
    data = bytearray(fuzz_segment(0, [[p]]))
    bad = len(data)
    data += bytearray(fuzz_frame(0, p))
    data[bad + 20] ^= 0xFF  # damage record 0's payload
    data += fuzz_frame(1, p, continues=True) + fuzz_frame(2, p, continues=True)
    broken = bytearray(fuzz_frame(3, p, continues=True))
    broken[-1] ^= 0xFF
    data += broken + fuzz_frame(3, p)
    root = _segment_dir(tmp_path, 0, bytes(data[:24] + data[bad:]))
    with pytest.raises(LedgerCorrupt, match="an acknowledged append ends intact"):
        FileLedger.open(root)


def test_the_last_offset_of_the_space(tmp_path: Path) -> None:
    last = 2**64 - 1
    payload = encode(Tick(), 0)
    root = _segment_dir(tmp_path, last, fuzz_segment(last, [[payload]]) + b"\0" * 30)
    reader = LedgerDirReader(root)
    with pytest.raises(LedgerCorrupt, match="records are missing"):
        list(reader.read())
    assert reader.end_offset() == 2**64  # a torn tail after it: no search past the end
    with FileLedger.open(root) as writer:
        assert writer.end_offset() == 2**64
        with pytest.raises(LedgerError, match="the ledger is full"):
            writer.append([wrap(Tick(), 0)])


def test_a_heavy_tailed_draw_is_capped_not_an_overflow() -> None:
    text = (
        "generators:\n  - {name: g, queue: q, arrival: {type: periodic, every_s: 60}, count: 3,\n"
        "     runtime_s: {type: lognormal, median: 600, sigma: 1000}}\n"
    )
    jobs = expand(parse(text, WorkloadFile))
    assert len(jobs) == 3 and all(j.runtime_ms <= MAX_QUANTITY * 1000 for j in jobs)

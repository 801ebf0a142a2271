"""events.ledgertime: ledger time shown and typed as people read it, and the CLI's use of
it on a live (wall-clock) ledger."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.codec import wrap
from events.filelog import FileLedger
from events.ledgertime import (
    WALL_CLOCK_FROM_MS,
    format_at,
    is_wall_clock,
    parse_at,
    parse_duration_ms,
)
from events.model import JobSubmitted, NodeRegistered, PodSpec, QueueConfigured

GPULEDGER = str(Path(sys.executable).parent / "gpuledger")
T0 = 1_764_748_800_000  # 2025-12-03T08:00:00Z


def test_clock_kind() -> None:
    assert not is_wall_clock(None)
    assert not is_wall_clock(0)
    assert not is_wall_clock(WALL_CLOCK_FROM_MS - 1)
    assert is_wall_clock(T0)


def test_format() -> None:
    assert format_at(T0, wall=True) == "2025-12-03T08:00:00.000Z"
    assert format_at(6 * 3_600_000 + 5_000, wall=False) == "+06:00:05"
    assert format_at(86_400_000 + 61_000, wall=False) == "+1d 00:01:01"
    assert format_at(None, wall=True) == ""


def test_parse() -> None:
    assert parse_at("6h", wall=False) == 21_600_000
    assert parse_at("90m", wall=True, origin_ms=T0) == T0 + 5_400_000
    assert parse_at("2025-12-03T08:00:00Z", wall=True) == T0
    assert parse_at("2025-12-03T09:00:00+01:00", wall=True) == T0
    assert parse_at("2025-12-03T08:00:00", wall=True) == T0  # no zone: UTC
    with pytest.raises(ValueError, match="simulated time"):
        parse_at("2025-12-03T08:00:00Z", wall=False)
    with pytest.raises(ValueError, match="'soon': expected an ISO-8601"):
        parse_at("soon", wall=True)


@given(st.integers(min_value=WALL_CLOCK_FROM_MS, max_value=4_102_444_800_000))
def test_iso_round_trip(ms: int) -> None:
    assert parse_at(format_at(ms, wall=True), wall=True) == ms


def test_state_at_iso_on_a_live_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    writer = FileLedger.open(ledger)
    try:
        writer.append(
            [
                wrap(NodeRegistered(node="n1", gpus=8), T0),
                wrap(QueueConfigured(queue="q"), T0),
                wrap(JobSubmitted(job="a", queue="q", pods=(PodSpec("a-0", 1000),)), T0),
                wrap(
                    JobSubmitted(job="b", queue="q", pods=(PodSpec("b-0", 1000),)), T0 + 7_200_000
                ),
            ]
        )
    finally:
        writer.close()

    def state(at: str) -> str:
        done = subprocess.run(
            [GPULEDGER, "state", "--ledger", str(ledger), "--at", at],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    iso = state("2025-12-03T09:00:00Z")
    assert iso.splitlines()[0] == "2025-12-03T09:00:00.000Z"
    assert "(through offset 2)" in iso  # job b (at 10:00) not yet submitted
    assert state("1h") == iso  # relative: one hour after the first record, not 1970
    assert "(through offset 3)" in state("2025-12-03T10:00:00Z")
    bad = subprocess.run(
        [GPULEDGER, "state", "--ledger", str(ledger), "--at", "yesterday"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "ISO-8601" in bad.stderr
    for past in ("3h", "2025-12-04T00:00:00Z", "5"):  # after the last record (10:00, offset 3)
        late = subprocess.run(
            [GPULEDGER, "state", "--ledger", str(ledger), "--at", past],
            capture_output=True,
            text=True,
            check=False,
        )
        assert late.returncode == 2, past
        assert "past the ledger's end" in late.stderr
        assert "offset 3, is at 2025-12-03T10:00:00.000Z" in late.stderr
    assert "(through offset 3)" in state("2h")  # the last record's own moment is not past it


def test_log_cat_shows_iso_on_a_live_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with FileLedger.open(ledger) as writer:
        writer.append([wrap(QueueConfigured(queue="q"), T0), wrap(QueueConfigured(queue="s"), 5)])
    done = subprocess.run(
        [GPULEDGER, "log", "cat", str(ledger)], capture_output=True, text=True, check=True
    )
    live, simulated = (json.loads(line) for line in done.stdout.splitlines())
    assert live["at_iso"] == "2025-12-03T08:00:00.000Z" and live["at"] == T0
    assert "at_iso" not in simulated
    export = tmp_path / "x.jsonl"
    subprocess.run([GPULEDGER, "log", "export", str(ledger), "--out", str(export)], check=True)
    assert "at_iso" not in export.read_text()  # the export format stays as it was


def test_one_duration_parser_behind_every_option() -> None:
    """``--at``, ``--window``, ``clock --every`` and a Queue resource's durations accept
    the same spellings, because they ask the same parser."""
    from projections.report import parse_window
    from scheduler.cli.clock import _period_s
    from scheduler.kube.mapping import _duration_ms

    for text, ms in [("500ms", 500), ("90s", 90_000), ("1.5h", 5_400_000), ("1h30m", 5_400_000),
                     ("2d", 172_800_000), ("1w", 604_800_000), ("45", 45_000)]:  # fmt: skip
        assert parse_duration_ms(text) == ms
        assert parse_window(text) * 1000 == ms
        assert _period_s(text) * 1000 == ms
        assert _duration_ms(text) == ms
        if not text.isdigit():
            assert parse_at(text, wall=False) == ms
    for bad in ("", "h", "5x", "1h30", "-5s", "1e3s", "5 parsecs"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration_ms(bad)


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["ms", "s", "m", "h", "d", "w"])), min_size=1, max_size=4))  # fmt: skip
def test_a_sum_of_parts_is_the_sum_of_their_durations(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    assert parse_duration_ms(text) == sum(parse_duration_ms(f"{n}{unit}") for n, unit in parts)

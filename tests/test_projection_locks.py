"""`project --follow` and the readers of its file in other processes: DuckDB lets one
process write a file and no other open it meanwhile, so each side waits for the other's
gap instead of failing (the console, `gpuledger serve`, avoids the contention entirely)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from events.codec import wrap
from events.filelog import FileLedger
from events.model import QueueConfigured
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

GPULEDGER = str(Path(sys.executable).parent / "gpuledger")
# Opens the file as soon as the other side leaves a gap (as gpuledger's readers do: the
# follower holds the lock while it projects), then holds it for argv[2] seconds.
HOLD = (
    "import duckdb, sys, time\n"
    "deadline = time.monotonic() + 20\n"
    "while True:\n"
    "    try:\n"
    "        con = duckdb.connect(sys.argv[1], read_only={ro})\n"
    "        break\n"
    "    except duckdb.IOException:\n"
    "        if time.monotonic() > deadline:\n"
    "            raise\n"
    "        time.sleep(0.05)  # intentional: the child's own retry until its deadline\n"
    "print('held', flush=True)\n"
    "time.sleep(float(sys.argv[2]))  # intentional: the deliberate hold\n"
    "con.close()\n"
)


def _hold(db: Path, seconds: float, read_only: bool) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(ro=read_only), str(db), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _ledger(path: Path, queues: range) -> None:
    with FileLedger.open(path) as writer:
        writer.append([wrap(QueueConfigured(queue=f"q{i}"), i) for i in queues])


def test_follow_waits_for_a_reader_and_carries_on(tmp_path: Path) -> None:
    ledger, db = tmp_path / "ledger", tmp_path / "h.duckdb"
    _ledger(ledger, range(3))
    subprocess.run([GPULEDGER, "project", "--ledger", str(ledger), "--db", str(db)], check=True)
    runs = tmp_path / "follow.out"  # a line per run of the follower
    with open(runs, "w") as out:
        follow = subprocess.Popen(
            [GPULEDGER, "project", "--follow", str(ledger), "--db", str(db), "--interval", "0.2"],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        wait_until(lambda: runs.read_text().strip(), 30, "the follower's first run")
        reader = _hold(db, 2.0, read_only=True)  # a reader keeps the file open for 2 s
        _ledger(ledger, range(3, 5))
        reader.wait(timeout=30)
        count = ""

        def counted_five() -> bool:
            nonlocal count
            done = subprocess.run(
                [
                    GPULEDGER,
                    "sql",
                    "--db",
                    str(db),
                    "--format",
                    "csv",
                    "SELECT count(*) FROM queues",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            count = done.stdout.splitlines()[-1] if done.returncode == 0 else done.stderr
            return count == "5"

        wait_until(
            counted_five,
            20,
            "the follower to project the two new queues",
            poll=0.3,
            detail=lambda: count,
        )
        assert count == "5"
        assert follow.poll() is None, "the follower exited"
    finally:
        follow.terminate()
        _, err = follow.communicate(timeout=30)
    assert "Could not set lock" in err and "retrying" in err


def test_sql_waits_for_a_writer_to_let_go(tmp_path: Path) -> None:
    ledger, db = tmp_path / "ledger", tmp_path / "h.duckdb"
    _ledger(ledger, range(2))
    subprocess.run([GPULEDGER, "project", "--ledger", str(ledger), "--db", str(db)], check=True)
    writer = _hold(db, 4.0, read_only=False)
    held = time.monotonic()
    done = subprocess.run(
        [GPULEDGER, "sql", "--db", str(db), "--format", "csv", "SELECT count(*) FROM queues"],
        capture_output=True,
        text=True,
        check=False,
    )
    # No process can open the file while the writer holds it (4 s from "held"), so an
    # answer means `sql` waited for it to let go.
    assert time.monotonic() - held >= 3.5
    writer.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "2"

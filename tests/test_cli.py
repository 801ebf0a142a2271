"""The simulate / replay / demo / schema commands, end to end through `main`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest

from events.codec import decode_event, wrap
from events.filelog import FileLedger, LedgerDirReader
from events.model import JobSubmitted
from scheduler.cli import main

EX = "replay/examples"


def simulate(tmp_path: Path, *extra: str) -> Path:
    ledger = tmp_path / "ledger"
    code = main(
        [
            "simulate",
            "--cluster", f"{EX}/demo-cluster.yaml",
            "--queues", f"{EX}/demo-queues.yaml",
            "--workload", f"{EX}/demo-workload.yaml",
            "--ledger", str(ledger),
            *extra,
        ]
    )  # fmt: skip
    assert code == 0
    return ledger


def test_simulate_writes_a_ledger_that_replays_with_zero_mismatches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = simulate(tmp_path, "--db", str(tmp_path / "h.duckdb"))
    out = capsys.readouterr().out
    assert "287 jobs" in out and "training" in out
    assert main(["replay", "--ledger", str(ledger), "--verify"]) == 0
    assert "verify: 0 mismatches" in capsys.readouterr().out


def test_simulate_refuses_to_overwrite_a_ledger(tmp_path: Path) -> None:
    simulate(tmp_path)
    assert main(["simulate", "--cluster", f"{EX}/demo-cluster.yaml", "--queues",
                 f"{EX}/demo-queues.yaml", "--workload", f"{EX}/demo-workload.yaml",
                 "--ledger", str(tmp_path / "ledger")]) == 2  # fmt: skip


def test_simulate_names_the_bad_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n  - {name: a, count: -1, gpus: 8}\n")
    code = main(["simulate", "--cluster", str(bad), "--queues", f"{EX}/demo-queues.yaml",
                 "--workload", f"{EX}/demo-workload.yaml", "--ledger", str(tmp_path / "l")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and "$.nodes[0].count" in err
    assert not (tmp_path / "l").exists() or not any((tmp_path / "l").iterdir())


@pytest.mark.parametrize(
    ("jobs", "says"),
    [
        (
            ["{name: a, queue: team}", "{name: b, queue: tema}"],
            "jobs[1] (b).queue: unknown queue 'tema'",
        ),
        (["{name: a, queue: org}"], "jobs[0] (a).queue: 'org' has child queues"),
        (["{name: a, queue: team}", "{name: a, queue: team}"], "duplicate job name 'a'"),
    ],
    ids=["unknown-queue", "inner-queue", "duplicate-name"],
)
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_job_the_run_would_refuse_is_an_error_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs: list[str], says: str, command: str
) -> None:
    """Not a job silently left out (exit 0, "submitted 1/2"), nor a stub ledger left behind
    that refuses the corrected run."""
    (tmp_path / "q.yaml").write_text(
        "queues:\n  - {name: org, deserved_gpus: 8}\n  - {name: team, parent: org}\n"
    )
    lines = "".join(f"  - {j[:-1]}, at_s: 0, runtime_s: 60}}\n" for j in jobs)
    (tmp_path / "w.yaml").write_text("jobs:\n" + lines)
    out = tmp_path / "out"
    where = ["--ledger", str(out)] if command == "simulate" else ["--out", str(out)]
    code = main([command, "--cluster", f"{EX}/demo-cluster.yaml", "--queues",
                 str(tmp_path / "q.yaml"), "--workload", str(tmp_path / "w.yaml"), *where])  # fmt: skip
    assert code == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_a_torn_tail_is_refused_accepted_or_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """37 bytes cut off a simulated ledger. Every reader refuses it with one line naming the
    segment and the lost offset, and writes nothing; --accept-torn-tail reads the appends
    before the tear (the simulator's batches keep all but the last), and --repair truncates
    the tail so that the ledger verifies clean afterwards."""
    ledger = simulate(tmp_path)
    (segment,) = ledger.glob("*.seg")
    with segment.open("r+b") as f:
        f.truncate(segment.stat().st_size - 37)
    size = segment.stat().st_size
    capsys.readouterr()
    db = tmp_path / "h.duckdb"
    for argv in (
        ["replay", "--ledger", str(ledger), "--verify"],
        ["state", "--ledger", str(ledger), "--at", "0"],
        ["project", "--ledger", str(ledger), "--db", str(db)],
        ["replay", "--ledger", str(ledger), "--policy-name", "fifo", "--out", str(tmp_path / "w")],
        ["serve", "--ledger", str(ledger), "--db", str(db), "--listen", "127.0.0.1:0"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "the ledger is damaged" in err and segment.name in err and "torn tail" in err
        assert "--accept-torn-tail" in err and "--repair" in err
    assert not db.exists() and not (tmp_path / "w").exists()
    assert segment.stat().st_size == size  # a refusal changes nothing

    readable = sum(1 for _ in LedgerDirReader(ledger).read(0))
    assert readable >= 1024  # earlier appends are intact
    assert main(["replay", "--ledger", str(ledger), "--verify", "--accept-torn-tail"]) == 0
    captured = capsys.readouterr()
    assert f"replayed {readable} records" in captured.out
    assert "up to its torn tail" in captured.out and "warning" in captured.err
    assert segment.stat().st_size == size  # accepting reads; it does not repair

    assert main(["project", "--ledger", str(ledger), "--db", str(db), "--repair"]) == 0
    err = capsys.readouterr().err
    assert f"repaired {ledger}" in err and f"{readable:,} records remain" in err
    assert main(["log", "verify", str(ledger)]) == 0
    assert main(["replay", "--ledger", str(ledger), "--verify"]) == 0


def test_an_empty_ledger_is_never_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FileLedger.open(tmp_path / "empty").close()
    assert main(["replay", "--ledger", str(tmp_path / "empty"), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "NOTHING TO VERIFY" in out and "0 mismatches" not in out


def test_simulate_rejects_an_unknown_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        simulate(tmp_path, "--policy", "lottery")
    assert "invalid choice: 'lottery'" in capsys.readouterr().err


def test_replay_reports_a_forged_decision_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = simulate(tmp_path)
    records = list(LedgerDirReader(ledger).read())
    target = next(o for o, env in records if env.type == "job_unschedulable")
    event = decode_event(records[target][1], target)
    forged = msgspec.structs.replace(event, reason="forged")  # type: ignore[type-var]
    records[target] = (target, wrap(forged, records[target][1].at))
    with FileLedger.open(tmp_path / "forged") as writer:
        writer.append([env for _, env in records])
    capsys.readouterr()
    assert main(["replay", "--ledger", str(tmp_path / "forged"), "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"MISMATCH at offset {target}" in out and '"reason": "forged"' in out


def test_replay_of_a_missing_ledger_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--ledger", str(tmp_path / "nope"), "--verify"]) == 2
    assert "nope" in capsys.readouterr().err


def test_demo_prints_the_side_by_side_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "gpuledger" in out and "fifo" in out
    for queue in ("training", "interactive", "experiments", "all"):
        assert any(line.startswith(queue) for line in out.splitlines()), queue
    assert (tmp_path / "demo" / "gpuledger" / "history.duckdb").is_file()
    assert main(["replay", "--ledger", str(tmp_path / "demo" / "fifo" / "ledger"), "--verify"]) == 0
    shutil.rmtree(tmp_path / "demo")


def test_schema_prints_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "workload"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "WorkloadFile" in schema["$defs"]


def test_example_tables_have_titles_and_legends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["example", "fintech", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for title in (
        "Per tenant and policy",
        "Per policy",
        "Per queue: its demand against its deserved quota",
        "Per queue and gang policy",
    ):
        assert f"\n{title}" in out, title
    for legend in ("done/day:", "lost %:", "X/fifo:", "within/fifo p90:"):
        assert legend in out, legend


def test_demo_ends_with_commands_that_run_as_printed(tmp_path: Path) -> None:
    """`make demo` does not activate its virtualenv: the closing lines name the command by a
    path that runs from where the demo ran, not a bare `gpuledger` that is not on PATH."""
    import os
    import shlex
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "gpuledger"
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(exe), "demo", "--out", str(tmp_path / "demo")],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = done.stdout.split("Next:\n", 1)[1].splitlines()
    assert lines and all(not line.strip().startswith("gpuledger ") for line in lines)
    for line in lines[:3]:  # replay --verify, report, sql (serve would not return)
        argv = shlex.split(line.split("#", 1)[0])
        ran = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=False
        )
        assert ran.returncode == 0, (line, ran.stderr)


def test_a_what_if_never_drops_a_refused_job_in_silence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A what-if whose queues.yaml drops a queue the ledger's jobs use: the scheduler
    refuses those jobs. Without --skip-invalid the run stops with one line naming the job,
    the queue and the ledger, and no ledger is left; with it each is a warning and the
    summary counts them."""
    ledger = simulate(tmp_path)
    queues = tmp_path / "two.yaml"
    queues.write_text(
        "queues:\n  - {name: training, deserved_percent: 70}\n"
        "  - {name: interactive, deserved_percent: 30}\n"
    )
    out = tmp_path / "what-if"
    argv = ["replay", "--ledger", str(ledger), "--queues", str(queues), "--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"ledger {ledger}: job 'sweep-" in err and "unknown queue 'experiments'" in err
    assert "--skip-invalid" in err
    assert not (out / "ledger").exists()
    assert not [p.name for p in out.iterdir()]  # no partial sibling either

    assert main([*argv, "--skip-invalid"]) == 0  # the empty directory does not block it
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    jobs = {line.split("job '", 1)[1].split("'", 1)[0] for line in warnings if "job '" in line}
    recorded = {
        e.job
        for _, env in LedgerDirReader(ledger).read(0)
        if isinstance(e := decode_event(env), JobSubmitted) and e.queue == "experiments"
    }
    assert jobs == recorded and recorded
    assert f"refused inputs: {len(warnings)} (left out of the run by --skip-invalid)" in (
        captured.out
    )
    rerun = {
        e.job
        for _, env in LedgerDirReader(out / "ledger").read(0)
        if isinstance(e := decode_event(env), JobSubmitted)
    }
    assert not rerun & recorded

"""The compiled policy core (``scheduler.native``) decides exactly as the Python one.

The rest of the suite runs the core as Python (tests/conftest.py): it patches functions of
the core, which compiled modules do not see. Here the compiled core, in processes of its
own, writes the pinned ledgers of every example under every policy, passes the policy's
spec tables and properties, and verifies a ledger the Python core wrote. Under CI the
build must exist (``make test`` builds it: ``make native``).
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from events.filelog import FileLedger
from replay.examples import EXAMPLES, simulate
from scheduler import native
from tests.prereq import require

ROOT = Path(__file__).resolve().parents[1]
PINNED = Path(__file__).with_name("ledger_digests.txt")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]

SPEC_TESTS = [
    "tests/test_policy_spec.py",
    "tests/test_properties.py",
    "tests/test_quota_guarantee.py",
    "tests/test_kai_parity.py",
    "tests/test_replay_examples.py",
    "tests/test_snapshot_encoder.py",
    "tests/test_service_restore.py",
    "tests/test_forecast.py",
]
"""Test files that patch nothing of the core: run whole under the compiled core."""


def _python(*args: str, core: str = "native", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "GPULEDGER_CORE": core, **env},
    )


def _require_build() -> Path:
    where = native.built()
    require(where is not None, "the policy core is not compiled for these sources: make native")
    assert where is not None
    return where


def test_the_suite_itself_runs_the_python_core() -> None:
    from scheduler.core import policy  # (what this process imported)

    assert native.mode() == "pure"
    assert policy.__file__ is not None and policy.__file__.endswith("policy.py")


def test_the_compiled_core_is_loaded_from_its_build() -> None:
    where = _require_build()
    done = _python(
        "-c",
        "import scheduler.native as n, scheduler.core.allocate as a; print(n.mode(), a.__file__)",
    )
    assert done.returncode == 0, done.stderr
    mode, file = done.stdout.split()
    assert mode == "native"
    assert file == str(where / "scheduler" / "core" / f"allocate{SUFFIX}")
    # auto (the default) takes the build too
    done = _python(
        "-c", "import scheduler.native as n, scheduler.core; print(n.mode())", core="auto"
    )
    assert done.stdout.strip() == "native", done.stderr


def test_the_compiled_core_writes_the_pinned_ledgers() -> None:
    _require_build()
    done = _python(str(ROOT / "scripts" / "ledger_digests.py"), PYTHONHASHSEED="4242")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == PINNED.read_text().splitlines()


@pytest.mark.slow
def test_the_compiled_core_passes_the_spec_tables_and_properties() -> None:
    _require_build()
    done = _python("-m", "pytest", "-q", "-p", "no:cacheprovider", *SPEC_TESTS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1]


def test_the_compiled_core_verifies_what_the_python_core_wrote(tmp_path: Path) -> None:
    """A ledger written by this (Python) process replays under the compiled core with no
    mismatch, through the command line users run."""
    _require_build()
    for name in sorted(EXAMPLES):
        with FileLedger.open(tmp_path / name) as ledger:
            simulate(name, "gpuledger", ledger)
    for name in sorted(EXAMPLES):
        path = str(tmp_path / name)
        done = _python("-m", "scheduler.cli", "replay", "--verify", "--ledger", path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "0 mismatches" in done.stdout, done.stdout
        assert "records/s (compiled core)" in done.stdout  # it says which core checked


def test_a_build_is_named_by_the_sources_it_was_made_from(tmp_path: Path) -> None:
    """Edit a file of the core (or of the event model) and the build no longer applies: the
    core runs as Python until it is built again. A file elsewhere changes nothing."""
    copy = tmp_path / "tree"
    for package in ("scheduler/core", "events"):
        shutil.copytree(ROOT / package, copy / package)
    (copy / "scheduler" / "cli").mkdir()
    (copy / "scheduler" / "cli" / "x.py").write_text("x = 1\n")
    before = native.key(copy)
    assert before == native.key(ROOT)
    (copy / "scheduler" / "cli" / "x.py").write_text("x = 2\n")
    assert native.key(copy) == before
    victims = copy / "scheduler" / "core" / "victims.py"
    victims.write_text(victims.read_text() + "\n")
    assert native.key(copy) != before
    victims.write_text((ROOT / "scheduler" / "core" / "victims.py").read_text())
    model = copy / "events" / "model.py"
    model.write_text(model.read_text() + "# a comment\n")
    assert native.key(copy) != before


def test_native_without_a_build_says_how_to_build_it(tmp_path: Path) -> None:
    done = _python("-c", "import scheduler.core", GPULEDGER_NATIVE_DIR=str(tmp_path))
    assert done.returncode != 0
    assert "GPULEDGER_CORE=native" in done.stderr and "make native" in done.stderr


def test_auto_without_a_build_runs_the_python_core(tmp_path: Path) -> None:
    done = _python(
        "-c",
        "import scheduler.native as n, scheduler.core.policy as p; print(n.mode(), p.__file__)",
        core="auto",
        GPULEDGER_NATIVE_DIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pure", str(ROOT / "scheduler" / "core" / "policy.py")]


def test_an_unknown_mode_is_refused_naming_the_variable() -> None:
    done = _python("-c", "import scheduler", core="fast")
    assert done.returncode != 0
    assert "GPULEDGER_CORE='fast': expected one of auto, native, pure" in done.stderr


def _fake_compiler(monkeypatch: pytest.MonkeyPatch, before_done: object = None) -> list[Path]:
    """``native.build`` with its compile step replaced by one that writes a stand-in build
    (``before_done`` runs inside it, as another process could); the scratch directories
    it compiled in."""
    runs: list[Path] = []

    def compile_(command: list[str], cwd: Path, **_: object) -> subprocess.CompletedProcess[str]:
        out = Path(command[command.index("--build-lib") + 1])
        (out / "scheduler" / "core").mkdir(parents=True)
        (out / "scheduler" / "core" / f"policy{SUFFIX}").write_text(str(len(runs)))
        runs.append(cwd)
        if callable(before_done):
            before_done()
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(native.subprocess, "run", compile_)
    return runs


def test_a_build_lands_whole_once_and_a_forced_one_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEDGER_NATIVE_DIR", str(tmp_path))
    runs = _fake_compiler(monkeypatch)
    where = native.build()
    assert where == tmp_path / native.key() and native.built() == where
    assert (where / "scheduler" / "core" / f"policy{SUFFIX}").read_text() == "0"
    assert native.build() == where and len(runs) == 1  # built: nothing compiled
    native.build(force=True)
    assert (where / "scheduler" / "core" / f"policy{SUFFIX}").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == [where.name]  # no scratch left


def test_a_build_that_another_process_finished_first_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEDGER_NATIVE_DIR", str(tmp_path))
    where = tmp_path / native.key()

    def other() -> None:
        (where / "scheduler").mkdir(parents=True)
        (where / native.DONE).write_text("theirs\n")

    _fake_compiler(monkeypatch, other)
    assert native.build() == where
    assert (where / native.DONE).read_text() == "theirs\n"  # theirs stands, ours is dropped
    assert [p.name for p in tmp_path.iterdir()] == [where.name]


def test_old_builds_and_scratch_of_killed_ones_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEDGER_NATIVE_DIR", str(tmp_path))
    for age, name in enumerate(["a", "b", "c", "d"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / native.DONE).write_text("")
        os.utime(tmp_path / name / native.DONE, (1000 + age, 1000 + age))
    killed, fresh = tmp_path / ".x-killed", tmp_path / ".y-running"
    killed.mkdir()
    fresh.mkdir()
    os.utime(killed, (1000, 1000))
    _fake_compiler(monkeypatch)
    where = native.build()
    left = sorted(p.name for p in tmp_path.iterdir())
    # the new build and the two newest others (KEEP = 3), and a scratch still in use
    assert left == sorted([where.name, "c", "d", ".y-running"])


BUILT_PER_CYCLE = {
    "scheduler.core.allocate": ["_Plan"],
    "scheduler.core.backfill": ["RunningEnds", "_Release"],
    "scheduler.core.fairshare": ["Shares"],
    "scheduler.core.pendingblocks": ["Summary", "HeldRun"],
    "scheduler.core.placement": ["Statement", "_Step"],
    "scheduler.core.session": ["Session"],
    "scheduler.core.state": ["JobShape", "Reservation", "PlannedMemo", "FailedMemo", "ShareMemo"],
    "scheduler.core.victims": ["Victims", "Candidates", "Reclaimer", "_Take"],
}
"""The core's dataclasses a cycle builds: most many times in every cycle, the memos
(``PlannedMemo``, ``FailedMemo``, ``ShareMemo``) once."""


def test_the_classes_a_cycle_builds_most_write_their_init_out() -> None:
    """Compiled, a dataclass keeps the ``__init__`` the dataclasses module generates at
    import, which runs as interpreted Python (a frozen one sets each field through
    ``object.__setattr__``): on a congested ledger those constructors took a tenth of
    ``replay --verify``. These classes write theirs out, so it is compiled; the generated
    one is compiled from no file (``<string>``)."""
    import importlib

    generated = [
        f"{module}.{name}"
        for module, names in BUILT_PER_CYCLE.items()
        for name in names
        if getattr(importlib.import_module(module), name).__init__.__code__.co_filename
        == "<string>"
    ]
    assert generated == []

"""Coverage-guided fuzzing with atheris, bounded, and the inputs it found kept as regressions.

Each target (``tests/fuzz/targets.py``) runs in a subprocess for a fixed number of inputs
with a fixed seed, starting from its seed corpus; exit status 0 means no input broke its
oracle. ``make fuzz`` runs the same targets for longer. atheris is in the ``dev`` extra, so
under CI a missing atheris fails these tests instead of skipping them.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.targets import REGRESSIONS, TARGETS, cleanup
from tests.prereq import require

ROOT = Path(__file__).resolve().parent.parent

# Inputs per target: about 20 s for all four on the 2-core CI machine.
RUNS = {"codec": 50_000, "segment": 2_000, "config": 5_000, "jsonl": 15_000}


def _require_atheris() -> None:
    require(
        importlib.util.find_spec("atheris") is not None,
        "atheris is not installed: pip install -e '.[dev]' (make test does)",
    )


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(RUNS))
def test_atheris_target_runs_clean(target: str, tmp_path: Path) -> None:
    _require_atheris()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fuzz.atheris_targets",
            target,
            f"-runs={RUNS[target]}",
            "-seed=1",
            "-timeout=20",
            f"-artifact_prefix={tmp_path}/",
            str(tmp_path / "corpus"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    found = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-")))
    assert proc.returncode == 0, (
        f"{target}: exit {proc.returncode}, inputs kept: {found}\n{proc.stderr[-4000:]}"
    )
    # libFuzzer counts the seed corpus too, so it may report a few more runs than asked
    done = re.search(r"^Done (\d+) runs", proc.stderr, re.MULTILINE)
    assert done is not None and int(done.group(1)) >= RUNS[target], proc.stderr[-2000:]


def test_every_target_has_seeds_and_regressions() -> None:
    from tests.fuzz.targets import SEEDS

    for target in TARGETS:
        assert list(SEEDS[target]()), target
    assert {p.name for p in REGRESSIONS.iterdir()} == set(TARGETS)


REGRESSION_FILES = sorted(REGRESSIONS.glob("*/*"))


@pytest.mark.parametrize(
    "path", REGRESSION_FILES, ids=[f"{p.parent.name}/{p.name}" for p in REGRESSION_FILES]
)
def test_fuzz_regression_inputs_pass(path: Path) -> None:
    """Each input once broke its target's oracle; the fix keeps it passing (no atheris needed)."""
    try:
        TARGETS[path.parent.name](path.read_bytes())
    finally:
        cleanup()

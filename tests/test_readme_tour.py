"""The README's five-minute tour, run as printed, reads as people read numbers.

Every command of the tour's code blocks runs verbatim (from a scratch directory whose
``.venv/bin/gpuledger`` is this environment's and whose ``replay/examples`` is the repo's),
after ``make demo``'s own command. Its output must not print a number in scientific
notation, bare seconds above 90, a Python ``True``/``False``/``None``, or more than 4
decimals. Left out: ``serve`` (it runs until stopped: the console's tests cover it) and step
8's import and compare of the whole Alibaba trace (minutes; ``tests/test_traces.py``
covers the import).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCIENTIFIC = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE][+-]?\d+\b")
SECONDS = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?) ?s\b(?!/)")
PYTHON = re.compile(r"\b(True|False|None)\b")
DECIMALS = re.compile(r"(?<![\w.])\d+\.\d{5,}\b")


def tour_commands() -> list[str]:
    """The shell commands of the README's tour, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    tour = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", tour, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  # ", 1)[0].strip()
            if command:
                commands.append(command)
    # The tour's commands given inline: the HTML report and one example.
    commands += re.findall(r"`(\.venv/bin/gpuledger report [^`]*--format html[^`]*)`", tour)
    commands += ["gpuledger example", "gpuledger example fintech"]
    return commands


def unreadable(line: str) -> list[str]:
    """What in one line of output is not as people read numbers."""
    found = [f"scientific notation {m}" for m in SCIENTIFIC.findall(line)]
    for value in SECONDS.findall(line):
        if float(value.replace(",", "")) > 90:
            found.append(f"bare seconds {value} s")
    found += [f"Python literal {m}" for m in PYTHON.findall(line)]
    found += [f"more than 4 decimals {m}" for m in DECIMALS.findall(line)]
    return found


def test_the_checker_catches_what_it_must() -> None:
    assert unreadable("lost 1.2e-05 GPU-h")
    assert unreadable("time to ready 7,420 s")
    assert unreadable("ok  False")
    assert unreadable("lost_gpu_h  0.03149972222")
    assert not unreadable("replayed 2808 records in 190 ms, 14,505 records/s; p90 55.8 min")
    assert not unreadable("ttr 45.0 s  2.4 h  0.0315  waited 12 s")


def test_the_readme_tour_prints_numbers_people_can_read(tmp_path: Path) -> None:
    gpuledger = Path(sys.executable).parent / "gpuledger"
    if not gpuledger.exists():
        pytest.fail(f"{gpuledger}: the project's console script is not installed")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "gpuledger").symlink_to(gpuledger)
    (tmp_path / "replay").mkdir()
    (tmp_path / "replay" / "examples").symlink_to(ROOT / "replay" / "examples")
    env = {**os.environ, "PATH": f"{tmp_path / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    commands = ["gpuledger demo --out out/demo"]  # `make demo`
    commands += [
        c
        for c in tour_commands()
        if " serve " not in c and "alibaba" not in c and "out/compare" not in c
    ]
    assert len(commands) >= 12, commands
    problems: list[str] = []
    for command in commands:
        done = subprocess.run(
            command, shell=True, executable="/bin/bash", cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        for line in (done.stdout + done.stderr).splitlines():
            if line.lstrip().startswith("{"):
                continue  # JSON records (`log cat`) are data, not a table
            problems += [f"{command}: {p}: {line.strip()}" for p in unreadable(line)]
    assert not problems, "\n".join(problems)

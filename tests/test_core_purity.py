"""The policy core must stay pure: no clock, randomness, I/O frameworks or hash order."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "scheduler" / "core"
FORBIDDEN = {
    "asyncio",
    "time",
    "datetime",
    "random",
    "uuid",
    "secrets",
    "os",
    "socket",
    "threading",
    "faust",
    "aiokafka",
    "kubernetes",
    "duckdb",
    "pyarrow",
}
# events.ledgertime: its formatters are pure functions of their arguments (a reason names a
# ledger time as every tool prints it); it reads no clock.
ALLOWED_PROJECT = ("events.model", "events.ledgertime", "scheduler.core")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return found


CORE_FILES = sorted(CORE.glob("*.py"))


def test_core_files_found() -> None:
    assert {p.name for p in CORE_FILES} >= {
        "apply.py", "policy.py", "state.py", "placement.py", "session.py", "allocate.py",
        "admission.py", "backfill.py", "victims.py", "consolidation.py", "neverfits.py",
        "stale.py", "reasons.py",
    }  # fmt: skip


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_imports_nothing_impure(path: Path) -> None:
    for line, module in _imports(path):
        root = module.split(".")[0]
        assert root not in FORBIDDEN, f"{path.name}:{line} imports {module}"
        if root in {"events", "scheduler", "projections", "replay"}:
            assert module.startswith(ALLOWED_PROJECT), (
                f"{path.name}:{line} imports {module}; the core may use only events.model "
                "and events.ledgertime's formatters, and itself"
            )


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_never_builds_sets_of_strings_to_iterate(path: Path) -> None:
    """Iterating a set of strings depends on PYTHONHASHSEED; the core keeps dicts instead."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.comprehension):
            target = node.iter
            if isinstance(target, ast.Call) and getattr(target.func, "id", "") in {
                "set",
                "frozenset",
            }:
                pytest.fail(f"{path.name}:{node.lineno}: iterates a set")
            assert not isinstance(target, ast.Set | ast.SetComp), (
                f"{path.name}:{getattr(node, 'lineno', '?')}: iterates a set literal"
            )


def test_purity_check_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom random import random\n")
    roots = {m.split(".")[0] for _, m in _imports(bad)}
    assert roots & FORBIDDEN == {"time", "random"}

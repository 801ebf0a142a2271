"""The decisions of every built-in example under every policy, pinned by the SHA-256 of the
ledger it writes (``scripts/ledger_digests.py``).

A refactoring of the core leaves every line as it is. A deliberate change of decisions
rewrites ``tests/ledger_digests.txt`` in the same commit
(``python scripts/ledger_digests.py > tests/ledger_digests.txt``), with a row in
docs/policy.md's revision table saying what changed and why. The script also runs under
another ``PYTHONHASHSEED``: no decision may depend on hash order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINNED = Path(__file__).with_name("ledger_digests.txt")
sys.path.insert(0, str(ROOT / "scripts"))

from ledger_digests import example_lines  # noqa: E402  # scripts/ is not a package


def test_every_example_decides_as_pinned() -> None:
    pinned = PINNED.read_text().splitlines()
    got = list(example_lines())
    changed = [f"pinned {p}\n   now {g}" for p, g in zip(pinned, got, strict=True) if p != g]
    assert not changed, (
        "decisions changed; if on purpose, rewrite tests/ledger_digests.txt and add a "
        "revision row to docs/policy.md:\n" + "\n".join(changed)
    )


@pytest.mark.slow
def test_the_digests_hold_under_another_hash_seed() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ledger_digests.py")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "4242"},
    )
    assert done.stdout.splitlines() == PINNED.read_text().splitlines()

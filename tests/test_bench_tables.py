"""docs/operations.md's benchmark tables are what the committed measurements render: no
figure in them is typed by hand, and each names the commit and machine it came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_tables_are_rendered_from_the_recorded_measurements() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_tables.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for path in (ROOT / "docs" / "bench").glob("*.json"):
        provenance = json.loads(path.read_text())["provenance"]
        assert provenance["commit"] and provenance["machine"], path

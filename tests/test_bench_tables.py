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


def test_the_forecast_table_says_which_submissions_were_forecast() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_tables
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    notes = {
        (every, limit): bench_tables.forecast_table({"sampling": {"every": every, "limit": limit}})
        for every, limit in ((10, 200), (2, 0), (1, 0), (21, 0))
    }
    assert "every 10th submission, thinned evenly to at most 200 per run." in notes[(10, 200)]
    assert "every 2nd submission." in notes[(2, 0)]
    assert "every submission." in notes[(1, 0)]
    assert "every 21st submission." in notes[(21, 0)]

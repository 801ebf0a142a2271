"""Numbers the docs state that the code defines: each is read from the code, so a changed
default fails here until the doc says the same."""

from __future__ import annotations

import argparse
import inspect
import itertools
import re
from pathlib import Path

from scheduler.cli import serve
from scheduler.kube.bind import Binder
from scheduler.kube.retry import Backoff

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _default(name: str) -> object:
    return inspect.signature(Binder.__init__).parameters[name].default


def test_the_binders_retries_are_as_operations_md_says() -> None:
    attempts, first = _default("attempts"), _default("backoff_s")
    assert isinstance(attempts, int) and isinstance(first, float)
    bind = inspect.getsource(Binder._retry)
    found = re.search(r"Backoff\(self\.backoff_s, ([\d.]+)\)", bind)
    assert found is not None, "the binder's back-off is no longer Backoff(backoff_s, cap)"
    cap = float(found.group(1))
    delays = list(itertools.islice(Backoff(first, cap).delays(), attempts - 1))
    text = " ".join((DOCS / "operations.md").read_text().split())
    waits = ", ".join(f"{d:g}" for d in delays[:-1]) + f" and {delays[-1]:g} s"
    claim = (
        f"up to {attempts} attempts in all, waiting {waits} between them ({sum(delays):g} s in all)"
    )
    assert claim in text, claim
    assert "Events are sent once" in text
    assert "retry" not in inspect.getsource(Binder._scheduled_event)  # sent once, indeed


def test_the_consoles_sql_limits_are_as_console_md_says() -> None:
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--ledger", "L"])
    table = (DOCS / "console.md").read_text()
    rows = {
        "--sql-timeout S": f"{args.sql_timeout:g}",
        "--sql-max-rows N": f"{args.sql_max_rows:,}",
        "--sql-max-bytes N": f"{args.sql_max_bytes // 2**20} MiB",
        "--sql-memory SIZE": str(args.sql_memory),
        "--sql-concurrency N": f"{args.sql_concurrency}",
    }
    for option, default in rows.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{option}` |"))
        assert row.split("|")[2].strip().startswith(default), (option, row)

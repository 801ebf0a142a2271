"""The console's SQL sandbox: what ``POST /api/sql`` may run, and the bounds on every query.

A query sees the projection and nothing of the host. The database instance the console owns
runs with DuckDB's external access off (no file, URL, extension or Python object reachable
from SQL: ``read_csv``, ``glob``, ``read_text``, ``httpfs``, ``INSTALL``/``LOAD`` all fail)
and its configuration locked (no ``SET``/``PRAGMA`` can turn that back on or raise a limit).
Those are settings of the instance, so they hold for every cursor of it: the pages, the
JSON API, ``sql``/``report`` through the console and the follower's projector, which needs
neither (it inserts from Arrow tables it registers, which the setting allows).

On top of that, each query is bounded: a statement type allow-list (one ``SELECT`` or
``EXPLAIN``, in a transaction rolled back), a time limit enforced by a watchdog that
interrupts the cursor, a cap on the rows and bytes of the answer (fetched as a stream, so a
billion-row result is never materialised), a memory limit for the instance, and a cap on
the queries running at once. docs/console.md gives the threat model.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import msgspec

__all__ = ["SQL_STATEMENTS", "SqlAnswer", "SqlGate", "SqlLimits", "lock_down"]

SQL_STATEMENTS = frozenset({"SELECT", "EXPLAIN"})
"""Statement types the read-only SQL endpoint runs (DuckDB's ``StatementType`` names)."""

_FETCH_CHUNK = 256
"""Rows fetched from DuckDB's stream at a time while the answer is built."""


@dataclass(frozen=True)
class SqlLimits:
    """The bounds on the console's queries (``serve --sql-*``; docs/console.md)."""

    timeout_s: float = 10.0
    """A query still running after this long is interrupted (and answers 400)."""
    max_rows: int = 10_000
    """Rows returned at most; the answer says ``truncated`` when there were more."""
    max_bytes: int = 32 * 1024 * 1024
    """JSON bytes of rows returned at most (wide rows stop the answer before max_rows)."""
    memory_limit: str = "1GB"
    """DuckDB's ``memory_limit`` for the console's database instance (spills beyond it)."""
    max_concurrent: int = 4
    """Queries running at once; one more answers 429."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"SQL time limit {self.timeout_s!r}: expected seconds > 0")
        if self.max_rows < 1:
            raise ValueError(f"SQL row limit {self.max_rows!r}: expected at least 1")
        if self.max_concurrent < 1:
            raise ValueError(f"SQL concurrency {self.max_concurrent!r}: expected at least 1")
        if self.max_bytes < 1:
            raise ValueError(f"SQL answer size {self.max_bytes!r}: expected at least 1 byte")


def lock_down(con: duckdb.DuckDBPyConnection, limits: SqlLimits) -> None:
    """Turn external access off, set the memory limit and lock the instance's configuration.

    DuckDB refuses to turn external access back on while the instance runs, and refuses any
    ``SET`` once the configuration is locked, so this holds until the process ends.
    """
    try:
        con.execute(f"SET memory_limit = '{_quoted(limits.memory_limit)}'")
    except duckdb.Error as exc:
        raise ValueError(f"SQL memory limit {limits.memory_limit!r}: {exc}") from exc
    con.execute("SET enable_progress_bar = false")  # a client's query draws nothing on ours
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _quoted(text: str) -> str:
    return text.replace("'", "''")


class SqlAnswer(msgspec.Struct, frozen=True):
    """What ``/api/sql`` answers: an HTTP status and its JSON body."""

    status: int
    body: dict[str, Any]


def _refusal(status: int, message: str) -> SqlAnswer:
    return SqlAnswer(status, {"error": message})


@dataclass
class SqlGate:
    """Runs the console's queries within ``limits``; ``interrupt_all`` ends the running ones.

    ``try_enter`` is called on the event loop (so a query over the cap is refused at once,
    without taking a worker thread) and ``run`` on a worker thread, which always leaves.
    """

    limits: SqlLimits = field(default_factory=SqlLimits)
    _slots: threading.BoundedSemaphore = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _running: set[duckdb.DuckDBPyConnection] = field(default_factory=set)
    _closed: bool = False

    def __post_init__(self) -> None:
        self._slots = threading.BoundedSemaphore(self.limits.max_concurrent)

    def try_enter(self) -> SqlAnswer | None:
        """Take a query slot, or the 429 answer when all are taken (or 503 when stopping)."""
        if self._closed:
            return _refusal(503, "the console is stopping")
        if not self._slots.acquire(blocking=False):
            return _refusal(
                429,
                f"{self.limits.max_concurrent} queries are already running on this console "
                "(serve --sql-concurrency); try again when one ends",
            )
        return None

    def run(self, open_cursor: Callable[[], duckdb.DuckDBPyConnection], query: str) -> SqlAnswer:
        """One query, on a cursor of its own, in a slot taken by ``try_enter``; frees it."""
        try:
            refused = _check_statement(query)
            if refused is not None:
                return refused
            return self._run(open_cursor(), query)
        finally:
            self._slots.release()

    def interrupt_all(self) -> None:
        """Interrupt every running query and refuse new ones (the console is stopping)."""
        with self._lock:
            self._closed = True
            for con in self._running:
                with contextlib.suppress(duckdb.Error):
                    con.interrupt()

    def _run(self, con: duckdb.DuckDBPyConnection, query: str) -> SqlAnswer:
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            with contextlib.suppress(duckdb.Error):
                con.interrupt()

        watchdog = threading.Timer(self.limits.timeout_s, expire)
        watchdog.daemon = True
        with self._lock:
            if self._closed:
                con.close()
                return _refusal(503, "the console is stopping")
            self._running.add(con)
        watchdog.start()
        try:
            con.execute("BEGIN TRANSACTION")
            return self._answer(con.execute(query))
        except duckdb.InterruptException:
            if timed_out.is_set():
                return _refusal(
                    400,
                    f"query interrupted at the console's {self.limits.timeout_s:g} s time "
                    "limit (serve --sql-timeout)",
                )
            return _refusal(503, "query interrupted: the console is stopping")
        except duckdb.PermissionException as exc:
            return _refusal(
                400,
                "the console's SQL reads only the projection; files, URLs, extensions and "
                f"settings are out of reach ({_first_line(exc)})",
            )
        except duckdb.OutOfMemoryException as exc:
            return _refusal(
                400,
                f"query ran out of the console's memory limit {self.limits.memory_limit} "
                f"(serve --sql-memory): {_first_line(exc)}",
            )
        except duckdb.Error as exc:
            return _refusal(400, f"SQL error: {exc}")
        finally:
            watchdog.cancel()
            with self._lock:
                self._running.discard(con)
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            con.close()

    def _answer(self, cur: Any) -> SqlAnswer:
        """Read at most ``max_rows`` rows and ``max_bytes`` of them from the result stream."""
        description = cur.description or []
        rows: list[Any] = []
        size = 0
        truncated = False
        if description:
            while True:
                chunk = cur.fetchmany(_FETCH_CHUNK)
                if not chunk:
                    break
                for row in chunk:
                    size += len(msgspec.json.encode(row, enc_hook=str))
                    if len(rows) == self.limits.max_rows or size > self.limits.max_bytes:
                        truncated = True
                        break
                    rows.append(row)
                if truncated:
                    break
        body: dict[str, Any] = {
            "columns": [d[0] for d in description],
            "types": [str(d[1]) for d in description],
            "rows": rows,
            "truncated": truncated,
        }
        if truncated:
            body["limit"] = (
                f"{self.limits.max_rows:,} rows"
                if len(rows) == self.limits.max_rows
                else f"{self.limits.max_bytes:,} bytes"
            )
        return SqlAnswer(200, body)


def _check_statement(query: str) -> SqlAnswer | None:
    """One statement of an allowed type, else the 400 answer saying why."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        return _refusal(400, f"SQL error: {exc}")
    if len(statements) != 1:
        return _refusal(400, f"expected one SQL statement, got {len(statements)}")
    kind = statements[0].type.name
    if kind not in SQL_STATEMENTS:
        return _refusal(400, f"the console runs read-only queries (SELECT), not {kind}")
    return None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0]

"""``gpuledger serve``: one process that owns a projection and serves a console over it.

The process holds the only DuckDB database instance of the projection file. A follower
thread runs the same incremental ``projections.projector.project`` that ``gpuledger
project --follow`` runs, into that instance; every HTTP request reads through its own
cursor of it, so readers see each committed batch (DuckDB's MVCC) and never take the file
lock the follower needs. ``gpuledger sql --server`` and ``report --server`` go through the
JSON API for the same reason.

The web framework is Starlette (ASGI) served by uvicorn, the pages are Jinja2 templates
with autoescaping on (queue and job names are user input), and the pages refresh
themselves from a server-sent events stream when the projection advances. See
docs/console.md for the routes and why each library was chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import duckdb
import msgspec
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from events.ledgertime import duration_unit, format_at, is_wall_clock, parse_at
from events.port import LedgerReader
from projections.console import queries
from projections.console.forecasts import Forecasts
from projections.console.sandbox import SqlGate, SqlLimits, lock_down
from projections.console.travel import Travel, nodes_of
from projections.console.whatif import MAX_QUEUES_YAML, WhatIfBusyError, WhatIfRuns
from projections.projector import connect, project
from projections.report import format_duration, parse_window
from scheduler.core.policy import POLICIES

__all__ = [
    "DISCOVERY_SUFFIX",
    "Console",
    "ListenError",
    "build_app",
    "check_listen",
    "discovery_path",
    "parse_listen",
]

DISCOVERY_SUFFIX = ".console.json"
"""``serve --db F`` writes ``F.console.json`` (its URL and pid) so that ``sql``/``report
--db F`` find the running server instead of opening the file it owns."""

TOKEN_COOKIE = "gpuledger_token"  # noqa: S105  # a cookie name, not a secret
STATIC = Path(__file__).parent / "static"


class ListenError(ValueError):
    """A ``--listen`` address that is malformed, or not local and without a token."""


def parse_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:8080``, ``[::1]:8080``, ``localhost:0`` → host and port."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ListenError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def check_listen(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token: the console shows every job and queue
    name and runs SQL, so only the local machine may reach it unauthenticated."""
    if not _is_loopback(host) and not token:
        raise ListenError(
            f"refusing to listen on {host} without a token: give --token T (or the "
            "GPULEDGER_TOKEN environment variable), or bind to 127.0.0.1 and put an "
            "authenticating proxy in front"
        )


def discovery_path(db_path: str | os.PathLike[str]) -> Path:
    """Where ``serve`` announces itself for the database at ``db_path``."""
    return Path(f"{db_path}{DISCOVERY_SUFFIX}")


@dataclass
class Console:
    """The projection a server owns: the database instance and the follower thread."""

    reader: LedgerReader
    db_path: str
    source: str = ""
    """The ledger's address, for time travel (a fold opens a reader of its own)."""
    interval_s: float = 0.5
    batch_size: int = 50_000
    token: str | None = None
    sql_limits: SqlLimits = field(default_factory=SqlLimits)
    log: Callable[[str], None] = print
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    """Called by ``stop`` (the what-if runs' clean-up)."""
    next_offset: int = 0
    last_error: str = ""
    runs: int = 0
    sql: SqlGate = field(init=False)
    """Runs ``/api/sql`` within ``sql_limits``."""
    _con: duckdb.DuckDBPyConnection | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.sql = SqlGate(self.sql_limits)

    def open(self) -> None:
        """Open (creating and migrating) the projection and bring it up to date once."""
        # Held for the server's lifetime: ``project`` connects to the same file with the
        # same configuration, and DuckDB shares one database instance per process between
        # such connections, so no second process lock is ever needed.
        self._con = connect(self.db_path)
        try:
            # Before any request: no SQL of a client reaches the host (projections.console.sandbox).
            lock_down(self._con, self.sql_limits)
        except BaseException:
            self._con.close()
            self._con = None
            raise
        self._project_once()

    def start(self) -> None:
        """Follow the ledger on a daemon thread until ``stop``."""
        self._thread = threading.Thread(target=self._follow, name="gpuledger-follow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the running queries, the what-if runs and the follower, then close the database."""
        self.sql.interrupt_all()
        for callback in self.on_stop:
            callback()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._con is not None:
            self._con.close()
            self._con = None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own for one request (cursors are not shared by threads)."""
        if self._con is None:
            raise RuntimeError("the console's projection is not open")
        return self._con.cursor()

    def _project_once(self) -> None:
        stats = project(self.reader, self.db_path, batch_size=self.batch_size)
        self.next_offset = stats.next_offset
        self.runs += 1
        if stats.events_read:
            self.log(
                f"projected {stats.events_read:,} events in {format_duration(stats.seconds)}; "
                f"next offset {stats.next_offset}"
            )

    def _follow(self) -> None:
        # The follower never stops on an error: it is reported on every page and in
        # /api/status, and the next run retries from the last committed batch.
        while not self._stop.wait(self.interval_s):
            try:
                self._project_once()
                self.last_error = ""
            except Exception as exc:  # any failure is shown and retried
                message = f"{type(exc).__name__}: {exc}"
                if message != self.last_error:
                    self.log(f"projection failed, retrying: {message}")
                self.last_error = message


def _json_default(value: Any) -> Any:
    return str(value)  # DuckDB values msgspec does not know (Decimal, intervals) as text


def _json(data: Any, status_code: int = 200) -> Response:
    body = msgspec.json.encode(data, enc_hook=_json_default)
    return Response(body, status_code=status_code, media_type="application/json")


def _error(status_code: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status_code)


class _TokenGate(BaseHTTPMiddleware):
    """With a token, every request must carry it: ``Authorization: Bearer T``, the
    ``gpuledger_token`` cookie, or ``?token=T`` once (which sets the cookie)."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token

    def _ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        auth = request.headers.get("authorization", "")
        bearer = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        query = request.query_params.get("token")
        if self._ok(bearer) or self._ok(request.cookies.get(TOKEN_COOKIE)):
            return await call_next(request)
        if self._ok(query):
            response = await call_next(request)
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
            return response
        return _error(401, "this console needs its token (Authorization: Bearer …)")


def _int_param(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name, "")
    if not text:
        return default
    if not text.isdigit():
        raise ValueError(f"{name}={text!r}: expected a whole number")
    return int(text)


def build_app(console: Console) -> Starlette:
    """The ASGI application: pages, the JSON API and the event stream over ``console``."""
    env = Environment(
        loader=PackageLoader("projections.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = format_duration
    env.filters["gpus"] = lambda v: "–" if v is None else f"{v:,.2f}"
    env.filters["num"] = lambda v, d=2: "–" if v is None else f"{v:,.{d}f}"

    async def read(fn: Callable[..., Any], *args: Any) -> Any:
        def run() -> Any:
            con = console.cursor()
            try:
                return fn(con, *args)
            finally:
                con.close()

        return await run_in_threadpool(run)

    status_cache: dict[int, dict[str, Any]] = {}

    async def clock() -> dict[str, Any]:
        # The projection's extent changes only when the follower advances: one query per
        # advance, not per request.
        offset = console.next_offset
        if offset not in status_cache:
            fresh: dict[str, Any] = await read(queries.status)
            fresh["wall"] = is_wall_clock(fresh["first_ms"])
            status_cache.clear()
            status_cache[offset] = fresh
        return {**status_cache[offset], "follower_error": console.last_error}

    def page(name: str, request: Request, st: dict[str, Any], **context: Any) -> Response:
        # The time filters depend on the ledger's clock. Setting them on the shared
        # environment is safe because rendering runs on the event loop, never interleaved.
        env.filters["at"] = lambda ms: format_at(ms, st["wall"])
        env.filters["at_s"] = lambda s: "" if s is None else format_at(s * 1000, st["wall"])
        template = env.get_template(f"{name}.html")
        values: dict[str, Any] = {"snap": None, "moment": None, "error": "", **context}
        html = template.render(
            page=name,
            status=st,
            fragment=request.query_params.get("fragment") == "1",
            query=dict(request.query_params),
            **values,
        )
        return HTMLResponse(html)

    travel = Travel(console.source) if console.source else None
    console.on_stop.append(lambda: travel.close() if travel is not None else None)

    def bound_of(request: Request, st: dict[str, Any]) -> tuple[str, int] | None:
        """``?at=``: an offset (digits), an ISO time on a live ledger, or ``6h`` (from the
        clock's 0 on a simulated ledger, from the first record on a live one)."""
        text = request.query_params.get("at", "").strip()
        if not text:
            return None
        if text.isdigit():
            return ("offset", int(text))
        origin = st["first_ms"] if st["wall"] else 0
        moment = parse_at(text, st["wall"], origin)
        if st["last_ms"] is not None and moment > st["last_ms"]:
            raise ValueError(
                f"{text}: past the ledger's end (its last record is at "
                f"{format_at(st['last_ms'], st['wall'])})"
            )
        return ("time", moment)

    async def snapshot_of(request: Request, st: dict[str, Any]) -> tuple[Any, str]:
        """The state at ``?at=`` (``state --at``), or ``None``; and an error to show."""
        try:
            bound = bound_of(request, st)
        except ValueError as exc:
            return None, str(exc)
        if bound is None:
            return None, ""
        if travel is None:
            return None, "time travel needs the ledger's address"
        snap = await run_in_threadpool(travel.at, bound, st["next_offset"])
        return snap, ""

    async def report_of(
        request: Request, st: dict[str, Any], window: float | None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The Tenants report: of the projection, or with ``?at=`` of the ledger's records
        up to that moment (``Travel.report``); and the moment (``None`` for now)."""
        bound = bound_of(request, st)
        if bound is None:
            return await read(queries.tenants, window), None
        if travel is None:
            raise ValueError("time travel needs the ledger's address")
        kind, value = bound
        if kind == "offset":
            end = min(value, int(st["next_offset"]))
        else:
            end = await read(queries.end_of_moment, value, int(st["next_offset"]))
        report = await run_in_threadpool(travel.report, end, window)
        at_ms = value if kind == "time" else int(report["window"]["end_s"] * 1000)
        return report, {"end_offset": end, "at_ms": at_ms}

    def window_of(request: Request) -> float | None:
        text = request.query_params.get("window", "")
        return parse_window(text) if text else None

    def job_filter(request: Request, st: dict[str, Any]) -> queries.JobFilter:
        q = request.query_params
        lo, hi = q.get("from", ""), q.get("to", "")
        wall = bool(st["wall"])
        origin = int(st["first_ms"] or 0) if wall else 0
        return queries.JobFilter(
            queue=q.get("queue", ""),
            status=q.get("status", ""),
            priority_class=q.get("priority_class", ""),
            namespace=q.get("namespace", ""),
            cause=q.get("cause", ""),
            submitted_from_s=parse_at(lo, wall, origin) / 1000 if lo else None,
            submitted_to_s=parse_at(hi, wall, origin) / 1000 if hi else None,
            page=_int_param(request, "page", 1),
            per_page=_int_param(request, "per_page", 50),
        )

    # ----------------------------------------------------------------- JSON API

    async def api_status(_request: Request) -> Response:
        return _json(await clock())

    async def api_queues(_request: Request) -> Response:
        return _json(await read(queries.queues))

    async def api_jobs(request: Request) -> Response:
        st = await clock()
        try:
            flt = job_filter(request, st)
        except ValueError as exc:
            return _error(400, str(exc))
        return _json(await read(queries.jobs_page, flt))

    async def api_job(request: Request) -> Response:
        detail = await read(queries.job_detail, request.path_params["job"])
        if detail is None:
            return _error(404, f"no job {request.path_params['job']!r}")
        for line in detail["timeline"]:
            line["payload"] = json.loads(line["payload"])
        return _json(detail)

    async def api_record(request: Request) -> Response:
        record = await read(queries.record, request.path_params["offset"])
        if record is None:
            return _error(404, f"no record at offset {request.path_params['offset']}")
        record["payload"] = json.loads(record["payload"])
        return _json(record)

    async def api_nodes(_request: Request) -> Response:
        return _json(await read(queries.nodes))

    async def api_report(request: Request) -> Response:
        st = await clock()
        try:
            window = window_of(request)
            report, _moment = await report_of(request, st, window)
        except ValueError as exc:
            return _error(400, str(exc))
        return _json(report)

    async def api_sql(request: Request) -> Response:
        try:
            body = await request.json()
            query = str(body["query"])
        except (ValueError, KeyError, TypeError):
            return _error(400, 'expected a JSON body {"query": "SELECT …"}')
        refused = console.sql.try_enter()
        if refused is not None:
            headers = {"Retry-After": "1"} if refused.status == 429 else None
            return JSONResponse(refused.body, status_code=refused.status, headers=headers)
        answer = await run_in_threadpool(console.sql.run, console.cursor, query)
        return _json(answer.body, answer.status)

    async def api_events(_request: Request) -> Response:
        async def stream() -> AsyncIterator[bytes]:
            seen = -1
            quiet = 0.0
            while True:
                if console.next_offset != seen:
                    seen = console.next_offset
                    data = json.dumps({"next_offset": seen, "error": console.last_error})
                    yield f"event: ledger\ndata: {data}\n\n".encode()
                    quiet = 0.0
                elif quiet >= 15:
                    yield b": keep-alive\n\n"  # proxies close idle streams
                    quiet = 0.0
                await asyncio.sleep(0.2)
                quiet += 0.2

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # ----------------------------------------------------------------- pages

    async def queues_page(request: Request) -> Response:
        st = await clock()
        snap, error = await snapshot_of(request, st)
        if snap is not None:
            return page("queues", request, st, snap=snap, queues=[], error=error)
        return page("queues", request, st, queues=await read(queries.queues), error=error)

    async def jobs_page(request: Request) -> Response:
        st = await clock()
        snap, travel_error = await snapshot_of(request, st)
        ahead, _ = await forecasts_of(request, st)  # a forecast's error shows on its page
        by_job = ahead["by_job"] if ahead is not None else {}
        if snap is not None:
            return page("jobs", request, st, snap=snap, error=travel_error, forecasts=by_job)
        try:
            flt = job_filter(request, st)
            error = ""
        except ValueError as exc:
            flt, error = queries.JobFilter(), str(exc)
        error = error or travel_error
        result = await read(queries.jobs_page, flt)
        pages = max(1, -(-result["total"] // result["per_page"]))
        base = {k: v for k, v in request.query_params.items() if k not in ("page", "fragment")}

        def page_url(n: int) -> str:
            return "/jobs?" + urlencode({**base, "page": n})

        return page(
            "jobs",
            request,
            st,
            result=result,
            pages=pages,
            page_url=page_url,
            error=error,
            forecasts=by_job,
            statuses=(
                "pending",
                "allocated",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                "unschedulable",
            ),
        )

    async def job_page(request: Request) -> Response:
        st = await clock()
        detail = await read(queries.job_detail, request.path_params["job"])
        if detail is None:
            return page("missing", request, st, what=f"job {request.path_params['job']}")
        for line in detail["timeline"]:
            line["payload"] = json.loads(line["payload"])
        ahead = None
        if detail["job"]["status"] == "pending":
            result, _ = await forecasts_of(request, st)
            ahead = None if result is None else result["by_job"].get(detail["job"]["job"])
        return page("job", request, st, d=detail, ahead=ahead)

    async def nodes_page(request: Request) -> Response:
        st = await clock()
        snap, error = await snapshot_of(request, st)
        if snap is not None:
            return page("nodes", request, st, snap=snap, nodes=nodes_of(snap), error=error)
        return page("nodes", request, st, nodes=await read(queries.nodes), error=error)

    async def tenants_page(request: Request) -> Response:
        st = await clock()
        try:
            window, error = window_of(request), ""
        except ValueError as exc:
            window, error = None, str(exc)
        try:
            report, moment = await report_of(request, st, window)
        except ValueError as exc:
            error = error or str(exc)
            report, moment = await read(queries.tenants, window), None
        charts = {
            "tenants": [
                {
                    k: t.get(k)
                    for k in (
                        "queue",
                        "p50_ttr_s",
                        "p90_ttr_s",
                        "p95_ttr_s",
                        "p99_ttr_s",
                        "p50_completion_s",
                        "p90_completion_s",
                        "p95_completion_s",
                        "p99_completion_s",
                    )
                }
                for t in report["tenants"]
            ],
            "series": report["series"],
            "usage": report["usage"],
        }
        for suffix in ("ttr_s", "completion_s"):  # each axis in the tables' unit of its top
            top = max(
                (t[k] or 0 for t in charts["tenants"] for k in t if k.endswith(suffix)), default=0
            )
            charts[f"{suffix}_unit"] = duration_unit(top)
        return page("tenants", request, st, r=report, charts=charts, moment=moment, error=error)

    whatifs = WhatIfRuns(console.source) if console.source else None
    console.on_stop.append(lambda: whatifs.close() if whatifs is not None else None)
    forecasts = Forecasts(console.source) if console.source else None

    async def forecasts_of(request: Request, st: dict[str, Any]) -> tuple[Any, str]:
        """The forecasts at ``?at=`` or at the projection's end, and an error to show."""
        if forecasts is None:
            return None, "forecasts need the ledger's address"
        try:
            bound = bound_of(request, st)
            result = await run_in_threadpool(forecasts.at, bound, st["next_offset"])
        except (ValueError, OSError) as exc:
            return None, str(exc)
        return result, ""

    async def api_forecasts(request: Request) -> Response:
        st = await clock()
        result, error = await forecasts_of(request, st)
        if result is None:
            return _error(400, error)
        return _json({k: v for k, v in result.items() if k != "by_job"})

    async def forecast_page(request: Request) -> Response:
        st = await clock()
        result, error = await forecasts_of(request, st)
        return page("forecast", request, st, f=result, new=None, pasted="", error=error)

    async def forecast_new(request: Request) -> Response:
        if forecasts is None:
            return _error(400, "forecasts need the ledger's address")
        if not same_origin(request):
            return _error(403, "cross-origin request refused")
        body = await request.body()
        if len(body) > 2 * MAX_QUEUES_YAML:
            return _error(413, "form too large")
        text = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}.get(
            "job", ""
        )
        st = await clock()
        new = await run_in_threadpool(forecasts.new_job, text, st["next_offset"])
        result, error = await forecasts_of(request, st)
        return page("forecast", request, st, f=result, new=new, pasted=text, error=error)

    def same_origin(request: Request) -> bool:
        """A browser sends Origin with a cross-site POST: refuse those (CSRF), so that
        another site open in the same browser cannot start runs on a local console."""
        origin = request.headers.get("origin")
        return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"

    async def whatif_page(request: Request) -> Response:
        st = await clock()
        runs = [r.view() for r in reversed(whatifs.runs.values())] if whatifs else []
        return page("whatif", request, st, runs=runs, policies=POLICIES, run=None)

    async def whatif_start(request: Request) -> Response:
        if whatifs is None:
            return _error(400, "what-if needs the ledger's address")
        if not same_origin(request):
            return _error(403, "cross-origin request refused")
        # The page's form is urlencoded; parsed here rather than with python-multipart,
        # which Starlette's request.form() needs and nothing else would.
        body = await request.body()
        if len(body) > 2 * MAX_QUEUES_YAML:
            return _error(413, "form too large")
        form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        policy = form.get("policy_name", "")
        if policy and policy not in POLICIES:
            return _error(400, f"policy_name={policy!r}: choose from {', '.join(POLICIES)}")
        try:
            run = whatifs.start(queues_yaml=form.get("queues", ""), policy_name=policy)
        except (ValueError, WhatIfBusyError) as exc:
            st = await clock()
            runs = [r.view() for r in reversed(whatifs.runs.values())]
            return page(
                "whatif", request, st, runs=runs, policies=POLICIES, run=None, error=str(exc)
            )
        return RedirectResponse(f"/whatif/{run.run_id}", status_code=303)

    async def whatif_run(request: Request) -> Response:
        st = await clock()
        run = whatifs.runs.get(request.path_params["run"]) if whatifs else None
        if run is None:
            return page("missing", request, st, what=f"what-if {request.path_params['run']}")
        return page("whatif", request, st, runs=[], policies=POLICIES, run=run.view())

    async def api_whatif(request: Request) -> Response:
        run = whatifs.runs.get(request.path_params["run"]) if whatifs else None
        if run is None:
            return _error(404, f"no what-if {request.path_params['run']}")
        return _json(run.view())

    async def home(request: Request) -> Response:
        return await queues_page(request)

    routes = [
        Route("/", home),
        Route("/queues", queues_page),
        Route("/jobs", jobs_page),
        Route("/jobs/{job:path}", job_page),
        Route("/nodes", nodes_page),
        Route("/tenants", tenants_page),
        Route("/forecast", forecast_page),
        Route("/forecast", forecast_new, methods=["POST"]),
        Route("/api/forecasts", api_forecasts),
        Route("/whatif", whatif_page),
        Route("/whatif", whatif_start, methods=["POST"]),
        Route("/whatif/{run:int}", whatif_run),
        Route("/api/whatif/{run:int}", api_whatif),
        Route("/api/status", api_status),
        Route("/api/queues", api_queues),
        Route("/api/jobs", api_jobs),
        Route("/api/jobs/{job:path}", api_job),
        Route("/api/nodes", api_nodes),
        Route("/api/records/{offset:int}", api_record),
        Route("/api/tenants", api_report),
        Route("/api/report", api_report),
        Route("/api/sql", api_sql, methods=["POST"]),
        Route("/api/events", api_events),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(_TokenGate, token=console.token)] if console.token else []
    return Starlette(routes=routes, middleware=middleware)


def serve(
    console: Console, host: str, port: int, *, ready: Callable[[str], None] | None = None
) -> None:
    """Run the follower and the HTTP server until interrupted; announce the server beside
    the database while it runs."""
    import uvicorn  # noqa: PLC0415  # only the serving process needs it

    app = build_app(console)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=1
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Interrupt running queries first, so their requests answer at once and the
            # graceful shutdown does not wait out a query's time limit.
            console.sql.interrupt_all()
            super().handle_exit(sig, frame)

    server = Server(config)
    announce = discovery_path(console.db_path)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                await task  # it failed to bind: raise why
                return
            await asyncio.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()
        url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}"
        announce.write_text(json.dumps({"url": url, "pid": os.getpid()}) + "\n")
        if ready is not None:
            ready(url)
        await task

    def terminate(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # unwind through the finally below, as Ctrl-C does

    # uvicorn shuts down gracefully on SIGTERM and then raises the signal again under the
    # handler it found; a Python handler there (rather than the default, which kills the
    # process at once) lets the announcement be removed and the database closed.
    signal.signal(signal.SIGTERM, terminate)
    console.start()
    try:
        asyncio.run(main())
    finally:
        with contextlib.suppress(OSError):
            announce.unlink()
        console.stop()

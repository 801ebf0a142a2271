"""Thin helpers over the official ``kubernetes`` client: raw JSON calls, watches, Events.

The adapters work on the API's JSON (plain dicts) rather than the client's generated models:
the mapping functions stay pure and testable, and deserialising models is the slowest part of
the client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import msgspec
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

Obj = dict[str, Any]

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses worth retrying: throttling and server-side hiccups."""
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    urllib3.exceptions.HTTPError,
    ConnectionError,
    socket.timeout,
)


class Gone(Exception):  # noqa: N818  # named after the HTTP status it stands for
    """The watch's resourceVersion is too old (HTTP 410): list again."""


def api_client(kubeconfig: str | None = None, *, pool: int = 16) -> client.ApiClient:
    """An ApiClient from a kubeconfig file (in-cluster config when None and in a pod)."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped in the client
            config_file=kubeconfig, client_configuration=cfg
        )
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def is_transient(exc: BaseException) -> bool:
    """True for errors a bounded retry may cure."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUS or exc.status == 0
    return isinstance(exc, TRANSIENT_ERRORS)


def error_text(exc: BaseException) -> str:
    """A short description of an API error: status, reason and the Status message."""
    if isinstance(exc, ApiException):
        message = ""
        try:
            body = json.loads(exc.body or "{}")
            message = str(body.get("message", "")) if isinstance(body, dict) else ""
        except (TypeError, ValueError):
            pass
        return f"ApiException {exc.status} {exc.reason}" + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"


def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
    """Call a client method and return its JSON body as a dict."""
    resp = call(*args, _preload_content=False, **kwargs)
    data: Obj = _decode(resp.data) if resp.data else {}
    return data


def send(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call a client method whose answer is not needed, and read the answer all the same.

    A response that is never read keeps its connection out of urllib3's pool, so every such
    call opened a new connection and made a TLS handshake, on both sides; in the binder that
    was ~80% of its time (py-spy, 4,000 binds and Events). Reading the body returns the
    connection to the pool for the next call."""
    resp = call(*args, _preload_content=False, **kwargs)
    resp.read()
    resp.release_conn()


_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder(dict[str, Any]).decode
"""JSON objects as dicts: msgspec, several times the json module's speed on the pods a
watch or a list carries (most of the ingestor's input)."""


def _lines(resp: Any) -> Iterator[bytes]:
    """The lines of a streamed response, as bytes (a watch sends one event per line)."""
    buffer = bytearray()
    for segment in resp.stream(amt=None, decode_content=False):
        buffer += segment
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
    if buffer:
        yield bytes(buffer)


class Poster:
    """POSTs JSON bodies to the API server over kept-alive connections, past the client's
    generated layer and urllib3's request machinery.

    For the binder's per-pod calls (a ``pods/binding``, an Event). The generated method
    validates its arguments with pydantic and serialises the body with the json module;
    urllib3 and http.client then spend ~1.5 ms of Python per request on headers, retries,
    timeouts and email-style response parsing (cProfile: over 85% of a POST's CPU, the TLS
    reads and writes the rest). On a machine shared with the API server, CPU the binder
    spends is taken from the API server. So each call writes its request in one piece on a
    connection of its own and reads the answer with a minimal HTTP/1.1 parser (status line,
    ``Content-Length`` or chunked body, ``Connection: close``).

    The connections are made by the client's own urllib3 pool (``_new_conn``: its TLS
    settings, CA, client certificate, server name and socket options), then used directly.
    Authentication is the client's (any client certificate through the pool; headers from
    ``auth_settings``, so a refreshed token is used). Behind a proxy every call goes
    through urllib3 as the generated methods would."""

    def __init__(self, api: client.ApiClient, *, timeout_s: float = 30.0) -> None:
        """Post through ``api``'s configuration, each read or write bounded by ``timeout_s``."""
        self.api = api
        self.timeout_s = timeout_s
        self.timeout = urllib3.Timeout(total=timeout_s)
        cfg = api.configuration
        url = urllib3.util.parse_url(cfg.host)
        self.direct = url.scheme in ("http", "https") and not cfg.proxy
        self.prefix = (url.path or "").rstrip("/")
        self.host_header = url.netloc or ""
        self.idle: list[Any] = []
        """Connections (urllib3 ``HTTPConnection`` objects) free for the next call; a
        list's ``append`` and ``pop`` are atomic, so the worker threads share it."""
        self.max_idle = int(cfg.connection_pool_maxsize or 16)

    def __call__(self, path: str, body: Obj) -> None:
        """POST ``body`` to ``path`` (already quoted) and read the answer; ``ApiException``
        for a status outside 2xx, as the generated methods raise."""
        cfg = self.api.configuration
        headers = {
            **self.api.default_headers,
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        for auth in cfg.auth_settings().values():
            if auth["in"] == "header" and auth["value"]:
                headers[auth["key"]] = auth["value"]
        payload = _json.encode(body)
        if self.direct:
            status, reason, data = self._post(path, headers, payload)
        else:
            status, reason, data = self._post_urllib3(path, headers, payload)
        if not 200 <= status <= 299:
            raise ApiException(status=status, reason=reason, body=data.decode(errors="replace"))

    def close(self) -> None:
        """Close the idle connections."""
        while self.idle:
            with contextlib.suppress(IndexError):
                self.idle.pop().close()

    def _post_urllib3(
        self, path: str, headers: dict[str, str], payload: bytes
    ) -> tuple[int, str, bytes]:
        resp = self.api.rest_client.pool_manager.request(
            "POST",
            self.api.configuration.host + path,
            body=payload,
            headers=headers,
            timeout=self.timeout,
            preload_content=False,
        )
        try:
            return resp.status, resp.reason or "", resp.read()
        finally:
            resp.release_conn()

    def _connect(self) -> Any:
        pool = self.api.rest_client.pool_manager.connection_from_url(self.api.configuration.host)
        conn: Any = pool._new_conn()  # the pool's TLS and socket settings
        conn.connect()
        conn.sock.settimeout(self.timeout_s)
        return conn

    def _post(self, path: str, headers: dict[str, str], payload: bytes) -> tuple[int, str, bytes]:
        lines = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "host"]
        lines += [f"Content-Length: {len(payload)}", "", ""]
        request = "\r\n".join(lines).encode("latin-1") + payload
        while True:
            try:
                conn, reused = self.idle.pop(), True
            except IndexError:
                conn, reused = self._connect_or_raise(), False
            try:
                status, reason, data, keep = _exchange(conn.sock, request)
            except _Stale:
                conn.close()
                if reused:
                    continue  # the server closed a kept-alive connection: a fresh one
                raise urllib3.exceptions.ProtocolError(
                    "connection closed before a response"
                ) from None
            except BaseException as exc:
                conn.close()
                if isinstance(exc, ssl.SSLError):
                    raise urllib3.exceptions.SSLError(exc) from exc
                if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
                    raise urllib3.exceptions.ProtocolError(str(exc)) from exc
                raise
            if keep and len(self.idle) < self.max_idle:
                self.idle.append(conn)
            else:
                conn.close()
            return status, reason, data

    def _connect_or_raise(self) -> Any:
        try:
            return self._connect()
        except ssl.SSLError as exc:
            raise urllib3.exceptions.SSLError(exc) from exc
        except OSError as exc:
            if isinstance(exc, ConnectionError | TimeoutError):
                raise
            raise urllib3.exceptions.NewConnectionError(None, str(exc)) from exc  # type: ignore[arg-type]


class _Stale(Exception):  # noqa: N818  # a condition, not an error to report
    """The connection ended before any byte of the response came."""


def _exchange(sock: Any, request: bytes) -> tuple[int, str, bytes, bool]:
    """Send one HTTP/1.1 request; (status, reason, body, keep the connection).

    ``_Stale`` when the connection ended before any byte of the response: closed (EOF), or
    reset or broken — a server that dropped an idle kept-alive connection answers the next
    request either way, depending on when its close reaches us."""
    buf = b""
    try:
        sock.sendall(request)
        while (end := buf.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(65536)
            if not chunk:
                if buf:
                    raise ConnectionResetError("connection closed in a response's head")
                raise _Stale
            buf += chunk
    except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
        if buf:
            raise
        raise _Stale from None
    head, rest = buf[:end].decode("latin-1").split("\r\n"), buf[end + 4 :]
    version, _, status_reason = head[0].partition(" ")
    code, _, reason = status_reason.partition(" ")
    status = int(code)
    fields: dict[str, str] = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    keep = version == "HTTP/1.1" and fields.get("connection", "").lower() != "close"

    def more() -> bytes:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("connection closed in a response's body")
        return bytes(chunk)

    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            while (eol := rest.find(b"\r\n")) < 0:
                rest += more()
            size = int(rest[:eol].split(b";", 1)[0], 16)
            rest = rest[eol + 2 :]
            if size == 0:
                while (trailer := rest.find(b"\r\n")) < 0:
                    rest += more()
                while trailer > 0:  # trailer fields, then the empty line
                    rest = rest[trailer + 2 :]
                    while (trailer := rest.find(b"\r\n")) < 0:
                        rest += more()
                rest = rest[2:]
                break
            while len(rest) < size + 2:
                rest += more()
            body += rest[:size]
            rest = rest[size + 2 :]
        data = bytes(body)
    elif "content-length" in fields:
        length = int(fields["content-length"])
        while len(rest) < length:
            rest += more()
        data, rest = rest[:length], rest[length:]
    elif status in (204, 304) or 100 <= status < 200:
        data = b""
    else:  # the body runs to the end of the connection
        while chunk := sock.recv(65536):
            rest += chunk
        data, rest, keep = rest, b"", False
    return status, reason, data, keep and not rest


def binding_path(namespace: str, name: str) -> str:
    """The ``pods/binding`` subresource of a pod."""
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"


def events_path(namespace: str) -> str:
    """Where a namespace's core/v1 Events are created."""
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/events"


def watch(
    call: Callable[..., Any], resource_version: str, *, timeout_s: int = 60, **kwargs: Any
) -> Iterator[Obj]:
    """Watch events (``{"type", "object"}``) from ``resource_version``; ``Gone`` on 410.

    Bookmarks are requested so that the caller's resourceVersion keeps moving on a quiet
    resource and a restart resumes close to where it stopped.
    """
    try:
        resp = call(
            *(),
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _preload_content=False,
            **kwargs,
        )
    except ApiException as exc:
        if exc.status == 410:
            raise Gone(str(exc)) from exc
        raise
    try:
        for line in _lines(resp):
            if not line.strip():
                continue
            event: Obj = _decode(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                if status.get("code") == 410:
                    raise Gone(status.get("message", "410 Gone"))
                raise ApiException(status=status.get("code", 500), reason=status.get("message"))
            yield event
    finally:
        resp.release_conn()


def now_rfc3339() -> str:
    """The current UTC time as Kubernetes writes timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def emit_event(
    core: client.CoreV1Api,
    pod: Obj | tuple[str, str, str],
    reason: str,
    message: str,
    *,
    component: str,
    warning: bool = False,
    kind: str = "Pod",
    api_version: str = "v1",
) -> None:
    """Create a core/v1 Event on a pod (``kubectl describe pod`` and ``get events`` show it),
    or on another object given its ``kind`` and ``api_version`` (a cluster-scoped one, such
    as a Queue, gets its Event in the ``default`` namespace).

    ``pod`` is the object's JSON or ``(namespace, name, uid)``. Failures are logged, not raised:
    an Event is a courtesy to people and must never stop a decision from being carried out.
    """
    ns, body = event_body(pod, reason, message, component=component, warning=warning,
                          kind=kind, api_version=api_version)  # fmt: skip
    try:
        send(core.create_namespaced_event, ns, body)
    except Exception:  # courtesy only, see above
        log.warning(
            "could not create %s event on %s/%s",
            reason,
            ns,
            body["involvedObject"]["name"],
            exc_info=True,
        )


def event_body(
    pod: Obj | tuple[str, str, str],
    reason: str,
    message: str,
    *,
    component: str,
    warning: bool = False,
    kind: str = "Pod",
    api_version: str = "v1",
) -> tuple[str, Obj]:
    """The namespace and body of ``emit_event``'s Event."""
    if isinstance(pod, tuple):
        ns, name, uid = pod
    else:
        meta = pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace") or "", meta["name"], meta.get("uid", "")
    object_ns = ns
    ns = ns or "default"
    stamp = now_rfc3339()
    body: Any = {  # the client serialises plain dicts as well as its models
        "metadata": {"generateName": f"{name}.", "namespace": ns},
        "involvedObject": {
            "kind": kind,
            "apiVersion": api_version,
            "namespace": object_ns,
            "name": name,
            "uid": uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    return ns, body

"""Thin helpers over the official ``kubernetes`` client: raw JSON calls, watches, Events.

The adapters work on the API's JSON (plain dicts) rather than the client's generated models:
the mapping functions stay pure and testable, and deserialising models is the slowest part of
the client.
"""

from __future__ import annotations

import contextlib
import http.client
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
from kubernetes.utils.keepalive import tcp_keepalive_socket_options

log = logging.getLogger(__name__)

Obj = dict[str, Any]

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses worth retrying: throttling and server-side hiccups."""
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,
)
"""Errors of the connection rather than answers: urllib3's (the generated methods), and
those of ``http.client`` and the socket (``Poster``): refused, reset, timed out, TLS, a
truncated or garbled answer."""


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
    """POSTs JSON bodies to the API server over kept-alive connections, with the standard
    library's ``http.client`` rather than the client's generated layer and urllib3.

    For the binder's per-pod calls (a ``pods/binding``, an Event), from its worker threads.
    The generated method validates its arguments with pydantic and serialises the body with
    the json module; urllib3 adds its pool, retry and response machinery to ``http.client``.
    CPU per request against a local TLS server from 32 threads: ≈ 0.14 ms here, ≈ 0.20 ms
    with an aiohttp session on an event-loop thread, ≈ 0.21 ms with urllib3's connections,
    ≈ 0.27 ms with urllib3's pool, over 1 ms with httpx. On a machine shared with the API
    server, CPU the binder spends is taken from the API server.

    Each call takes an idle connection (or makes one), writes its request in one piece
    (``_Connection``), reads the whole answer and puts the connection back unless the
    server said it will close it. A kept-alive connection that the server dropped while it
    was idle fails before any answer: the call is made once more on a new connection.

    TLS and the socket are set up from the client's ``Configuration`` as the client's
    urllib3 pool sets them up: the CA (``ssl_ca_cert``, ``ca_cert_data``; the system's
    otherwise), ``verify_ssl``, ``assert_hostname`` (False: no host name check), the client
    certificate (``cert_file``, ``key_file``), the server name (``tls_server_name``, for SNI
    and the certificate check) and ``socket_options`` (or TCP keepalive with
    ``keep_alive``). Headers: the client's ``default_headers`` and those of
    ``auth_settings``, read on every call, so a refreshed token is used. Behind a proxy
    every call goes through the client's urllib3 pool manager instead."""

    def __init__(self, api: client.ApiClient, *, timeout_s: float = 30.0) -> None:
        """Post through ``api``'s configuration, each read or write bounded by ``timeout_s``."""
        self.api = api
        self.timeout_s = timeout_s
        self.timeout = urllib3.Timeout(total=timeout_s)
        cfg = api.configuration
        url = urllib3.util.parse_url(cfg.host)
        self.direct = url.scheme in ("http", "https") and not cfg.proxy
        self.prefix = (url.path or "").rstrip("/")
        self.host = url.host or ""
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = tls_context(cfg) if url.scheme == "https" and self.direct else None
        self.server_hostname = cfg.tls_server_name or self.host
        self.socket_options: list[tuple[int, int, Any]]
        if cfg.socket_options is not None:
            self.socket_options = list(cfg.socket_options)
        elif cfg.keep_alive:
            self.socket_options = tcp_keepalive_socket_options()
        else:  # urllib3's default
            self.socket_options = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        self.idle: list[_Connection] = []
        """Connections free for the next call; a list's ``append`` and ``pop`` are atomic,
        so the worker threads share it."""
        self.max_idle = int(cfg.connection_pool_maxsize or 16)

    def __call__(self, path: str, body: Obj) -> None:
        """POST ``body`` to ``path`` (already quoted) and read the answer; ``ApiException``
        for a status outside 2xx, as the generated methods raise."""
        headers = {
            **self.api.default_headers,
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        for auth in self.api.configuration.auth_settings().values():
            if auth["in"] == "header" and auth["value"]:
                headers[auth["key"]] = auth["value"]
        payload = _json.encode(body)
        if self.direct:
            status, reason, data = self._post(self.prefix + path, headers, payload)
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

    def _post(self, url: str, headers: dict[str, str], payload: bytes) -> tuple[int, str, bytes]:
        while True:
            try:
                conn, reused = self.idle.pop(), True
            except IndexError:
                conn, reused = self._connection(), False
            try:
                conn.request("POST", url, payload, headers)
                resp = conn.getresponse()
            except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
                # http.client.RemoteDisconnected (closed before any answer) is a reset too
                conn.close()
                if reused:
                    continue  # the server closed a kept-alive connection: a fresh one
                raise
            except BaseException:
                conn.close()
                raise
            try:
                data = resp.read()
            except BaseException:
                conn.close()
                raise
            if resp.will_close or len(self.idle) >= self.max_idle:
                conn.close()
            else:
                self.idle.append(conn)
            return resp.status, resp.reason, data

    def _connection(self) -> _Connection:
        return _Connection(
            self.host,
            self.port,
            timeout=self.timeout_s,
            tls=self.tls,
            server_hostname=self.server_hostname,
            socket_options=self.socket_options,
        )


def tls_context(cfg: client.Configuration) -> ssl.SSLContext:
    """The TLS settings of ``cfg`` as the client's urllib3 pool applies them."""
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert, cadata=cfg.ca_cert_data)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        ctx.check_hostname = False
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


class _Connection(http.client.HTTPConnection):
    """An ``http.client`` connection whose socket is made with the ``Poster``'s settings
    (socket options, then TLS with its context and server name), and whose request is
    written in one piece.

    ``request`` hands ``send`` the request's head and then its body; they are kept until
    ``getresponse`` and written together: one TLS record and one system call rather than
    two, and no lone segment with the head."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float,
        tls: ssl.SSLContext | None,
        server_hostname: str,
        socket_options: list[tuple[int, int, Any]],
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self.tls = tls
        self.server_hostname = server_hostname
        self.socket_options = socket_options
        self.pending: list[bytes] = []

    def connect(self) -> None:
        """Open the socket: TCP with the socket options, then TLS if the server uses it."""
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            for option in self.socket_options:
                sock.setsockopt(*option)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.server_hostname)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def send(self, data: Any) -> None:
        """Keep ``data`` (bytes) for ``getresponse`` to write."""
        self.pending.append(data)

    def getresponse(self) -> http.client.HTTPResponse:
        """Write the request kept by ``send``, then read the answer's head."""
        request, self.pending = b"".join(self.pending), []
        super().send(request)
        return super().getresponse()

    def close(self) -> None:
        """Close the socket and forget a request not written."""
        self.pending = []
        super().close()


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
